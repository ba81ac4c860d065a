"""Kernel bodies of split-K paged decode attention (the algorithms only; see `ops.py`).

Two passes, each one `pallas_call`:

**Attention pass** (`splitk_attention_kernel`), one program per `(sequence b, KV head kv,
query-head block j, split s)`. It handles the `block_h` query heads
`kv * G + j * block_h + [0, block_h)` of KV head `kv` (`G = Hq // Hkv`; rows at or past `G`
are padding: loaded as zeros, never stored), so every KV page it reads is used by the whole
group.

The keys of sequence `b` are positions `[t0, len)` with `len = min(seq_lens[b],
max_blocks_per_seq * block_size)` and `t0 = max(0, len - window)` (`t0 = 0` without a
window). They lie in the pages `[t0 // block_size, ceil(len / block_size))` of the block table;
pages before the window are never visited. Split `s` takes `P = ceil(n / num_splits)` of those
`n` pages, starting at page `t0 // block_size + s * P`; a split whose range is empty (short
sequence, `len == 0`) runs no iteration. The loop walks its pages one at a time, gathering
each through the block table, with the online softmax (running max `m`, running sum `l`,
unnormalised output `o`, all f32). Keys outside `[t0, len)` (the tail of the last page, the
head of the first page of a window) are masked by selection (`jnp.where`): their logits become
`-inf` and their values `0` before any arithmetic, so whatever a stale page holds (NaN
included) never reaches the output. Every page visited holds at least one valid key, so `m` is
finite after the first iteration and no `inf - inf` arises.

Per key: `x = sm_scale * k_scale * (q . k)`, then `x = softcap * tanh(x / softcap)` with a
soft-cap; values are `v_scale * v`. FP8 pages are converted to q's dtype (exact for e4m3) and
the per-KV-head scales multiply the dot products, not the pages. The P.V product keeps the f32
probabilities to 16 (bf16) or 22 (f16) significant bits as two 16-bit dots (`_probs_dot`):
they are never rounded once to v's dtype.

Head dims are processed in power-of-two column chunks (`80 = 64 + 16`, `576 = 512 + 64`): no
padding in HBM or registers. With `v_from_k` (MLA's latent cache) the values are the first
`D_v` columns of the key pages and reuse the key chunks already loaded.

With one split, the program finalises (`_finalize`) and stores the output (and the LSE); with
several it stores `(o, m, l)` of each query head in its workspace slot
`(b * num_splits + s) * Hq + h`, a row of `D_v + 2` f32 words `[o[0:D_v], m, l]`; an empty
split stores `o = 0, m = -inf, l = 0`.

**Combine pass** (`splitk_combine_kernel`), one program per `(b, kv, j)`: reads the
`num_splits` partials of its heads, merges them with the log-sum-exp rescaling (in split order,
the same arithmetic as a `jnp` sum over the split axis), finalises and stores the output.

Outputs and partials are stored as 32-bit words into a 2-D `uint32` operand (a `Place` says
where a region starts): the arena itself in the arena form, or the caller's workspace / a
fresh output buffer in the standalone form. 16-bit outputs are packed two per word
(little-endian, as the arena's bytes are laid out). Every index is int32: a region's first row
is a static Python int and offsets inside a region stay below 2^31 bytes (checked by the
wrapper).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._arena_io import Place

__all__ = ["Place", "KernelConfig", "splitk_attention_kernel", "splitk_combine_kernel"]

# f32 dots in IEEE precision (Triton would otherwise use TF32, 10 mantissa bits).
_HI = lax.Precision.HIGHEST
# Contract the last dim of both operands: `a @ b^T` without a transpose.
_NT = (((1,), (1,)), ((), ()))
_NN = (((1,), (0,)), ((), ()))
# Widest column piece the combine pass holds per split.
_COMBINE_COLS = 128


def _cdiv(a, b):
    return (a + b - 1) // b


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Static parameters of both passes (hashable: part of the jit cache key)."""

    sm_scale: float
    num_splits: int
    num_q_heads: int
    group_size: int
    block_h: int
    use_dot: bool
    qk_chunks: tuple[tuple[int, int], ...]  # (first column, width) of each key-dim chunk
    v_chunks: tuple[tuple[int, int], ...]  # the same for the value dim
    v_from_k: bool = False
    softcap: float | None = None
    window: int | None = None
    fp8: bool = False  # k/v scales present
    sinks: bool = False
    out_itemsize: int = 4  # 4: f32 words; 2: two 16-bit values per word
    out_dtype: str = "float32"
    return_lse: bool = False
    count_pages: bool = False
    # The destination is also an input (aliased), passed after the other inputs: skip that
    # ref (attention pass), or after src (combine pass, when src is not the destination).
    dst_is_input: bool = False
    # Where things go (None: not written by this call).
    ws: Place | None = None  # partial slots, rows of (d_v + 2) words
    out: Place | None = None  # output rows of d_v * itemsize / 4 words, row b * Hq + h

    @property
    def d_v(self) -> int:
        return sum(w for _, w in self.v_chunks)


