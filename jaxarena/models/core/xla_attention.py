"""Paged attention in plain XLA (`jnp`): the models' `kernels="xla"` path for the split-K
decode and the paged prefill Pallas kernels, with their semantics (`pallas_kernels`'
`splitk_decode_attention` and `prefill_attention` module docstrings).

One routine serves both: the queries come in groups `[G, C, Hq, D]`, each group belonging to
one sequence (decode: one group of one query per sequence; prefill: tiles of `C` packed
queries that never straddle two sequences, as the prefill kernel's tile table cuts them). A
`lax.fori_loop` walks the keys in blocks of whole pages, gathered through each group's
block-table row, with an f32 online softmax; its bounds are data (the visible key range over
all groups), so a step reads the pages its sequences use, not the table's `max_seq_len`.

The interpreter runs the Pallas kernels program by program; this is a few fused XLA ops per
key block, which is what makes the CPU fast. It is written independently of the kernels'
test references (`reference.py`, which gather whole contexts densely): the tests compare it
with them.

Semantics kept: GQA (query head `h` reads KV head `h // (Hq // Hkv)`); sliding window (the
query at position `p` sees keys `(p - window, p]`); gpt-oss sinks (`exp(sink)` joins the
denominator, no value); Gemma-2 soft-cap on the scaled logits; FP8 KV (`scale * page`, per
tensor or per KV head); MLA's latent cache (`v_cache=None`: the values are the first
`v_head_dim` key columns). A query with nothing to attend (and padding rows) gives 0. Keys
and values no query of a group sees are selected away before any arithmetic (stale pages,
NaN included, do not matter).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["decode_attention_xla", "grouped_paged_attention", "prefill_attention_xla"]

F32 = jnp.float32
KEY_BLOCK_TOKENS = 256
"""Keys per loop iteration (rounded to whole pages)."""
PREFILL_TILE = 32
"""Packed prefill queries per group (fewer when the step has fewer tokens)."""


def _scale_vec(scale: Any, hkv: int) -> jax.Array | None:
    """An FP8 page scale as `f32[Hkv]` (per tensor or per KV head), or None."""
    if scale is None:
        return None
    return jnp.broadcast_to(jnp.asarray(scale, F32).reshape(-1), (hkv,))


def grouped_paged_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array | None,
                            tables: jax.Array, pos: jax.Array, valid: jax.Array,
                            ctx_lens: jax.Array, *, sm_scale: float | None = None,
                            window: int | None = None, softcap: float | None = None,
                            sinks: jax.Array | None = None, k_scale: Any = None,
                            v_scale: Any = None, v_head_dim: int | None = None,
                            key_block: int = KEY_BLOCK_TOKENS) -> jax.Array:  # fmt: skip
    """Attention of grouped queries over their sequences' paged keys.

    Args:
      q: `[G, C, Hq, D]` queries (any float dtype; computed in f32).
      k_cache: `[num_blocks, bs, Hkv, D]` (q's dtype or `float8_e4m3fn` with `k_scale`).
      v_cache: `[num_blocks, bs, Hkv, D_v]`, or None with `v_head_dim` (MLA's latent cache).
      tables: `int32[G, P]`, the block-table row of each group's sequence.
      pos: `int32[G, C]`, each query's position; valid: `bool[G, C]` (False: padding).
      ctx_lens: `int32[G]`, the keys each group's sequence holds (keys `t >= ctx_lens` are
        never seen).

    Returns:
      `float32[G, C, Hq, D_v]`; zeros for invalid queries and queries with nothing to attend.
    """
    g, c, hq, d = q.shape
    nb, bs, hkv, _ = k_cache.shape
    dv = v_head_dim if v_cache is None else v_cache.shape[-1]
    grp = hq // hkv
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    ks, vs = _scale_vec(k_scale, hkv), _scale_vec(v_scale, hkv)
    ppb = max(1, min(tables.shape[1], key_block // bs))  # pages per key block
    kbt = ppb * bs
    nblk = -(-tables.shape[1] // ppb)
    tables = jnp.pad(jnp.clip(tables, 0, nb - 1), ((0, 0), (0, nblk * ppb - tables.shape[1])))
    # Each query's visible range [lo, hi): causal, the context length, the window.
    hi = jnp.minimum(pos + 1, ctx_lens[:, None])
    lo = jnp.zeros_like(hi) if window is None else jnp.maximum(pos - window + 1, 0)
    hi = jnp.where(valid, hi, 0)
    lo = jnp.where(valid, lo, hi)
    any_key = hi > lo
    first = jnp.min(jnp.where(any_key, lo, jnp.iinfo(jnp.int32).max)) // kbt
    last = -(-jnp.max(hi) // kbt)
    first = jnp.minimum(first, last)
    qf = q.astype(F32).reshape(g, c, hkv, grp, d) * jnp.asarray(scale, F32)
    # A group's keys that none of its queries sees (for the values' select).
    g_lo = jnp.min(jnp.where(any_key, lo, jnp.iinfo(jnp.int32).max), axis=1)
    g_hi = jnp.max(hi, axis=1)

    def gather(cache, pages, s, width):
        x = cache[pages].astype(F32)[..., :width]  # [G, ppb, bs, Hkv, w]
        x = x.reshape(g, kbt, hkv, width)
        return x if s is None else x * s[None, None, :, None]

    def body(j, carry):
        m, den, acc = carry
        pages = jax.lax.dynamic_slice_in_dim(tables, j * ppb, ppb, axis=1)
        t = j * kbt + jnp.arange(kbt, dtype=jnp.int32)
        k = gather(k_cache, pages, ks, d)
        v = gather(k_cache if v_cache is None else v_cache, pages, vs, dv)
        seen = (t[None, :] >= g_lo[:, None]) & (t[None, :] < g_hi[:, None])  # [G, kbt]
        k = jnp.where(seen[:, :, None, None], k, 0.0)
        v = jnp.where(seen[:, :, None, None], v, 0.0)
        x = jnp.einsum("gckxd,gtkd->gckxt", qf, k)
        if softcap is not None:
            x = softcap * jnp.tanh(x / softcap)
        vis = (t[None, None, :] >= lo[:, :, None]) & (t[None, None, :] < hi[:, :, None])
        x = jnp.where(vis[:, :, None, None, :], x, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(x, axis=-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        alpha = jnp.exp(m - m_safe)
        p = jnp.exp(x - m_safe[..., None])
        den = den * alpha + jnp.sum(p, axis=-1)
        acc = acc * alpha[..., None] + jnp.einsum("gckxt,gtkd->gckxd", p, v)
        return m_new, den, acc

    shape = (g, c, hkv, grp)
    if sinks is None:
        m0, l0 = jnp.full(shape, -jnp.inf, F32), jnp.zeros(shape, F32)
    else:  # the sink starts each softmax: its logit, probability 1 relative to itself
        m0 = jnp.broadcast_to(jnp.asarray(sinks, F32).reshape(hkv, grp), shape)
        l0 = jnp.ones(shape, F32)
    acc0 = jnp.zeros((*shape, dv), F32)
    m, den, acc = jax.lax.fori_loop(first, last, body, (m0, l0, acc0))
    del m
    ok = (den > 0) & valid[:, :, None, None]
    out = jnp.where(ok[..., None], acc / jnp.where(ok, den, 1.0)[..., None], 0.0)
    return out.reshape(g, c, hq, dv)


def decode_attention_xla(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array | None,
                         block_tables: jax.Array, seq_lens: jax.Array,
                         **opts: Any) -> jax.Array:  # fmt: skip
    """`splitk_decode_attention`'s result (`[B, Hq, D_v]` in q's dtype): the query of
    sequence `b` at position `seq_lens[b] - 1` over its first `seq_lens[b]` keys. `opts`:
    `sm_scale`, `window` (the kernel's `window_size`), `softcap`, `sinks`, `k_scale`,
    `v_scale`, `v_head_dim`."""
    b = q.shape[0]
    lens = jnp.clip(seq_lens, 0, block_tables.shape[1] * k_cache.shape[1])
    out = grouped_paged_attention(q[:, None], k_cache, v_cache, block_tables[:b],
                                  (lens - 1)[:, None], (lens > 0)[:, None], lens,
                                  **opts)  # fmt: skip
    return out[:, 0].astype(q.dtype)


def prefill_attention_xla(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array | None,
                          block_tables: jax.Array, cu_seqlens: jax.Array, seq_lens: jax.Array,
                          *, tile: int = PREFILL_TILE, **opts: Any) -> jax.Array:  # fmt: skip
    """`paged_prefill_attention`'s result (`[T, Hq, D_v]` in q's dtype): query `i` of packed
    sequence `s` (rows `cu_seqlens[s]:cu_seqlens[s + 1]`) at position `seq_lens[s] - qlen_s +
    i` over the keys up to itself; padding rows (past `cu_seqlens[S]`) give zeros. The rows
    are cut into tiles of at most `tile` tokens of one sequence (`ceil(T / tile) + S`
    groups, the last ones empty). `opts` as for `decode_attention_xla`."""
    t, hq, d = q.shape
    s = block_tables.shape[0]
    c = max(1, min(tile, t))
    g = -(-t // c) + s
    cu = cu_seqlens.astype(jnp.int32)
    qlen = cu[1:] - cu[:-1]
    ntiles = (qlen + c - 1) // c
    ends = jnp.cumsum(ntiles)
    j = jnp.arange(g, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(ends, j, side="right"), 0, s - 1).astype(jnp.int32)
    k = j - (ends - ntiles)[seq]
    n = jnp.clip(qlen[seq] - k * c, 0, c)
    rows = (cu[seq] + k * c)[:, None] + jnp.arange(c, dtype=jnp.int32)[None, :]  # [G, C]
    valid = jnp.arange(c)[None, :] < n[:, None]
    lens = jnp.clip(seq_lens, 0, block_tables.shape[1] * k_cache.shape[1])
    pos = (lens - qlen)[seq][:, None] + rows - cu[seq][:, None]
    qg = q[jnp.clip(rows, 0, t - 1)]
    out = grouped_paged_attention(qg, k_cache, v_cache, block_tables[seq], pos, valid,
                                  lens[seq], **opts)  # fmt: skip
    dest = jnp.where(valid, rows, t).reshape(-1)  # invalid rows: out of range, dropped
    dv = out.shape[-1]
    res = jnp.zeros((t, hq, dv), q.dtype)
    return res.at[dest].set(out.reshape(-1, hq, dv).astype(q.dtype), mode="drop")
