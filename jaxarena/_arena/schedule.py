"""The seed's standard layer schedule and which buffers each phase keeps live, as data.

`Lifetimes.standard(config)` turns `standard_live(config)` into `Lifetimes`.

The standard schedule (`standard_schedule`)
-----------------------------------------------

Every mode runs the same phases; the modes differ in which buffers they use. One pass is

    upload, embed,                                   # prologue
    <block>.pre_norm ... <block>.ffn_add             # one block per mixer kind (below)
    final_norm, lm_head, mtp_propose                 # epilogue

with these phases in each block (`LAYER_PHASES`):

    pre_norm   residual add + RMSNorm (and the hyper-connection pre-mix) -> norm_output
    quant_in   activation quantization of the mixer input (FP8 prefill, q8_1 MMQ)
    proj_in    input projections: QKV / GDN QKVZ + BA / Mamba-2 in_proj / MLA latents (+LoRA)
    prep       RoPE, de-interleave, conv1d, gates; prefill K/V staging; QSA selection
    mix        the mixer: attention (split-K in decode), GDN FLA or SSD chunked scan
    quant_out  quantization of the mixer output
    o_proj     output projection (grouped O latent, LoRA)
    post_norm  residual add + RMSNorm (and the hyper-connection post-mix)
    router     MoE router logits (bf16 and f32), top-k ids and weights
    ffn_quant  quantization of the FFN input (dense int8/FP8/NVFP4, grouped FP8 MoE)
    ffn_up     gate and up GEMMs (routed experts, shared expert, fused dense decode GEMM)
    ffn_act    SiLU(gate) * up and its quantization for the down GEMM
    ffn_down   down GEMMs and the expert combine
    ffn_add    FFN output + residual -> hidden_states (and the hyper-connection post-mix)

Blocks: `attn` when the model has attention layers, `ssm` when it has gated-delta-net or
Mamba-2 layers (an attention-free, SSM-free config gets an `attn` block so that every buffer
has a place). Layers of one kind repeat the same pattern and every buffer that lives across
layers is live for the whole pass, so one block per kind gives exactly the conflicts and the
peak of the fully unrolled pass. Every block carries the FFN phases: for configs whose FFN
layers are separate (`moe`/`mlp` entries in `layer_types`, Nemotron-H) this only adds
conflicts, never removes one.

Modes: `prefill` runs the chunked prefill kernels (FP8 projections, GDN FLA, SSD, QSA
selection, grouped FP8 MoE, the dense FFN's activation quantization); `decode` runs the
one-token kernels (split-K attention, the fused dense gate+up GEMM); `verify` (batched MTP
verify, up to 256 rows) may take either path, so it uses the union of both.

Assumptions: the MTP propose's own decoder layer runs as a separate pass (so only its concat
and normed rows are in this epilogue); the o_proj output may land in `moe_output`; the dense
FFN's `ffn_act_*` buffers serve the FFN only (the mixer projections quantize into `fp8_act`,
whose K covers exactly their input widths).
"""

from __future__ import annotations

from typing import Any

from jaxarena._errors import ConfigError

__all__ = ["MODES", "LAYER_PHASES", "standard_schedule", "standard_live"]

# The modes of the seed's runtime, which never run at the same time.
MODES = ("prefill", "decode", "verify")

LAYER_PHASES = (
    "pre_norm",
    "quant_in",
    "proj_in",
    "prep",
    "mix",
    "quant_out",
    "o_proj",
    "post_norm",
    "router",
    "ffn_quant",
    "ffn_up",
    "ffn_act",
    "ffn_down",
    "ffn_add",
)
_PROLOGUE = ("upload", "embed")
_EPILOGUE = ("final_norm", "lm_head", "mtp_propose")


def standard_schedule(config: Any) -> tuple[str, ...]:
    """The phases of one pass of `config` in the standard schedule (the same in every mode):
    `upload, embed, <block>.<phase>... , final_norm, lm_head, mtp_propose`."""
    return _phases(config)


