"""gpt-oss (`model_type: gpt_oss`, transformers' `gpt_oss/modeling_gpt_oss.py`): Llama's
tensor layout and norms with

- attention with q/k/v/o biases (`attention_bias`, default true) and one learned sink logit
  per query head (`self_attn.sinks`), sliding (`sliding_window`) and full layers as
  `layer_types` says (alternating in the releases);
- RoPE from the config's RoPE parameters (YaRN in the releases: factor 32 over 4096
  original positions, `truncate: false`; base `rope_theta`, default 150000);
- a `GptOssMoE` block in every layer (router with a bias, clamped GLU experts with biases;
  `swiglu_alpha`, `swiglu_limit`), under `model.layers.{i}.mlp`.

MXFP4 checkpoints (`quantization_config.quant_method: mxfp4`, the hub's releases) are refused
when their weights are loaded (`checkpoint.fp8_spec`); their `config.json` still builds the
blocks, so the memory budget and the plan work on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.moe_gpt_oss import GptOssMoE
from jaxarena.models.families.base import unsupported
from jaxarena.models.families.llama import Llama, rope_kwargs
from jaxarena.models.stack import Arch

__all__ = ["GptOss"]

DEFAULT_THETA = 150000.0  # GptOssConfig.default_theta


class GptOss(Llama):
    """`gpt_oss` (bf16 / f32 weights)."""

    model_types = ("gpt_oss",)

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """Per layer: attention (sinks, biases, sliding or full) and a `GptOssMoE` block."""
        if config.num_experts < 1:
            raise unsupported(path, "gpt_oss without experts (num_local_experts = 0)")
        kinds = set(config.layer_types) - {"full_attention", "sliding_attention"}
        if kinds:
            raise unsupported(path, f"layer_types {sorted(kinds)}; only full_attention and "
                              "sliding_attention")  # fmt: skip
        eps = float(raw.get("rms_norm_eps", 1e-5))
        bias = bool(raw.get("attention_bias", True))
        rope = rope_kwargs(raw, config, path, max_seq_len, default_theta=DEFAULT_THETA)
        try:
            moe = GptOssMoE(alpha=float(raw.get("swiglu_alpha", 1.702)),
                            limit=float(raw.get("swiglu_limit", 7.0)))  # fmt: skip
        except ValueError as e:
            raise ValueError(f"{path / 'config.json'}: {e}") from None
        blocks = []
        for w in self.windows(raw, config, max_seq_len):
            blocks += [Attention(rope=True, rms_eps=eps, qkv_bias=bias, o_bias=bias, sinks=True,
                                 window=w, **rope), moe]  # fmt: skip
        return Arch(blocks=tuple(blocks), rms_eps=eps,
                    tie_embeddings=config.tie_word_embeddings)  # fmt: skip
