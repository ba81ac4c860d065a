"""Llama and Mistral: `num_hidden_layers` x (attention with RoPE, SwiGLU MLP), tensors under
`model.layers.{i}.{self_attn,mlp}`, `input_layernorm` / `post_attention_layernorm`.

Shared by the Llama-layout families (Qwen2, Qwen3): RoPE from the config's RoPE parameters
(every type of `core.rope_params`), projection biases (`attention_bias`; Qwen2's q/k/v
biases), and sliding windows per layer (`sliding_window` on the layers `layer_types` names
`sliding_attention`, else on every layer where the family applies it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.core.rope_params import rope_parameters, rope_spec
from jaxarena.models.families.base import Family, TensorNames, unsupported
from jaxarena.models.stack import Arch

__all__ = ["Llama", "rope_kwargs", "rope_theta"]


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


def rope_kwargs(raw: dict[str, Any], config: ModelConfig, path: Path, max_seq_len: int,
                layer_type: str | None = None, default_theta: float = 10000.0) -> dict[str, Any]:  # fmt: skip
    """The `Attention` RoPE fields for `config.json` (of `layer_type` where the RoPE
    parameters are per layer type): `rope_theta` for the default full-width RoPE, else a
    `rope_inv_freq` table and `rope_scaling` (`core.rope_params`).

    Raises:
      NotImplementedError: a RoPE type (or length) `rope_spec` does not run (names the file).
      ValueError: bad RoPE parameters (names the file).
    """
    params = rope_parameters(raw, layer_type)
    try:
        spec = rope_spec(params, head_dim=config.head_dim, max_seq_len=max_seq_len,
                         max_position_embeddings=int(raw.get("max_position_embeddings") or 0)
                         or max_seq_len, default_theta=default_theta)  # fmt: skip
    except NotImplementedError as e:
        raise unsupported(path, str(e)) from None
    except ValueError as e:
        raise ValueError(f"{path / 'config.json'}: {e}") from None
    theta = float(params.get("rope_theta") or default_theta)
    if params["rope_type"] in ("default", "dynamic") and spec.rotary_dim == config.head_dim:
        return {"rope_theta": theta}  # the plain RoPE (dynamic NTK unscaled at these lengths)
    return {"rope_inv_freq": spec.inv_freq, "rope_scaling": spec.attention_scaling}


class Llama(Family):
    """`llama` and `mistral` (Mistral's `sliding_window` on every layer)."""

    model_types = ("llama", "mistral")
    qk_norm = False
    qkv_bias = False  # Qwen2: q/k/v biases without `attention_bias`

    def uses_sliding_window(self, raw: dict[str, Any]) -> bool:
        """Whether a `sliding_window` in the config applies (always, for Llama / Mistral)."""
        return True

    def first_window_layer(self, raw: dict[str, Any]) -> int:
        """The first layer a config-wide `sliding_window` applies to (Qwen: `max_window_layers`)."""
        return 0

    def windows(self, raw: dict[str, Any], config: ModelConfig, max_seq_len: int) -> list[int | None]:  # fmt: skip
        """Per layer its sliding window, None for full attention (and for a window that never
        binds: at least `max_seq_len`)."""
        n, w = config.num_hidden_layers, raw.get("sliding_window")
        types = raw.get("layer_types")
        if isinstance(types, list) and len(types) == n:
            on = [t == "sliding_attention" for t in types]
        elif w and self.uses_sliding_window(raw):
            on = [i >= self.first_window_layer(raw) for i in range(n)]
        else:
            on = [False] * n
        return [int(w) if flag and w and int(w) < max_seq_len else None for flag in on]

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """Attention (RoPE; q/k norms for Qwen3) then a SwiGLU MLP, per decoder layer."""
        if raw.get("hidden_act", "silu") != "silu":
            raise unsupported(path, f"hidden_act={raw['hidden_act']!r}; only silu is implemented")
        if raw.get("mlp_bias"):
            raise unsupported(path, "mlp_bias=true; biased MLP projections are not implemented")
        kinds = set(config.layer_types) - {"full_attention", "sliding_attention"}
        if kinds:
            raise unsupported(path, f"layer_types {sorted(kinds)}; only full_attention and "
                              "sliding_attention")  # fmt: skip
        eps = float(raw.get("rms_norm_eps", 1e-6))
        bias = bool(raw.get("attention_bias"))
        common = dict(rope=True, qk_norm=self.qk_norm, rms_eps=eps, qkv_bias=bias or self.qkv_bias,
                      o_bias=bias, **rope_kwargs(raw, config, path, max_seq_len))  # fmt: skip
        blocks = []
        for w in self.windows(raw, config, max_seq_len):
            blocks += [Attention(window=w, **common), MLP(act="swiglu")]
        return Arch(blocks=tuple(blocks), rms_eps=eps,
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