# -- the table ---------------------------------------------------------------------------------

_ALL = MODES
_PV = ("prefill", "verify")
_DV = ("decode", "verify")
_PASS = ((_ALL, "pass", "", ""),)

# Why each buffer lives where it does (the reasons; the intervals are the data below):
# The table (`_TABLE`; scopes: `pass` = the whole pass, `layer` = every block, `attn`/`ssm` =
# blocks of that kind, `epilogue`):
#
# | buffer | live (modes: scope first..last phase) |
# |---|---|
# | hidden_states, residual | all: pass (the residual stream) |
# | scratch | all: pass (step metadata, top-k ids/weights, q12 staging: the union of its uses) |
# | token_ids, lora_seq_slot | all: pass (read by every hash-routed MoE / LoRA projection) |
# | norm_unit_w | all: pass (a constant zero weight; sharing would overwrite it) |
# | hc_streams | all: pass (hyper-connection residual streams) |
# | ssm_rowwise_w_bf16 | all: pass (a weight cache that outlives the pass) |
# | q2_dequant_scratch | all: pass (one dequantized weight, reused by every projection) |
# | norm_output | all: layer pre_norm..proj_in, ssm mix..o_proj (gated norm at d_inner width), layer post_norm..ffn_up, epilogue final_norm..lm_head |
# | qkv_output | all: attn proj_in..mix |
# | attn_output | all: attn mix..o_proj, ssm mix..o_proj |
# | gate_logits, gate_logits_f32, moe_router_in_f32 | all: layer router |
# | moe_output | all: layer o_proj..ffn_add (the FFN output; also the o_proj output, to be safe) |
# | logits | all: epilogue lm_head..mtp_propose (read by the caller after the pass) |
# | ssm_qkvz | prefill+verify: attn prep..mix (K then V rows); all: ssm proj_in..o_proj (QKVZ / in_proj, z read after the mixer); all: layer ffn_up..ffn_down (shared-expert up) |
# | ssm_ba | all: attn proj_in..mix (MLA q_latent, K rope), ssm proj_in..mix (beta/alpha), layer router..ffn_down (LatentMoE latent), epilogue mtp_propose (concat) |
# | ssm_deinterleaved | all: attn prep..mix (query rows, absorbed MLA Q), ssm prep..o_proj (QKVZ with z, Mamba-2 xBC) |
# | ssm_gates | all: ssm prep..mix, epilogue mtp_propose (propose's normed rows) |
# | ssm_conv_out_f32 | all: attn prep..mix (MLA Q rope rows), ssm prep..mix (f32 conv output) |
# | expert_gate_out, expert_up_out | all: layer ffn_up..ffn_down |
# | expert_down_out | all: layer ffn_down..ffn_add |
# | splitk_workspace | decode+verify: attn mix |
# | gdn_fla_scratch, ssd_scratch | prefill+verify: ssm mix |
# | qsa_select_scratch | prefill+verify: attn prep..mix |
# | o_latent | all: attn o_proj |
# | hc_post, hc_comb, hc_lowrank_scratch | all: layer pre_norm..ffn_add, epilogue final_norm |
# | ffn_act_q8, ffn_act_a, ffn_act_scale, ffn_act_scale_kmajor | prefill+verify: layer ffn_quant..ffn_down |
# | ffn_gate_up_fused | decode+verify: layer ffn_up..ffn_down |
# | fp8_act, fp8_act_scale, fp8_act_scale_kmajor | prefill+verify: layer quant_in..proj_in, mix..o_proj, epilogue final_norm..lm_head |
# | moe_fp8_scratch | prefill+verify: layer ffn_quant..ffn_down |
# | lora_xa, lora_delta | all: layer proj_in, o_proj, ffn_up, ffn_down (shrink then expand, per projection) |
# | lora_hact | all: layer ffn_up..ffn_down |
# | q2_act_q8 | all: layer quant_in..proj_in, mix..o_proj, ffn_quant..ffn_down, epilogue final_norm..lm_head |

