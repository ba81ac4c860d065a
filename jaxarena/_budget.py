"""Weights, KV cache, recurrent state and arena in one device-memory budget.

Three layers, each built on the one below:

* `weight_tensors(config)`: every parameter tensor the HuggingFace implementation of the
  architecture holds (shape, count, and whether an FP8 block-quantized checkpoint stores it in
  FP8), grouped by component. `param_count`, `param_breakdown` and `weight_bytes` sum it.
* `kv_bytes_per_token` / `state_bytes_per_sequence`: the per-token KV cache of the layers whose
  cache grows with the context, and the fixed per-sequence state (Mamba / gated-delta-net conv
  and SSM states, sliding-window KV capped at the window).
* `MemoryBudget`: weights + arena + reserve + KV/state on one device of a tp x ep mesh, with the
  answers an operator asks (`max_kv_tokens`, `max_sequences`, `fits`, and `fit_max_batch_tokens`).

Per device: every count is computed on `config.shard(tp, ep)` (the same per-device config the
arena is sized from), with the routed experts divided by `ep`. So a tensor the shard rules
split (heads, FFN widths, vocabulary) is counted at its per-device size and a tensor they keep
whole (norms, routers, MLA down-projections, replicated KV heads) is counted on every device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from jaxarena import ModelConfig

__all__ = [
    "COMPONENTS",
    "WeightTensor",
    "weight_tensors",
    "param_count",
    "param_breakdown",
    "mtp_param_count",
    "weight_bytes",
    "kv_bytes_per_token",
    "state_bytes_per_sequence",
    "parse_memory",
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

# Extra `ModelConfig` attributes the counts read, with the value assumed when a config does
# not have them (a config built before these fields existed).
_EXTRA_DEFAULTS: dict[str, Any] = {
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "v_head_dim": 0,
    "sliding_window": 0,
    "ffn_layer_types": (),
    "conv_kernel": 4,
    "mamba_proj_bias": False,
    "mamba_conv_bias": True,
    "mamba1_d_inner": 0,
    "mamba1_d_state": 0,
    "mamba1_dt_rank": 0,
    "num_mtp_layers": 0,
    "vision_param_count": 0,
    "other_param_count": 0,
    "moe_layer_widths": (),
}
_HC_FAMILIES = frozenset({"qwen4_exp", "qwen4_exp_text", "qwen3_8_flash_next"})


def _x(config: Any, name: str) -> Any:
    return getattr(config, name, _EXTRA_DEFAULTS[name])


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
        block scales (linear weights of attention, MLPs, experts and SSM projections); False
        for embeddings, the LM head, norms, routers, biases, convs and A/D/dt (kept in bf16).
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
        """Bytes of all `count` tensors in the `weights` format (`"bf16"` or `"fp8"`)."""
        if weights == "fp8" and self.fp8:
            out, inp = self.shape[0], math.prod(self.shape[1:])
            scales = -(-out // FP8_BLOCK) * -(-inp // FP8_BLOCK) * 4
            return (out * inp + scales) * self.count
        return self.numel * self.itemsize


# -- the tensors ----------------------------------------------------------------------------------


def _ffn_types(c: Any) -> tuple[str, ...]:
    """Per layer `"dense"`, `"moe"` or `"none"` (a layer whose only block is its mixer)."""
    n = c.num_hidden_layers
    listed = tuple(_x(c, "ffn_layer_types"))
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


def _layer_kinds(c: Any) -> tuple[str, ...]:
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
    if _x(c, "attention_bias") or c.model_type in _QKV_BIAS_FAMILIES:
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
    v = _x(c, "v_head_dim") or qk - rope
    a = "attention"
    bias = bool(_x(c, "attention_bias"))
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
        WeightTensor(
            a, "self_attn.kv_b_proj.weight", (heads * (qk - rope + v), lora_kv), n, fp8=True
        ),
        WeightTensor(a, "self_attn.o_proj.weight", (h, heads * v), n, fp8=True),
    ]
    if bias:
        out += [
            WeightTensor(a, "self_attn.kv_a_proj_with_mqa.bias", (lora_kv + rope,), n),
            WeightTensor(a, "self_attn.o_proj.bias", (h,), n),
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
    k = _x(c, "conv_kernel")
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
    if _x(c, "mamba_conv_bias"):
        out.append(WeightTensor(s, "mixer.conv1d.bias", (conv,), n))
    if _x(c, "mamba_proj_bias"):
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
    k = _x(c, "conv_kernel")
    s = "ssm"
    if c.model_type in _GDN_SPLIT_FAMILIES or c.model_type in ("qwen4_exp", "qwen4_exp_text"):
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
    di, ds, r = _x(c, "mamba1_d_inner"), _x(c, "mamba1_d_state"), _x(c, "mamba1_dt_rank")
    k = _x(c, "conv_kernel")
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
    if _x(c, "mamba_conv_bias"):
        out.append(WeightTensor(s, "mixer.conv1d.bias", (di,), n))
    if _x(c, "mamba_proj_bias"):
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
    if _x(c, "mlp_bias"):
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
    shared = c.shared_expert_intermediate_size
    if shared:
        _dense_ffn(c, n, shared, out, prefix="shared_experts", part="shared_experts")
        if (
            mt in ("qwen2_moe", "qwen3_next")
            or mt in _GDN_SPLIT_FAMILIES
            or mt.startswith("qwen4_exp")
        ):
            out.append(WeightTensor("shared_experts", "mlp.shared_expert_gate.weight", (1, h), n))


def _tensors(c: Any, experts_per_device: int, expert_split: int = 1) -> list[WeightTensor]:
    h, vocab = c.hidden_size, c.vocab_size
    out = [WeightTensor("embed", "embed_tokens.weight", (vocab, h))]
    if not _x(c, "tie_word_embeddings"):
        out.append(WeightTensor("lm_head", "lm_head.weight", (vocab, h)))
    kinds = _layer_kinds(c)
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
        widths = tuple(_x(c, "moe_layer_widths"))
        if widths:  # per-block expert widths (Nemotron-H Puzzle), split like the global one
            for w in sorted(set(widths)):
                wide = _Override(c, moe_intermediate_size=w // expert_split)
                _moe(wide, widths.count(w), experts_per_device, out)
        else:
            _moe(c, ffn.count("moe"), experts_per_device, out)
    out.append(WeightTensor("norms", "layers.*.norm.weight", (h,), _norms_per_layer(c) * len(ffn)))
    if c.model_type not in _HC_FAMILIES:  # there the final hyper-connection mixer normalizes
        out.append(WeightTensor("norms", "norm.weight", (h,)))
    # Family blocks ModelConfig has no dimensions for, counted by the parser (replicated).
    out.append(WeightTensor("other", "<family blocks>", (_x(c, "other_param_count"),)))
    out.append(WeightTensor("vision", "visual.*", (_x(c, "vision_param_count"),)))
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
    if (tp, ep) != (1, 1):
        # `shard` keeps the global expert count for the router; the weights are per device.
        local = _Local(local, config)
    experts = config.num_experts // ep if config.num_experts else 0
    return tuple(_tensors(local, experts, expert_split=tp if ep == 1 else 1))


class _Local:
    """The sharded config plus the extra (weight-only) attributes of the global one."""

    def __init__(self, local: Any, whole: Any) -> None:
        self._local = local
        self._whole = whole

    def __getattr__(self, name: str) -> Any:
        if hasattr(self._local, name):
            return getattr(self._local, name)
        return getattr(self._whole, name)


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
    n = _x(config, "num_mtp_layers")
    if n == 0:
        return 0
    one = config.replace(num_hidden_layers=1, layer_types=config.layer_types[-1:])
    if _x(config, "ffn_layer_types"):
        one = _Override(one, ffn_layer_types=tuple(_x(config, "ffn_layer_types"))[-1:])
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


class _Override:
    def __init__(self, base: Any, **changes: Any) -> None:
        self._base = base
        self._changes = changes

    def __getattr__(self, name: str) -> Any:
        if name in self._changes:
            return self._changes[name]
        return getattr(self._base, name)


def exactness(config: ModelConfig) -> str | None:
    """None when `param_count` is exact for this family, else what it leaves out."""
    return _APPROXIMATE_FAMILIES.get(config.model_type)


def weight_bytes(config: ModelConfig, weights: str = "bf16", *, tp: int = 1, ep: int = 1) -> int:
    """Bytes of the weights on ONE device of a `tp` x `ep` mesh (the whole model at 1 x 1).

    Args:
      weights: `"bf16"` (2 bytes per parameter) or `"fp8"` (e4m3 1 byte for the linear
        weights of attention, MLPs, experts and SSM projections plus one f32 scale per 128 x
        128 block, `ceil(out/128) * ceil(in/128) * 4` bytes per matrix; embeddings, LM head,
        norms, routers, biases, convs and A/D/dt stay bf16).
      tp, ep: the mesh; replicated tensors count in full on every device.

    Registered router-correction buffers (f32) are included; MTP layers are not.

    Raises:
      ValueError: `weights` is neither format.
      ConfigError: `tp`/`ep` do not divide the model.
    """
    if weights not in ("bf16", "fp8"):
        raise ValueError(f"weights={weights!r} must be 'bf16' or 'fp8'")
    return sum(t.nbytes(weights) for t in weight_tensors(config, tp=tp, ep=ep))


# -- KV cache and state ---------------------------------------------------------------------------

_DTYPE_BYTES = {"bf16": 2, "fp8": 1}


def _dtype_bytes(name: str, what: str) -> int:
    if name not in _DTYPE_BYTES:
        raise ValueError(f"{what}={name!r} must be one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def _cache_layers(c: Any) -> Iterator[tuple[str, bool]]:
    """(mixer kind, sliding) per layer that keeps a KV cache."""
    raw = c.layer_types or ()
    for i, kind in enumerate(_layer_kinds(c)):
        if kind in ("attention", "mla"):
            sliding = bool(raw) and raw[i] == "sliding_attention" and _x(c, "sliding_window") > 0
            yield kind, sliding


def _kv_per_token_layer(c: Any, kind: str, itemsize: int) -> int:
    if kind == "mla":
        return (c.kv_lora_rank + c.qk_rope_head_dim) * itemsize
    return 2 * c.num_key_value_heads * c.head_dim * itemsize


def kv_bytes_per_token(
    config: ModelConfig, kv_dtype: str = "bf16", *, tp: int = 1, ep: int = 1
) -> int:
    """KV-cache bytes one more token of context costs on one device, over every layer whose
    cache grows with the context (full attention: `2 * kv_heads * head_dim`; MLA: the latent
    `kv_lora_rank + qk_rope_head_dim`, replicated on every tp device). Sliding-window layers are
    capped and so counted in `state_bytes_per_sequence` instead.

    KV heads under tp are those of `config.shard(tp)`: when there are fewer KV heads than
    devices each device keeps one, so the per-device bytes stop shrinking at tp = kv_heads.
    """
    itemsize = _dtype_bytes(kv_dtype, "kv_dtype")
    c = config.shard(tp=tp, ep=ep) if (tp, ep) != (1, 1) else config
    c = _Local(c, config) if c is not config else c
    return sum(
        _kv_per_token_layer(c, k, itemsize) for k, sliding in _cache_layers(c) if not sliding
    )


def sliding_tokens(window: int, max_seq_len: int, kv_block_size: int) -> int:
    """Cache slots a sliding-window layer holds per sequence: `min(window, max_seq_len)` in a
    ring buffer; paged, the blocks a window of that many tokens can touch at any alignment,
    `ceil((w - 1) / B) + 1` blocks of `B` tokens (capped at the sequence's own blocks)."""
    w = min(window, max_seq_len)
    if kv_block_size <= 0:
        return w
    blocks = min(-(-(w - 1) // kv_block_size) + 1, -(-max_seq_len // kv_block_size))
    return blocks * kv_block_size


def state_bytes_per_sequence(
    config: ModelConfig,
    *,
    max_seq_len: int,
    kv_block_size: int = 0,
    kv_dtype: str = "bf16",
    state_dtype: str = "f32",
    tp: int = 1,
    ep: int = 1,
) -> int:
    """Fixed bytes one sequence holds on one device whatever its length (beyond the window):

    * Mamba-2: conv state `(conv_kernel - 1) * (d_inner + 2 * n_groups * d_state)` in bf16 and
      SSM state `heads * head_dim * d_state` in `state_dtype`;
    * gated delta net: conv state `(conv_kernel - 1) * (2 * k_heads * k_dim + v_heads *
      v_dim)` in bf16 and the recurrent state `v_heads * k_dim * v_dim` in `state_dtype`;
    * Mamba-1: conv `(conv_kernel - 1) * d_inner` bf16 and SSM `d_inner * d_state`;
    * sliding-window attention: the KV of `sliding_tokens(window, max_seq_len, kv_block_size)`
      tokens in `kv_dtype`.

    Per device under tp: heads and groups of `config.shard(tp)`.
    """
    state_item = {"f32": 4, "bf16": 2}.get(state_dtype)
    if state_item is None:
        raise ValueError(f"state_dtype={state_dtype!r} must be 'f32' or 'bf16'")
    kv_item = _dtype_bytes(kv_dtype, "kv_dtype")
    c = config.shard(tp=tp, ep=ep) if (tp, ep) != (1, 1) else config
    c = _Local(c, config) if c is not config else c
    k1 = max(_x(c, "conv_kernel") - 1, 0)
    total = 0
    for kind in _layer_kinds(c):
        if kind == "mamba2":
            total += k1 * c.mamba2_d_xbc * 2
            total += c.mamba_num_heads * c.mamba_head_dim * c.ssm_state_size * state_item
        elif kind == "gdn":
            conv = 2 * c.linear_num_key_heads * c.linear_key_head_dim
            conv += c.linear_num_value_heads * c.linear_value_head_dim
            total += k1 * conv * 2
            total += (
                c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
                * state_item
            )  # fmt: skip
        elif kind == "mamba1":
            di = _x(c, "mamba1_d_inner") // tp
            total += k1 * di * 2 + di * _x(c, "mamba1_d_state") * state_item
    window = _x(c, "sliding_window")
    for kind, sliding in _cache_layers(c):
        if sliding:
            tokens = sliding_tokens(window, max_seq_len, kv_block_size)
            total += tokens * _kv_per_token_layer(c, kind, kv_item)
    return total


# -- memory strings -------------------------------------------------------------------------------

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4, "p": 1000**5, "pb": 1000**5,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5,
    "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4, "pi": 1024**5,
}  # fmt: skip
# A number with at most 30 significant characters: anything longer is a typo, not a size
# (10**30 bytes is a million times the largest machine's memory).
_NUMBER = re.compile(
    r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?(?:[eE][+]?[0-9]{1,2})?)\s*([A-Za-z]{0,3})\s*"
)
# No device or machine has an exabyte of memory: a larger size is a typo.
MAX_MEMORY = 1000**6


def parse_memory(text: Any) -> int:
    """A memory size in bytes: `"141GB"` (10^9), `"24GiB"` (2^30), `"80e9"`, `"1.5 TiB"`, or a
    plain byte count (`"1000000"`, or an int).

    Units (case-insensitive): B, K/KB, M/MB, G/GB, T/TB, P/PB (powers of 1000) and
    KiB/MiB/GiB/TiB/PiB (powers of 1024). Fractions round down to whole bytes.

    Raises:
      ValueError: not a size (names the text and shows valid spellings), zero or negative, or
        above 1 EB (10^18 bytes; certainly a typo).
    """
    if isinstance(text, bool):
        raise ValueError(f"memory={text!r} is not a size; write e.g. 141GB, 24GiB or 80e9")
    if isinstance(text, int):
        value = text
        shown = str(text) if abs(text) < 10**40 else f"<int of {len(str(abs(text)))} digits>"
    elif isinstance(text, str):
        shown = text if len(text) <= 40 else text[:37] + "..."
        match = _NUMBER.fullmatch(text)
        if match is None or match.group(2).lower() not in _UNITS:
            if re.fullmatch(r"\s*-.*", text):
                raise ValueError(f"memory {shown!r} must be positive")
            raise ValueError(
                f"memory {shown!r} is not a size; write e.g. 141GB, 24GiB, 512MiB, 80e9 or a "
                f"byte count (at most 30 digits)"
            )
        number, unit = match.group(1), _UNITS[match.group(2).lower()]
        if re.fullmatch(r"[0-9]+", number):
            value = int(number) * unit
        else:
            from fractions import Fraction

            value = math.floor(Fraction(number) * unit)
    else:
        raise ValueError(
            f"memory must be a str such as '141GB' or an int byte count, got {type(text).__name__}"
        )
    if value <= 0:
        raise ValueError(f"memory {shown!r} must be positive (at least one byte)")
    if value > MAX_MEMORY:
        raise ValueError(f"memory {shown!r} is over 1 EB (10^18 bytes); that is not a device")
    return value


# -- HF fields the weight counts read (to move into the config parser) -----------------------------

_TIE_DEFAULT_TRUE = frozenset({"mamba", "mamba2", "falcon_mamba", "gemma", "gemma2", "gemma3",
                               "gemma3_text"})  # fmt: skip


def weight_fields(data: Any, model_type: str, num_hidden_layers: int) -> dict[str, Any]:
    """The extra fields of a HuggingFace config that the weight counts read, with the HF class
    defaults of each family when a key is absent."""
    top = data
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else None
    obj = text if text is not None and "hidden_size" in text else top

    def get(name: str, default: Any) -> Any:
        value = obj.get(name)
        return default if value is None else value

    mt = model_type
    n = num_hidden_layers
    out: dict[str, Any] = {}
    tie_default = mt in _TIE_DEFAULT_TRUE
    tie = obj.get("tie_word_embeddings", top.get("tie_word_embeddings"))
    out["tie_word_embeddings"] = tie_default if tie is None else bool(tie)
    out["attention_bias"] = bool(get("attention_bias", mt == "gpt_oss"))
    out["mlp_bias"] = bool(get("mlp_bias", False))
    out["v_head_dim"] = int(get("v_head_dim", 0))
    sliding = get("sliding_window", 0)
    if mt in ("gemma2", "gemma3", "gemma3_text") and obj.get("sliding_window") is None:
        sliding = 4096 if mt == "gemma2" else 4096
    out["sliding_window"] = int(sliding or 0)
    out["conv_kernel"] = int(get("linear_conv_kernel_dim", get("conv_kernel", get("d_conv", 4))))
    if mt in ("mamba2", "mamba", "falcon_mamba"):
        out["mamba_proj_bias"] = bool(get("use_bias", False))
        out["mamba_conv_bias"] = bool(get("use_conv_bias", True))
    elif mt in ("nemotron_h", "nemotron_h_puzzle"):
        out["mamba_proj_bias"] = bool(get("mamba_proj_bias", get("use_bias", False)))
        out["mamba_conv_bias"] = bool(get("use_conv_bias", True))
    elif mt == "jamba":
        out["mamba_proj_bias"] = bool(get("mamba_proj_bias", False))
        out["mamba_conv_bias"] = bool(get("mamba_conv_bias", True))
    if mt in ("mamba", "falcon_mamba", "jamba"):
        h = int(obj["hidden_size"])
        expand = get("mamba_expand" if mt == "jamba" else "expand", 2)
        out["mamba1_d_inner"] = (
            int(get("intermediate_size", expand * h)) if mt != "jamba" else (int(expand * h))
        )
        out["mamba1_d_state"] = int(get("mamba_d_state" if mt == "jamba" else "state_size", 16))
        rank = get("mamba_dt_rank" if mt == "jamba" else "time_step_rank", "auto")
        out["mamba1_dt_rank"] = math.ceil(h / 16) if rank == "auto" else int(rank)
        if mt == "jamba":
            out["conv_kernel"] = int(get("mamba_d_conv", 4))
    out["num_mtp_layers"] = int(get("num_nextn_predict_layers", get("mtp_num_hidden_layers", 0)))
    # Which layers have a dense FFN and which a MoE.
    experts = get("num_experts", get("n_routed_experts", get("num_local_experts", 0)))
    ffn: tuple[str, ...] = ()
    if mt in ("deepseek_v2", "deepseek_v3", "deepseek_v32") and experts:
        k, freq = int(get("first_k_dense_replace", 0)), int(get("moe_layer_freq", 1))
        ffn = tuple("moe" if i >= k and i % freq == 0 else "dense" for i in range(n))
    elif mt in ("qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_vl_moe", "qwen3_5_moe",
                "qwen3_5_moe_text", "qwen3_6_moe") and experts:  # fmt: skip
        only = set(get("mlp_only_layers", []) or [])
        step = int(get("decoder_sparse_step", 1))
        ffn = tuple("moe" if i not in only and (i + 1) % step == 0 else "dense" for i in range(n))
    elif mt == "jamba":
        period, offset = int(get("expert_layer_period", 2)), int(get("expert_layer_offset", 1))
        e = int(get("num_experts", 16))
        ffn = tuple("moe" if e > 1 and i % period == offset else "dense" for i in range(n))
    if ffn and len(set(ffn)) > 1:
        out["ffn_layer_types"] = ffn
    blocks = obj.get("block_configs")
    if mt == "nemotron_h_puzzle" and isinstance(blocks, list):
        widths = tuple(
            int(b.get("moe_intermediate_size") or 0)
            for b in blocks
            if isinstance(b, dict) and b.get("block_type") == "moe"
        )
        if len(set(widths)) > 1:
            out["moe_layer_widths"] = widths
    vision = top.get("vision_config")
    if isinstance(vision, dict) and mt.startswith(("qwen3_vl", "qwen3_5", "qwen3_6", "qwen4_exp")):
        out["vision_param_count"] = _qwen3_vl_vision(vision, mt)
    if mt == "deepseek_v4":
        out["other_param_count"] = _deepseek_v4_other(obj, n)
    elif mt in _HC_FAMILIES:
        out["other_param_count"] = _qwen4_exp_other(obj, n)
    return out


def _qwen3_vl_vision(v: dict, model_type: str) -> int:
    """Parameters of the Qwen3-VL vision tower (also Qwen3.5's and Qwen4-exp's): a Conv3d patch
    embedding, learned position embeddings, `depth` pre-norm ViT blocks with biases, the patch
    merger and one merger per deepstack layer (those normalize after the 2x2 shuffle)."""
    h, inter, depth = (
        int(v.get("hidden_size", 1152)),
        int(v.get("intermediate_size", 4304)),
        int(v.get("depth", 27)),
    )
    out = int(v.get("out_hidden_size", 3584))
    patch, temporal = int(v.get("patch_size", 16)), int(v.get("temporal_patch_size", 2))
    channels, merge = int(v.get("in_channels", 3)), int(v.get("spatial_merge_size", 2))
    positions = int(v.get("num_position_embeddings", 2304))
    default_deep = [8, 16, 24] if model_type.startswith("qwen3_vl") else []
    deep = len(v.get("deepstack_visual_indexes", default_deep) or [])
    wide = h * merge * merge
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (inter * h + inter) + (h * inter + h)

    def merger(norm_width: int) -> int:
        return 2 * norm_width + wide * wide + wide + out * wide + out

    return (
        h * channels * temporal * patch * patch + h + positions * h + depth * block
        + merger(h) + deep * merger(wide)
    )  # fmt: skip


def _deepseek_v4_other(obj: dict, n: int) -> int:
    """DeepSeek-V4's KV compressors (per `compress_ratios` entry: 4 = overlapping windows with
    an indexer, 128 = heavy compression, 0 = none) and hyper-connection mixers."""
    h, hd, lora_q = (
        int(obj["hidden_size"]),
        int(obj.get("head_dim") or 512),
        int(obj.get("q_lora_rank") or 1024),
    )
    hc = int(obj.get("hc_mult") or 4)
    ih, ihd = int(obj.get("index_n_heads") or 64), int(obj.get("index_head_dim") or 128)
    total = 0
    for ratio in list(obj.get("compress_ratios") or [])[:n]:
        if ratio == 0:
            continue
        width = 2 * hd if ratio == 4 else hd  # overlapping windows keep two series
        total += ratio * width + 2 * width * h + hd  # position bias, kv/gate projections, norm
        if ratio == 4:  # the sparse indexer's own compressor, query projection and scorer
            total += ratio * 2 * ihd + 2 * 2 * ihd * h + ihd + ih * ihd * lora_q + ih * h
    mix = hc * (2 + hc)
    total += n * 2 * (mix * hc * h + mix + 3)  # attn_hc and ffn_hc per layer
    total += hc * hc * h + hc + 1  # the head's mixer
    return total


def _qwen4_exp_other(obj: dict, n: int) -> int:
    """Qwen4-exp's hyper-connection blocks (two per layer and a final mixer), the indexer of
    its full-attention layers, and the per-layer n-gram embeddings (PLE)."""
    h = int(obj["hidden_size"])
    hc, rank = int(obj.get("hc_count") or 4), int(obj.get("hc_lowrank") or 0)
    wide = hc * h
    block = wide + 2 * rank * wide  # norm, low-rank down and up
    total = n * 2 * (block + hc * wide) + block  # + per-layer injection weights; final mixer
    kinds = list(obj.get("layer_types") or [])
    full = sum(1 for k in kinds if k == "full_attention")
    ih, ihd = int(obj.get("indexer_n_heads") or 0), int(obj.get("indexer_head_dim") or 0)
    ikv = int(obj.get("indexer_kv_heads") or 1)
    if ih:
        total += full * ((ih + ikv) * ihd * h + 2 * ihd)
    ple_layers = list(obj.get("ple_layer_ids") or [])
    if ple_layers:
        dim = int(obj.get("ple_embed_dim") or h)
        ngram, per = int(obj.get("ngram_size") or 3), int(obj.get("heads_per_ngram") or 8)
        base = int(obj.get("ngram_vocab_size_base") or 0)
        divisor = int(obj.get("make_ngram_vocab_size_divisible_by") or 1)
        kernel = int(obj.get("ple_conv_kernel_size") or 4)
        heads = (ngram - 1) * per
        for index in range(len(ple_layers)):
            # Head j of PLE layer i hashes into a table of the (i*heads + j + 1)-th prime >= base.
            sizes = _primes_from(base, (index + 1) * heads)[index * heads :]
            rows = -(-sum(sizes) // divisor) * divisor
            total += rows * (dim // heads) + wide * dim + h * dim + 3 * wide + wide * kernel
    return total


def _primes_from(start: int, count: int) -> list[int]:
    """The first `count` primes >= `start` (trial division: fine for the few dozen needed)."""
    out: list[int] = []
    value = max(start, 2)
    while len(out) < count:
        if value % 2 or value == 2:
            if all(value % d for d in range(3, math.isqrt(value) + 1, 2)):
                out.append(value)
        value += 1
    return out


# -- the budget -----------------------------------------------------------------------------------

GIB = 1 << 30
# The default reserve for what the static plan cannot see: 1 GiB for the CUDA context's share
# of the pool, cuBLAS/cuDNN workspaces and NCCL channel buffers, plus 5% of the device against
# the allocator's fragmentation and XLA's few own temporaries (fusion scratch, collectives
# staging). For comparison, JAX preallocates 75% of a GPU by default and vLLM uses 90%.
DEFAULT_RESERVE_FIXED = GIB
DEFAULT_RESERVE_FRACTION = 0.05

# The keys of `MemoryBudget.as_dict()` (and of `jaxarena budget --json`), in order.
BUDGET_KEYS = (
    "model", "memory_bytes", "tp", "ep", "weights", "kv_dtype", "arena",
    "max_batch_tokens", "max_seq_len", "kv_block_size", "max_batch_size",
    "param_count", "weight_bytes", "kv_bytes_per_token", "state_bytes_per_sequence",
    "sequence_bytes", "arena_bytes", "reserve_bytes", "free_bytes",
    "max_kv_tokens", "max_kv_blocks", "max_sequences", "fits", "shortfall_bytes",
)  # fmt: skip


def default_reserve(memory_bytes: int) -> int:
    """`DEFAULT_RESERVE_FIXED + DEFAULT_RESERVE_FRACTION * memory_bytes` (see their comment)."""
    return DEFAULT_RESERVE_FIXED + int(memory_bytes * DEFAULT_RESERVE_FRACTION)


def _check_int(name: str, value: Any, lo: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name}={value!r} must be an int, got {type(value).__name__}"
    if value < lo:
        return f"{name}={value} must be >= {lo}"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryBudget:
    """Weights + arena + reserve + KV cache + recurrent state on ONE device of a tp x ep mesh.

    Build it from a config, the serve limits and the device's memory; every answer is a
    property (computed once). All byte figures are per device.

    Attributes:
      config: the whole model (`ModelConfig.preset(...)`, `ModelConfig.from_hf(...)`).
      memory_bytes: the device's memory (an int, or a string for `parse_memory`: "141GB").
      max_batch_tokens, max_seq_len, kv_block_size, max_batch_size: the serve limits, as for
        `BufferSizes.from_config` (kv_block_size 0: unpaged KV).
      tp, ep: tensor- and expert-parallel degrees (`ModelConfig.shard` rules).
      weights: "bf16" or "fp8" (block-quantized, see `weight_bytes`).
      kv_dtype: "bf16" or "fp8" for the KV cache (and sliding-window KV).
      state_dtype: "f32" (default) or "bf16" for SSM / gated-delta-net recurrent states.
      arena: "sequential" (every buffer its own bytes) or "packed" (buffers never live
        together share bytes, `ArenaPlan.packed` with `Lifetimes.standard`).
      reserve: bytes left to the runtime and XLA outside the plan (`reserve_bytes`); None
        means `default_reserve(memory_bytes)` = 1 GiB + 5% of the memory.
      levers, target: as for `BufferSizes.from_config` (None: from the environment / the
        detected device).
      align_bytes: arena region alignment.

    Raises:
      ValueError: a bad memory, dtype, arena kind or reserve; ConfigError for bad limits or a
        tp/ep that does not divide the model.
    """

    config: ModelConfig
    memory_bytes: int
    max_batch_tokens: int = 8192
    max_seq_len: int = 32768
    kv_block_size: int = 16
    max_batch_size: int = 64
    tp: int = 1
    ep: int = 1
    weights: str = "bf16"
    kv_dtype: str = "bf16"
    state_dtype: str = "f32"
    arena: str = "sequential"
    reserve: int | None = None
    levers: Any = None
    target: Any = None
    align_bytes: int = 256

    def __post_init__(self) -> None:
        from jaxarena import ConfigError, ModelConfig

        if not isinstance(self.config, ModelConfig):
            raise ValueError(f"config must be a ModelConfig, got {type(self.config).__name__}")
        object.__setattr__(self, "memory_bytes", parse_memory(self.memory_bytes))
        if self.weights not in ("bf16", "fp8"):
            raise ValueError(f"weights={self.weights!r} must be 'bf16' or 'fp8'")
        _dtype_bytes(self.kv_dtype, "kv_dtype")
        if self.state_dtype not in ("f32", "bf16"):
            raise ValueError(f"state_dtype={self.state_dtype!r} must be 'f32' or 'bf16'")
        if self.arena not in ("sequential", "packed"):
            raise ValueError(f"arena={self.arena!r} must be 'sequential' or 'packed'")
        problems = [
            p
            for p in (
                _check_int("max_batch_tokens", self.max_batch_tokens, 1),
                _check_int("max_seq_len", self.max_seq_len, 1),
                _check_int("kv_block_size", self.kv_block_size, 0),
                _check_int("max_batch_size", self.max_batch_size, 1),
                _check_int("tp", self.tp, 1),
                _check_int("ep", self.ep, 1),
            )
            if p
        ]
        if problems:
            raise ConfigError("invalid budget:\n  - " + "\n  - ".join(problems))
        r = self.reserve
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 0):
            raise ValueError(f"reserve={r!r} must be an int >= 0 (bytes) or None (the default)")
        _ = self.local_config  # validates tp/ep against the model now, not at first use

    def replace(self, **changes: Any) -> MemoryBudget:
        """A copy with `changes` applied (e.g. `weights="fp8"`, `tp=8`)."""
        return dataclasses.replace(self, **changes)

    @property
    def reserve_bytes(self) -> int:
        """Memory left to the runtime and XLA: `reserve`, or 1 GiB + 5% of the memory."""
        return default_reserve(self.memory_bytes) if self.reserve is None else self.reserve

    # -- the parts ------------------------------------------------------------------------------

    @functools.cached_property
    def local_config(self) -> ModelConfig:
        """The per-device config, `config.shard(tp=tp, ep=ep)`."""
        return self.config.shard(tp=self.tp, ep=self.ep)

    @functools.cached_property
    def param_count(self) -> int:
        """Parameters of the whole model (`param_count(config)`; MTP layers excluded)."""
        return param_count(self.config)

    @functools.cached_property
    def weight_bytes(self) -> int:
        """Weight bytes on this device (`weight_bytes(config, weights, tp=, ep=)`)."""
        return weight_bytes(self.config, self.weights, tp=self.tp, ep=self.ep)

    @functools.cached_property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token of context on this device, over the full-attention layers."""
        return kv_bytes_per_token(self.config, self.kv_dtype, tp=self.tp, ep=self.ep)

    @functools.cached_property
    def state_bytes_per_sequence(self) -> int:
        """Fixed per-sequence bytes on this device (SSM/GDN states, sliding-window KV)."""
        return state_bytes_per_sequence(
            self.config, max_seq_len=self.max_seq_len, kv_block_size=self.kv_block_size,
            kv_dtype=self.kv_dtype, state_dtype=self.state_dtype, tp=self.tp, ep=self.ep,
        )  # fmt: skip

    @property
    def _seq_tokens(self) -> int:
        b = self.kv_block_size
        return -(-self.max_seq_len // b) * b if b > 0 else self.max_seq_len

    @functools.cached_property
    def sequence_bytes(self) -> int:
        """Bytes one sequence of `max_seq_len` tokens holds: its KV (whole blocks when paged)
        plus `state_bytes_per_sequence`."""
        return self._seq_tokens * self.kv_bytes_per_token + self.state_bytes_per_sequence

    @functools.cached_property
    def arena_bytes(self) -> int:
        """The arena on this device: `ArenaPlan.sequential` (or `.packed`) of
        `BufferSizes.from_config(config.shard(tp, ep), limits)`."""
        from jaxarena import ArenaPlan, BufferSizes, Levers, Lifetimes, Target

        levers = Levers.from_env() if self.levers is None else self.levers
        target = Target.detect() if self.target is None else self.target
        sizes = BufferSizes.from_config(
            self.local_config, self.max_batch_tokens, self.max_seq_len, self.kv_block_size,
            self.max_batch_size, levers=levers, target=target,
        )  # fmt: skip
        if self.arena == "packed":
            lifetimes = Lifetimes.standard(self.local_config)
            return ArenaPlan.packed(sizes, lifetimes, align_bytes=self.align_bytes).total_bytes
        return ArenaPlan.sequential(sizes, align_bytes=self.align_bytes).total_bytes

    @property
    def fixed_bytes(self) -> int:
        """Weights + arena + reserve: what the device holds before any sequence."""
        return self.weight_bytes + self.arena_bytes + self.reserve_bytes

    @property
    def free_bytes(self) -> int:
        """`memory - weights - arena - reserve`: room for KV cache and states (negative when
        even the fixed part does not fit)."""
        return self.memory_bytes - self.fixed_bytes

    def required_bytes(self, sequences: int) -> int:
        """Weights + arena + reserve + `sequences` sequences of `max_seq_len` tokens."""
        return self.fixed_bytes + sequences * self.sequence_bytes

    # -- the answers ----------------------------------------------------------------------------

    @property
    def max_kv_tokens(self) -> int | None:
        """KV-cache tokens that fit in `free_bytes` after the states of `max_batch_size`
        sequences (whole blocks when paged); None when no layer's cache grows with context."""
        if self.kv_bytes_per_token == 0:
            return None
        room = self.free_bytes - self.max_batch_size * self.state_bytes_per_sequence
        tokens = max(room, 0) // self.kv_bytes_per_token
        b = self.kv_block_size
        return tokens // b * b if b > 0 else tokens

    @property
    def max_kv_blocks(self) -> int | None:
        """`max_kv_tokens // kv_block_size`; None unpaged or without a growing KV cache."""
        tokens = self.max_kv_tokens
        if tokens is None or self.kv_block_size == 0:
            return None
        return tokens // self.kv_block_size

    @property
    def max_sequences(self) -> int:
        """Concurrent sequences of `max_seq_len` tokens whose KV and state fit in `free_bytes`
        (not capped by `max_batch_size`)."""
        if self.free_bytes <= 0:
            return 0
        if self.sequence_bytes == 0:
            raise ValueError("the model holds no per-sequence memory; max_sequences is unbounded")
        return self.free_bytes // self.sequence_bytes

    @property
    def fits(self) -> bool:
        """True when weights, arena, reserve and one sequence of `max_seq_len` fit."""
        return self.required_bytes(1) <= self.memory_bytes

    @property
    def shortfall_bytes(self) -> int:
        """How many bytes one sequence of `max_seq_len` is short of fitting (0 when it fits)."""
        return max(self.required_bytes(1) - self.memory_bytes, 0)

    def as_dict(self) -> dict[str, Any]:
        """`{key: value}` for every key of `BUDGET_KEYS` (what `jaxarena budget --json` prints)."""
        out = {
            "model": self.config.source or self.config.model_type,
            "memory_bytes": self.memory_bytes,
            "tp": self.tp,
            "ep": self.ep,
            "weights": self.weights,
            "kv_dtype": self.kv_dtype,
            "arena": self.arena,
            "max_batch_tokens": self.max_batch_tokens,
            "max_seq_len": self.max_seq_len,
            "kv_block_size": self.kv_block_size,
            "max_batch_size": self.max_batch_size,
            "param_count": self.param_count,
            "weight_bytes": self.weight_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "state_bytes_per_sequence": self.state_bytes_per_sequence,
            "sequence_bytes": self.sequence_bytes,
            "arena_bytes": self.arena_bytes,
            "reserve_bytes": self.reserve_bytes,
            "free_bytes": self.free_bytes,
            "max_kv_tokens": self.max_kv_tokens,
            "max_kv_blocks": self.max_kv_blocks,
            "max_sequences": self.max_sequences,
            "fits": self.fits,
            "shortfall_bytes": self.shortfall_bytes,
        }
        assert tuple(out) == BUDGET_KEYS
        return out

    # -- what would make it fit -----------------------------------------------------------------

    def alternatives(self) -> list[str]:
        """When it does not fit: each change that would (FP8 weights, more devices, a smaller
        `max_seq_len` or `max_batch_tokens`), as readable lines; [] when it fits."""
        if self.fits:
            return []
        out = []
        if self.weights == "bf16" and self.replace(weights="fp8").fits:
            out.append("FP8 weights (--weights fp8)")
        for tp, ep in self._device_options():
            try:
                other = self.replace(tp=tp, ep=ep)
            except ValueError:
                continue
            if other.fits:
                out.append(f"tp={tp}" + (f", ep={ep}" if ep > 1 else "") + f" ({tp} devices)")
                break
        length = _largest(lambda n: self.replace(max_seq_len=n).fits, 1, self.max_seq_len - 1)
        if length:
            out.append(f"max_seq_len <= {length:,}")
        tokens = _largest(
            lambda m: self.replace(max_batch_tokens=m).fits, 1, self.max_batch_tokens - 1
        )
        if tokens:
            out.append(f"max_batch_tokens <= {tokens:,}")
        return out

    def _device_options(self) -> Iterator[tuple[int, int]]:
        tp = self.tp * 2
        while tp <= 1024:
            yield tp, self.ep
            if self.config.is_moe and tp != self.ep:
                yield tp, tp
            tp *= 2

    def message(self) -> str:
        """One line: how much is free and how many sequences fit, or by how much it does not
        fit and what would make it fit."""
        from jaxarena._units import format_bytes

        if self.fits:
            return (
                f"fits: {format_bytes(self.free_bytes)} free for KV cache and states, "
                f"{self.max_sequences:,} sequences of {self.max_seq_len:,} tokens"
            )
        what = ", or ".join(self.alternatives()) or "nothing tried (fewer limits, more memory)"
        return (
            f"does not fit: short by {format_bytes(self.shortfall_bytes)} "
            f"(weights {format_bytes(self.weight_bytes)} + arena {format_bytes(self.arena_bytes)}"
            f" + reserve {format_bytes(self.reserve_bytes)} + one sequence "
            f"{format_bytes(self.sequence_bytes)} > {format_bytes(self.memory_bytes)}); "
            f"would fit with: {what}"
        )


def _largest(ok: Any, lo: int, hi: int) -> int | None:
    """Largest n in [lo, hi] with ok(n), for ok monotone (true then false); None if none."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_max_batch_tokens(budget: MemoryBudget, sequences: int = 1) -> int | None:
    """The largest `max_batch_tokens` m with `budget.replace(max_batch_tokens=m)
    .required_bytes(sequences) <= budget.memory_bytes`: weights + arena(m) + reserve + the KV
    and state of `sequences` sequences of `max_seq_len` fit. None when even m = 1 does not.

    Unbounded above: doubles m until it no longer fits (the arena grows with m), then
    bisects; relies on the arena being monotone in `max_batch_tokens` (a tested property).
    """
    err = _check_int("sequences", sequences, 0)
    if err:
        raise ValueError(err)

    def ok(m: int) -> bool:
        return budget.replace(max_batch_tokens=m).required_bytes(sequences) <= budget.memory_bytes

    if not ok(1):
        return None
    lo, hi = 1, 2
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 62:
            raise ValueError("max_batch_tokens beyond 2^62 still fits: the arena does not grow")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


# -- plot -----------------------------------------------------------------------------------------


def budget_segments(b: MemoryBudget) -> list[tuple[str, int]]:
    """The stacked parts of one device's memory, bottom to top: weights, arena, reserve, the KV
    and state of `max_sequences` full-length sequences, and what is left (never negative)."""
    n = b.max_sequences
    kv = n * (b.sequence_bytes - b.state_bytes_per_sequence)
    state = n * b.state_bytes_per_sequence
    parts = [
        ("weights", b.weight_bytes),
        ("arena", b.arena_bytes),
        ("reserve", b.reserve_bytes),
        (f"KV cache ({n:,} x {b.max_seq_len:,} tokens)", kv),
        ("SSM / sliding-window state", state),
    ]
    used = sum(v for _, v in parts)
    parts.append(("free", max(b.memory_bytes - used, 0)))
    return parts


def plot_budget(b: MemoryBudget, path: str, *, title: str | None = None) -> str:
    """Saves one stacked bar per device (PNG; `.png` is added when `path` has no extension)
    and returns the path written. The dashed line is the device's memory; a bar that crosses
    it does not fit.

    Raises:
      ImportError: matplotlib is not installed (`pip install "jaxarena[plot]"`).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError('plotting needs matplotlib: pip install "jaxarena[plot]"') from e
    from pathlib import Path

    from jaxarena._units import format_bytes

    out = str(path) if Path(path).suffix else f"{path}.png"
    devices = max(b.tp, b.ep)
    bars = min(devices, 16)
    gib = float(1 << 30)
    colors = ["#4c72b0", "#dd8452", "#8c8c8c", "#55a868", "#8172b3", "#e8e8e8"]
    fig, ax = plt.subplots(figsize=(max(3.0, 1.2 + 0.55 * bars), 5.5))
    xs = list(range(bars))
    bottom = [0.0] * bars
    for (label, nbytes), color in zip(budget_segments(b), colors, strict=True):
        if nbytes == 0:
            continue
        ax.bar(xs, [nbytes / gib] * bars, bottom=bottom, color=color, edgecolor="white",
               width=0.7, label=f"{label}: {format_bytes(nbytes)}")  # fmt: skip
        bottom = [y + nbytes / gib for y in bottom]
    ax.axhline(b.memory_bytes / gib, color="#c44e52" if not b.fits else "black", ls="--", lw=1)
    ax.set_ylabel("GiB per device")
    names = [f"dev {i}" for i in xs] if bars == devices else [f"each of {devices}"]
    ax.set_xticks(xs if bars == devices else [0], names, fontsize=7)
    verdict = "fits" if b.fits else f"short by {format_bytes(b.shortfall_bytes)}"
    ax.set_title(
        (title or (b.config.model_type or "model"))
        + f"\n{format_bytes(b.memory_bytes)} per device, tp={b.tp} ep={b.ep}, {b.weights}: "
        + verdict,
        fontsize=9,
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out
