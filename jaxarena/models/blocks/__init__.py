"""The residual blocks a decoder is made of (`base.Block`): `Attention` (GQA over a paged KV
cache), `MLP` (relu^2, SwiGLU or GeGLU), `Mamba2`, `GatedDeltaNet` (Qwen3-Next / Qwen3.5
linear attention), `MLA` (multi-head latent attention) and `MoE` (routed experts);
`registry.BLOCKS` names them by kind."""

from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.base import Block, Env, StepContext
from jaxarena.models.blocks.gated_deltanet import GatedDeltaNet
from jaxarena.models.blocks.mamba2 import Mamba2
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.blocks.moe import MoE
from jaxarena.models.blocks.registry import BLOCKS, LAYER_TYPES, block_kind

__all__ = ["Attention", "BLOCKS", "Block", "Env", "GatedDeltaNet", "LAYER_TYPES", "MLP",
           "Mamba2", "MoE", "StepContext", "block_kind"]  # fmt: skip