# name -> uses; a use is (modes, scope, first phase, last phase), both phases included.
# Scopes: "pass" (whole pass), "layer" (every block), "attn", "ssm", "epilogue".
_TABLE: dict[str, tuple[tuple[tuple[str, ...], str, str, str], ...]] = {
    "hidden_states": _PASS,
    "residual": _PASS,
    "norm_output": (
        (_ALL, "layer", "pre_norm", "proj_in"),
        (_ALL, "ssm", "mix", "o_proj"),
        (_ALL, "layer", "post_norm", "ffn_up"),
        (_ALL, "epilogue", "final_norm", "lm_head"),
    ),
    "qkv_output": ((_ALL, "attn", "proj_in", "mix"),),
    "attn_output": ((_ALL, "attn", "mix", "o_proj"), (_ALL, "ssm", "mix", "o_proj")),
    "gate_logits": ((_ALL, "layer", "router", "router"),),
    "gate_logits_f32": ((_ALL, "layer", "router", "router"),),
    "moe_router_in_f32": ((_ALL, "layer", "router", "router"),),
    "moe_output": ((_ALL, "layer", "o_proj", "ffn_add"),),
    "logits": ((_ALL, "epilogue", "lm_head", "mtp_propose"),),
    "ssm_qkvz": (
        (_PV, "attn", "prep", "mix"),
        (_ALL, "ssm", "proj_in", "o_proj"),
        (_ALL, "layer", "ffn_up", "ffn_down"),
    ),
    "ssm_ba": (
        (_ALL, "attn", "proj_in", "mix"),
        (_ALL, "ssm", "proj_in", "mix"),
        (_ALL, "layer", "router", "ffn_down"),
        (_ALL, "epilogue", "mtp_propose", "mtp_propose"),
    ),
    "ssm_deinterleaved": ((_ALL, "attn", "prep", "mix"), (_ALL, "ssm", "prep", "o_proj")),
    "ssm_gates": (
        (_ALL, "ssm", "prep", "mix"),
        (_ALL, "epilogue", "mtp_propose", "mtp_propose"),
    ),
    "ssm_conv_out_f32": ((_ALL, "attn", "prep", "mix"), (_ALL, "ssm", "prep", "mix")),
    "scratch": _PASS,
    "expert_gate_out": ((_ALL, "layer", "ffn_up", "ffn_down"),),
    "expert_up_out": ((_ALL, "layer", "ffn_up", "ffn_down"),),
    "expert_down_out": ((_ALL, "layer", "ffn_down", "ffn_add"),),
    "splitk_workspace": ((_DV, "attn", "mix", "mix"),),
    "gdn_fla_scratch": ((_PV, "ssm", "mix", "mix"),),
    "ssd_scratch": ((_PV, "ssm", "mix", "mix"),),
    "o_latent": ((_ALL, "attn", "o_proj", "o_proj"),),
    "norm_unit_w": _PASS,
    "hc_streams": _PASS,
    "hc_post": (
        (_ALL, "layer", "pre_norm", "ffn_add"),
        (_ALL, "epilogue", "final_norm", "final_norm"),
    ),
    "hc_comb": (
        (_ALL, "layer", "pre_norm", "ffn_add"),
        (_ALL, "epilogue", "final_norm", "final_norm"),
    ),
    "hc_lowrank_scratch": (
        (_ALL, "layer", "pre_norm", "ffn_add"),
        (_ALL, "epilogue", "final_norm", "final_norm"),
    ),
    "qsa_select_scratch": ((_PV, "attn", "prep", "mix"),),
    "token_ids": _PASS,
    "ffn_act_q8": ((_PV, "layer", "ffn_quant", "ffn_down"),),
    "ffn_act_a": ((_PV, "layer", "ffn_quant", "ffn_down"),),
    "ffn_act_scale": ((_PV, "layer", "ffn_quant", "ffn_down"),),
    "ffn_act_scale_kmajor": ((_PV, "layer", "ffn_quant", "ffn_down"),),
    "ffn_gate_up_fused": ((_DV, "layer", "ffn_up", "ffn_down"),),
    "fp8_act": (
        (_PV, "layer", "quant_in", "proj_in"),
        (_PV, "layer", "mix", "o_proj"),
        (_PV, "epilogue", "final_norm", "lm_head"),
    ),
    "moe_fp8_scratch": ((_PV, "layer", "ffn_quant", "ffn_down"),),
    "fp8_act_scale": (
        (_PV, "layer", "quant_in", "proj_in"),
        (_PV, "layer", "mix", "o_proj"),
        (_PV, "epilogue", "final_norm", "lm_head"),
    ),
    "fp8_act_scale_kmajor": (
        (_PV, "layer", "quant_in", "proj_in"),
        (_PV, "layer", "mix", "o_proj"),
        (_PV, "epilogue", "final_norm", "lm_head"),
    ),
    "lora_xa": (
        (_ALL, "layer", "proj_in", "proj_in"),
        (_ALL, "layer", "o_proj", "o_proj"),
        (_ALL, "layer", "ffn_up", "ffn_up"),
        (_ALL, "layer", "ffn_down", "ffn_down"),
    ),
    "lora_delta": (
        (_ALL, "layer", "proj_in", "proj_in"),
        (_ALL, "layer", "o_proj", "o_proj"),
        (_ALL, "layer", "ffn_up", "ffn_up"),
        (_ALL, "layer", "ffn_down", "ffn_down"),
    ),
    "lora_hact": ((_ALL, "layer", "ffn_up", "ffn_down"),),
    "lora_seq_slot": _PASS,
    "q2_dequant_scratch": _PASS,
    "q2_act_q8": (
        (_ALL, "layer", "quant_in", "proj_in"),
        (_ALL, "layer", "mix", "o_proj"),
        (_ALL, "layer", "ffn_quant", "ffn_down"),
        (_ALL, "epilogue", "final_norm", "lm_head"),
    ),
    "ssm_rowwise_w_bf16": _PASS,
}


