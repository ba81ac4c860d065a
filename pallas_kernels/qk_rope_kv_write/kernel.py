"""Kernel body of the fused decode write (the algorithm only; see `ops.py`).

One program per `(token t, head j)` of the `Hq + Hkv` query and key heads of the projection
output `qkv [T, Hq + 2 Hkv, D]` (the interpreter: one program per token, looping over the
heads). For head `j`, in float32:

    x = qkv[t, j]        (bf16 -> f32, exact; or bf16(sum of the S split-K partials))
    x = x * rsqrt(sum(x * x) / D + eps) * (w + off)  w = q_norm (j < Hq) or k_norm
    x[:R/2], x[R/2:R] = x1 cos - x2 sin, x2 cos + x1 sin     angle = f32(pos) * inv_freq

then a query head is stored rounded to bf16 in `q[t, j]`, a key head rounded as the cache
stores it (bf16, or e4m3 of `clip(bf16(x) / k_scale, +-448)`) in the cache row
`r = block_tables[t, pos // bs] * bs + pos % bs`, together with the token's value head
`qkv[t, Hq + Hkv + (j - Hq)]` (stored the same way with `v_scale`). A row outside the cache
(possible only for traced table entries) is never stored to, as XLA's scatter drops it; the
block index `pos // bs` is clamped into the table, as XLA's gather clamps it.

The head is processed in power-of-two column segments: the two rotated halves, then the
unrotated rest in power-of-two chunks (Triton tiles); the norm's sum of squares is taken over
the whole head first.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["WriteConfig", "qk_rope_kv_write_kernel"]

E4M3_MAX = 448.0


@dataclasses.dataclass(frozen=True)
class WriteConfig:
    """Static parameters of the kernel (hashable: part of the jit cache key).

    Attributes:
      num_q_heads, num_kv_heads, head_dim: Hq, Hkv, D.
      block_size: tokens per cache page; num_rows: pages x block_size (the flat cache rows).
      norm: q/k RMSNorm with `eps` and `norm_offset`.
      rotary_dim: channels rotated (R, 0: no RoPE); rope_scaling multiplies cos and sin.
      fp8: the caches are float8_e4m3fn (the per-KV-head scales are operands).
      heads_per_program: heads one program loops over (1 compiled; all in the interpreter).
      splits: 1: qkv is the projection `[T, Hq + 2 Hkv, D]`; S > 1: it is S float32 split-K
        partials `[S, T, Hq + 2 Hkv, D]`, summed in order 0..S-1 and rounded to bf16 (the
        projection as the step stores it) before anything else.
    """

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_rows: int
    norm: bool
    eps: float
    norm_offset: float
    rotary_dim: int
    rope_scaling: float
    fp8: bool
    heads_per_program: int
    splits: int = 1

    @property
    def segments(self) -> tuple[tuple[int, int], ...]:
        """`(first column, width)` of each power-of-two column segment of a head: the two
        rotated halves, then the rest in power-of-two chunks, widest first."""
        half = self.rotary_dim // 2
        out = [(0, half), (half, half)] if half else []
        c0, rest = self.rotary_dim, self.head_dim - self.rotary_dim
        for bit in reversed(range(rest.bit_length())):
            if rest & (1 << bit):
                out.append((c0, 1 << bit))
                c0 += 1 << bit
        return tuple(out)


def _cache_value(x, scale_ref, h, dtype, fp8: bool):
    """`x` (float32) as the cache stores it: bf16, or e4m3 of the clamped `bf16(x) / scale`."""
    x = x.astype(jnp.bfloat16)
    if not fp8:
        return x.astype(dtype)
    y = x.astype(jnp.float32) / scale_ref[h].astype(jnp.float32)
    return jnp.clip(y, -E4M3_MAX, E4M3_MAX).astype(dtype)


def qk_rope_kv_write_kernel(*refs, cfg: WriteConfig):
    """One `(t, head group)` program. Refs, in order: positions `int32[T]`, block_tables
    `int32[T, P]`, qkv `[T, Hq + 2 Hkv, D]` (or its `[S, ...]` split-K partials), with `norm` q_norm and k_norm `[D]`, with RoPE
    inv_freq `float32[R / 2]`, with `fp8` k_scale and v_scale `float32[Hkv]`, the caches' rows
    `[N, Hkv, D]` (inputs, aliased to the last two outputs: not read), then the outputs q
    `bf16[T, Hq, D]` and the caches' rows (written)."""
    refs = list(refs)
    pos_ref, tab_ref, qkv_ref = refs[:3]
    rest = refs[3:]
    qn_ref = kn_ref = inv_ref = ks_ref = vs_ref = None
    if cfg.norm:
        qn_ref, kn_ref, rest = rest[0], rest[1], rest[2:]
    if cfg.rotary_dim:
        inv_ref, rest = rest[0], rest[1:]
    if cfg.fp8:
        ks_ref, vs_ref, rest = rest[0], rest[1], rest[2:]
    _, _, q_ref, k_ref, v_ref = rest
    f32 = jnp.float32
    hq, hkv, d, bs = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cfg.block_size

    t, g = pl.program_id(0), pl.program_id(1)
    pos = pos_ref[t]
    blk = jnp.clip(pos // bs, 0, tab_ref.shape[1] - 1)
    row = tab_ref[t, blk] * bs + pos % bs
    ok = (row >= 0) & (row < cfg.num_rows)
    row = jnp.clip(row, 0, cfg.num_rows - 1)
    if cfg.rotary_dim:
        ang = pos.astype(f32) * inv_ref[...]
        cos, sin = jnp.cos(ang), jnp.sin(ang)
        if cfg.rope_scaling != 1.0:
            cos, sin = cos * cfg.rope_scaling, sin * cfg.rope_scaling
    segs = cfg.segments

    def load(j, cols):
        if cfg.splits == 1:
            return qkv_ref[t, j, cols].astype(f32)
        acc = qkv_ref[0, t, j, cols].astype(f32)
        for s in range(1, cfg.splits):
            acc = acc + qkv_ref[s, t, j, cols].astype(f32)
        return acc.astype(jnp.bfloat16).astype(f32)

    def head(j):
        is_q = j < hq
        parts = []
        if cfg.norm:
            x = load(j, slice(None))
            r = jax.lax.rsqrt(jnp.sum(x * x) / d + cfg.eps)
        for c0, n in segs:
            x = load(j, pl.ds(c0, n))
            if cfg.norm:
                w = jnp.where(is_q, qn_ref[pl.ds(c0, n)], kn_ref[pl.ds(c0, n)]).astype(f32)
                if cfg.norm_offset:
                    w = w + cfg.norm_offset
                x = x * r * w
            parts.append(x)
        if cfg.rotary_dim:
            x1, x2 = parts[0], parts[1]
            parts[0], parts[1] = x1 * cos - x2 * sin, x2 * cos + x1 * sin

        @pl.when(is_q)
        def _():
            for (c0, n), x in zip(segs, parts, strict=True):
                q_ref[t, j, pl.ds(c0, n)] = x.astype(q_ref.dtype)

        @pl.when(jnp.logical_not(is_q))
        def _():
            h = j - hq
            for (c0, n), x in zip(segs, parts, strict=True):
                plgpu.store(k_ref.at[row, h, pl.ds(c0, n)],
                            _cache_value(x, ks_ref, h, k_ref.dtype, cfg.fp8),
                            mask=jnp.broadcast_to(ok, (n,)))  # fmt: skip
            v = load(hq + hkv + h, slice(None))
            plgpu.store(v_ref.at[row, h, :], _cache_value(v, vs_ref, h, v_ref.dtype, cfg.fp8),
                        mask=jnp.broadcast_to(ok, (d,)))  # fmt: skip

    hpp = cfg.heads_per_program
    if hpp == 1:
        head(g)
    else:
        jax.lax.fori_loop(0, hpp, lambda i, c: (head(g * hpp + i), c)[1], 0)
