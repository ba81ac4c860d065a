"""Public wrapper: decode's q/k RMSNorm + RoPE + K/V cache write as one `pallas_call`.

A decode step's attention block turns the QKV projection into the query the attention kernel
reads and the new key and value the paged cache stores. Written plainly that is a q/k
sum-of-squares reduction, a pass that norms and rotates q, and one scatter each for K and V:
four launches per layer. This kernel does all of it in one: each program loads one head of
one token, norms it (f32 sum of squares, `rsqrt`, weight), rotates it (rotate-half, angles
`f32(position) * inv_freq`), and stores a query head as bf16 or a key head (with the token's
value head) in the token's cache row, in place (`input_output_aliases`; the caches are seen as
`[rows, Hkv, D]`, a bitcast).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._args import check_kv_scale, check_nonempty, check_rank, resolve_interpret
from pallas_kernels._cost import declare_fixed
from pallas_kernels.qk_rope_kv_write.kernel import WriteConfig, qk_rope_kv_write_kernel

__all__ = ["qk_rope_kv_write", "qk_rope_kv_write_cost", "fused_write_unsupported"]

_FP8 = jnp.dtype(jnp.float8_e4m3fn)
_CACHE_DTYPES = (jnp.dtype(jnp.bfloat16), _FP8)


def _pow2(n: int) -> bool:
    return n >= 1 and not n & (n - 1)


def fused_write_unsupported(head_dim: int, rotary_dim: int, cache_dtype: Any) -> str | None:
    """Why the kernel cannot serve a layer of these widths (None: it can): `head_dim` must be
    a power of two (Triton tiles), so must `rotary_dim / 2` when there is RoPE
    (`rotary_dim` even, <= head_dim), and the cache bf16 or float8_e4m3fn."""
    if not _pow2(head_dim):
        return f"head_dim={head_dim} is not a power of two"
    if rotary_dim and (rotary_dim % 2 or rotary_dim > head_dim or not _pow2(rotary_dim // 2)):
        return f"rotary_dim={rotary_dim} is not twice a power of two <= head_dim={head_dim}"
    if jnp.dtype(cache_dtype) not in _CACHE_DTYPES:
        return f"the cache dtype {jnp.dtype(cache_dtype)} is not bfloat16 or float8_e4m3fn"
    return None


def qk_rope_kv_write_cost(cfg: WriteConfig, t: int, qkv_itemsize: int, w_itemsize: int,
                          cache_itemsize: int) -> tuple[int, int]:  # fmt: skip
    """`(bytes, flops)` of one launch: the token's position and table entry, the projection
    row (each of its split-K partials), the norm weights, the frequencies and scales read once; q and one K and one V row per
    token written. Flops: 4 per normed value (square, add, two multiplies), 3 per rotated one
    (two multiplies, an add per value of a pair's two), 1 per quantized K/V value (the
    division); cos/sin not counted."""
    hq, hkv, d, r = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim
    heads = hq + hkv
    read = t * (4 + 4) + cfg.splits * t * (hq + 2 * hkv) * d * qkv_itemsize
    read += 2 * d * w_itemsize if cfg.norm else 0
    read += (r // 2) * 4 + (2 * hkv * 4 if cfg.fp8 else 0)
    written = t * hq * d * 2 + 2 * t * hkv * d * cache_itemsize
    flops = t * heads * ((4 * d if cfg.norm else 0) + 3 * r) + (2 * t * hkv * d if cfg.fp8 else 0)
    flops += (cfg.splits - 1) * t * (hq + 2 * hkv) * d  # the partials' sum
    return read + written, flops


@functools.partial(jax.jit, static_argnames=("cfg", "interpret"), donate_argnums=(0, 1))
def _write(k_rows, v_rows, positions, tables, qkv, extras, *, cfg: WriteConfig, interpret: bool):
    t = qkv.shape[-3]
    whole = pl.no_block_spec
    grid = (t, (cfg.num_q_heads + cfg.num_kv_heads) // cfg.heads_per_program)
    operands = (positions, tables, qkv, *extras, k_rows, v_rows)
    b, f = qk_rope_kv_write_cost(cfg, t, qkv.dtype.itemsize,
                                 extras[0].dtype.itemsize if cfg.norm else 0,
                                 k_rows.dtype.itemsize)  # fmt: skip
    declare_fixed("qk_rope_kv_write", grid, operands, bytes=b, flops=f)
    n = len(operands)
    q, k_rows, v_rows = pl.pallas_call(
        functools.partial(qk_rope_kv_write_kernel, cfg=cfg),
        grid=grid,
        in_specs=[whole] * n,
        out_specs=[whole] * 3,
        out_shape=[
            jax.ShapeDtypeStruct((t, cfg.num_q_heads, cfg.head_dim), jnp.bfloat16),
            jax.ShapeDtypeStruct(k_rows.shape, k_rows.dtype),
            jax.ShapeDtypeStruct(v_rows.shape, v_rows.dtype),
        ],
        input_output_aliases={n - 2: 1, n - 1: 2},
        # Triton explicitly (jax 0.10 otherwise picks Mosaic GPU); a head is <= a few hundred
        # values: one warp.
        compiler_params=plgpu.CompilerParams(num_warps=1, num_stages=1),
        interpret=interpret,
        name="qk_rope_kv_write",
    )(*operands)
    return q, k_rows, v_rows


def _vector(name: str, v: Any, n: int) -> None:
    shape = check_rank(name, v, 1, f"[{n}]")
    if shape != (n,) or not jnp.issubdtype(v.dtype, jnp.floating):
        raise ValueError(f"{name} must be a float vector of shape ({n},), got "
                         f"{name}.shape={shape}, dtype {v.dtype}")  # fmt: skip


def qk_rope_kv_write(
    qkv: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    positions: jax.Array,
    block_tables: jax.Array,
    *,
    num_q_heads: int,
    q_norm: jax.Array | None = None,
    k_norm: jax.Array | None = None,
    eps: float = 1e-6,
    norm_offset: float = 0.0,
    inv_freq: Any = None,
    rope_scaling: float = 1.0,
    k_scale: jax.Array | None = None,
    v_scale: jax.Array | None = None,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Norms and rotates the new queries and keys of a decode step and writes the new keys
    and values into the paged cache, in one kernel.

    Token `t` (sequence `t`: row `t` of `block_tables`, as a decode step lays them out) at
    position `p = positions[t]` has the cache row `block_tables[t, p // bs] * bs + p % bs`.
    Its head `h` of `x = qkv[t]` seen as `[Hq + 2 Hkv, D]` (`[q heads | k heads | v heads]`):

        n = x * rsqrt(mean(x^2) + eps) * (w + norm_offset)   (w: q_norm / k_norm; or n = x)
        n[:R/2], n[R/2:R] = n1 cos - n2 sin, n2 cos + n1 sin    cos, sin of f32(p) * inv_freq,
                                                                 times rope_scaling

    in float32; a q head is returned as bf16, a k head and the token's v head are stored as
    the cache stores them: bf16, or with a float8_e4m3fn cache `e4m3(clip(bf16(n) / scale,
    +-448))` with the per-KV-head `k_scale` / `v_scale` (vLLM's write).

    Args:
      qkv: `[T, (Hq + 2 Hkv) * D]` float (bf16: the projection as the step holds it), or
        `float32[S, T, (Hq + 2 Hkv) * D]`: S split-K partials of the projection, summed in
        order and rounded to bf16 first (the projection a split-K GEMM would give; a decode
        step's GEMM output is split-K at small T, and its reduction is then this kernel's
        instead of a launch of its own).
      k_cache, v_cache: `[num_blocks, bs, Hkv, D]`, bf16 or float8_e4m3fn. DONATED: use the
        returned caches. Only the T rows named are written; every other byte is kept.
      positions: `int32[T]`; block_tables: `int32[T, P]`. A table entry outside the cache
        (traced values only) writes nothing, as XLA's scatter; `p // bs` past the table is
        clamped into it, as XLA's gather.
      num_q_heads: Hq (a multiple of Hkv is not required here).
      q_norm, k_norm: `[D]` float, both or neither (no norm).
      eps, norm_offset: the norms' epsilon and weight offset (1: the `(1 + w)` norms).
      inv_freq: None (no RoPE) or `float32[R / 2]` (array or sequence of floats): rotate the
        first `R` channels of each head; R / 2 and D powers of two.
      rope_scaling: multiplies cos and sin (YaRN's attention factor).
      k_scale, v_scale: `float32[Hkv]`, required with a float8_e4m3fn cache.
      interpret: None = interpret on CPU, compiled (Triton) on GPU.

    Returns:
      `(q bf16[T, Hq, D], k_cache, v_cache)`.

    Raises:
      ValueError: bad shapes or dtypes, one norm weight without the other, missing scales, an
        empty batch; all before tracing.
      NotImplementedError: D or R / 2 not a power of two, a cache dtype other than bf16/e4m3.
    """
    nb, bs, hkv, d = check_rank("k_cache", k_cache, 4, "[num_blocks, block_size, Hkv, D]")
    if tuple(v_cache.shape) != (nb, bs, hkv, d) or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache must match k_cache: got v_cache {tuple(v_cache.shape)} "
                         f"{v_cache.dtype}, k_cache {(nb, bs, hkv, d)} {k_cache.dtype}")  # fmt: skip
    if getattr(qkv, "ndim", 0) == 3:  # split-K partials
        splits, t, cols = check_rank("qkv", qkv, 3, "[S, T, (Hq + 2 Hkv) * D]")
        if qkv.dtype != jnp.float32 or splits < 1:
            raise ValueError(f"split-K partials qkv [S, T, N] must be float32 with S >= 1, got "
                             f"qkv.shape={tuple(qkv.shape)}, dtype {qkv.dtype}")  # fmt: skip
    else:
        splits = 1
        t, cols = check_rank("qkv", qkv, 2, "[T, (Hq + 2 Hkv) * D]")
    check_nonempty("qkv", t, "tokens T")
    if not isinstance(num_q_heads, int) or num_q_heads < 1:
        raise ValueError(f"num_q_heads={num_q_heads!r} must be an int >= 1")
    if cols != (num_q_heads + 2 * hkv) * d or not jnp.issubdtype(qkv.dtype, jnp.floating):
        raise ValueError(
            f"qkv must be float [T, (Hq + 2 Hkv) * D] = [{t}, {(num_q_heads + 2 * hkv) * d}] "
            f"(Hq={num_q_heads}, Hkv={hkv}, D={d} from k_cache), got qkv.shape={(t, cols)}, "
            f"dtype {qkv.dtype}"
        )
    if check_rank("positions", positions, 1, "[T]") != (t,) or positions.dtype != jnp.int32:
        raise ValueError(f"positions must be int32[{t}], got {positions.shape} {positions.dtype}")
    tab = check_rank("block_tables", block_tables, 2, "[T, P]")
    if tab[0] != t or tab[1] < 1 or block_tables.dtype != jnp.int32:
        raise ValueError(f"block_tables must be int32[{t}, P >= 1] (one row per token), got "
                         f"{tab} {block_tables.dtype}")  # fmt: skip
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm go together: pass both (q/k RMSNorm) or neither")
    extras: list[Any] = []
    if q_norm is not None:
        _vector("q_norm", q_norm, d)
        _vector("k_norm", k_norm, d)
        if q_norm.dtype != k_norm.dtype:
            k_norm = k_norm.astype(q_norm.dtype)
        extras += [q_norm, k_norm]
    rotary = 0
    if inv_freq is not None:
        inv = jnp.asarray(inv_freq, jnp.float32) if not hasattr(inv_freq, "shape") else inv_freq
        check_rank("inv_freq", inv, 1, "[R / 2]")
        if inv.dtype != jnp.float32:
            raise ValueError(f"inv_freq must be float32, got {inv.dtype}")
        rotary = 2 * int(inv.shape[0])
        extras.append(inv)
    why = fused_write_unsupported(d, rotary, k_cache.dtype)
    if why is not None:
        raise NotImplementedError(f"qk_rope_kv_write: {why}")
    fp8 = jnp.dtype(k_cache.dtype) == _FP8
    if fp8:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            check_kv_scale(name, s, hkv)
        extras += [jnp.broadcast_to(jnp.asarray(s, jnp.float32).reshape(-1), (hkv,))
                   for s in (k_scale, v_scale)]  # fmt: skip
    if not np.isfinite(float(rope_scaling)) or not np.isfinite(float(eps)) or eps < 0:
        raise ValueError(f"rope_scaling={rope_scaling!r} and eps={eps!r} must be finite, eps >= 0")
    interpret = resolve_interpret(interpret)
    heads = num_q_heads + hkv
    cfg = WriteConfig(
        num_q_heads=num_q_heads, num_kv_heads=hkv, head_dim=d, block_size=bs, num_rows=nb * bs,
        norm=q_norm is not None, eps=float(eps), norm_offset=float(norm_offset),
        rotary_dim=rotary, rope_scaling=float(rope_scaling), fp8=fp8,
        # The interpreter pays per grid step (it copies the whole caches): one per token.
        heads_per_program=heads if interpret else 1, splits=splits,
    )  # fmt: skip
    rows = (nb * bs, hkv, d)
    q, k_rows, v_rows = _write(
        k_cache.reshape(rows), v_cache.reshape(rows), positions, block_tables,
        qkv.reshape(*qkv.shape[:-1], num_q_heads + 2 * hkv, d), tuple(extras), cfg=cfg,
        interpret=interpret,
    )  # fmt: skip
    return q, k_rows.reshape(k_cache.shape), v_rows.reshape(v_cache.shape)
