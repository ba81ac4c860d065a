"""jaxarena: one static, donated workspace arena for LLM inference in JAX/XLA.

A model config and serve limits give the byte size of every buffer (`BufferSizes`); a plan
gives each a static offset (`ArenaPlan`); one donated `jax.Array` holds the whole arena; typed
views and in-place writes at static offsets are taken inside `jax.jit`.
"""

from jaxarena._config import LAYER_TYPES, ConfigError, ModelConfig
from jaxarena._layouts import DecodeMetaLayout, ssd_scratch_layout
from jaxarena._levers import Levers
from jaxarena._lifetimes import Interval, Lifetimes, record_lifetimes
from jaxarena._packing import packing_report
from jaxarena._plan import ArenaError, ArenaPlan, GuardError, Region
from jaxarena._presets import load_preset, presets
from jaxarena._shard import (
    BufferScaling,
    experts_per_device,
    format_scaling_table,
    scaling_table,
    shard_config,
)
from jaxarena._sizes import GATEUP_FUSED_MAX_M, BufferSizes, ServeLimits, splitk_policy
from jaxarena._splitk import SplitKPolicy, num_splits, workspace_slots
from jaxarena._target import Target

__all__ = [
    "ArenaError",
    "BufferScaling",
    "ArenaPlan",
    "GuardError",
    "Interval",
    "Lifetimes",
    "Region",
    "BufferSizes",
    "ConfigError",
    "DecodeMetaLayout",
    "GATEUP_FUSED_MAX_M",
    "LAYER_TYPES",
    "Levers",
    "ModelConfig",
    "ServeLimits",
    "SplitKPolicy",
    "Target",
    "experts_per_device",
    "format_scaling_table",
    "num_splits",
    "load_preset",
    "packing_report",
    "presets",
    "record_lifetimes",
    "scaling_table",
    "shard_config",
    "splitk_policy",
    "ssd_scratch_layout",
    "workspace_slots",
]
