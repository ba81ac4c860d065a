"""Parameter counts, weight bytes, KV-cache bytes and recurrent-state bytes of a model,
exact as the HuggingFace implementation of its family holds the parameters.

* `weight_tensors(config, tp=, ep=)`: every parameter tensor one device holds (shape, count,
  whether an FP8 block-quantized checkpoint stores it in FP8), grouped by component;
  `param_count`, `param_breakdown` and `weight_bytes` sum it.
* The KV cache and recurrent states are in `jaxarena._sizing.cache`.

Per device: every count is computed on `config.shard(tp, ep)` (the same per-device config the
arena is sized from), with the routed experts divided by `ep`. So a tensor the shard rules
split (heads, FFN widths, vocabulary) is counted at its per-device size and a tensor they keep
whole (norms, routers, MLA down-projections, replicated KV heads) on every device.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from jaxarena._config.model import ModelConfig

__all__ = [
    "COMPONENTS",
    "FP8_BLOCK",
    "WeightTensor",
    "exactness",
    "mtp_param_count",
    "param_breakdown",
    "param_count",
    "weight_bytes",
    "weight_tensors",
]

# The components a parameter count is broken down into, in display order.
COMPONENTS = (
    "embed",
    "lm_head",
    "attention",
    "mlp",
    "experts",
    "shared_experts",
    "router",
    "ssm",
    "norms",
    "other",
    "vision",
)

# FP8 block quantization: e4m3 weights, one f32 scale per 128 x 128 block.
FP8_BLOCK = 128
# MXFP4 (OCP microscaling): 32 4-bit values share one 8-bit (e8m0) scale.
MXFP4_BLOCK = 32
WEIGHT_FORMATS = ("bf16", "fp8", "mxfp4")

# Family rules that the ModelConfig fields do not carry (they are fixed by the architecture).
_QK_NORM_FAMILIES = frozenset(
    {
        "qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe",
        "qwen3_vl_moe_text", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
        "qwen3_6", "qwen3_6_moe", "qwen4_exp", "qwen4_exp_text", "qwen3_8_flash_next",
        "gemma3", "gemma3_text",
    }
)  # fmt: skip
# Qwen2 attention has q/k/v biases (no o_proj bias) whatever `attention_bias` says.
_QKV_BIAS_FAMILIES = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"})
_GDN_SPLIT_FAMILIES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
# Routers that carry an `e_score_correction_bias` buffer (f32, loaded from the checkpoint).
_CORRECTION_BIAS_FAMILIES = frozenset(
    {"deepseek_v3", "deepseek_v32", "longcat_flash", "longcat_flash_ngram", "nemotron_h",
     "nemotron_h_puzzle"}
)  # fmt: skip
# Families that transformers (or the published checkpoint) describe in more detail than
# `ModelConfig` holds; their counts cover the parts ModelConfig describes (see `exactness`).
_APPROXIMATE_FAMILIES = {
    "longcat_flash_ngram": "the n-gram embedding tables (their layout is not published)",
}

_HC_FAMILIES = frozenset({"qwen4_exp", "qwen4_exp_text", "qwen3_8_flash_next"})


@dataclasses.dataclass(frozen=True)
class WeightTensor:
    """`count` parameter tensors of one `shape`.

    Attributes:
      component: one of `COMPONENTS`.
      name: the HuggingFace parameter name with layer indices as `*` (informational).
      shape: the tensor shape as the checkpoint stores one of them; for a linear layer
        `(out_features, in_features)`.
      count: how many such tensors (layers x experts ...).
      fp8: True when an FP8 block-quantized checkpoint stores it as e4m3 with 128 x 128 f32
        block scales and the models keep it so on the device (linear weights of attention,
        MLPs, experts and SSM projections); False for embeddings, the LM head, norms,
        routers, biases, convs and A/D/dt (kept in bf16), and MLA's `kv_b_proj` (dequantized
        to bf16 at load).
      itemsize: bytes per element when not FP8 (2 for bf16; 4 for the f32 router-correction
        buffers that checkpoints ship in f32).
      buffer: True for a registered buffer that the checkpoint holds but `parameters()` does
        not list (router correction biases); counted in bytes, not in `param_count`.
    """

    component: str
    name: str
    shape: tuple[int, ...]
    count: int = 1
    fp8: bool = False
    itemsize: int = 2
    buffer: bool = False

    @property
    def numel(self) -> int:
        """Elements of all `count` tensors."""
        return math.prod(self.shape) * self.count

    def nbytes(self, weights: str) -> int:
        """Bytes of all `count` tensors in the `weights` format: `"bf16"`, `"fp8"`, or
        `"mxfp4"` (gpt-oss's hub format: the routed experts' matrices as 4-bit values with
        one e8m0 scale byte per 32 along the input, `out * ceil(in/32) * 17` bytes; every
        other tensor bf16)."""
        if weights == "mxfp4" and self.fp8 and self.component == "experts":
            out, inp = self.shape[0], math.prod(self.shape[1:])
            return out * -(-inp // MXFP4_BLOCK) * (MXFP4_BLOCK // 2 + 1) * self.count
        if weights == "fp8" and self.fp8:
            out, inp = self.shape[0], math.prod(self.shape[1:])
            scales = -(-out // FP8_BLOCK) * -(-inp // FP8_BLOCK) * 4
            return (out * inp + scales) * self.count
        return self.numel * self.itemsize


# -- the tensors ----------------------------------------------------------------------------------


def _ffn_types(c: Any) -> tuple[str, ...]:
    """Per layer `"dense"`, `"moe"` or `"none"` (a layer whose only block is its mixer)."""
    n = c.num_hidden_layers
    listed = tuple(c.ffn_layer_types)
    if listed:
        return listed
    mt = c.model_type
    if mt in ("mamba", "mamba2", "falcon_mamba"):
        return ("none",) * n
    if mt in ("nemotron_h", "nemotron_h_puzzle") or (c.layer_types and "mlp" in c.layer_types):
        return (
            tuple({"mlp": "dense", "moe": "moe"}.get(k, "none") for k in (c.layer_types or ()))
            or ("none",) * n
        )
    kind = "moe" if c.num_experts > 0 else ("dense" if c.intermediate_size else "none")
    return (kind,) * n


def layer_kinds(c: Any) -> tuple[str, ...]:
    """Per layer the mixer: "attention", "mla", "mamba2", "mamba1", "gdn", or "none"."""
    n = c.num_hidden_layers
    if c.layer_types:
        raw = c.layer_types
    else:  # the seed's fallback: every full_attention_interval-th layer is attention
        k = c.full_attention_interval
        raw = tuple(
            "full_attention" if k == 0 or (i + 1) % k == 0 else "linear_attention" for i in range(n)
        )
    out = []
    for kind in raw:
        if kind in ("moe", "mlp"):
            out.append("none")
        elif kind in ("linear_attention", "mamba"):
            if c.mamba_num_heads > 0:
                out.append("mamba2")
            elif c.linear_num_key_heads > 0:
                out.append("gdn")
            else:
                out.append("mamba1")
        elif c.kv_lora_rank > 0:
            out.append("mla")
        else:
            out.append("attention")
    return tuple(out)


def _norms_per_layer(c: Any) -> int:
    mt = c.model_type
    if mt in ("mamba", "mamba2", "falcon_mamba", "nemotron_h", "nemotron_h_puzzle"):
        return 1
    if mt in ("gemma2", "gemma3", "gemma3_text"):
        return 4
    if mt in _HC_FAMILIES:
        return 0  # the hyper-connection blocks hold the pre-norms ("other")
    return 2


def _attention(c: Any, n: int, out: list[WeightTensor]) -> None:
    if n == 0:
        return
    h, heads, kv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    q_out = heads * hd * (2 if c.attn_gated else 1)
    a = "attention"
    out += [
        WeightTensor(a, "self_attn.q_proj.weight", (q_out, h), n, fp8=True),
        WeightTensor(a, "self_attn.k_proj.weight", (kv * hd, h), n, fp8=True),
        WeightTensor(a, "self_attn.v_proj.weight", (kv * hd, h), n, fp8=True),
        WeightTensor(a, "self_attn.o_proj.weight", (h, heads * hd), n, fp8=True),
    ]
    if c.attention_bias or c.model_type in _QKV_BIAS_FAMILIES:
        out += [
            WeightTensor(a, "self_attn.q_proj.bias", (q_out,), n),
            WeightTensor(a, "self_attn.k_proj.bias", (kv * hd,), n),
            WeightTensor(a, "self_attn.v_proj.bias", (kv * hd,), n),
        ]
        if c.model_type not in _QKV_BIAS_FAMILIES:
            out.append(WeightTensor(a, "self_attn.o_proj.bias", (h,), n))
    if c.model_type in _QK_NORM_FAMILIES:
        out += [
            WeightTensor("norms", "self_attn.q_norm.weight", (hd,), n),
            WeightTensor("norms", "self_attn.k_norm.weight", (hd,), n),
        ]
    if c.model_type == "gpt_oss":
        out.append(WeightTensor(a, "self_attn.sinks", (heads,), n))


def _mla(c: Any, n: int, out: list[WeightTensor]) -> None:
    if n == 0:
        return
    h, heads = c.hidden_size, c.num_attention_heads
    rope, lora_kv, lora_q = c.qk_rope_head_dim, c.kv_lora_rank, c.q_lora_rank
    qk = c.head_dim  # the parser stores qk_nope_head_dim + qk_rope_head_dim
    v = c.v_head_dim or qk - rope
    a = "attention"
    bias = bool(c.attention_bias)
    if lora_q:
        out += [
            WeightTensor(a, "self_attn.q_a_proj.weight", (lora_q, h), n, fp8=True),
            WeightTensor("norms", "self_attn.q_a_layernorm.weight", (lora_q,), n),
            WeightTensor(a, "self_attn.q_b_proj.weight", (heads * qk, lora_q), n, fp8=True),
        ]
        if bias:
            out.append(WeightTensor(a, "self_attn.q_a_proj.bias", (lora_q,), n))
    else:
        out.append(WeightTensor(a, "self_attn.q_proj.weight", (heads * qk, h), n, fp8=True))
    out += [
        WeightTensor(a, "self_attn.kv_a_proj_with_mqa.weight", (lora_kv + rope, h), n, fp8=True),
        WeightTensor("norms", "self_attn.kv_a_layernorm.weight", (lora_kv,), n),
        # Stored FP8 by an FP8 checkpoint, held bf16 on the device: the MLA block dequantizes
        # it at load (its einsums take no FP8 weight; jaxarena/models/blocks/mla.py).
        WeightTensor(a, "self_attn.kv_b_proj.weight", (heads * (qk - rope + v), lora_kv), n),
        WeightTensor(a, "self_attn.o_proj.weight", (h, heads * v), n, fp8=True),
    ]
    if bias:
        out += [
            WeightTensor(a, "self_attn.kv_a_proj_with_mqa.bias", (lora_kv + rope,), n),
            WeightTensor(a, "self_attn.o_proj.bias", (h,), n),
        ]
    if c.model_type == "deepseek_v32" and c.index_n_heads:
        _lightning_indexer(c, n, out)


def _lightning_indexer(c: Any, n: int, out: list[WeightTensor]) -> None:
    """DeepSeek-V3.2's per-layer lightning indexer (transformers' `DeepseekV32Indexer`): `wq_b`
    from the query latent to `index_n_heads * index_head_dim`, one shared key `wk`, a LayerNorm
    `k_norm` (weight and bias) on it, and `weights_proj` giving one weight per indexer head."""
    h, heads, dim = c.hidden_size, c.index_n_heads, c.index_head_dim
    a, pre = "attention", "self_attn.indexer."
    out += [
        WeightTensor(a, pre + "wq_b.weight", (heads * dim, c.q_lora_rank or h), n, fp8=True),
        WeightTensor(a, pre + "wk.weight", (dim, h), n, fp8=True),
        WeightTensor("norms", pre + "k_norm.weight", (dim,), n),
        WeightTensor("norms", pre + "k_norm.bias", (dim,), n),
        WeightTensor(a, pre + "weights_proj.weight", (heads, h), n),
    ]


def _v4_attention(c: Any, n: int, out: list[WeightTensor]) -> None:
    """DeepSeek-V4: low-rank queries, one shared K=V head, grouped low-rank output, sinks."""
    if n == 0:
        return
    h, heads, hd, lora_q = c.hidden_size, c.num_attention_heads, c.head_dim, c.q_lora_rank
    groups, lora_o = c.o_groups or 8, c.o_lora_rank  # 8: DeepseekV4Config's default
    a = "attention"
    out += [
        WeightTensor(a, "self_attn.sinks", (heads,), n),
        WeightTensor(a, "self_attn.q_a_proj.weight", (lora_q, h), n, fp8=True),
        WeightTensor("norms", "self_attn.q_a_norm.weight", (lora_q,), n),
        WeightTensor(a, "self_attn.q_b_proj.weight", (heads * hd, lora_q), n, fp8=True),
        WeightTensor(a, "self_attn.kv_proj.weight", (hd, h), n, fp8=True),
        WeightTensor("norms", "self_attn.kv_norm.weight", (hd,), n),
        WeightTensor(
            a, "self_attn.o_a_proj.weight", (groups * lora_o, heads * hd // groups), n, fp8=True
        ),
        WeightTensor(a, "self_attn.o_b_proj.weight", (h, groups * lora_o), n, fp8=True),
    ]


def _mamba2(c: Any, n: int, out: list[WeightTensor]) -> None:
    if n == 0:
        return
    h, heads, d_inner, conv = c.hidden_size, c.mamba_num_heads, c.mamba2_d_inner, c.mamba2_d_xbc
    k = c.conv_kernel
    s = "ssm"
    out += [
        WeightTensor(s, "mixer.in_proj.weight", (c.mamba2_in_proj_size, h), n, fp8=True),
        WeightTensor(s, "mixer.conv1d.weight", (conv, 1, k), n),
        WeightTensor(s, "mixer.dt_bias", (heads,), n),
        WeightTensor(s, "mixer.A_log", (heads,), n),
        WeightTensor(s, "mixer.D", (heads,), n),
        WeightTensor("norms", "mixer.norm.weight", (d_inner,), n),
        WeightTensor(s, "mixer.out_proj.weight", (h, d_inner), n, fp8=True),
    ]
    if c.mamba_conv_bias:
        out.append(WeightTensor(s, "mixer.conv1d.bias", (conv,), n))
    if c.mamba_proj_bias:
        out += [
            WeightTensor(s, "mixer.in_proj.bias", (c.mamba2_in_proj_size,), n),
            WeightTensor(s, "mixer.out_proj.bias", (h,), n),
        ]


def _gdn(c: Any, n: int, out: list[WeightTensor]) -> None:
    if n == 0:
        return
    h = c.hidden_size
    nk, dk, nv, dv = (
        c.linear_num_key_heads, c.linear_key_head_dim,
        c.linear_num_value_heads, c.linear_value_head_dim,
    )  # fmt: skip
    conv = 2 * nk * dk + nv * dv
    k = c.conv_kernel
    s = "ssm"
    if c.model_type in _GDN_SPLIT_FAMILIES or c.model_type in _HC_FAMILIES:
        out += [
            WeightTensor(s, "linear_attn.in_proj_qkv.weight", (conv, h), n, fp8=True),
            WeightTensor(s, "linear_attn.in_proj_z.weight", (nv * dv, h), n, fp8=True),
            WeightTensor(s, "linear_attn.in_proj_b.weight", (nv, h), n),
            WeightTensor(s, "linear_attn.in_proj_a.weight", (nv, h), n),
        ]
    else:
        out += [
            WeightTensor(s, "linear_attn.in_proj_qkvz.weight", (c.ssm_qkvz_size, h), n, fp8=True),
            WeightTensor(s, "linear_attn.in_proj_ba.weight", (c.ssm_ba_size, h), n),
        ]
    out += [
        WeightTensor(s, "linear_attn.conv1d.weight", (conv, 1, k), n),
        WeightTensor(s, "linear_attn.dt_bias", (nv,), n),
        WeightTensor(s, "linear_attn.A_log", (nv,), n),
        WeightTensor("norms", "linear_attn.norm.weight", (dv,), n),
        WeightTensor(s, "linear_attn.out_proj.weight", (h, nv * dv), n, fp8=True),
    ]


def _mamba1(c: Any, n: int, out: list[WeightTensor]) -> None:
    if n == 0:
        return
    h = c.hidden_size
    di, ds, r = c.mamba1_d_inner, c.mamba1_d_state, c.mamba1_dt_rank
    k = c.conv_kernel
    s = "ssm"
    out += [
        WeightTensor(s, "mixer.in_proj.weight", (2 * di, h), n, fp8=True),
        WeightTensor(s, "mixer.conv1d.weight", (di, 1, k), n),
        WeightTensor(s, "mixer.x_proj.weight", (r + 2 * ds, di), n, fp8=True),
        WeightTensor(s, "mixer.dt_proj.weight", (di, r), n, fp8=True),
        WeightTensor(s, "mixer.dt_proj.bias", (di,), n),
        WeightTensor(s, "mixer.A_log", (di, ds), n),
        WeightTensor(s, "mixer.D", (di,), n),
        WeightTensor(s, "mixer.out_proj.weight", (h, di), n, fp8=True),
    ]
    if c.mamba_conv_bias:
        out.append(WeightTensor(s, "mixer.conv1d.bias", (di,), n))
    if c.mamba_proj_bias:
        out += [
            WeightTensor(s, "mixer.in_proj.bias", (2 * di,), n),
            WeightTensor(s, "mixer.out_proj.bias", (h,), n),
        ]
    if c.model_type == "jamba":
        out += [
            WeightTensor("norms", "mamba.dt_layernorm.weight", (r,), n),
            WeightTensor("norms", "mamba.b_layernorm.weight", (ds,), n),
            WeightTensor("norms", "mamba.c_layernorm.weight", (ds,), n),
        ]


def _dense_ffn(
    c: Any, n: int, width: int, out: list[WeightTensor], *, prefix: str, part: str = "mlp"
) -> None:
    if n == 0 or width == 0:
        return
    h = c.hidden_size
    gated = c.model_type not in ("nemotron_h", "nemotron_h_puzzle")  # Nemotron-H: relu2 up/down
    if gated:
        out.append(WeightTensor(part, f"{prefix}.gate_proj.weight", (width, h), n, fp8=True))
    out += [
        WeightTensor(part, f"{prefix}.up_proj.weight", (width, h), n, fp8=True),
        WeightTensor(part, f"{prefix}.down_proj.weight", (h, width), n, fp8=True),
    ]
    if c.mlp_bias:
        if gated:
            out.append(WeightTensor(part, f"{prefix}.gate_proj.bias", (width,), n))
        out += [
            WeightTensor(part, f"{prefix}.up_proj.bias", (width,), n),
            WeightTensor(part, f"{prefix}.down_proj.bias", (h,), n),
        ]


def _moe(c: Any, n: int, experts_here: int, out: list[WeightTensor]) -> None:
    if n == 0:
        return
    h, e, w = c.hidden_size, c.num_experts, c.moe_intermediate_size
    mt = c.model_type
    nemotron = mt in ("nemotron_h", "nemotron_h_puzzle")
    width_in = c.moe_input_size  # LatentMoE experts read and write the latent
    scored = e + c.zero_expert_num  # LongCat's router also scores its zero (identity) experts
    router = "mlp.router.weight" if mt == "gpt_oss" else "mlp.gate.weight"
    out.append(WeightTensor("router", router, (scored, h), n))
    if mt == "gpt_oss":
        out.append(WeightTensor("router", "mlp.router.bias", (e,), n))
    if mt in _CORRECTION_BIAS_FAMILIES:
        out.append(
            WeightTensor(
                "router", "mlp.gate.e_score_correction_bias", (scored,), n, itemsize=4,
                buffer=True,
            )
        )  # fmt: skip
    x = experts_here * n
    if x:
        if not nemotron:
            out.append(WeightTensor("experts", "experts.*.gate_proj.weight", (w, width_in), x,
                                    fp8=True))  # fmt: skip
        out += [
            WeightTensor("experts", "experts.*.up_proj.weight", (w, width_in), x, fp8=True),
            WeightTensor("experts", "experts.*.down_proj.weight", (width_in, w), x, fp8=True),
        ]
        if mt == "gpt_oss":
            out += [
                WeightTensor("experts", "experts.gate_up_proj_bias", (2 * w,), x),
                WeightTensor("experts", "experts.down_proj_bias", (h,), x),
            ]
    if c.moe_latent_size:
        out += [
            WeightTensor("experts", "fc1_latent_proj.weight", (c.moe_latent_size, h), n, fp8=True),
            WeightTensor("experts", "fc2_latent_proj.weight", (h, c.moe_latent_size), n, fp8=True),
        ]
        if c.mlp_bias:
            out += [
                WeightTensor("experts", "fc1_latent_proj.bias", (c.moe_latent_size,), n),
                WeightTensor("experts", "fc2_latent_proj.bias", (h,), n),
            ]
    shared = c.shared_expert_intermediate_size
    if shared:
        _dense_ffn(c, n, shared, out, prefix="shared_experts", part="shared_experts")
        if mt in ("qwen2_moe", "qwen3_next") or mt in _GDN_SPLIT_FAMILIES or mt in _HC_FAMILIES:
            out.append(WeightTensor("shared_experts", "mlp.shared_expert_gate.weight", (1, h), n))


def _tensors(c: Any, experts_per_device: int) -> list[WeightTensor]:
    h, vocab = c.hidden_size, c.vocab_size
    out = [WeightTensor("embed", "embed_tokens.weight", (vocab, h))]
    if not c.tie_word_embeddings:
        out.append(WeightTensor("lm_head", "lm_head.weight", (vocab, h)))
    kinds = layer_kinds(c)
    mla = _v4_attention if c.model_type == "deepseek_v4" else _mla
    for kind, fn in (
        ("attention", _attention), ("mla", mla), ("mamba2", _mamba2), ("gdn", _gdn),
        ("mamba1", _mamba1),
    ):  # fmt: skip
        fn(c, kinds.count(kind), out)
    ffn = _ffn_types(c)
    longcat = c.model_type in ("longcat_flash", "longcat_flash_ngram")
    if longcat:
        # A LongCat layer is two (attention + dense MLP) sublayers sharing one MoE block;
        # `num_hidden_layers` counts the sublayers, so every sublayer has a dense MLP and every
        # second one a MoE.
        _dense_ffn(c, len(ffn), c.intermediate_size, out, prefix="mlps.*")
        _moe(c, len(ffn) // 2, experts_per_device, out)
    else:
        _dense_ffn(c, ffn.count("dense"), c.intermediate_size, out, prefix="mlp")
        widths = tuple(c.moe_layer_widths)
        if widths:  # per-block expert widths (Nemotron-H Puzzle), split like the global one
            for w in sorted(set(widths)):
                wide = c.replace(moe_intermediate_size=w)
                _moe(wide, widths.count(w), experts_per_device, out)
        else:
            _moe(c, ffn.count("moe"), experts_per_device, out)
    out.append(WeightTensor("norms", "layers.*.norm.weight", (h,), _norms_per_layer(c) * len(ffn)))
    if c.model_type not in _HC_FAMILIES:  # there the final hyper-connection mixer normalizes
        out.append(WeightTensor("norms", "norm.weight", (h,)))
    # Family blocks ModelConfig has no dimensions for, counted by the parser (replicated).
    out.append(WeightTensor("other", "<family blocks>", (c.other_param_count,)))
    out.append(WeightTensor("vision", "visual.*", (c.vision_param_count,)))
    return [t for t in out if t.count and t.numel]


def weight_tensors(config: ModelConfig, *, tp: int = 1, ep: int = 1) -> tuple[WeightTensor, ...]:
    """Every weight tensor one device holds under `tp` x `ep` (the whole model at 1 x 1).

    The shapes are those of the HuggingFace implementation of `config.model_type` (checkpoint
    layout: q/k/v and gate/up projections as separate matrices, experts one matrix each).
    Multi-token-prediction layers are not included (see `mtp_param_count`).

    Raises:
      ConfigError: `tp`/`ep` do not divide the model (as `ModelConfig.shard`).
    """
    local = config.shard(tp=tp, ep=ep) if (tp, ep) != (1, 1) else config
    # `shard` keeps the global expert count (the router scores every expert on every device);
    # each device holds the weights of num_experts / ep of them.
    experts = config.num_experts // ep if config.num_experts else 0
    return tuple(_tensors(local, experts))


def param_breakdown(config: ModelConfig) -> dict[str, int]:
    """Parameters per component (`COMPONENTS` order) of the whole model, as `parameters()` of
    the HuggingFace implementation counts them (registered buffers and MTP layers excluded)."""
    out = dict.fromkeys(COMPONENTS, 0)
    for t in weight_tensors(config):
        if not t.buffer:
            out[t.component] += t.numel
    return out


def param_count(config: ModelConfig) -> int:
    """Total parameters of the whole model (see `param_breakdown`)."""
    return sum(param_breakdown(config).values())


def mtp_param_count(config: ModelConfig) -> int:
    """Parameters of the multi-token-prediction layers the checkpoint ships but transformers
    does not instantiate (0 when the config has none).

    DeepSeek-V3 style (`num_nextn_predict_layers`): per MTP layer one decoder layer of the
    model's last kind (MLA + MoE), `enorm` and `hnorm` (hidden), `eh_proj` (2*hidden ->
    hidden), and the shared head's norm; the checkpoint also repeats the embedding and LM head
    in every MTP layer, which are counted too (they occupy memory when loaded as stored).
    """
    n = config.num_mtp_layers
    if n == 0:
        return 0
    changes: dict[str, Any] = {"num_hidden_layers": 1, "layer_types": config.layer_types[-1:]}
    for name in ("ffn_layer_types", "moe_layer_widths"):
        if getattr(config, name):
            changes[name] = getattr(config, name)[-1:]
    one = config.replace(**changes)
    skip = ("embed", "lm_head", "other", "vision")
    layer = sum(
        t.numel
        for t in weight_tensors(one)
        if not t.buffer and t.name != "norm.weight" and t.component not in skip
    )
    h = config.hidden_size
    if config.model_type.startswith(("qwen", "qwen4")):
        # Qwen3-Next / Qwen3.5: fc (2*hidden -> hidden), two pre-fc norms and a final norm;
        # the embedding and LM head are the model's own.
        return n * (layer + 2 * h * h + 3 * h)
    # DeepSeek-V3: enorm, hnorm, eh_proj (2*hidden -> hidden), the shared head's norm, and the
    # embedding and head that the checkpoint stores again in every MTP layer.
    return n * (layer + 2 * h + 2 * h * h + h + 2 * config.vocab_size * h)


def exactness(config: ModelConfig) -> str | None:
    """None when `param_count` is exact for this family, else what it leaves out."""
    return _APPROXIMATE_FAMILIES.get(config.model_type)


def weight_bytes(config: ModelConfig, weights: str = "bf16", *, tp: int = 1, ep: int = 1) -> int:
    """Bytes of the weights on ONE device of a `tp` x `ep` mesh (the whole model at 1 x 1).

    Args:
      weights: `"bf16"` (2 bytes per parameter), `"fp8"` (e4m3 1 byte for the linear
        weights of attention, MLPs, experts and SSM projections plus one f32 scale per 128 x
        128 block, `ceil(out/128) * ceil(in/128) * 4` bytes per matrix; embeddings, LM head,
        norms, routers, biases, convs and A/D/dt stay bf16) or `"mxfp4"` (the routed
        experts' matrices in MXFP4, `WeightTensor.nbytes`; the rest bf16).
      tp, ep: the mesh; replicated tensors count in full on every device.

    Registered router-correction buffers (f32) are included; MTP layers are not.

    Raises:
      ValueError: `weights` is neither format.
      ConfigError: `tp`/`ep` do not divide the model.
    """
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights={weights!r} must be one of {', '.join(WEIGHT_FORMATS)}")
    return sum(t.nbytes(weights) for t in weight_tensors(config, tp=tp, ep=ep))
