"""Gemma 2 and Gemma 3 (text): Llama's tensor layout with Gemma's differences.

- RMSNorm scales by `1 + w` (computed in float32): the norm weights are read as float32
  `1 + w` (exact: a bf16 `w` plus one fits float32), the q/k norms (Gemma 3) too.
- Four norms per layer: `input_layernorm` before attention and `post_attention_layernorm` on
  its output; `pre_feedforward_layernorm` before the MLP and `post_feedforward_layernorm` on
  its output (the blocks' `"post_norm"`, see `jaxarena.models.stack.Arch`).
- Embeddings times `sqrt(hidden_size)` rounded to bf16 (transformers casts the normalizer to
  the activation dtype; bf16 is ours).
- GeGLU MLP (`gelu_pytorch_tanh`), attention scale `query_pre_attn_scalar ** -0.5`, sliding
  and global layers (`layer_types`, `sliding_window`).
- Attention-logit and final-logit soft-caps where the config sets them (Gemma 2; Gemma 3's
  configs leave them null).
- Gemma 3: q/k norms; RoPE per layer type (global layers: `rope_theta` with `rope_scaling`,
  e.g. linear x8; sliding layers: the default RoPE at `rope_local_base_freq`).
  `gemma3` (Gemma3ForConditionalGeneration) reads the language model's weights
  (`model.language_model.*` as transformers 5 saves them, or `language_model.model.*` as
  released); the vision tower and projector are left on the host unread (counted by the
  memory budget: `ModelConfig.vision_param_count`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from jaxarena import ModelConfig
from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.checkpoint import Reader
from jaxarena.models.families.base import Family, TensorNames, unsupported
from jaxarena.models.families.llama import rope_kwargs
from jaxarena.models.stack import Arch

__all__ = ["Gemma2", "Gemma3"]

GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")
# Prefixes of the language model in a Gemma3ForConditionalGeneration checkpoint, and of the
# parts it does not run.
_LM_PREFIXES = ("model.language_model.", "language_model.model.")
_VISION_PREFIXES = ("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                    "multi_modal_projector.")  # fmt: skip


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` over the top level."""
    text = raw.get("text_config")
    return {**raw, **text} if isinstance(text, dict) else dict(raw)


def _plus_one(w: np.ndarray) -> np.ndarray:
    return np.asarray(w, np.float32) + np.float32(1.0)