def _rows(cfg: KernelConfig):
    """Query-head offsets of this program's rows and the mask of real (non-padding) rows."""
    j = pl.program_id(2)
    g = j * cfg.block_h + jnp.arange(cfg.block_h, dtype=jnp.int32)
    row_ok = g < cfg.group_size
    return g, row_ok


def _finalize(o_chunks, m, denom, sink, cfg: KernelConfig):
    """`o / l` (0 where `l == 0`) with the sink joining the denominator, and the LSE.

    `m` is the max the running sums are relative to (`-inf` or anything finite when `l == 0`).
    Without a sink this is exactly `where(l == 0, 0, o / l)`: only an exactly empty sum (no
    key) gives 0; a NaN sum (a NaN or infinite q, key or value) stays NaN, never a plausible 0.
    """
    if sink is not None:
        # gpt-oss: exp(sink) joins the sum; the sink has no value. Rescale to m' = max(m, sink).
        m_new = jnp.maximum(m, sink)
        alpha = jnp.where(denom > 0.0, jnp.exp(m - m_new), 0.0)
        denom = denom * alpha + jnp.exp(sink - m_new)
        o_chunks = [o * alpha[:, None] for o in o_chunks]
        m = m_new
    empty = denom == 0.0
    safe = jnp.where(empty, 1.0, denom)
    outs = [jnp.where(empty[:, None], 0.0, o / safe[:, None]) for o in o_chunks]
    lse = None
    if cfg.return_lse:
        lse = jnp.where(empty, -jnp.inf, m + jnp.log(safe))
    return outs, lse


def _store_words(dst_ref, place: Place, word0, words, row_ok):
    """Stores `words uint32[block_h, n]` at words `word0[:, None] + [0, n)` of `place`."""
    n = words.shape[1]
    idx = word0[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]
    r, c = place.at(idx)
    plgpu.store(dst_ref.at[r, c], words, mask=jnp.broadcast_to(row_ok[:, None], idx.shape))


def _store_vec(dst_ref, place: Place, word, vals, row_ok):
    """Stores f32 `vals[block_h]` as words at `word[block_h]` of `place`."""
    r, c = place.at(word)
    plgpu.store(dst_ref.at[r, c], lax.bitcast_convert_type(vals, jnp.uint32), mask=row_ok)


