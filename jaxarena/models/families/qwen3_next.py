"""Qwen3-Next: Qwen3.5's decoder (Gated DeltaNet / gated attention mixers, `(1 + w)` norms)
with the GDN's fused, per-key-head interleaved `in_proj_qkvz` / `in_proj_ba`, under
`model.layers.{i}`, and MoE layers as transformers 5.x builds them
(`qwen3_next/modeling_qwen3_next.py`): `Qwen3NextDecoderLayer` makes layer `i` a
`Qwen3NextSparseMoeBlock` when `num_experts > 0`, `i` is not in `mlp_only_layers` and
`(i + 1) % decoder_sparse_step == 0`, else a dense SwiGLU `Qwen3NextMLP` of
`intermediate_size`. The sparse block: `Qwen3NextTopKRouter` (float32 softmax of the router
logits, top-k, renormalised when `norm_topk_prob`), the routed experts, and the
`shared_expert` scaled by `sigmoid(shared_expert_gate(x))` (`qwen3_5_moe.shared_expert_moe`).
Tensors: `model.layers.{i}.mlp.gate.weight`, `mlp.experts.{j}.{gate,up,down}_proj.weight`
(or fused, `families.fused_experts`), `mlp.shared_expert.*`, `mlp.shared_expert_gate.weight`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.blocks.moe_routing import is_qwen3_moe_layer
from jaxarena.models.families.qwen3_5 import Qwen3_5
from jaxarena.models.families.qwen3_5_moe import shared_expert_moe

__all__ = ["Qwen3Next"]


class Qwen3Next(Qwen3_5):
    """`qwen3_next`: interleaved GDN projections; MoE or dense MLP per layer."""

    model_types = ("qwen3_next",)
    interleaved = True

    def mlp(self, config: ModelConfig, text: dict[str, Any], path: Path, layer: int) -> Any:
        """The sparse MoE block where `Qwen3NextDecoderLayer` puts one, else a SwiGLU MLP."""
        only = text.get("mlp_only_layers") or []
        step = int(text.get("decoder_sparse_step", 1))
        if config.num_experts > 0 and is_qwen3_moe_layer(layer, only, step):
            return shared_expert_moe(config, path, bool(text.get("norm_topk_prob", True)))
        return MLP(act="swiglu")
