"""Qwen3.5 (dense): per decoder layer a Gated DeltaNet (`linear_attention`) or a gated
full-attention mixer (`full_attention`, as `layer_types` / `full_attention_interval` say),
then a SwiGLU MLP. Tensors under `model.layers.{i}.{linear_attn,self_attn,mlp}` (the text
model, `qwen3_5_text` / `Qwen3_5ForCausalLM`) or `model.language_model.layers.{i}...`
(`qwen3_5` / `Qwen3_5ForConditionalGeneration`, whose vision tower and MTP head are not
read). Every RMSNorm but the GDN's gated one scales by `(1 + w)`; attention has q/k norms,
partial RoPE (`partial_rotary_factor`) and a sigmoid output gate.

Positions are text positions: the multimodal RoPE (`mrope_section`) gives all three position
streams the same value for text tokens, which is the plain rotate-half RoPE here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.gated_deltanet import GatedDeltaNet
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.checkpoint import Reader
from jaxarena.models.families.base import Family, TensorNames, unsupported
from jaxarena.models.families.fused_experts import FusedExpertsReader
from jaxarena.models.families.llama import rope_theta
from jaxarena.models.stack import Arch

__all__ = ["Qwen3_5"]

# Checkpoint prefixes that are not the language model (ConditionalGeneration checkpoints).
_NOT_TEXT = ("model.visual.", "mtp.", "model.mtp.")
_GDN_HEAD_DIM = 128  # the seed sizes `gdn_fla_scratch` for 128 x 128 heads only


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of `config.json` (`text_config` when there is one)."""
    inner = raw.get("text_config")
    return inner if isinstance(inner, dict) else raw


class Qwen3_5(Family):
    """`qwen3_5` and `qwen3_5_text`: a dense MLP after every mixer (MoE: `Qwen3_5Moe`)."""

    model_types = ("qwen3_5", "qwen3_5_text")
    interleaved = False  # Qwen3-Next's fused in_proj_qkvz / in_proj_ba

    def check_gdn(self, config: ModelConfig, path: Path) -> None:
        """Raises NotImplementedError for GDN shapes the arena's kernels do not run."""
        nk, dk = config.linear_num_key_heads, config.linear_key_head_dim
        nv, dv = config.linear_num_value_heads, config.linear_value_head_dim
        if (dk, dv) != (_GDN_HEAD_DIM, _GDN_HEAD_DIM):
            raise unsupported(path, f"linear_key_head_dim={dk}, linear_value_head_dim={dv}; "
                              "the arena's GDN scratch is sized for 128 x 128 heads")  # fmt: skip
        if nk < 1 or nv % nk:
            raise unsupported(path, f"linear_num_value_heads={nv} is not a multiple of "
                              f"linear_num_key_heads={nk}")  # fmt: skip
        # A value width past the attention width is fine: the gated norm's output, out_proj's
        # input, is an XLA value (the step rule), not a view of `attn_output`; `fp8_act`
        # is sized for it (`max_proj_k`).

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """A GDN or gated-attention mixer per layer, each followed by a SwiGLU MLP."""
        text = text_config(raw)
        if text.get("hidden_act", "silu") != "silu":
            raise unsupported(path, f"hidden_act={text['hidden_act']!r}; only silu")
        if text.get("attention_bias"):
            raise unsupported(path, "attention_bias=true; biased projections are not implemented")
        if not config.attn_gated:
            raise unsupported(path, "attn_output_gate=false is not implemented")
        self.check_gdn(config, path)
        rp = text.get("rope_parameters") or text.get("rope_scaling") or {}
        factor = float(rp.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0)))
        eps = float(text.get("rms_norm_eps", 1e-6))
        attn = Attention(rope=True, rope_theta=rope_theta(text, path), qk_norm=True,
                         rms_eps=eps, rotary_dim=int(config.head_dim * factor), gated=True,
                         norm_offset=1.0)  # fmt: skip
        gdn = GatedDeltaNet(conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
                            rms_eps=eps, interleaved=self.interleaved)  # fmt: skip
        mixers = {"full_attention": attn, "linear_attention": gdn}
        other = sorted(set(config.layer_types) - set(mixers))
        if other or len(config.layer_types) != config.num_hidden_layers:
            raise unsupported(path, f"layer_types {other or config.layer_types}; only "
                              "full_attention and linear_attention")  # fmt: skip
        blocks = []
        for i, lt in enumerate(config.layer_types):
            blocks += [mixers[lt], self.mlp(config, text, path, i)]
        return Arch(blocks=tuple(blocks), rms_eps=eps, tie_embeddings=config.tie_word_embeddings,
                    norm_offset=1.0)  # fmt: skip

    def mlp(self, config: ModelConfig, text: dict[str, Any], path: Path, layer: int) -> Any:
        """The block after decoder layer `layer`'s mixer: a dense SwiGLU MLP.

        Raises:
          NotImplementedError: a config with experts (`qwen3_5_moe` is its own family).
        """
        if config.num_experts > 0:
            raise unsupported(path, f"num_experts={config.num_experts} under a dense Qwen3.5 "
                              "model_type; MoE checkpoints are model_type qwen3_5_moe")  # fmt: skip
        return MLP(act="swiglu")

    def tensor_names(self, config: ModelConfig, arch: Arch, prefix: str = "model") -> TensorNames:
        """`{prefix}.layers.{i}.{linear_attn,self_attn,mlp}` with their layer norms."""
        blocks = []
        for i, lt in enumerate(config.layer_types):
            pre = f"{prefix}.layers.{i}"
            mixer = "linear_attn" if lt == "linear_attention" else "self_attn"
            blocks.append((f"{pre}.{mixer}", f"{pre}.input_layernorm.weight"))
            blocks.append((f"{pre}.mlp", f"{pre}.post_attention_layernorm.weight"))
        return TensorNames(blocks=tuple(blocks), embed=f"{prefix}.embed_tokens.weight",
                           final_norm=f"{prefix}.norm.weight")  # fmt: skip

    def read_params(self, reader: Reader, config: ModelConfig, arch: Arch) -> dict[str, Any]:
        """The text model's weights, under `model.language_model` when the checkpoint is a
        ConditionalGeneration one (its vision and MTP tensors are left unread on purpose);
        MoE experts per expert or fused (`FusedExpertsReader`)."""
        nested = "model.language_model.embed_tokens.weight" in reader.ckpt
        prefix = "model.language_model" if nested else "model"
        names = self.tensor_names(config, arch, prefix)
        experts = FusedExpertsReader(reader, config.num_experts)
        params = self.read_named(experts, config, arch, names)  # type: ignore[arg-type]
        reader.used.update(n for n in reader.ckpt if n.startswith(_NOT_TEXT))
        return params