def _pack(x, cfg: KernelConfig):
    """f32 `[rows, w]` -> uint32 words of the output dtype, `[rows, w * itemsize / 4]`."""
    y = x.astype(jnp.dtype(cfg.out_dtype))
    if cfg.out_itemsize == 4:
        return lax.bitcast_convert_type(y, jnp.uint32)
    rows, w = x.shape
    bits = lax.bitcast_convert_type(y, jnp.uint16).astype(jnp.uint32).reshape(rows, w // 2, 2)
    lo, hi = jnp.split(bits, 2, axis=2)
    return (lo | (hi << jnp.uint32(16))).reshape(rows, w // 2)


def _store_output(dst_ref, lse_ref, chunks, outs, lse, row_ok, cfg: KernelConfig):
    """Stores the finalised output `chunks` of this program's heads (and the LSE)."""
    b, kv = pl.program_id(0), pl.program_id(1)
    g, _ = _rows(cfg)
    head = b * cfg.num_q_heads + kv * cfg.group_size + g  # row of [B * Hq, ...]
    row_words = cfg.d_v * cfg.out_itemsize // 4
    for (c0, _), o in zip(chunks, outs, strict=True):
        _store_words(dst_ref, cfg.out, head * row_words + c0 * cfg.out_itemsize // 4,
                     _pack(o, cfg), row_ok)  # fmt: skip
    if lse_ref is not None:
        head0 = kv * cfg.group_size + pl.program_id(2) * cfg.block_h
        mask = None if cfg.group_size % cfg.block_h == 0 else row_ok
        plgpu.store(lse_ref.at[b, pl.ds(head0, cfg.block_h)], lse, mask=mask)


def _probs_dot(probs, v, acc):
    """`acc + probs f32[h, t] @ v[t, d]` in f32, with `v` in a 16-bit dtype on the tensor cores.

    Rounding the probabilities to v's dtype once (as a plain `probs.astype(v.dtype)` dot
    would) costs up to half a bf16 ulp (2^-9 relative) on every weight: about 2e-3 absolute
    on MLA's 512-wide outputs, 37x vLLM's bf16 tolerance on its MLA decode grid. Instead the
    probabilities are split into `hi = round(p)` and `lo = round(p - hi)` and both products
    are accumulated in f32: `hi + lo` carries 2x the mantissa bits (16 for bf16, 22 for f16),
    and `v` (already in its dtype) is exact, so the result is the f32 product up to about
    2^-17 relative, below the output's own rounding. `p - hi` is exact in f32. An f32 `v`
    takes one IEEE f32 dot. Each product is added to `acc` on its own (`acc + dot`), which
    Triton folds into the MMA's accumulator: no separate product tile is held.
    """

    def dot(a):
        return lax.dot_general(a, v, _NN, precision=_HI, preferred_element_type=jnp.float32)

    if v.dtype == jnp.float32:
        return acc + dot(probs)
    hi = probs.astype(v.dtype)
    lo = (probs - hi.astype(jnp.float32)).astype(v.dtype)
    return (acc + dot(hi)) + dot(lo)


def splitk_attention_kernel(*refs, cfg: KernelConfig):
    """One `(b, kv, j, s)` program of the attention pass.

    Refs, in order: q `[B, Hq, D_qk]`; k `[num_blocks, block_size, Hkv, D_qk]`; v
    `[num_blocks, block_size, Hkv, D_v]` (absent with `v_from_k`); block_tables
    `int32[B, max_blocks_per_seq]`; seq_lens `int32[B]`; k_scale, v_scale `f32[Hkv]` (with
    `fp8`); sinks `f32[Hq]` (with `sinks`); dst_in (the aliased destination, unused) when
    the destination is an input; then the outputs: dst `uint32[rows, width]`, lse `f32[B, Hq]`
    (one split with `return_lse`), pages `int32[B, Hkv, blocks, S]` (with `count_pages`).
    """
    refs = list(refs)
    q_ref, k_ref = refs.pop(0), refs.pop(0)
    v_ref = k_ref if cfg.v_from_k else refs.pop(0)
    block_tables_ref, seq_lens_ref = refs.pop(0), refs.pop(0)
    k_scale_ref = v_scale_ref = sinks_ref = None
    if cfg.fp8:
        k_scale_ref, v_scale_ref = refs.pop(0), refs.pop(0)
    if cfg.sinks:
        sinks_ref = refs.pop(0)
    write_partials = cfg.num_splits > 1
    if cfg.dst_is_input:
        refs.pop(0)  # dst_in: aliased to dst, written through the output ref only
    dst_ref = refs.pop(0)
    lse_ref = refs.pop(0) if (cfg.return_lse and not write_partials) else None
    pages_ref = refs.pop(0) if cfg.count_pages else None
    assert not refs, refs

    b, kv, j, s = (pl.program_id(i) for i in range(4))
    num_blocks, block_size = k_ref.shape[:2]
    max_pages = block_tables_ref.shape[1]
    q_dtype = q_ref.dtype

    g, row_ok = _rows(cfg)
    row_mask = None if cfg.group_size % cfg.block_h == 0 else row_ok[:, None]
    head0 = kv * cfg.group_size + j * cfg.block_h
    q_chunks = [
        plgpu.load(
            q_ref.at[b, pl.ds(head0, cfg.block_h), pl.ds(c0, w)],
            mask=row_mask,
            other=None if row_mask is None else 0.0,
        )
        for c0, w in cfg.qk_chunks
    ]
    if not cfg.use_dot:  # pages narrower than Triton's 16-wide minimum: f32 multiply-and-sum
        q_chunks = [qc.astype(jnp.float32) for qc in q_chunks]

    seq_len = jnp.minimum(seq_lens_ref[b], max_pages * block_size)
    num_pages = _cdiv(seq_len, block_size)
    if cfg.window is None:
        t0 = None
        first_page = 0
    else:
        t0 = jnp.maximum(seq_len - cfg.window, 0)
        first_page = t0 // block_size
    pages_per_split = _cdiv(num_pages - first_page, cfg.num_splits)
    first = first_page + s * pages_per_split
    last = jnp.minimum(first + pages_per_split, num_pages)
    offsets = jnp.arange(block_size)
    k_scale = k_scale_ref[kv] if cfg.fp8 else None
    v_scale = v_scale_ref[kv] if cfg.fp8 else None

    def load_page(ref, page, chunks):
        tiles = [ref[page, pl.ds(0, block_size), kv, pl.ds(c0, w)] for c0, w in chunks]
        if cfg.fp8 or not cfg.use_dot:
            # e4m3 -> q's dtype is exact; the no-dot path works in f32.
            want = q_dtype if cfg.use_dot else jnp.float32
            tiles = [t.astype(want) for t in tiles]
        return tiles

    def body(p, carry):
        o_prev, m_prev, sum_prev, count = carry
        # Clamp the page id: a bad table entry reads a wrong page, never out of bounds.
        page = jnp.clip(block_tables_ref[b, p], 0, num_blocks - 1)
        k_tiles = load_page(k_ref, page, cfg.qk_chunks)
        if cfg.v_from_k:
            by_chunk = dict(zip(cfg.qk_chunks, k_tiles, strict=True))
            v_tiles = [
                by_chunk[c] if c in by_chunk else load_page(k_ref, page, (c,))[0]
                for c in cfg.v_chunks
            ]
        else:
            v_tiles = load_page(v_ref, page, cfg.v_chunks)
        logits = None
        for qc, kc in zip(q_chunks, k_tiles, strict=True):
            if cfg.use_dot:
                part = lax.dot_general(qc, kc, _NT, precision=_HI,
                                       preferred_element_type=jnp.float32)  # fmt: skip
            else:
                part = jnp.sum(qc[:, None, :] * kc[None, :, :], axis=2)
            logits = part if logits is None else logits + part
        if cfg.fp8:
            logits = logits * k_scale
        logits = logits * cfg.sm_scale  # [block_h, block_size]
        if cfg.softcap is not None:
            logits = cfg.softcap * jnp.tanh(logits / cfg.softcap)
        pos = p * block_size + offsets
        valid = pos < seq_len
        if t0 is not None:
            valid = valid & (pos >= t0)
        logits = jnp.where(valid[None, :], logits, -jnp.inf)
        m_next = jnp.maximum(m_prev, jnp.max(logits, axis=1))
        alpha = jnp.exp(m_prev - m_next)
        probs = jnp.exp(logits - m_next[:, None])
        sum_next = alpha * sum_prev + jnp.sum(probs, axis=1)
        o_next = []
        for o, vc in zip(o_prev, v_tiles, strict=True):
            vc = jnp.where(valid[:, None], vc, jnp.zeros_like(vc))  # never 0 * NaN
            if cfg.use_dot and not cfg.fp8:
                o_next.append(_probs_dot(probs, vc, alpha[:, None] * o))
                continue
            if cfg.use_dot:
                pv = _probs_dot(probs, vc, jnp.zeros((probs.shape[0], vc.shape[1]), jnp.float32))
            else:
                pv = jnp.sum(probs[:, :, None] * vc[None, :, :], axis=1)
            if cfg.fp8:
                pv = pv * v_scale
            o_next.append(alpha[:, None] * o + pv)
        return o_next, m_next, sum_next, count + 1

    o = [jnp.zeros((cfg.block_h, w), jnp.float32) for _, w in cfg.v_chunks]
    m = jnp.full((cfg.block_h,), -jnp.inf, jnp.float32)
    denom = jnp.zeros((cfg.block_h,), jnp.float32)  # the running sum `l`
    o, m, denom, count = lax.fori_loop(first, last, body, (o, m, denom, jnp.int32(0)))

    if pages_ref is not None:
        pages_ref[b, kv, j, s] = count

    if write_partials:
        slot = (b * cfg.num_splits + s) * cfg.num_q_heads + kv * cfg.group_size + g
        word0 = slot * (cfg.d_v + 2)
        for (c0, _), oc in zip(cfg.v_chunks, o, strict=True):
            words = lax.bitcast_convert_type(oc, jnp.uint32)
            _store_words(dst_ref, cfg.ws, word0 + c0, words, row_ok)
        _store_vec(dst_ref, cfg.ws, word0 + cfg.d_v, m, row_ok)
        _store_vec(dst_ref, cfg.ws, word0 + cfg.d_v + 1, denom, row_ok)
    else:
        sink = _load_sinks(sinks_ref, head0, row_mask, cfg)
        outs, lse = _finalize(o, m, denom, sink, cfg)
        _store_output(dst_ref, lse_ref, cfg.v_chunks, outs, lse, row_ok, cfg)


def _load_sinks(sinks_ref, head0, row_mask, cfg: KernelConfig):
    if sinks_ref is None:
        return None
    mask = None if row_mask is None else row_mask[:, 0]
    return plgpu.load(sinks_ref.at[pl.ds(head0, cfg.block_h)], mask=mask,
                      other=None if mask is None else 0.0)  # fmt: skip


def splitk_combine_kernel(*refs, cfg: KernelConfig):
    """One `(b, kv, j)` program of the combine pass.

    Refs, in order: sinks `f32[Hq]` (with `sinks`); src `uint32[rows, width]` holding the
    partials at `cfg.ws`; dst_in (with `dst_is_input`: a separate destination, aliased); then
    the outputs: dst `uint32[rows', width']` (in the arena form the same buffer as src,
    aliased, unless dst_in is given) and lse `f32[B, Hq]` (with `return_lse`).
    """
    refs = list(refs)
    sinks_ref = refs.pop(0) if cfg.sinks else None
    src_ref = refs.pop(0)  # in the arena form the aliased arena: read through the input ref
    if cfg.dst_is_input:
        refs.pop(0)  # dst_in: a separate destination aliased to dst (interpreted arena windows)
    dst_ref = refs.pop(0)
    lse_ref = refs.pop(0) if cfg.return_lse else None
    assert not refs, refs
    b, kv, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    g, row_ok = _rows(cfg)
    head0 = kv * cfg.group_size + j * cfg.block_h
    row_mask = None if cfg.group_size % cfg.block_h == 0 else row_ok[:, None]
    d_v = cfg.d_v

    def load_words(word0, n):
        idx = word0[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]
        r, c = cfg.ws.at(idx)
        mask = jnp.broadcast_to(row_ok[:, None], idx.shape)
        w = plgpu.load(src_ref.at[r, c], mask=mask, other=0)
        return lax.bitcast_convert_type(w, jnp.float32)

    def load_vec(word):
        r, c = cfg.ws.at(word)
        w = plgpu.load(src_ref.at[r, c], mask=row_ok, other=0)
        return lax.bitcast_convert_type(w, jnp.float32)

    def word0(s):
        slot = (b * cfg.num_splits + s) * cfg.num_q_heads + kv * cfg.group_size + g
        return slot * (d_v + 2)

    # Loops over the splits (not unrolled: 16 splits of 512-wide MLA rows would spill), in
    # split order: the same sums as a sequential `jnp` reduction over the split axis.
    n = cfg.num_splits

    def m_of(s):
        return load_vec(word0(s) + d_v)

    def weight(s, m_max):
        return jnp.exp(m_of(s) - m_max)  # 0 for an empty split

    m_max = lax.fori_loop(0, n, lambda s, acc: jnp.maximum(acc, m_of(s)),
                          jnp.full((cfg.block_h,), -jnp.inf, jnp.float32))  # fmt: skip
    # All splits empty (seq_len 0): m_max = -inf; use 0 so that the weights are exp(-inf) = 0.
    m_max = jnp.where(jnp.isfinite(m_max), m_max, 0.0)
    l_sum = lax.fori_loop(
        0, n, lambda s, acc: acc + weight(s, m_max) * load_vec(word0(s) + d_v + 1),
        jnp.zeros_like(m_max),
    )  # fmt: skip
    # Columns in pieces of at most _COMBINE_COLS (MLA's 512-wide values would spill).
    pieces = [
        (c0 + i, min(_COMBINE_COLS, w))
        for c0, w in cfg.v_chunks
        for i in range(0, w, _COMBINE_COLS)
    ]
    o_sum = []
    for c0, w in pieces:

        def add(s, acc, c0=c0, w=w):
            return acc + weight(s, m_max)[:, None] * load_words(word0(s) + c0, w)

        o_sum.append(lax.fori_loop(0, n, add, jnp.zeros((cfg.block_h, w), jnp.float32)))
    sink = _load_sinks(sinks_ref, head0, row_mask, cfg)
    outs, lse = _finalize(o_sum, m_max, l_sum, sink, cfg)
    _store_output(dst_ref, lse_ref, pieces, outs, lse, row_ok, cfg)