class Gemma2(Family):
    """`gemma2`."""

    model_types = ("gemma2",)
    qk_norm = False
    default_window = 4096

    def rope(self, raw, config, path, max_seq_len, layer_type) -> dict[str, Any]:
        """One RoPE for every layer."""
        return rope_kwargs(raw, config, path, max_seq_len)

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """Per layer: attention (sliding or global) and a GeGLU MLP, each with a post-norm."""
        raw = text_config(raw)
        act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in GELU_TANH:
            raise unsupported(path, f"hidden_activation={act!r}; only gelu_pytorch_tanh")
        if raw.get("use_bidirectional_attention"):
            raise unsupported(path, "use_bidirectional_attention=true (embedding models)")
        types = tuple(config.layer_types)
        other = set(types) - {"full_attention", "sliding_attention"}
        if other or len(types) != config.num_hidden_layers:
            raise unsupported(path, f"layer_types {sorted(other) or types}")
        eps = float(raw.get("rms_norm_eps", 1e-6))
        window = int(raw.get("sliding_window") or self.default_window)
        # transformers' Gemma2Config / Gemma3TextConfig default: 256
        scale = float(raw.get("query_pre_attn_scalar") or 256) ** -0.5
        attn_cap = raw.get("attn_logit_softcapping")
        final_cap = raw.get("final_logit_softcapping")
        blocks = []
        for t in types:
            w = window if t == "sliding_attention" and window < max_seq_len else None
            blocks.append(Attention(
                rope=True, qk_norm=self.qk_norm, rms_eps=eps, window=w, scale=scale,
                softcap=None if attn_cap is None else float(attn_cap),
                **self.rope(raw, config, path, max_seq_len, t),
            ))  # fmt: skip
            blocks.append(MLP(act="geglu_tanh"))
        normalizer = float(np.float32(ml_dtypes.bfloat16(math.sqrt(config.hidden_size))))
        return Arch(blocks=tuple(blocks), rms_eps=eps, tie_embeddings=config.tie_word_embeddings,
                    embed_scale=normalizer,
                    final_softcap=None if final_cap is None else float(final_cap))  # fmt: skip

    def prefix(self, reader: Reader | None) -> str:
        """The language model's module prefix in this checkpoint."""
        return "model."

    def tensor_names(self, config: ModelConfig, arch: Arch, prefix: str = "model.") -> TensorNames:
        """`{prefix}layers.{i}.self_attn` / `.mlp` with their pre-norms."""
        blocks = []
        for i in range(config.num_hidden_layers):
            pre = f"{prefix}layers.{i}"
            blocks.append((f"{pre}.self_attn", f"{pre}.input_layernorm.weight"))
            blocks.append((f"{pre}.mlp", f"{pre}.pre_feedforward_layernorm.weight"))
        return TensorNames(blocks=tuple(blocks), embed=f"{prefix}embed_tokens.weight",
                           final_norm=f"{prefix}norm.weight")  # fmt: skip

    def read_params(self, reader: Reader, config: ModelConfig, arch: Arch) -> dict[str, Any]:
        """The Llama-layout weights plus the post-norms, every norm weight as float32 `1 + w`."""
        prefix = self.prefix(reader)
        names = self.tensor_names(config, arch, prefix)
        h, v = config.hidden_size, config.vocab_size
        layers = []
        for j, (block, (mod, norm)) in enumerate(zip(arch.blocks, names.blocks, strict=True)):
            p = block.read_params(reader, config, mod, norm)
            post = "post_attention_layernorm" if j % 2 == 0 else "post_feedforward_layernorm"
            p["post_norm"] = reader.vector(f"{prefix}layers.{j // 2}.{post}.weight", h)
            for key in ("norm", "post_norm", "q_norm", "k_norm"):
                if key in p:
                    p[key] = _plus_one(p[key])
            layers.append(p)
        params: dict[str, Any] = {"embed": reader.matrix(names.embed, v, h), "layers": layers,
                                  "final_norm": _plus_one(reader.vector(names.final_norm, h))}  # fmt: skip
        head = "lm_head.weight"
        if arch.tie_embeddings:
            if head in reader.ckpt:
                reader.matrix(head, v, h)
        else:
            params["lm_head"] = np.ascontiguousarray(reader.matrix(head, v, h).T)
        return params


class Gemma3(Gemma2):
    """`gemma3_text` and `gemma3` (the language model of Gemma3ForConditionalGeneration)."""

    model_types = ("gemma3_text", "gemma3")
    qk_norm = True

    def rope(self, raw, config, path, max_seq_len, layer_type) -> dict[str, Any]:
        """Global layers: `rope_theta` (default 1e6) with the scaling; sliding layers: the
        default RoPE at `rope_local_base_freq` (default 1e4)."""
        theta = 10000.0 if layer_type == "sliding_attention" else 1_000_000.0
        if layer_type == "sliding_attention" and "rope_local_base_freq" not in raw \
                and not isinstance((raw.get("rope_parameters") or {}).get(layer_type), dict):  # fmt: skip
            raw = {**raw, "rope_local_base_freq": 10000.0}
        return rope_kwargs(raw, config, path, max_seq_len, layer_type, default_theta=theta)

    def prefix(self, reader: Reader | None) -> str:
        """`model.` (Gemma3ForCausalLM), else the language model's prefix of a
        Gemma3ForConditionalGeneration checkpoint; marks its vision tensors as read."""
        if reader is None or "model.embed_tokens.weight" in reader.ckpt:
            return "model."
        names = list(reader.ckpt)
        reader.used.update(n for n in names if n.startswith(_VISION_PREFIXES))
        for pre in _LM_PREFIXES:
            if f"{pre}embed_tokens.weight" in reader.ckpt:
                return pre
        return "model."
