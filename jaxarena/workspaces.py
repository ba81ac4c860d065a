"""The kernel workspace contract: the one source of every kernel workspace's geometry.

The sizing (`BufferSizes.from_config`), the kernels' arena forms and the models all read these
functions, so the bytes a kernel uses can never exceed the bytes sized.

- Split-K decode attention (spec §7): the policy, how many key splits a decode step uses, how
  many `[o[head_dim], m, l]` f32 slots the arena holds, and the bytes of one slot.
- Mamba-2 SSD chunked scan: the f32 scratch sections `dt`, `dA_cumsum` and `CB`.
- Gated DeltaNet chunked prefill: the sections `W | U | S | uc | gc` of `gdn_fla_scratch`.
- Grouped FP8 MoE slab (`moe_fp8_scratch`, spec §10): its four parts' offsets.
- FP8 block-scaled activations: rows (`ceil16(M)`), scale columns and region bytes. The seed
  sizes the dense-FFN k-major scales with `floor(K / 128)` columns (spec §13); the kernel
  writes `ceil(K / 128)`; `fp8_scale_cols` names both roundings.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from jaxarena._units import ceil16, ceil_div, round_up

__all__ = [
    "SplitKPolicy",
    "parse_policy",
    "resolve_policy",
    "auto_splits",
    "legacy_splits",
    "num_splits",
    "workspace_slots",
    "SPLITK_TARGET_WAVES",
    "MAX_DECODE_SPLITS",
    "splitk_policy",
    "splitk_slot_bytes",
    "splitk_slots_needed",
    "SPLITK_ATTN_REGIONS",
    "SSD_CHUNK",
    "ssd_scratch_layout",
    "ssd_chunk_slot_bytes",
    "GDN_CHUNK",
    "GDN_HEAD_DIM",
    "GDN_SPARE_CHUNKS",
    "gdn_fla_chunk_slots",
    "gdn_fla_sections",
    "gdn_fla_scratch_layout",
    "FP8_BLOCK",
    "FP8_ACT_REGIONS",
    "fp8_rows",
    "fp8_scale_cols",
    "fp8_act_bytes",
    "ffn_fp8_uses_seed_regions",
    "MOE_FP8_PARTS",
    "moe_fp8_scratch_layout",
]

SPLITK_TARGET_WAVES = 2
MAX_DECODE_SPLITS = 16
_U32_MAX = 2**32 - 1

# Rust's `str::trim` strips exactly the Unicode White_Space set; Python's bare `strip()` also
# strips U+001C..U+001F, which the original keeps (spec §7.2), so the set is spelled out.
_RUST_WHITESPACE = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


@dataclasses.dataclass(frozen=True)
class SplitKPolicy:
    """A resolved split-K policy: `kind` is `"legacy"`, `"auto"` or `"pinned"`.

    `splits` is the pinned split count (1..16) for `"pinned"` and 0 otherwise.
    """

    kind: str
    splits: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("legacy", "auto", "pinned"):
            raise ValueError(f"SplitKPolicy kind={self.kind!r} must be legacy, auto or pinned")
        if self.kind == "pinned" and not 1 <= self.splits <= MAX_DECODE_SPLITS:
            raise ValueError(f"pinned splits={self.splits} must be in 1..{MAX_DECODE_SPLITS}")

    def __str__(self) -> str:
        return f"pinned({self.splits})" if self.kind == "pinned" else self.kind


LEGACY = SplitKPolicy("legacy")
AUTO = SplitKPolicy("auto")


def _clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


def parse_policy(spelling: str | None) -> SplitKPolicy | None:
    """Parses a split-K spelling as the seed does; returns None when it does not parse.

    Accepted (after trimming Rust whitespace and lower-casing ASCII letters): `legacy`, `auto`,
    `0`/`off`/`false`/`no` (one split), or a decimal u32 with an optional leading `+`
    (clamped to 1..16). Anything else, `-0`, `1_6`, non-ASCII digits and values above 2^32-1
    included, is None.
    """
    if spelling is None:
        return None
    s = spelling.strip(_RUST_WHITESPACE)
    s = "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)
    if s == "legacy":
        return LEGACY
    if s == "auto":
        return AUTO
    if s in ("0", "off", "false", "no"):
        return SplitKPolicy("pinned", 1)
    digits = s[1:] if s.startswith("+") else s
    if not digits or any(c not in "0123456789" for c in digits):
        return None
    value = int(digits)
    if value > _U32_MAX:
        return None
    return SplitKPolicy("pinned", _clamp(value, 1, MAX_DECODE_SPLITS))


def resolve_policy(declared: str, env_value: str | None) -> SplitKPolicy:
    """The environment's spelling wins when it parses; else the target's; else legacy."""
    from_env = parse_policy(env_value)
    if from_env is not None:
        return from_env
    return parse_policy(declared) or LEGACY


def auto_splits(sm_count: int, num_q_heads: int) -> int:
    """Splits that fill `SPLITK_TARGET_WAVES` waves of the SMs with one sequence's heads."""
    ctas = min(SPLITK_TARGET_WAVES * max(sm_count, 1), _U32_MAX)
    heads = max(num_q_heads, 1)
    return _clamp(-(-ctas // heads), 1, MAX_DECODE_SPLITS)


def legacy_splits(sm_count: int, num_q_heads: int, ref_seqs: int) -> int:
    """The legacy rule: split only while heads x sequences leave SMs idle."""
    ctas = min(max(num_q_heads, 1) * max(ref_seqs, 1), _U32_MAX)
    if ctas >= sm_count:
        return 1
    return sm_count // ctas


def num_splits(policy: SplitKPolicy, sm_count: int, num_q_heads: int, legacy_ref_seqs: int) -> int:
    """Splits per (sequence, head) that `policy` runs with."""
    if policy.kind == "legacy":
        return legacy_splits(sm_count, num_q_heads, legacy_ref_seqs)
    if policy.kind == "auto":
        return auto_splits(sm_count, num_q_heads)
    return _clamp(policy.splits, 1, MAX_DECODE_SPLITS)


def workspace_slots(
    policy: SplitKPolicy, sm_count: int, num_q_heads: int, max_rows: int, legacy_ref_seqs: int
) -> int:
    """Workspace slots the arena holds for `policy`.

    Legacy sizes one slot per SM whatever the batch (the legacy dispatch never needs more);
    every other policy sizes `rows * heads * splits`, saturating at 2^32-1 like the seed's u32
    arithmetic.
    """
    if policy.kind == "legacy":
        return max(sm_count, 1)
    splits = num_splits(policy, sm_count, num_q_heads, legacy_ref_seqs)
    return min(max(max_rows, 1) * max(num_q_heads, 1) * splits, _U32_MAX)


def splitk_policy(levers: Any, target: Any) -> SplitKPolicy:
    """The split-K policy in force: the lever's spelling when it parses, else the target's.

    Args:
      levers: a `jaxarena.Levers` (reads `attn_decode_splitk`).
      target: a `jaxarena.Target` (reads `attn_decode_splitk`).
    """
    return resolve_policy(target.attn_decode_splitk, levers.attn_decode_splitk)


def splitk_slot_bytes(head_dim: int) -> int:
    """Bytes of one split-K workspace slot: `o[head_dim]`, `m` and `l`, all f32."""
    return (head_dim + 2) * 4


def splitk_slots_needed(batch_size: int, num_q_heads: int, num_splits: int) -> int:
    """Workspace slots one call writes: `B * Hq * num_splits`, or 0 with a single split.

    A single split writes its normalised output directly and needs no workspace.
    """
    return 0 if num_splits == 1 else batch_size * num_q_heads * num_splits


SPLITK_ATTN_REGIONS: tuple[str, str] = ("splitk_workspace", "attn_output")
"""Arena regions the split-K decode-attention arena form uses: partials, output."""


# -- Mamba-2 SSD chunked scan -------------------------------------------------------------------

SSD_CHUNK = 64
"""Chunk length of the SSD chunked scan the arena is sized for."""


def ssd_scratch_layout(num_heads: int, n_groups: int, m: int) -> dict[str, tuple[int, int]]:
    """Byte `(offset, nbytes)` of the three f32 sections of the Mamba-2 SSD scratch.

    The chunked scan with chunk length 64 keeps `dt[H][nc][64]`, `dA_cumsum[H][nc][64]` and
    `CB[nc][G][64][64]` here, with `nc = ceil(m / 64) + 1` (one spare chunk for a stream whose
    start is not chunk-aligned).
    """
    nc = ceil_div(m, SSD_CHUNK) + 1
    g = max(n_groups, 1)
    dt = num_heads * nc * SSD_CHUNK * 4
    cb = nc * g * SSD_CHUNK * SSD_CHUNK * 4
    return {"dt": (0, dt), "dA_cumsum": (dt, dt), "CB": (2 * dt, cb)}


def ssd_chunk_slot_bytes(num_heads: int, n_groups: int) -> int:
    """Bytes of one chunk slot of the SSD scratch: `dt` and `dA_cumsum` (`H * 64` f32 each)
    and `CB` (`G * 64 * 64` f32), with `G = max(n_groups, 1)`; a region of `nbytes` holds
    `nbytes // ssd_chunk_slot_bytes(H, G)` slots."""
    return (2 * num_heads * SSD_CHUNK + max(n_groups, 1) * SSD_CHUNK * SSD_CHUNK) * 4


# -- Gated DeltaNet chunked prefill (FLA's algorithm) -------------------------------------------

GDN_CHUNK = 64
"""Chunk length of the GDN chunked prefill the arena is sized for."""

GDN_HEAD_DIM = 128
"""Key and value head dim the seed sizes `gdn_fla_scratch` for (other dims get no scratch)."""

GDN_SPARE_CHUNKS = 16
"""Spare chunk slots: every sequence is padded to whole chunks, 16 spares cover 17 sequences
(more run in rounds of the region's slots: `pallas_kernels.gdn_chunked_into`)."""

_GDN_ROW_BYTES = 256  # one section row: 128 bf16 values, or 64 f32 values of gc


def gdn_fla_chunk_slots(m: int) -> int:
    """Chunk slots `nt = ceil(m / 64) + 16` of the seed's `gdn_fla_scratch` for `m` tokens."""
    return ceil_div(m, GDN_CHUNK) + GDN_SPARE_CHUNKS


def gdn_fla_sections(
    num_value_heads: int, num_chunks: int, key_dim: int = GDN_HEAD_DIM
) -> dict[str, tuple[int, int]]:
    """Byte `(offset, nbytes)` of the sections `W | U | S | uc | gc` for `num_chunks` slots.

    Every section is made of 256-byte rows (the arena's row), in this order:

    - `W` (bf16): row `(c * nv + h) * 64 + i` holds `w` of row `i` of chunk slot `c`, value
      head `h` (its first `key_dim` values); `U` (bf16) and `uc` (bf16, `v_new`) the same with
      `u` and `v_new` (first `value_dim` values).
    - `S` (bf16): rows `(c * nv + h) * key_dim + r`, the state `[key_dim, value_dim]` of
      value head `h` at the start of chunk slot `c`.
    - `gc` (f32): row `c * nv + h`, the within-chunk cumulative sum of `g` (64 floats).

    With `key_dim = value_dim = 128` the byte counts are the seed's (spec section 6); smaller
    heads (the standalone kernel) use the first values of each row.
    """
    nv, nt, r = num_value_heads, num_chunks, _GDN_ROW_BYTES
    w = nt * nv * GDN_CHUNK * r
    state = nt * nv * key_dim * r
    gc = nt * nv * r
    out, off = {}, 0
    for name, n in (("W", w), ("U", w), ("S", state), ("uc", w), ("gc", gc)):
        out[name] = (off, n)
        off += n
    return out


def gdn_fla_scratch_layout(num_value_heads: int, m: int) -> dict[str, tuple[int, int]]:
    """Byte `(offset, nbytes)` of the seed's `gdn_fla_scratch` sections for `m` tokens.

    128x128 heads, chunks of 64, `nt = ceil(m / 64) + 16` slots (`gdn_fla_sections`).
    """
    return gdn_fla_sections(num_value_heads, gdn_fla_chunk_slots(m))


# -- FP8 block-scaled activations ---------------------------------------------------------------

FP8_BLOCK = 128
"""Columns per f32 scale of the FP8 GEMMs' activations (1 x 128 blocks)."""

FP8_ACT_REGIONS: tuple[str, str, str] = ("fp8_act", "fp8_act_scale", "fp8_act_scale_kmajor")
"""Arena regions the FP8 activation quantizer writes: q, row-major scales, k-major scales."""


def fp8_rows(m: int) -> int:
    """Rows of every FP8 activation buffer: `ceil16(M)` (the FP8 GEMMs read the pad rows)."""
    return ceil16(m)


def fp8_scale_cols(k: int, block: int = FP8_BLOCK, *, rounding: Literal["ceil", "floor"] = "ceil"):
    """Scale columns for `K` features in `block`-wide groups.

    `"ceil"` is what the quantizer writes (a partial last block gets a scale); `"floor"` is the
    seed's sizing of the dense-FFN `ffn_act_scale_kmajor` (spec §13), which only fits a `K`
    that is a multiple of `block`.
    """
    if rounding == "ceil":
        return ceil_div(k, block)
    if rounding == "floor":
        return k // block
    raise ValueError(f"rounding={rounding!r} must be 'ceil' or 'floor'")


def fp8_act_bytes(m: int, k: int, block: int = FP8_BLOCK) -> dict[str, int]:
    """Bytes the quantizer writes for `x[M, K]`, keyed by `FP8_ACT_REGIONS`' roles.

    Returns:
      `{"q": rows * K, "scale": rows * ceil(K / block) * 4, "kmajor": same}` with
      `rows = ceil16(M)`.
    """
    rows = fp8_rows(m)
    scales = rows * fp8_scale_cols(k, block) * 4
    return {"q": rows * k, "scale": scales, "kmajor": scales}


def ffn_fp8_uses_seed_regions(k: int) -> bool:
    """Whether an FFN projection with input width `K` may quantize into the seed's dense-FFN
    FP8 regions (`ffn_act_a`, `ffn_act_scale`, `ffn_act_scale_kmajor`).

    The seed sizes `ffn_act_scale_kmajor` with `floor(K / 128)` columns (spec §13) and the
    quantizer writes `ceil(K / 128)`, so the regions hold a projection's scales only when `K`
    is a multiple of 128. Otherwise the model keeps that projection's activations in bf16.
    """
    return k % FP8_BLOCK == 0


# -- Grouped FP8 MoE slab ------------------------------------------------------------------------

MOE_FP8_PARTS: tuple[str, str, str, str] = ("activation", "scales", "worklist", "counter")
"""The parts of `moe_fp8_scratch`, in arena order (spec §10)."""


def moe_fp8_scratch_layout(
    *,
    rows: int,
    top_k: int,
    num_experts: int,
    hidden_size: int,
    moe_intermediate_size: int,
    shared_expert_intermediate_size: int = 0,
) -> dict[str, tuple[int, int]]:
    """Byte `(offset, nbytes)` of each part of the grouped FP8 MoE slab for `rows` tokens.

    The seed's layout (spec §10), each part 256-aligned, for the wider of the shared expert
    (`rows` tokens of `max(hidden, shared_inter)`) and the routed experts (`rows * top_k`
    expanded rows of `moe_inter`): `activation` (e4m3, 1 B per element), `scales` (f32 per 128
    elements), `worklist` (8 bytes per tile item: `(ceil(rows * top_k / 128) + E + 1)` row
    tiles times `ceil(max(hidden, moe_inter) / 64)` column tiles) and `counter` (one u32).
    `nbytes` is each part's unrounded size; the slab's bytes are
    `offset + nbytes` of `counter`. Empty (all zeros) when `num_experts == 0`.
    """
    if num_experts == 0:
        return {p: (0, 0) for p in MOE_FP8_PARTS}
    expanded = rows * top_k
    shared_k = max(hidden_size, shared_expert_intermediate_size)
    inter = moe_intermediate_size
    activation = max(rows * shared_k, expanded * inter)
    scales = max(rows * ceil_div(shared_k, 128), expanded * ceil_div(inter, 128)) * 4
    items = (ceil_div(expanded, 128) + num_experts + 1) * ceil_div(max(hidden_size, inter), 64)
    scale_off = round_up(activation, 256)
    worklist_off = scale_off + round_up(scales, 256)
    counter_off = worklist_off + round_up(items * 8, 256)
    return {
        "activation": (0, activation),
        "scales": (scale_off, scales),
        "worklist": (worklist_off, items * 8),
        "counter": (counter_off, 4),
    }
