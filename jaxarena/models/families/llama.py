"""Llama and Mistral: `num_hidden_layers` x (attention with RoPE, SwiGLU MLP), tensors under
`model.layers.{i}.{self_attn,mlp}`, `input_layernorm` / `post_attention_layernorm`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.families.base import Family, TensorNames, unsupported
from jaxarena.models.stack import Arch

__all__ = ["Llama", "rope_theta"]


def rope_theta(raw: dict[str, Any], path: Path) -> float:
    """The RoPE base of `config.json` (`rope_parameters` or `rope_scaling`, else
    `rope_theta`, default 10000).

    Raises:
      NotImplementedError: a RoPE type other than the default (no scaling).
    """
    rp = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = rp.get("rope_type", rp.get("type", "default")) if isinstance(rp, dict) else "default"
    if kind != "default":
        raise unsupported(path, f"rope_type={kind!r}; only the default RoPE is implemented")
    theta = (rp.get("rope_theta") if isinstance(rp, dict) else None) or raw.get("rope_theta")
    return float(theta or 10000.0)


class Llama(Family):
    """`llama` and `mistral` (without a sliding window shorter than `max_seq_len`)."""

    model_types = ("llama", "mistral")
    qk_norm = False

    def uses_sliding_window(self, raw: dict[str, Any]) -> bool:
        """Whether a `sliding_window` in the config applies (always, for Llama / Mistral)."""
        return True

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """Attention (RoPE; q/k norms for Qwen3) then a SwiGLU MLP, per decoder layer."""
        if raw.get("hidden_act", "silu") != "silu":
            raise unsupported(path, f"hidden_act={raw['hidden_act']!r}; only silu is implemented")
        for flag in ("attention_bias", "mlp_bias"):
            if raw.get(flag):
                raise unsupported(path, f"{flag}=true; biased projections are not implemented")
        window = raw.get("sliding_window")
        if window and self.uses_sliding_window(raw) and window < max_seq_len:
            raise unsupported(path, f"sliding_window={window} < max_seq_len={max_seq_len}; "
                              "sliding-window attention is not implemented")  # fmt: skip
        kinds = set(config.layer_types) - {"full_attention"}
        if kinds:
            raise unsupported(path, f"layer_types {sorted(kinds)}; only full_attention")
        eps = float(raw.get("rms_norm_eps", 1e-6))
        attn = Attention(rope=True, rope_theta=rope_theta(raw, path), qk_norm=self.qk_norm,
                         rms_eps=eps)  # fmt: skip
        return Arch(blocks=(attn, MLP(act="swiglu")) * config.num_hidden_layers, rms_eps=eps,
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
