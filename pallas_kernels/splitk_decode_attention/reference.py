"""Plain-`jnp` float32 reference for paged decode attention, independent of the kernel.

Nothing here imports from the kernel folder's other modules: a reference that reuses the
kernel's helpers would cancel the bug it should catch. It gathers every sequence's keys and
values densely through its block table, dequantizes FP8 pages (`scale * page`, in f32),
builds one mask per sequence (length, sliding window) and takes one softmax over all keys,
with the sink as an extra logit: no splits, no online rescaling, no column chunks.

Semantics (the peers the kernel follows): sliding window as Hugging Face's `sliding_window`
(the last `window_size` keys, the current one included); sinks as gpt-oss (an extra logit per
head in the softmax whose probability is dropped); soft-cap as Gemma-2 (`c * tanh(x / c)` on
the scaled logits); FP8 KV as vLLM (`k_scale * k`, `v_scale * v`, per tensor or per KV head);
MLA's latent cache as vLLM/FlashMLA (values = the first `v_head_dim` columns of the keys); LSE
as FlashAttention's `softmax_lse` (natural log).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["paged_decode_attention_reference", "paged_decode_logits_reference"]

_HI = jax.lax.Precision.HIGHEST


def _gather(cache: jax.Array, block_tables: jax.Array, scale=None) -> jax.Array:
    """`[num_blocks, bs, Hkv, D]` + `[B, P]` -> `f32[B, P * bs, Hkv, D]` (token order)."""
    pages = jnp.clip(block_tables, 0, cache.shape[0] - 1)
    g = cache[pages].astype(jnp.float32)  # [B, P, bs, Hkv, D]
    b, p, bs, hkv, d = g.shape
    g = g.reshape(b, p * bs, hkv, d)
    if scale is not None:  # per tensor () / (1,) or per KV head (Hkv,)
        s = jnp.asarray(scale, jnp.float32).reshape(-1)
        g = g * jnp.broadcast_to(s, (hkv,))[None, None, :, None]
    return g


def paged_decode_logits_reference(
    q: jax.Array,
    k_cache: jax.Array,
    block_tables: jax.Array,
    seq_lens: jax.Array,
    *,
    sm_scale: float | None = None,
    softcap: float | None = None,
    window_size: int | None = None,
    k_scale=None,
) -> tuple[jax.Array, jax.Array]:
    """Scaled (soft-capped) logits of every query head against every gathered key, and the
    mask of the keys each sequence sees.

    Args:
      q: `[B, Hq, D]`; k_cache: `[num_blocks, bs, Hkv, D]` (any float dtype, FP8 with
        `k_scale`); block_tables: `int[B, P]`; seq_lens: `int[B]`; `sm_scale` defaults to
        `1 / sqrt(D)`; `softcap`: `x -> softcap * tanh(x / softcap)`; `window_size`: only the
        last `window_size` keys are seen.

    Returns:
      `(logits f32[B, Hq, P * bs], valid bool[B, P * bs])`, `valid[b, t] = t < seq_lens[b]`
      (and `t >= seq_lens[b] - window_size`). Logits at invalid positions are computed but
      meaningless.
    """
    B, Hq, D = q.shape
    hkv = k_cache.shape[2]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    keys = _gather(k_cache, block_tables, k_scale)  # [B, T, Hkv, D]
    keys = jnp.repeat(keys, Hq // hkv, axis=2)  # [B, T, Hq, D]: head h reads h // (Hq/Hkv)
    logits = jnp.einsum("bhd,bthd->bht", q.astype(jnp.float32), keys, precision=_HI) * scale
    if softcap is not None:
        logits = softcap * jnp.tanh(logits / softcap)
    t = jnp.arange(keys.shape[1])
    valid = t[None, :] < seq_lens[:, None]
    if window_size is not None:
        valid = valid & (t[None, :] >= seq_lens[:, None] - window_size)
    return logits, valid


def paged_decode_attention_reference(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array | None,
    block_tables: jax.Array,
    seq_lens: jax.Array,
    *,
    sm_scale: float | None = None,
    softcap: float | None = None,
    window_size: int | None = None,
    sinks: jax.Array | None = None,
    k_scale=None,
    v_scale=None,
    v_head_dim: int | None = None,
    return_lse: bool = False,
):
    """`softmax(logits) @ V` over each sequence's visible keys, in f32.

    Shapes as for `paged_decode_logits_reference`, plus v_cache `[num_blocks, bs, Hkv, D_v]`
    (or None: the values are `k_cache[..., :v_head_dim]`), `sinks [Hq]` (an extra logit per
    head whose probability is dropped), `v_scale` like `k_scale`. A sequence with nothing to
    attend gives zeros. Masked keys and values are selected away (`where`) before any
    arithmetic, so NaN in a stale page does not reach the result.

    Returns:
      `out f32[B, Hq, D_v]`, or `(out, lse f32[B, Hq])` with `return_lse` (natural log,
      `-inf` where the sum is empty).
    """
    B, Hq, D = q.shape
    if v_cache is None:
        v_cache = k_cache[..., :v_head_dim]
    hkv = v_cache.shape[2]
    logits, valid = paged_decode_logits_reference(
        q, k_cache, block_tables, seq_lens, sm_scale=sm_scale, softcap=softcap,
        window_size=window_size, k_scale=k_scale,
    )  # fmt: skip
    values = jnp.repeat(_gather(v_cache, block_tables, v_scale), Hq // hkv, axis=2)
    values = jnp.where(valid[:, :, None, None], values, 0.0)  # [B, T, Hq, D_v]
    masked = jnp.where(valid[:, None, :], logits, -jnp.inf)
    if sinks is not None:  # gpt-oss: concatenate the sink logit, softmax, drop its column
        sink_col = jnp.broadcast_to(jnp.asarray(sinks, jnp.float32)[None, :, None], (B, Hq, 1))
        masked = jnp.concatenate([masked, sink_col], axis=-1)
    m = jnp.max(masked, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(masked - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    if sinks is not None:
        p = p[..., :-1]
    out = jnp.einsum("bht,bthd->bhd", p, values, precision=_HI)
    # Only an exactly empty sum gives 0 (and lse -inf); a NaN sum stays NaN, never 0.
    empty, safe = denom == 0, jnp.where(denom == 0, 1.0, denom)
    out = jnp.where(empty, 0.0, out / safe)
    if not return_lse:
        return out
    lse = jnp.where(empty, -jnp.inf, m + jnp.log(safe))
    return out, lse[..., 0]
