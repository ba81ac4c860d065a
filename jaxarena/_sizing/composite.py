"""Sub-layouts that size the seed's composite buffers: decode metadata, the shared `scratch`,
the kernel-batched ("q12") prefill staging, the SSM prefill scratch, the grouped FP8 MoE slab,
the keep-packed Q2 scratch and the row-wise FP8 weight slab (spec §3-§6, §8-§10).

`BufferSizes.from_config` calls these; nothing else computes these bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from jaxarena._config.model import ModelConfig
from jaxarena._units import ceil_div, round_up
from jaxarena.workspaces import (
    GDN_CHUNK,
    gdn_fla_scratch_layout,
    moe_fp8_scratch_layout,
    ssd_scratch_layout,
)

__all__ = [
    "DECODE_META_MIN_ROWS",
    "DECODE_META_MAX_ROWS",
    "VERIFY_ROW_CAP",
    "Q12_SIZING_STREAMS",
    "FLA_CHUNK",
    "DecodeMetaLayout",
    "scratch_bytes",
    "q12_batched_scratch_bytes",
    "ssm_scratch_bytes",
    "moe_fp8_scratch_bytes",
    "q2_dequant_scratch_bytes",
    "q2_act_q8_bytes",
    "ssm_rowwise_w_bf16_bytes",
    "q8_1_scratch_bytes",
]

DECODE_META_MIN_ROWS = 32
DECODE_META_MAX_ROWS = 128
VERIFY_ROW_CAP = 256
Q12_SIZING_STREAMS = 8
FLA_CHUNK = GDN_CHUNK
_FIXED_DECODE_META = 32768
_SCRATCH_FLOOR = 64 * 1024
_Q8_1_EXTRA = 1 << 20


@dataclasses.dataclass(frozen=True)
class DecodeMetaLayout:
    """Per-step decode metadata: positions, LoRA slots, KV slots, lengths and block tables for
    `rows` sequences. `rows` is the serve's batch ceiling, floored at 32 so that small serves
    still get the common decode shapes."""

    rows: int

    @classmethod
    def for_max_batch_size(cls, max_batch_size: int) -> DecodeMetaLayout:
        """The layout the seed uses for a serve of `max_batch_size` slots (floor 32 rows)."""
        return cls(max(max_batch_size, DECODE_META_MIN_ROWS))

    def meta_bytes(self, max_blocks: int) -> int:
        """Bytes of the metadata for `rows` sequences with `max_blocks` block-table entries."""
        # positions u32 | lora slot i32 | slots i64 | seq_lens i32 | gap | block table i32
        return 24 * self.rows + self.rows * max_blocks * 4


def _streams(config: ModelConfig) -> int:
    # MRoPE uploads three position streams (temporal, height, width) per token.
    return 3 if config.mrope_interleaved else 1


def q12_batched_scratch_bytes(
    n: int, chunk_len: int, top_k: int, mrope: bool, *, variant: Literal["A", "B"] = "B"
) -> int:
    """Staging for `n` prefill streams of `chunk_len` tokens batched into one kernel launch.

    Variant B (default) sizes each stream's metadata block exactly (positions, then the u64
    slot table at an 8-aligned offset, the block rounded to 64 bytes); variant A reserves a
    flat `max(16 * chunk + 64, 4096)` per stream. Which one the reference seed was built with
    is unknown (spec §5, §17.1).
    """
    s = 3 if mrope else 1
    total = n * chunk_len
    if variant == "B":
        slot_off = round_up(chunk_len * 4 * s, 8)
        per_stream = round_up(slot_off + chunk_len * 8, 64)
        meta = n * per_stream
    elif variant == "A":
        meta = n * max(chunk_len * 16 + 64, 4096)
    else:
        raise ValueError(f"q12 variant={variant!r} must be 'A' or 'B'")
    moe = round_up(total * top_k * 4 * 2, 64)  # u32 expert ids + f32 weights per (token, k)
    pos = round_up(total * 4, 8)
    slot = round_up(total * 8, 8)
    ptrs = round_up(n * 8, 8)
    cu_seqlens = round_up((n + 1) * 4, 8)
    kv_lens = round_up(n * 4, 8)
    stage_meta = s * pos + slot + 2 * ptrs + cu_seqlens + kv_lens
    h_state_ptrs = n * 8
    return moe + meta + stage_meta + h_state_ptrs


def scratch_bytes(
    config: ModelConfig,
    m: int,
    max_seq_len: int,
    kv_block_size: int,
    decode_meta: DecodeMetaLayout,
    *,
    q12_variant: Literal["A", "B"] = "B",
) -> int:
    """The shared `scratch` buffer: the largest of four layouts that take turns in it.

    1. single-stream prefill: MoE routing (ids + weights) then the chunk's metadata
       (positions, KV slots, one block table, one length);
    2. batched decode / MTP verify metadata behind a fixed 32 KiB region, for the wider of
       the verify envelope (256 rows) and the decode-metadata rows;
    3. kernel-batched prefill staging for 8 streams splitting `m`;
    4. a 64 KiB floor.
    """
    top_k = config.num_experts_per_tok
    moe_scratch = 2 * m * top_k * 4
    max_blocks = (max_seq_len // kv_block_size) + 1 if kv_block_size != 0 else 256

    s = _streams(config)
    slot_off = round_up(m * 4 * s, 8)
    bt_off = round_up(slot_off + m * 8, 4)
    sl_off = round_up(bt_off + max_blocks * 4, 4)
    prefill_meta = sl_off + 4

    bt_rows = VERIFY_ROW_CAP
    bt_meta = _FIXED_DECODE_META + max(
        bt_rows * 24 + bt_rows * max_blocks * 4, decode_meta.meta_bytes(max_blocks)
    )

    q12_chunk = max(ceil_div(m, Q12_SIZING_STREAMS), 1)
    q12 = q12_batched_scratch_bytes(
        Q12_SIZING_STREAMS, q12_chunk, top_k, config.mrope_interleaved, variant=q12_variant
    )
    return max(_SCRATCH_FLOOR, moe_scratch + prefill_meta, bt_meta, q12)


def ssm_scratch_bytes(config: ModelConfig, m: int) -> tuple[int, int]:
    """`(ssd_scratch, gdn_fla_scratch)`: prefill scratch of the two chunked SSM scans.

    The GDN (gated delta net) FLA kernels only run 128x128 heads; they keep per chunk and
    value head the W, U and uc tiles (bf16), the 128x128 state S (bf16) and the gate cumsum gc
    (f32), with 16 spare chunks so up to 16 streams may each start mid-chunk.
    """
    if config.mamba_num_heads > 0 and config.ssm_state_size > 0:
        layout = ssd_scratch_layout(config.mamba_num_heads, config.n_groups, m)
        ssd = sum(n for _, n in layout.values())
    else:
        ssd = 0
    if (
        config.linear_num_value_heads > 0
        and config.linear_key_head_dim == 128
        and config.linear_value_head_dim == 128
    ):
        layout = gdn_fla_scratch_layout(config.linear_num_value_heads, m)
        fla = sum(n for _, n in layout.values())
    else:
        fla = 0
    return ssd, fla


def moe_fp8_scratch_bytes(config: ModelConfig, rows: int) -> int:
    """The grouped FP8 MoE slab: FP8 activations, their f32 block scales, a tile worklist and
    a tile counter, each region 256-aligned. Sized for the wider of the shared expert (`rows`
    tokens) and the routed experts (`rows * top_k` expanded rows)."""
    if config.num_experts == 0:
        return 0
    offset, nbytes = moe_fp8_scratch_layout(
        rows=rows,
        top_k=config.num_experts_per_tok,
        num_experts=config.num_experts,
        hidden_size=config.hidden_size,
        moe_intermediate_size=config.moe_intermediate_size,
        shared_expert_intermediate_size=config.shared_expert_intermediate_size,
    )["counter"]
    return offset + nbytes


def q2_dequant_scratch_bytes(config: ModelConfig) -> int:
    """One BF16 copy of the largest keep-packed Q2 projection weight (`[n, hidden]`)."""
    q_mul = 2 if config.attn_gated else 1
    max_n = max(
        config.intermediate_size,
        config.ssm_qkvz_size,
        config.mamba2_in_proj_size,
        config.num_attention_heads * q_mul * config.head_dim,
        2 * config.num_key_value_heads * config.head_dim,
    )
    return max_n * config.hidden_size * 2


def q2_act_q8_bytes(config: ModelConfig, m: int) -> int:
    """q8_1 activations for the widest keep-packed MMQ projection input, plus 1 MiB."""
    k = max(
        config.hidden_size, config.intermediate_size, config.num_attention_heads * config.head_dim
    )
    return q8_1_scratch_bytes(m, k)


def ssm_rowwise_w_bf16_bytes(config: ModelConfig) -> int:
    """BF16 copies of every GDN layer's `in_proj_qkvz` and `out_proj` weights."""
    h = config.hidden_size
    per_layer = (
        config.ssm_qkvz_size * h * 2
        + h * (config.linear_num_value_heads * config.linear_value_head_dim) * 2
    )
    return config.num_ssm_layers * per_layer


def q8_1_scratch_bytes(m: int, k: int) -> int:
    """q8_1 MMQ activation scratch for `m` rows of width `k` (K padded to 256), plus 1 MiB."""
    return m * round_up(k, 256) * 4 + _Q8_1_EXTRA
