"""Kernel body of split-K paged decode attention (the algorithm only; see `ops.py`).

One program per `(sequence b, KV head kv, query-head block j, split s)`. It handles the
`block_h` query heads `kv * G + j * block_h + [0, block_h)` of KV head `kv` (`G = Hq // Hkv`;
rows at or past `G` are padding: loaded as zeros, never stored), so every KV page it reads is
used by the whole group.

The keys of sequence `b` are the `num_pages = ceil(len / block_size)` pages of its block
table, with `len = min(seq_lens[b], max_blocks_per_seq * block_size)`. Split `s` takes the
pages `[s * P, min((s + 1) * P, num_pages))` with `P = ceil(num_pages / num_splits)`; a split
whose range is empty (short sequence, or `len == 0`) runs no iteration. The loop walks the
split's pages one at a time, gathering each through the block table, with the online softmax
(running max `m`, running sum `l`, unnormalised output `o`, all f32); keys at positions
`>= len` in the last page are masked by selection (`jnp.where`): their logits become `-inf`
and their values 0 before any arithmetic, so whatever the unused tail of a page holds (a NaN
left by an earlier tenant included) never reaches the output (0 * NaN would be NaN). Every
page visited holds at least one valid key, so `m` is finite after the first iteration and no
`inf - inf` arises for finite input; a NaN or infinite q, key or value propagates as NaN.

With `write_partials=True` the program stores `(o, m, l)` of each of its query heads in that
head's workspace slot `(b * num_splits + s) * Hq + h`, a row `[o[0:D], m, l]` of the f32
workspace `[slots, D + 2]`; an empty split stores `o = 0, m = -inf, l = 0`. With
`write_partials=False` (one split) it stores the final `o / l` (0 where `l == 0`, i.e. no key;
NaN stays NaN) straight into the output `[B, Hq, D]`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["splitk_decode_attention_kernel"]

# f32 dots in IEEE precision (Triton would otherwise use TF32, 10 mantissa bits).
_HI = lax.Precision.HIGHEST
# Contract the last dim of both operands: `a @ b^T` without a transpose.
_NT = (((1,), (1,)), ((), ()))


def _cdiv(a, b):
    return (a + b - 1) // b


def splitk_decode_attention_kernel(
    q_ref,
    k_ref,
    v_ref,
    block_tables_ref,
    seq_lens_ref,
    *refs,
    sm_scale: float,
    num_splits: int,
    num_q_heads: int,
    group_size: int,
    block_h: int,
    write_partials: bool,
    use_dot: bool,
):
    """One `(b, kv, j, s)` program. Refs (whole arrays; the kernel does its own addressing):

    q `[B, Hq, D]`, k / v `[num_blocks, block_size, Hkv, D]`, block_tables
    `int32[B, max_blocks_per_seq]`, seq_lens `int32[B]`; then either (`write_partials`)
    ws_in (aliased to ws, unused) and ws `f32[slots, D + 2]`, or out `[B, Hq, D]`.
    """
    b = pl.program_id(0)
    kv = pl.program_id(1)
    j = pl.program_id(2)
    s = pl.program_id(3)
    num_blocks, block_size, _, head_dim = k_ref.shape
    max_pages = block_tables_ref.shape[1]

    # Query rows of this program; rows >= group_size belong to the next KV head (or past the
    # end of q) and are masked on load and store.
    g = j * block_h + jnp.arange(block_h)
    row_ok = g < group_size
    row_mask = None if group_size % block_h == 0 else row_ok[:, None]
    head0 = kv * group_size + j * block_h
    q = plgpu.load(
        q_ref.at[b, pl.ds(head0, block_h), pl.ds(0, head_dim)],
        mask=row_mask,
        other=None if row_mask is None else 0.0,
    )
    # Without a dot (pages narrower than Triton's 16-wide minimum) the products run in f32.
    q_f32 = None if use_dot else q.astype(jnp.float32)

    seq_len = jnp.minimum(seq_lens_ref[b], max_pages * block_size)
    num_pages = _cdiv(seq_len, block_size)
    pages_per_split = _cdiv(num_pages, num_splits)
    first = s * pages_per_split
    last = jnp.minimum(first + pages_per_split, num_pages)
    offsets = jnp.arange(block_size)

    def body(p, carry):
        o_prev, m_prev, sum_prev = carry
        # Clamp the page id: a bad table entry reads a wrong page, never out of bounds.
        page = jnp.clip(block_tables_ref[b, p], 0, num_blocks - 1)
        k = k_ref[page, pl.ds(0, block_size), kv, pl.ds(0, head_dim)]  # [block_size, D]
        v = v_ref[page, pl.ds(0, block_size), kv, pl.ds(0, head_dim)]
        if use_dot:
            logits = lax.dot_general(q, k, _NT, precision=_HI, preferred_element_type=jnp.float32)
        else:
            kf = k.astype(jnp.float32)
            logits = jnp.sum(q_f32[:, None, :] * kf[None, :, :], axis=2)
        logits = logits * sm_scale  # [block_h, block_size]
        valid = (p * block_size + offsets) < seq_len
        logits = jnp.where(valid[None, :], logits, -jnp.inf)
        v = jnp.where(valid[:, None], v, jnp.zeros_like(v))  # select: never 0 * stale NaN
        m_next = jnp.maximum(m_prev, jnp.max(logits, axis=1))
        alpha = jnp.exp(m_prev - m_next)
        probs = jnp.exp(logits - m_next[:, None])
        sum_next = alpha * sum_prev + jnp.sum(probs, axis=1)
        if use_dot:
            pv = lax.dot_general(
                probs.astype(v.dtype),
                v,
                (((1,), (0,)), ((), ())),
                precision=_HI,
                preferred_element_type=jnp.float32,
            )
        else:
            pv = jnp.sum(probs[:, :, None] * v.astype(jnp.float32)[None, :, :], axis=1)
        return alpha[:, None] * o_prev + pv, m_next, sum_next

    o = jnp.zeros((block_h, head_dim), jnp.float32)
    m = jnp.full((block_h,), -jnp.inf, jnp.float32)
    denom = jnp.zeros((block_h,), jnp.float32)  # the running sum `l`
    o, m, denom = lax.fori_loop(first, last, body, (o, m, denom))

    if write_partials:
        _, ws_ref = refs  # ws_in is aliased to ws; written through the output ref only
        slot0 = (b * num_splits + s) * num_q_heads + head0
        rows = pl.ds(slot0, block_h)
        vec_mask = None if row_mask is None else row_ok
        plgpu.store(ws_ref.at[rows, pl.ds(0, head_dim)], o, mask=row_mask)
        # Traced column indices: the interpreter's store rule needs array-like scalars.
        col_m = jnp.int32(head_dim)
        plgpu.store(ws_ref.at[rows, col_m], m, mask=vec_mask)
        plgpu.store(ws_ref.at[rows, col_m + 1], denom, mask=vec_mask)
    else:
        (out_ref,) = refs
        # 0 only for an exactly empty sum (no key); a NaN sum stays NaN, never a plausible 0.
        safe = jnp.where(denom == 0.0, 1.0, denom)
        out = jnp.where((denom == 0.0)[:, None], 0.0, o / safe[:, None])
        plgpu.store(
            out_ref.at[b, pl.ds(head0, block_h), pl.ds(0, head_dim)],
            out.astype(out_ref.dtype),
            mask=row_mask,
        )
