"""jaxarena: one static, donated workspace arena for LLM inference in JAX/XLA.

A model config and serve limits give the byte size of every buffer (`BufferSizes`); a plan
gives each a static offset (`ArenaPlan`); one donated `jax.Array` holds the whole arena; typed
views and in-place writes at static offsets are taken inside `jax.jit`.
"""

from jaxarena._config import LAYER_TYPES, ConfigError, ModelConfig
from jaxarena._layouts import DecodeMetaLayout, ssd_scratch_layout
from jaxarena._levers import Levers
from jaxarena._plan import ArenaError, ArenaPlan, GuardError, Region
try:
    from jaxarena._presets import presets
except ImportError:  # TEMP-LEAD: until _presets lands
    presets = None
from jaxarena._sizes import GATEUP_FUSED_MAX_M, BufferSizes, ServeLimits, splitk_policy
from jaxarena._splitk import SplitKPolicy, num_splits, workspace_slots
from jaxarena._target import Target

__all__ = [
    "ArenaError",
    "ArenaPlan",
    "GuardError",
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
    "num_splits",
    "presets",
    "splitk_policy",
    "ssd_scratch_layout",
    "workspace_slots",
]
