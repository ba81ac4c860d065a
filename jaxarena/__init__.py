"""jaxarena: one static, donated workspace arena for LLM inference in JAX/XLA.

The pipeline, stage by stage: a model config (`ModelConfig`, with `Levers` and a `Target`)
and the serve limits (`ServeLimits`) give the byte size of every buffer (`BufferSizes`); a
plan gives each a static offset (`ArenaPlan`, sequential or packed by `Lifetimes`); one donated
`jax.Array` holds the whole arena; typed views and in-place writes at static offsets are taken
inside `jax.jit`; the Pallas kernels in `pallas_kernels` take their workspace from it.

Public modules: `jaxarena.workspaces` (the kernel workspace contract), `jaxarena.testing`
(footprint and trace-count assertions) and `jaxarena.models` (reference models).
"""

from jaxarena._arena.lifetimes import Interval, Lifetimes
from jaxarena._arena.plan import ArenaPlan, Region
from jaxarena._arena.record import record_lifetimes
from jaxarena._arena.report import packing_report
from jaxarena._config.hf_source import presets
from jaxarena._config.levers import Levers
from jaxarena._config.model import ModelConfig
from jaxarena._config.target import Target
from jaxarena._errors import ArenaError, ConfigError, GuardError
from jaxarena._sizing.budget import MemoryBudget
from jaxarena._sizing.buffers import BufferSizes, ServeLimits
from jaxarena._sizing.scaling import scaling_table
from jaxarena._units import parse_memory

__all__ = [
    "ArenaError",
    "ArenaPlan",
    "BufferSizes",
    "ConfigError",
    "GuardError",
    "Interval",
    "Levers",
    "Lifetimes",
    "MemoryBudget",
    "ModelConfig",
    "Region",
    "ServeLimits",
    "Target",
    "packing_report",
    "parse_memory",
    "presets",
    "record_lifetimes",
    "scaling_table",
]
