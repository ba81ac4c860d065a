"""Qwen3.5-MoE (`qwen3_5_moe_text` / `Qwen3_5MoeForCausalLM`, and the language model of
`Qwen3_5MoeForConditionalGeneration`, `qwen3_5_moe`): Qwen3.5's decoder with every MLP a
routed-experts block with a sigmoid-gated shared expert.

As transformers 5.x computes it (`qwen3_5_moe/modeling_qwen3_5_moe.py`):
`Qwen3_5MoeDecoderLayer` puts a `Qwen3_5MoeSparseMoeBlock` in EVERY layer (`mlp_only_layers`
and `decoder_sparse_step` are not read); `Qwen3_5MoeTopKRouter` takes the float32 softmax of
`x @ gate.weight.T`, its top-k, and always renormalises them (there is no `norm_topk_prob`);
the shared expert (`shared_expert.{gate,up,down}_proj`, width
`shared_expert_intermediate_size`) is scaled by `sigmoid(x @ shared_expert_gate.weight.T)` and
added. The experts are read per expert (`mlp.experts.{j}.{gate,up,down}_proj.weight`, what
`save_pretrained` writes) or fused (`mlp.experts.gate_up_proj` / `mlp.experts.down_proj`, the
modules' own parameters; `families.fused_experts`).

Qwen3-Next's MoE layers are the same block (`qwen3_next.py`), with `norm_topk_prob` and the
layer choice read from the config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.blocks.moe import MoE
from jaxarena.models.families.base import unsupported
from jaxarena.models.families.qwen3_5 import Qwen3_5

__all__ = ["Qwen3_5Moe", "shared_expert_moe"]


def shared_expert_moe(config: ModelConfig, path: Path, norm_topk_prob: bool) -> MoE:
    """The Qwen3-Next / Qwen3.5 sparse MoE block: softmax top-k routing, renormalised when
    `norm_topk_prob`, plus the `shared_expert` scaled by `sigmoid(x @ shared_expert_gate)`.

    Raises:
      NotImplementedError: no shared expert width (transformers always builds one).
    """
    if config.shared_expert_intermediate_size < 1:
        raise unsupported(path, "shared_expert_intermediate_size=0; the Qwen3-Next / "
                          "Qwen3.5 MoE block always has a shared expert")  # fmt: skip
    return MoE(router="softmax", norm_topk_prob=norm_topk_prob, shared="shared_expert",
               shared_gate=True)  # fmt: skip


class Qwen3_5Moe(Qwen3_5):
    """`qwen3_5_moe` and `qwen3_5_moe_text`: a routed MoE block after every mixer."""

    model_types = ("qwen3_5_moe", "qwen3_5_moe_text")

    def mlp(self, config: ModelConfig, text: dict[str, Any], path: Path, layer: int) -> Any:
        """Every layer's FFN is the sparse MoE block, always renormalised.

        Raises:
          NotImplementedError: a config without experts.
        """
        if config.num_experts < 1:
            raise unsupported(path, "num_experts=0 under model_type qwen3_5_moe")
        return shared_expert_moe(config, path, norm_topk_prob=True)
