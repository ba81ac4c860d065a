"""Plain-`jnp` float32 reference for paged prefill attention, independent of the kernel.

Nothing here imports from the kernel folder's other modules. Each sequence's whole context is
gathered densely through its block table, every query gets a dense mask over those keys
(causal at its position, the sliding window, the context length), and one softmax is taken
over all keys with the sink as an extra logit: no tiles, no key blocks, no online
rescaling, no column chunks. Memory is `O(T * Hq * max_context)`: for tests, not for use.

Semantics: query `i` of sequence `s` (rows `cu_seqlens_q[s]:cu_seqlens_q[s + 1]`) sits at
position `seq_lens[s] - qlen_s + i` and sees keys `t <= pos` (and `t > pos - window_size`);
sliding window as Hugging Face's `sliding_window`, sinks as gpt-oss, soft-cap as Gemma-2
(on the scaled logits), MLA's latent cache as vLLM (values = the first `v_head_dim` key
columns), an FP8 cache as vLLM (`k_scale * k`, `v_scale * v`, dequantized in f32 before
anything else). Rows past `cu_seqlens_q[S]` (padding) are zeros.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["paged_prefill_attention_reference"]

_HI = jax.lax.Precision.HIGHEST


def paged_prefill_attention_reference(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array | None,
    block_tables: jax.Array,
    cu_seqlens_q: jax.Array,
    seq_lens: jax.Array,
    *,
    sm_scale: float | None = None,
    window_size: int | None = None,
    sinks: jax.Array | None = None,
    softcap: float | None = None,
    v_head_dim: int | None = None,
    k_scale=None,
    v_scale=None,
) -> jax.Array:
    """Dense masked softmax attention of every packed query over its sequence's keys, in f32.

    Args: as `paged_prefill_attention` (q `[T, Hq, D]`, caches `[num_blocks, bs, Hkv, D]`,
      block_tables `int[S, P]`, cu_seqlens_q `int[S + 1]`, seq_lens `int[S]`; `k_scale`,
      `v_scale`: a float, or per tensor `()` / `(1,)` or per KV head `(Hkv,)`, multiplying
      the pages as stored (None: 1)).

    Returns:
      `f32[T, Hq, D_v]`; a query with no visible key and no sink, and every padding row,
      gives zeros. Masked keys and values are selected away before any arithmetic.
    """
    T, Hq, D = q.shape
    if v_cache is None:
        v_cache = k_cache[..., :v_head_dim]
        v_scale = k_scale if v_scale is None else v_scale
    num_blocks, bs, hkv, _ = k_cache.shape
    S, P = block_tables.shape
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    pages = jnp.clip(block_tables, 0, num_blocks - 1)

    def dense(cache, s):  # [num_blocks, bs, Hkv, d] -> f32[S, P * bs, Hq, d], token order
        g = cache[pages].astype(jnp.float32)
        if s is not None:  # dequantize: one scale, or one per KV head
            g = g * jnp.asarray(s, jnp.float32).reshape(-1)[:, None]
        g = g.reshape(S, P * bs, hkv, cache.shape[-1])
        return jnp.repeat(g, Hq // hkv, axis=2)

    keys, values = dense(k_cache, k_scale), dense(v_cache, v_scale)
    cu = jnp.asarray(cu_seqlens_q)
    tok = jnp.arange(T)
    # Sequence of each query row, and whether it is a real row (not padding).
    seq = jnp.clip(jnp.sum(tok[:, None] >= cu[None, 1:], axis=1), 0, S - 1)
    real = tok < cu[S]
    qlen = cu[1:] - cu[:-1]
    pos = seq_lens[seq] - qlen[seq] + (tok - cu[seq])  # [T]
    t = jnp.arange(P * bs)
    visible = (t[None, :] <= pos[:, None]) & (t[None, :] < seq_lens[seq][:, None])
    if window_size is not None:
        visible &= t[None, :] > pos[:, None] - window_size
    visible &= real[:, None]  # [T, L]

    logits = jnp.einsum("thd,tlhd->thl", q.astype(jnp.float32), keys[seq], precision=_HI)
    logits = logits * scale
    if softcap is not None:
        logits = softcap * jnp.tanh(logits / softcap)
    logits = jnp.where(visible[:, None, :], logits, -jnp.inf)
    if sinks is not None:  # an extra logit per head; its probability is dropped
        col = jnp.broadcast_to(jnp.asarray(sinks, jnp.float32)[None, :, None], (T, Hq, 1))
        logits = jnp.concatenate([logits, col], axis=-1)
    m = jnp.max(logits, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(logits - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    if sinks is not None:
        p = p[..., :-1]
    vals = jnp.where(visible[:, :, None, None], values[seq], 0.0)  # [T, L, Hq, Dv]
    out = jnp.einsum("thl,tlhd->thd", p, vals, precision=_HI)
    empty = denom == 0.0
    out = jnp.where(empty, 0.0, out / jnp.where(empty, 1.0, denom))
    return jnp.where(real[:, None, None], out, 0.0)
