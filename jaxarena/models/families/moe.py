"""Mixture-of-experts families in Llama's layout: `qwen3_moe` (Qwen3's attention with q/k
norms; an `MoE` block where `is_qwen3_moe_layer` says so, else a dense SwiGLU MLP) and
`mixtral` (Llama's attention; every FFN an `MoE` block, experts `w1` / `w3` / `w2` under
`block_sparse_moe`). Routing follows transformers' `Qwen3MoeTopKRouter` and
`MixtralTopKRouter` (softmax in float32, top-k; Mixtral always renormalises)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.blocks.moe import MoE
from jaxarena.models.blocks.moe_routing import is_qwen3_moe_layer
from jaxarena.models.families.base import TensorNames, unsupported
from jaxarena.models.families.llama import Llama
from jaxarena.models.families.qwen3 import Qwen3
from jaxarena.models.stack import Arch

__all__ = ["Mixtral", "Qwen3Moe"]


def _check_moe(raw: dict[str, Any], config: ModelConfig, path: Path) -> None:
    if config.num_experts < 1:
        raise unsupported(path, "an MoE model_type without experts (num_experts = 0)")
    if config.shared_expert_intermediate_size:
        raise unsupported(path, "shared experts in this family are not implemented")


class Qwen3Moe(Qwen3):
    """`qwen3_moe` (bf16, or FP8 block-quantized experts and projections)."""

    model_types = ("qwen3_moe",)
    ffn_prefix = "mlp"

    def moe_layers(self, raw: dict[str, Any], config: ModelConfig) -> list[bool]:
        """Per decoder layer: MoE (True) or dense MLP."""
        only = raw.get("mlp_only_layers") or []
        step = int(raw.get("decoder_sparse_step", 1))
        return [is_qwen3_moe_layer(i, only, step) for i in range(config.num_hidden_layers)]

    def moe_block(self, raw: dict[str, Any]) -> MoE:
        """The routed-experts block of this family."""
        return MoE(router="softmax", norm_topk_prob=bool(raw.get("norm_topk_prob", False)))

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """Llama's blocks with the FFN of every MoE layer an `MoE` block."""
        _check_moe(raw, config, path)
        dense = super().arch(model_type, raw, config, path, max_seq_len)
        moe, flags = self.moe_block(raw), self.moe_layers(raw, config)
        blocks = list(dense.blocks)
        for i, is_moe in enumerate(flags):
            if is_moe:
                blocks[2 * i + 1] = moe
        return Arch(blocks=tuple(blocks), rms_eps=dense.rms_eps,
                    tie_embeddings=dense.tie_embeddings)  # fmt: skip

    def tensor_names(self, config: ModelConfig, arch: Arch) -> TensorNames:
        """Llama's names; the MoE FFN under `model.layers.{i}.<ffn_prefix>`."""
        names = super().tensor_names(config, arch)
        blocks = list(names.blocks)
        for j, block in enumerate(arch.blocks):
            if isinstance(block, MoE):
                _, norm = blocks[j]
                blocks[j] = (f"model.layers.{j // 2}.{self.ffn_prefix}", norm)
        return TensorNames(blocks=tuple(blocks), embed=names.embed,
                           final_norm=names.final_norm)  # fmt: skip


class Mixtral(Qwen3Moe):
    """`mixtral`: Llama's attention (no q/k norm), a softmax-routed MoE in every layer."""

    model_types = ("mixtral",)
    qk_norm = False
    ffn_prefix = "block_sparse_moe"

    def uses_sliding_window(self, raw: dict[str, Any]) -> bool:
        """Mixtral's `sliding_window` applies when set (Llama's rule)."""
        return Llama.uses_sliding_window(self, raw)

    def moe_layers(self, raw: dict[str, Any], config: ModelConfig) -> list[bool]:
        """Every layer is MoE."""
        return [True] * config.num_hidden_layers

    def moe_block(self, raw: dict[str, Any]) -> MoE:
        """Softmax top-k, always renormalised; experts `w1` (gate), `w3` (up), `w2` (down)."""
        return MoE(router="softmax", norm_topk_prob=True, expert_names=("w1", "w3", "w2"))