def _blocks(config: Any) -> list[str]:
    blocks = []
    if config.num_attention_layers > 0:
        blocks.append("attn")
    if config.num_ssm_layers > 0:
        blocks.append("ssm")
    return blocks or ["attn"]


def _phases(config: Any) -> tuple[str, ...]:
    body = tuple(f"{k}.{p}" for k in _blocks(config) for p in LAYER_PHASES)
    return _PROLOGUE + body + _EPILOGUE


def standard_live(config: Any) -> tuple[tuple[str, ...], dict[str, list[tuple[str, int, int]]]]:
    """The phases of one pass of `config` and `{buffer: [(mode, start, end), ...]}` over them.

    Args:
      config: a `ModelConfig` (reads its attention and SSM layer counts).
    """
    if not hasattr(config, "num_attention_layers") or not hasattr(config, "num_ssm_layers"):
        raise ConfigError(f"config must be a ModelConfig, got {type(config).__name__}")
    phases = _phases(config)
    index = {p: i for i, p in enumerate(phases)}
    blocks = _blocks(config)
    live: dict[str, list[tuple[str, int, int]]] = {}
    for name, uses in _TABLE.items():
        out = live.setdefault(name, [])
        for modes, scope, first, last in uses:
            if scope == "pass":
                spans = [(0, len(phases))]
            elif scope == "epilogue":
                spans = [(index[first], index[last] + 1)]
            else:
                kinds = blocks if scope == "layer" else [k for k in blocks if k == scope]
                spans = [(index[f"{k}.{first}"], index[f"{k}.{last}"] + 1) for k in kinds]
            out.extend((m, s, e) for m in modes for s, e in spans)
    return phases, live
