"""Kernel body of paged prefill attention (the algorithm only; see `ops.py`).

One `pallas_call`, one program per `(query tile i, KV head kv, query-head block j)`.

**Rows.** A program owns `block_m = block_t * block_h` query rows: `block_t` consecutive
tokens of ONE sequence times the `block_h` query heads `kv * G + j * block_h + [0, block_h)`
of KV head `kv` (`G = Hq // Hkv`), row `r` being token `r // block_h`, head `r % block_h`. So
every key and value it loads serves the whole group (GQA reads each KV page once per
`block_t` tokens, not once per query head). Rows past the tile's last token, or at a head
`>= G`, are padding: computed on zeros, never stored.

**Tiles.** The tile table (`int32[max_tiles, 5]`, built with `jnp` by the wrapper, O(T + S))
gives each tile `(q0, q1, pos0, seq, kv_end)`: its tokens `[q0, q1)` of the packed queries,
the position of token `q0` in its sequence, the sequence (its block-table row) and the end of
the keys it can see (`pos of q1 - 1, plus 1`). Query token `t` of the tile sits at position
`pos0 + t - q0` and sees the keys `[pos - window + 1, pos]` (`[0, pos]` without a window).
Padding tokens (past `cu_seqlens[-1]`) get tiles with `kv_end = 0`: no key, zeros stored.
Tiles past the table's used part have `q0 == q1` and store nothing.

**Keys.** The program walks key positions `[kv_start, kv_end)` in blocks of `block_k`
(`kv_start = max(0, pos0 - window + 1)`, the first row's window start, or 0): a
dynamic-bound `fori_loop`, so nothing past the causal limit or before the window is read.
Each key position is gathered through the block table (`page = block_tables[seq, p //
block_size]`, row `p % block_size`), so pages of any size (smaller or larger than
`block_k`) are read the same way; page ids are clamped into `[0, num_blocks)` and positions
past the table into its last column, so bad input reads a wrong key, never out of bounds.

Per row and key: `x = sm_scale * (q . k)`, `x = softcap * tanh(x / softcap)` with a soft-cap,
then keys outside the row's causal window are selected away (`-inf` logits, zero values:
stale cache bytes, NaN included, never reach the arithmetic). The online softmax keeps the
running max `m`, sum `l` and unnormalised output `o` in f32; a row whose keys so far are all
masked keeps `m = -inf` and uses 0 as the reference max, so no `inf - inf` arises.

Head dims run in power-of-two column chunks (`80 = 64 + 16`, `576 = 512 + 64`), each at
least 16 wide (Triton's dot minimum): a narrower chunk (the `8` of `24 = 16 + 8`) is loaded
16 wide with the extra columns masked to zero, exact for both dots. bf16 dots take bf16
operands (probabilities rounded to bf16 for `P.V`, as FlashAttention does) with f32
accumulation; f32 dots run at `HIGHEST` precision (IEEE, not TF32).

FP8 KV cache (`fp8`, vLLM's `kv_cache_dtype="fp8"`): the pages are `float8_e4m3fn` and the
real key is `k_scale[kv] * k`, the real value `v_scale[kv] * v`. The tiles are converted to
q's dtype as they are loaded (exact: every e4m3 value is a bf16, f16 and f32 value), so the
dots are those of a bf16 cache; `k_scale` joins `sm_scale` in the one multiply of the logits
and `v_scale` multiplies the normalised output once (`P.V` is linear in `v`).

The output is stored as 32-bit words (16-bit values packed two per word, little-endian)
into a 2-D `uint32` operand at a `Place`: a fresh buffer in the standalone form, the arena's
`attn_output` region in the arena form. Row `t * Hq + h` of `[T * Hq, D_v]` is token `t`,
head `h`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._arena_io import Place

__all__ = ["Place", "PrefillConfig", "prefill_attention_kernel", "TILE_FIELDS"]

_HI = lax.Precision.HIGHEST
_NT = (((1,), (1,)), ((), ()))  # a @ b^T without a transpose
_NN = (((1,), (0,)), ((), ()))
# Columns of the tile table.
TILE_FIELDS = ("q0", "q1", "pos0", "seq", "kv_end")


@dataclasses.dataclass(frozen=True)
class PrefillConfig:
    """Static parameters of the kernel (hashable: part of the jit cache key)."""

    sm_scale: float
    num_q_heads: int
    num_kv_heads: int
    group_size: int
    block_h: int  # query heads per program (a power of two)
    block_t: int  # tokens per program; block_m = block_t * block_h rows
    block_k: int  # keys per loop iteration
    page_size: int
    num_blocks: int
    max_pages: int
    # (first column, real width, loaded width >= 16) of each column chunk.
    qk_chunks: tuple[tuple[int, int, int], ...]
    v_chunks: tuple[tuple[int, int, int], ...]
    softcap: float | None = None
    window: int | None = None
    sinks: bool = False
    fp8: bool = False  # float8_e4m3fn pages, with k_scale / v_scale refs
    out_itemsize: int = 4
    out_dtype: str = "float32"
    out: Place = Place(0, 0, 1)
    dst_is_input: bool = False  # the destination is also an (aliased) input, after the others

    @property
    def d_v(self) -> int:
        return sum(w for _, w, _ in self.v_chunks)

    @property
    def block_m(self) -> int:
        return self.block_t * self.block_h


def _pack(x, cfg: PrefillConfig):
    """f32 `[rows, w]` -> uint32 words of the output dtype, `[rows, w * itemsize / 4]`."""
    y = x.astype(jnp.dtype(cfg.out_dtype))
    if cfg.out_itemsize == 4:
        return lax.bitcast_convert_type(y, jnp.uint32)
    rows, w = x.shape
    bits = lax.bitcast_convert_type(y, jnp.uint16).astype(jnp.uint32).reshape(rows, w // 2, 2)
    lo, hi = jnp.split(bits, 2, axis=2)
    return (lo | (hi << jnp.uint32(16))).reshape(rows, w // 2)


def _load_cols(ref, rows, c0, w, wpad, row_ok):
    """`ref[rows, c0:c0 + w]` as `[len(rows), wpad]` (columns past `w` and rows not `row_ok`
    read as 0): a gather of whole rows."""
    cols = c0 + jnp.arange(wpad, dtype=jnp.int32)
    shape = (rows.shape[0], wpad)
    r = jnp.broadcast_to(rows[:, None], shape)
    c = jnp.broadcast_to(cols[None, :], shape)
    mask = None
    if row_ok is not None:
        mask = jnp.broadcast_to(row_ok[:, None], shape)
    if wpad != w:
        col_ok = jnp.broadcast_to((jnp.arange(wpad) < w)[None, :], shape)
        mask = col_ok if mask is None else mask & col_ok
        c = jnp.where(col_ok, c, c0)  # keep masked addresses in bounds too
    if mask is None:
        return plgpu.load(ref.at[r, c])
    return plgpu.load(ref.at[r, c], mask=mask, other=0)


def prefill_attention_kernel(*refs, cfg: PrefillConfig):
    """One `(i, kv, j)` program.

    Refs, in order: q `[T * Hq, D_qk]`; k `[num_blocks * page_size * Hkv, D_qk]`; v
    `[num_blocks * page_size * Hkv, D_v]` (the k ref again for MLA's latent cache);
    block_tables `int32[S * max_pages]`; tiles `int32[max_tiles, 5]`; k_scale, v_scale
    `f32[Hkv]` (with `fp8`); sinks `f32[Hq]` (with `sinks`); dst_in (with `dst_is_input`: the aliased destination, unused); dst
    `uint32[rows, width]` (the output).
    """
    refs = list(refs)
    q_ref, k_ref, v_ref, bt_ref, tiles_ref = (refs.pop(0) for _ in range(5))
    k_scale_ref, v_scale_ref = (refs.pop(0), refs.pop(0)) if cfg.fp8 else (None, None)
    sinks_ref = refs.pop(0) if cfg.sinks else None
    if cfg.dst_is_input:
        refs.pop(0)  # dst_in: aliased to dst, written through the output ref only
    dst_ref = refs.pop(0)
    assert not refs, refs

    i, kv, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q0, q1, pos0, seq, kv_end = (tiles_ref[i, f] for f in range(len(TILE_FIELDS)))
    G, bh, bm, bk = cfg.group_size, cfg.block_h, cfg.block_m, cfg.block_k

    r = jnp.arange(bm, dtype=jnp.int32)
    tok_off = r // bh  # token of row r, relative to q0
    g = j * bh + r % bh  # query head of row r within the group
    tok = q0 + tok_off
    head = kv * G + g
    row_ok = (tok < q1) & (g < G)
    row_pos = pos0 + tok_off  # position of the row's token in its sequence
    q_rows = jnp.where(row_ok, tok * cfg.num_q_heads + head, 0)
    q_tiles = [_load_cols(q_ref, q_rows, c0, w, wp, row_ok) for c0, w, wp in cfg.qk_chunks]
    dtype = q_tiles[0].dtype
    precision = _HI if dtype == jnp.float32 else None
    logit_scale = cfg.sm_scale
    if cfg.fp8:
        logit_scale = cfg.sm_scale * k_scale_ref[kv]

    def load_kv(ref, rows, c0, w, wp):
        t = _load_cols(ref, rows, c0, w, wp, None)
        return t.astype(dtype) if cfg.fp8 else t  # e4m3 -> q's dtype is exact

    if cfg.window is None:
        kv_start = jnp.int32(0)
    else:
        kv_start = jnp.maximum(pos0 - cfg.window + 1, 0)
    num_iters = jnp.maximum(kv_end - kv_start + bk - 1, 0) // bk
    key_off = jnp.arange(bk, dtype=jnp.int32)
    bt_row0 = seq * cfg.max_pages

    def body(it, carry):
        o_prev, m_prev, l_prev = carry
        kp = kv_start + it * bk + key_off  # key positions of this block
        col = jnp.clip(kp // cfg.page_size, 0, cfg.max_pages - 1)
        page = jnp.clip(plgpu.load(bt_ref.at[bt_row0 + col]), 0, cfg.num_blocks - 1)
        k_rows = (page * cfg.page_size + kp % cfg.page_size) * cfg.num_kv_heads + kv
        logits = None
        for qt, (c0, w, wp) in zip(q_tiles, cfg.qk_chunks, strict=True):
            kt = load_kv(k_ref, k_rows, c0, w, wp)
            part = lax.dot_general(qt, kt, _NT, precision=precision,
                                   preferred_element_type=jnp.float32)  # fmt: skip
            logits = part if logits is None else logits + part
        logits = logits * logit_scale  # [bm, bk]
        if cfg.softcap is not None:
            logits = cfg.softcap * jnp.tanh(logits / cfg.softcap)
        valid = (kp[None, :] <= row_pos[:, None]) & (kp[None, :] < kv_end)
        if cfg.window is not None:
            valid = valid & (kp[None, :] > row_pos[:, None] - cfg.window)
        logits = jnp.where(valid, logits, -jnp.inf)
        m_next = jnp.maximum(m_prev, jnp.max(logits, axis=1))
        m_ref = jnp.where(m_next == -jnp.inf, 0.0, m_next)  # all masked so far: no inf - inf
        alpha = jnp.exp(m_prev - m_ref)
        probs = jnp.exp(logits - m_ref[:, None])
        l_next = alpha * l_prev + jnp.sum(probs, axis=1)
        key_ok = kp < kv_end
        o_next = []
        for o, (c0, w, wp) in zip(o_prev, cfg.v_chunks, strict=True):
            vt = load_kv(v_ref, k_rows, c0, w, wp)
            vt = jnp.where(key_ok[:, None], vt, jnp.zeros_like(vt))  # never 0 * NaN
            pv = lax.dot_general(probs.astype(vt.dtype), vt, _NN, precision=precision,
                                 preferred_element_type=jnp.float32)  # fmt: skip
            o_next.append(alpha[:, None] * o + pv)
        return o_next, m_next, l_next

    o = [jnp.zeros((bm, wp), jnp.float32) for _, _, wp in cfg.v_chunks]
    m = jnp.full((bm,), -jnp.inf, jnp.float32)
    denom = jnp.zeros((bm,), jnp.float32)
    o, m, denom = lax.fori_loop(0, num_iters, body, (o, m, denom))

    if sinks_ref is not None:
        # gpt-oss: exp(sink) joins the sum with no value. Rescale to m' = max(m, sink).
        sink = plgpu.load(sinks_ref.at[jnp.where(row_ok, head, 0)])
        m_new = jnp.maximum(m, sink)
        alpha = jnp.where(denom > 0.0, jnp.exp(m - m_new), 0.0)
        denom = denom * alpha + jnp.exp(sink - m_new)
        o = [oc * alpha[:, None] for oc in o]
    # Only an exactly empty sum (no key, no sink) gives 0; a NaN sum stays NaN.
    empty = denom == 0.0
    safe = jnp.where(empty, 1.0, denom)
    if cfg.fp8:
        safe = safe / v_scale_ref[kv]  # out = v_scale * o / l
    row_words = cfg.d_v * cfg.out_itemsize // 4
    out_row = (tok * cfg.num_q_heads + head) * row_words
    for (c0, w, wp), oc in zip(cfg.v_chunks, o, strict=True):
        words = _pack(jnp.where(empty[:, None], 0.0, oc / safe[:, None]), cfg)
        n = wp * cfg.out_itemsize // 4
        idx = out_row[:, None] + (c0 * cfg.out_itemsize // 4) + jnp.arange(n, dtype=jnp.int32)
        mask = row_ok[:, None] & (jnp.arange(n) < w * cfg.out_itemsize // 4)[None, :]
        # Masked addresses are left as they are (never clamped to one word: the interpreter
        # scatters masked lanes too, writing back what it read, and a duplicate of a real
        # lane's address could win over the real value).
        rr, cc = cfg.out.at(idx)
        plgpu.store(dst_ref.at[rr, cc], words, mask=mask)
