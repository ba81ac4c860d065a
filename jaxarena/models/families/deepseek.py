"""DeepSeek-V2 and DeepSeek-V3 (and Kimi-K2, a DeepSeek-V3 checkpoint): per decoder layer an
MLA block (`jaxarena.models.blocks.mla`) then an MLP, tensors under
`model.layers.{i}.{self_attn,mlp}` with `input_layernorm` / `post_attention_layernorm`.

The first `first_k_dense_replace` layers have a dense SwiGLU MLP; the later ones are routed
MoE layers, which need the MoE block (`jaxarena/models/blocks/moe.py`), not part of this
implementation yet: a config with such layers raises NotImplementedError naming it. The
multi-token-prediction layers that DeepSeek-V3 checkpoints carry after the last decoder layer
(`model.layers.{num_hidden_layers + j}`, `num_nextn_predict_layers` of them) are skipped at
load: their tensors are accepted and not read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.blocks.mla import MLA
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.checkpoint import Reader
from jaxarena.models.core.mla_rope import Yarn
from jaxarena.models.families.base import Family, TensorNames, unsupported
from jaxarena.models.stack import Arch

__all__ = ["DeepseekV2", "DeepseekV3", "mla_rope_options"]

_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def mla_rope_options(raw: dict[str, Any], path: Path) -> tuple[float, Yarn | None]:
    """`(rope_theta, yarn)` of a DeepSeek `config.json` (`rope_parameters` or the released
    `rope_scaling` plus a top-level `rope_theta`).

    Raises:
      NotImplementedError: a RoPE type other than the default or `yarn`.
    """
    rp = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rp = rp if isinstance(rp, dict) else {}
    kind = rp.get("rope_type", rp.get("type", "default"))
    theta = float(rp.get("rope_theta") or raw.get("rope_theta") or 10000.0)
    if kind == "default":
        return theta, None
    if kind != "yarn":
        raise unsupported(path, f"rope_type={kind!r}; MLA implements the default RoPE and yarn")
    try:
        return theta, Yarn.from_config(rp, int(raw.get("max_position_embeddings") or 0))
    except ValueError as e:
        raise unsupported(path, str(e)) from None


class DeepseekV2(Family):
    """`deepseek_v2` (V2, V2-Lite): MLA with or without a q LoRA, interleaved RoPE pairs."""

    model_types: tuple[str, ...] = ("deepseek_v2",)

    def rope_interleave(self, raw: dict[str, Any]) -> bool:
        """V2 rotates adjacent pairs (its complex-number RoPE) always."""
        return True

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """MLA then an MLP per layer; every layer must be dense (see the module docstring)."""
        if raw.get("hidden_act", "silu") != "silu":
            raise unsupported(path, f"hidden_act={raw['hidden_act']!r}; only silu is implemented")
        if raw.get("attention_bias"):
            raise unsupported(path, "attention_bias=true; biased MLA projections are not "
                              "implemented")  # fmt: skip
        if config.kv_lora_rank <= 0 or config.qk_rope_head_dim <= 0:
            raise unsupported(path, "kv_lora_rank and qk_rope_head_dim must be > 0 for MLA")
        n = config.num_hidden_layers
        dense = int(raw.get("first_k_dense_replace") or 0)
        routed = int(raw.get("n_routed_experts") or 0)
        if routed and dense < n:
            raise unsupported(path, f"layers {dense}..{n - 1} are routed MoE layers "
                              f"(first_k_dense_replace={dense} < num_hidden_layers={n}); "
                              "they need the MoE block jaxarena/models/blocks/moe.py, which is "
                              "not implemented")  # fmt: skip
        theta, yarn = mla_rope_options(raw, path)
        eps = float(raw.get("rms_norm_eps", 1e-6))
        mla = MLA(rope_theta=theta, rope_interleave=self.rope_interleave(raw), yarn=yarn,
                  rms_eps=eps)  # fmt: skip
        return Arch(blocks=(mla, MLP(act="swiglu")) * n, rms_eps=eps,
                    tie_embeddings=config.tie_word_embeddings)  # fmt: skip

    def tensor_names(self, config: ModelConfig, arch: Arch) -> TensorNames:
        """`model.layers.{i}.self_attn` / `.mlp` with their layer norms."""
        blocks = []
        for i in range(config.num_hidden_layers):
            pre = f"model.layers.{i}"
            blocks.append((f"{pre}.self_attn", f"{pre}.input_layernorm.weight"))
            blocks.append((f"{pre}.mlp", f"{pre}.post_attention_layernorm.weight"))
        return TensorNames(blocks=tuple(blocks), embed="model.embed_tokens.weight",
                           final_norm="model.norm.weight")  # fmt: skip

    def read_params(self, reader: Reader, config: ModelConfig, arch: Arch) -> dict[str, Any]:
        """The decoder's weights; the MTP layers' tensors (past the last layer) are skipped."""
        params = super().read_params(reader, config, arch)
        n = config.num_hidden_layers
        for name in reader.ckpt:
            m = _LAYER.match(name)
            if m and int(m.group(1)) >= n:
                reader.used.add(name)
        return params


class DeepseekV3(DeepseekV2):
    """`deepseek_v3` and `kimi_k2`: V2's layout with a q LoRA, YaRN and `rope_interleave`
    (default true; false: rotate-half pairs)."""

    model_types = ("deepseek_v3", "kimi_k2")

    def rope_interleave(self, raw: dict[str, Any]) -> bool:
        """`rope_interleave` of the config (transformers' default: true)."""
        return bool(raw.get("rope_interleave", True))
