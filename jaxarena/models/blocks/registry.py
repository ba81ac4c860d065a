"""The block vocabulary: block kinds by name, and HuggingFace `layer_types` names by kind.

A new block is one module under `jaxarena/models/blocks/` and one line in `BLOCKS` (and in
`LAYER_TYPES` when configs name its layers).
"""

from __future__ import annotations

from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.base import Block
from jaxarena.models.blocks.gated_deltanet import GatedDeltaNet
from jaxarena.models.blocks.mamba2 import Mamba2
from jaxarena.models.blocks.mla import MLA
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.blocks.moe import MoE
from jaxarena.models.blocks.moe_gpt_oss import GptOssMoE

__all__ = ["BLOCKS", "LAYER_TYPES", "block_kind"]

# kind -> Block class
BLOCKS: dict[str, type[Block]] = {
    Attention.kind: Attention,
    GatedDeltaNet.kind: GatedDeltaNet,
    Mamba2.kind: Mamba2,
    MLP.kind: MLP,
    MLA.kind: MLA,
    MoE.kind: MoE,
    GptOssMoE.kind: GptOssMoE,
}

# A config's `layer_types` entry -> block kind (the names Nemotron-H-style configs use).
LAYER_TYPES: dict[str, str] = {
    "full_attention": "attention",
    "attention": "attention",
    "mamba": "mamba",
    "mlp": "mlp",
}


def block_kind(layer_type: str, extra: dict[str, str] | None = None) -> str | None:
    """The block kind of a config's layer type (`LAYER_TYPES`, then `extra`); None if none."""
    return LAYER_TYPES.get(layer_type, (extra or {}).get(layer_type))
