"""`BufferSizes`: the byte size of every arena buffer, from a model config, the serve limits,
the levers and the target. A port of the newer seed's `BufferSizes::from_config` (spec §12),
field for field and byte for byte.

This is the one place each buffer's size is computed. The plan, the views, the footprint
assertions and the kernels' workspaces all derive from these numbers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from jaxarena import workspaces as W
from jaxarena._config.hf_json import show
from jaxarena._config.levers import Levers
from jaxarena._config.model import ModelConfig
from jaxarena._config.target import Target
from jaxarena._errors import ConfigError
from jaxarena._sizing import composite as L
from jaxarena._units import ceil16, ceil_div

__all__ = ["BufferSizes", "ServeLimits", "GATEUP_FUSED_MAX_M"]

# The widest M the fused dense-FFN gate+up decode GEMM serves: the row extent of
# `ffn_gate_up_fused`.
GATEUP_FUSED_MAX_M = 16
_BF16 = 2
_F32 = 4
# Buffers that exist even when their feature is off get this placeholder size, so the
# runtime can always hand out a valid pointer.
_PLACEHOLDER = 256
# Left out of the seed's own `total_bytes()` although they are allocated (spec §13).
_SEED_TOTAL_EXCLUDES = frozenset({"o_latent", "norm_unit_w"})


# The largest serve limit: no memory holds 2^62 tokens' worth of anything.
MAX_LIMIT = 1 << 62


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeLimits:
    """The serve limits the arena is sized for.

    Attributes:
      max_batch_tokens: token rows of one forward pass (`M`), >= 1.
      max_seq_len: longest sequence, >= 1; sets block-table widths and QSA score width.
      kv_block_size: paged-KV block size in tokens; 0 means "no paging" and the seed then
        reserves 256 block-table entries.
      max_batch_size: sequence slots of the serve, >= 1; sets the decode-metadata rows.

    Every limit is at most `MAX_LIMIT` (2^62): past it no arena fits any memory, and sizes
    would stop being float-printable.
    """

    max_batch_tokens: int
    max_seq_len: int
    kv_block_size: int
    max_batch_size: int

    def __post_init__(self) -> None:
        problems = []
        for name, lo in (
            ("max_batch_tokens", 1),
            ("max_seq_len", 1),
            ("kv_block_size", 0),
            ("max_batch_size", 1),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                problems.append(f"{name}={v!r} must be an int")
            elif v < lo:
                problems.append(f"{name}={v} must be >= {lo}")
            elif v > MAX_LIMIT:
                problems.append(f"{name}={show(v)} is beyond 2^62, more than any memory holds")
        if problems:
            raise ConfigError("invalid serve limits:\n  - " + "\n  - ".join(problems))


@dataclasses.dataclass(frozen=True, kw_only=True)
class BufferSizes:
    """Byte size of each arena buffer, in the seed's field order.

    Build with `BufferSizes.from_config`. `M` below is `max_batch_tokens`; `ceil16(M)` is M
    rounded up to a multiple of 16 (the row count the cuBLASLt FP8 arms read and write).
    Zero means the buffer is not allocated; 256 is the placeholder of an always-allocated
    buffer whose feature is off.
    """

    hidden_states: int
    residual: int
    norm_output: int
    qkv_output: int
    attn_output: int
    gate_logits: int
    gate_logits_f32: int
    moe_router_in_f32: int
    moe_output: int
    logits: int
    ssm_qkvz: int
    ssm_ba: int
    ssm_deinterleaved: int
    ssm_gates: int
    ssm_conv_out_f32: int
    scratch: int
    expert_gate_out: int
    expert_up_out: int
    expert_down_out: int
    splitk_workspace: int
    gdn_fla_scratch: int
    ssd_scratch: int
    o_latent: int
    norm_unit_w: int
    hc_streams: int
    hc_post: int
    hc_comb: int
    hc_lowrank_scratch: int
    qsa_select_scratch: int
    token_ids: int
    ffn_act_q8: int
    ffn_act_a: int
    ffn_act_scale: int
    ffn_act_scale_kmajor: int
    ffn_gate_up_fused: int
    fp8_act: int
    moe_fp8_scratch: int
    fp8_act_scale: int
    fp8_act_scale_kmajor: int
    lora_xa: int
    lora_delta: int
    lora_hact: int
    lora_seq_slot: int
    q2_dequant_scratch: int
    q2_act_q8: int
    ssm_rowwise_w_bf16: int

    # -- summaries ---------------------------------------------------------------------------

    def as_dict(self) -> dict[str, int]:
        """`{buffer name: bytes}` in the seed's field order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def total_bytes(self) -> int:
        """Sum of every buffer, i.e. what the arena really occupies before alignment.

        Unlike the seed's `total_bytes()`, this includes `o_latent` and `norm_unit_w`: the seed
        leaves them out of its total but allocates them all the same (see `seed_total_bytes`).
        """
        return sum(self.as_dict().values())

    def seed_total_bytes(self) -> int:
        """The seed's own total: every buffer except `o_latent` and `norm_unit_w`."""
        return sum(v for k, v in self.as_dict().items() if k not in _SEED_TOTAL_EXCLUDES)

    # -- the sizing ----------------------------------------------------------------------------

    @classmethod
    def from_config(
        cls,
        config: ModelConfig,
        limits: ServeLimits | int | None = None,
        max_seq_len: int | None = None,
        kv_block_size: int | None = None,
        max_batch_size: int | None = None,
        *,
        max_batch_tokens: int | None = None,
        levers: Levers | None = None,
        target: Target | None = None,
        q12_variant: Literal["A", "B"] = "B",
    ) -> BufferSizes:
        """Every buffer size for `config` at the given serve limits.

        Args:
          config: the model.
          limits: the serve limits, a `ServeLimits`. The loose form, four ints
            `max_batch_tokens, max_seq_len, kv_block_size, max_batch_size` (positional or by
            keyword), is also accepted and builds the same `ServeLimits`:
            max_batch_tokens: token rows of one forward pass (`M`, >= 1);
            max_seq_len: longest sequence (>= 1);
            kv_block_size: paged-KV block size; 0 keeps the seed's meaning (256 entries);
            max_batch_size: sequence slots (>= 1).
          levers: the environment switches; `None` reads them with `Levers.from_env()`.
          target: the hardware target; `None` means `Target.detect()`.
          q12_variant: which `sizes_q12` formula sizes the batched-prefill staging in
            `scratch` (`"B"`, the default, or `"A"`; spec §5).

        Raises:
          ConfigError: a serve limit is invalid, or `levers` / `target` has the wrong type.
        """
        if not isinstance(config, ModelConfig):
            raise ConfigError(f"config must be a ModelConfig, got {type(config).__name__}")
        limits = _limits(limits, max_batch_tokens, max_seq_len, kv_block_size, max_batch_size)
        max_batch_tokens, max_seq_len = limits.max_batch_tokens, limits.max_seq_len
        kv_block_size, max_batch_size = limits.kv_block_size, limits.max_batch_size
        levers = Levers.from_env() if levers is None else levers
        target = Target.detect() if target is None else target
        if not isinstance(levers, Levers):
            raise ConfigError(
                f"levers must be a Levers (Levers(...), Levers.from_env()) or None, got "
                f"{type(levers).__name__}"
            )
        if not isinstance(target, Target):
            raise ConfigError(
                f"target must be a Target (Target.preset('gb10'), Target.detect()) or None, "
                f"got {type(target).__name__}"
            )
        c = config
        m = max_batch_tokens
        h = c.hidden_size
        decode_meta = L.DecodeMetaLayout.for_max_batch_size(max_batch_size)
        rows = decode_meta.rows

        q_heads, kv_heads, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        # A gated q projection writes [Q | gate]: twice the query width.
        q_mul = 2 if c.attn_gated else 1
        qkv_dim = (q_heads * q_mul + 2 * kv_heads) * hd
        # Rows of every buffer a block-scaled FP8 GEMM touches: the GEMM runs on ceil16(M) rows
        # and reads/writes the pad rows, so M rows would be overrun by up to 15.
        m_pad = ceil16(m)
        # Expert outputs take ceil16(max(M, 3)) rows (a tiny prefill still gets 16).
        k_max = ceil16(max(m, 3))
        is_moe = c.num_experts > 0
        mla = c.kv_lora_rank > 0
        rope = c.qk_rope_head_dim
        d_inner = c.mamba2_d_inner
        # norm_output and attn_output hold rows of either hidden or Mamba-2 d_inner width.
        max_dim = max(h, d_inner)
        # Logit rows: a batched MTP verify scores up to VERIFY_ROW_CAP rows, and a mixed decode
        # step writes one prefill row after its (up to `rows`) decode rows.
        logits_tokens = min(m, max(L.VERIFY_ROW_CAP, rows + 1))
        # MTP batched propose works on at most DECODE_META_MAX_ROWS rows at once.
        propose_rows = min(m, L.DECODE_META_MAX_ROWS)
        # The widest K among the prefill projections that quantize into fp8_act: hidden (qkv,
        # ssm qkvz), q width (o_proj), Mamba-2 d_inner and the GDN value width (out_projs).
        max_proj_k = max(
            h, q_heads * hd, d_inner, c.linear_num_value_heads * c.linear_value_head_dim
        )

        if is_moe:
            expert_inter = k_max * max(
                c.num_experts_per_tok * c.moe_intermediate_size, c.intermediate_size
            )
            # LatentMoE experts write moe_latent_size-wide rows.
            expert_down_out = k_max * c.num_experts_per_tok * c.moe_input_size * _BF16
        else:
            expert_inter = k_max * c.intermediate_size
            expert_down_out = k_max * h * _BF16

        # Split-K decode: one [o[head_dim], m, l] f32 slot per (sequence, q head, split), for
        # the widest batch the decode metadata accepts. Too few slots would be an out-of-bounds
        # device write, so the kernel asks the same policy for its split count.
        policy = W.splitk_policy(levers, target)
        slots = W.workspace_slots(policy, target.sm_count, q_heads, rows, max(max_batch_size, 1))
        splitk_workspace = slots * W.splitk_slot_bytes(hd)

        fp8_act = W.fp8_act_bytes(m, max_proj_k)

        if c.adapter_max_rank > 0:
            # The widest projection output a LoRA adapter can target.
            lora_n = max(h, c.intermediate_size, q_mul * q_heads * hd)
            lora_xa = m * c.adapter_max_rank * _BF16
            lora_delta = m * lora_n * _BF16
            lora_hact = m * c.intermediate_size * _BF16
            lora_seq_slot = m * 4
        else:
            lora_xa = lora_delta = lora_hact = lora_seq_slot = 0

        ssd_scratch, gdn_fla_scratch = L.ssm_scratch_bytes(c, m)

        if not is_moe:
            # Dense-FFN activation quantization, shared by every layer's prefill, for
            # K = max(hidden, intermediate). The int8 buffers also hold the NVFP4 and FP8
            # forms; the scale rows round K down (K/32, K/128) as the seed does.
            kmax = max(h, c.intermediate_size)
            ffn_act_q8 = L.q8_1_scratch_bytes(m, kmax)
            ffn_act_a = m_pad * kmax
            ffn_act_scale = m_pad * (kmax // 32) * _F32
            # The seed's floor: a K that is not a multiple of 128 does not fit the quantizer's
            # ceil(K / 128) columns, and models keep such FFN activations in bf16
            # (`workspaces.ffn_fp8_uses_seed_regions`).
            kmajor_cols = W.fp8_scale_cols(kmax, rounding="floor")
            ffn_act_scale_kmajor = W.fp8_rows(m) * kmajor_cols * _F32
            # The fused gate+up decode GEMM's [ceil16(16), 2 * intermediate] output.
            ffn_gate_up_fused = ceil16(GATEUP_FUSED_MAX_M) * 2 * c.intermediate_size * _BF16
        else:
            ffn_act_q8 = ffn_act_a = ffn_act_scale = ffn_act_scale_kmajor = 0
            ffn_gate_up_fused = 0

        if c.hc_mult > 0 and c.hc_lowrank > 0:
            # Two layouts share the region: decode (T <= 64) normed + low in f32, and prefill
            # slabs of up to 2048 tokens holding normed, up_pre, low and inj_pre in bf16.
            t = min(m, 64)
            split = t * (c.hc_mult * h + c.hc_lowrank) * _F32
            ts = min(m, 2048)
            gemm = ts * (2 * c.hc_mult * h + c.hc_lowrank + c.hc_mult) * _BF16
            hc_lowrank_scratch = max(split, gemm)
        else:
            hc_lowrank_scratch = _PLACEHOLDER

        if c.index_topk > 0 and c.index_compress_ratio > 0:
            # QSA prefill selection for 2048-row slabs: qk (bf16), q_post (f32), block scores
            # over the compressed sequence (f32) and the selected lists (i32).
            slab = 2048
            qkw = (c.index_n_heads + 1) * c.index_head_dim
            n_blocks = ceil_div(max_seq_len, c.index_compress_ratio)
            topk = c.index_topk // c.index_compress_ratio
            qsa_select_scratch = (
                slab * qkw * _BF16
                + slab * c.index_n_heads * c.index_head_dim * _F32
                + slab * n_blocks * _F32
                + slab * topk * 4
            )
        else:
            qsa_select_scratch = _PLACEHOLDER

        n_router = c.num_experts + c.zero_expert_num  # zero experts are scored, have no FFN
        return cls(
            hidden_states=m * h * _BF16,
            residual=m * h * _BF16,
            norm_output=m * max_dim * _BF16,
            # ceil16(M) rows: the FP8 Q/K/V prefill arm writes padded rows of Q here.
            qkv_output=m_pad * qkv_dim * _BF16,
            # Attention output, Mamba-2 pre-out_proj rows, or absorbed MLA's
            # [M, q_heads, kv_lora_rank + rope].
            attn_output=max(
                m * q_heads * hd * _BF16,
                m * d_inner * _BF16,
                m * q_heads * (c.kv_lora_rank + rope) * _BF16 if mla else 0,
            ),
            gate_logits=m * n_router * _BF16 if is_moe else _PLACEHOLDER,
            # f32 router logits and router input, for the unrounded-top-k routing paths.
            gate_logits_f32=m * n_router * _F32 if is_moe else _PLACEHOLDER,
            moe_router_in_f32=m * h * _F32 if is_moe else _PLACEHOLDER,
            # ceil16(M) rows: the FP8 dense-FFN down projection writes its output here.
            moe_output=ceil16(m) * h * _BF16,
            logits=logits_tokens * c.vocab_size * _BF16,
            # The SSM buffers double as scratch for other layers: each is the largest of its
            # uses. ssm_qkvz: the GDN QKVZ projection (padded rows), the Mamba-2 in_proj
            # output, prefill K (M rows) then V (ceil16(M) rows), the shared-expert up output.
            ssm_qkvz=max(
                m_pad * c.ssm_qkvz_size * _BF16,
                m * c.mamba2_in_proj_size * _BF16,
                (m + m_pad) * kv_heads * hd * _BF16,
                m * c.shared_expert_intermediate_size * _BF16,
                _PLACEHOLDER,
            ),
            # ssm_ba: GDN beta/alpha, the LatentMoE latent, MLA's q_latent or K rope rows,
            # and the MTP propose's [n, 2 * hidden] concat.
            ssm_ba=max(
                m * c.ssm_ba_size * _BF16,
                m * c.moe_latent_size * _BF16,
                max(m * rope * _BF16, m * c.q_lora_rank * _BF16) if mla else 0,
                propose_rows * 2 * h * _BF16,
                _PLACEHOLDER,
            ),
            # ssm_deinterleaved: sequential QKVZ output, Mamba-2 xBC, the query rows, or
            # absorbed MLA's Q.
            ssm_deinterleaved=max(
                m_pad * c.ssm_qkvz_size * _BF16,
                m * c.mamba2_d_xbc * _BF16,
                m * q_heads * hd * _BF16,
                m * q_heads * (c.kv_lora_rank + rope) * _BF16 if mla else 0,
                _PLACEHOLDER,
            ),
            # ssm_gates: GDN gates (two f32 per value head) or the propose's normed rows.
            ssm_gates=max(
                m * c.linear_num_value_heads * 2 * _F32,
                propose_rows * h * _BF16,
                _PLACEHOLDER,
            ),
            # f32 conv1d output (QKVZ width), or MLA's Q rope rows.
            ssm_conv_out_f32=max(
                m * c.ssm_qkvz_size * _F32,
                m * q_heads * rope * _BF16 if mla else 0,
                _PLACEHOLDER,
            ),
            scratch=L.scratch_bytes(
                c, m, max_seq_len, kv_block_size, decode_meta, q12_variant=q12_variant
            ),
            # Routed experts' (or the dense FFN's) gate and up outputs.
            expert_gate_out=expert_inter * _BF16,
            expert_up_out=expert_inter * _BF16,
            expert_down_out=expert_down_out,
            splitk_workspace=splitk_workspace,
            gdn_fla_scratch=gdn_fla_scratch,
            ssd_scratch=ssd_scratch,
            # Grouped O-projection latent [M, o_groups * o_lora_rank].
            o_latent=max(m * c.o_groups * c.o_lora_rank * _BF16, _PLACEHOLDER),
            # A zero RMSNorm weight of the widest row, for "norm without weight" calls.
            norm_unit_w=max_dim * _BF16,
            # Hyper-connection residual streams [M, hc_mult, hidden] f32, post weights
            # [M, hc_mult] and the mixing matrix [M, hc_mult, hc_mult].
            hc_streams=m * c.hc_mult * h * _F32 if c.hc_mult > 0 else _PLACEHOLDER,
            hc_post=max(m * c.hc_mult * _F32, _PLACEHOLDER) if c.hc_mult > 0 else _PLACEHOLDER,
            hc_comb=(
                max(m * c.hc_mult * c.hc_mult * _F32, _PLACEHOLDER)
                if c.hc_mult > 0
                else _PLACEHOLDER
            ),
            hc_lowrank_scratch=hc_lowrank_scratch,
            qsa_select_scratch=qsa_select_scratch,
            # u32 token ids of the pass, for hash-routed MoE layers.
            token_ids=max(m * 4, _PLACEHOLDER),
            ffn_act_q8=ffn_act_q8,
            ffn_act_a=ffn_act_a,
            ffn_act_scale=ffn_act_scale,
            ffn_act_scale_kmajor=ffn_act_scale_kmajor,
            ffn_gate_up_fused=ffn_gate_up_fused,
            # FP8 prefill activations, 1 byte per element, [ceil16(M), max_proj_k].
            fp8_act=fp8_act["q"],
            moe_fp8_scratch=L.moe_fp8_scratch_bytes(c, m),
            # One f32 scale per 128 activations, and its [K/128, ceil16(M)] transpose; the
            # transpose is written while the row-major scales are still live, so they cannot
            # share a buffer.
            fp8_act_scale=fp8_act["scale"],
            fp8_act_scale_kmajor=fp8_act["kmajor"],
            lora_xa=lora_xa,
            lora_delta=lora_delta,
            lora_hact=lora_hact,
            lora_seq_slot=lora_seq_slot,
            q2_dequant_scratch=L.q2_dequant_scratch_bytes(c) if levers.gguf_native_q2 else 0,
            q2_act_q8=L.q2_act_q8_bytes(c, m) if levers.gguf_native_q2_mmq else 0,
            ssm_rowwise_w_bf16=L.ssm_rowwise_w_bf16_bytes(c) if levers.fp8_rowwise else 0,
        )


def _limits(limits: Any, m: Any, seq: Any, block: Any, batch: Any) -> ServeLimits:
    """The `ServeLimits` of `from_config`'s two spellings (a `ServeLimits`, or four ints)."""
    if isinstance(limits, ServeLimits):
        extra = {k: v for k, v in (("max_batch_tokens", m), ("max_seq_len", seq),
                                   ("kv_block_size", block), ("max_batch_size", batch))
                 if v is not None}  # fmt: skip
        if extra:
            raise ConfigError(
                f"limits is a ServeLimits; do not also pass {sorted(extra)} (put them in it)"
            )
        return limits
    if limits is not None and m is not None:
        raise ConfigError(f"max_batch_tokens given twice: {limits!r} and max_batch_tokens={m!r}")
    m = limits if m is None else m
    loose = {"max_batch_tokens": m, "max_seq_len": seq, "kv_block_size": block,
             "max_batch_size": batch}  # fmt: skip
    missing = [k for k, v in loose.items() if v is None]
    if missing:
        raise ConfigError(
            f"serve limits missing: {missing}; pass limits=ServeLimits(...) or all four of "
            "max_batch_tokens, max_seq_len, kv_block_size, max_batch_size"
        )
    return ServeLimits(**loose)
