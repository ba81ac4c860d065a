"""Argument checks of paged prefill attention's two entry points.

Everything here runs before tracing: shapes, dtypes, options, concrete values (the packed
query offsets, the context lengths, the used block-table entries, q and the sinks) and the
arena region. Messages name the argument, show its value and state the rule.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from pallas_kernels._args import check_finite as _check_finite
from pallas_kernels._args import check_kv_scale, check_paged_heads, paged_v_shape
from pallas_kernels._args import check_nonempty as _check_nonempty
from pallas_kernels._args import check_rank as _shape
from pallas_kernels._args import is_concrete as _is_concrete
from pallas_kernels._args import is_int as _is_int

__all__ = ["FP8_DTYPE", "OUTPUT_REGION", "validate"]

OUTPUT_REGION = "attn_output"
FP8_DTYPE = jnp.dtype(jnp.float8_e4m3fn)
_SUPPORTED = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_I32_LIMIT = 2**31


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check_float_option(name: str, value: Any, *, positive: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ValueError(f"{name} must be a Python float or None, got {name}={value!r}")
    if not math.isfinite(float(value)) or (positive and float(value) <= 0.0):
        rule = "finite and > 0" if positive else "finite"
        raise ValueError(f"{name} must be {rule}, got {name}={value}")


def _check_values(cu_seqlens_q, seq_lens, block_tables, *, T, page_size, num_blocks,
                  window_size) -> None:  # fmt: skip
    """The concrete offsets, lengths and used page ids (skipped for traced values)."""
    if not _is_concrete(cu_seqlens_q):
        return
    cu = np.asarray(cu_seqlens_q).astype(np.int64)
    if cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] > T:
        raise ValueError(
            f"cu_seqlens_q must start at 0, never decrease and end at most at the token count "
            f"q.shape[0]={T}, got cu_seqlens_q={cu.tolist()}"
        )
    if not _is_concrete(seq_lens):
        return
    lens = np.asarray(seq_lens).astype(np.int64)
    qlen = np.diff(cu)
    max_pages = block_tables.shape[1]
    cap = max_pages * page_size
    short = np.flatnonzero(lens < qlen)
    if short.size:
        s = int(short[0])
        raise ValueError(
            f"seq_lens[{s}]={int(lens[s])} is shorter than the {int(qlen[s])} queries of sequence "
            f"{s} (cu_seqlens_q[{s}:{s + 2}]={cu[s : s + 2].tolist()}); seq_lens counts the "
            "whole context, the earlier tokens in the cache plus this chunk"
        )
    if lens.max() > cap:
        s = int(lens.argmax())
        raise ValueError(
            f"block_tables is too narrow: seq_lens[{s}]={int(lens[s])} needs "
            f"{-(-int(lens[s]) // page_size)} pages of {page_size} tokens but "
            f"block_tables.shape[1]={max_pages} (covers {cap} tokens)"
        )
    if not _is_concrete(block_tables):
        return
    table = np.asarray(block_tables)
    pages = np.arange(max_pages)[None, :]
    used = pages < -(-lens[:, None] // page_size)
    if window_size is not None:  # pages wholly before the first query's window are not read
        first = np.maximum(lens - qlen - window_size + 1, 0)
        used &= pages >= (first // page_size)[:, None]
    used &= (qlen > 0)[:, None]
    bad = used & ((table < 0) | (table >= num_blocks))
    if bad.any():
        s, p = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"block_tables[{s}, {p}]={int(table[s, p])} is out of range: page ids must be in "
            f"[0, {num_blocks}) (k_cache.shape[0]={num_blocks})"
        )


def validate(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    cu_seqlens_q: Any,
    seq_lens: Any,
    *,
    sm_scale: Any,
    window_size: Any,
    sinks: Any,
    softcap: Any,
    v_head_dim: Any,
    k_scale: Any = None,
    v_scale: Any = None,
    arena: Any = None,
    plan: Any = None,
    region: Any = OUTPUT_REGION,
) -> int:
    """Checks every argument of both entry points before anything is traced.

    Returns:
      `d_v`, the value head dim.

    Raises:
      ValueError, NotImplementedError: see `paged_prefill_attention` and
        `paged_prefill_attention_into`.
    """
    T, Hq, D = _shape("q", q, 3, "[num_tokens, num_q_heads, head_dim]")
    _check_nonempty("q", T, "token count q.shape[0]")
    kshape = _shape("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    vshape = paged_v_shape(kshape, v_cache, v_head_dim)
    bshape = _shape("block_tables", block_tables, 2, "[num_seqs, max_blocks_per_seq]")
    cshape = _shape("cu_seqlens_q", cu_seqlens_q, 1, "[num_seqs + 1]")
    lshape = _shape("seq_lens", seq_lens, 1, "[num_seqs]")
    q_dtype = jnp.dtype(q.dtype)
    if not jnp.issubdtype(q_dtype, jnp.floating):
        raise ValueError(f"q must be floating (float32, bfloat16, float16), got q.dtype={q_dtype}")
    check_paged_heads(Hq, D, kshape, vshape)
    num_blocks, page_size, Hkv, _ = kshape
    Dv = vshape[3]
    for name, arr in (("block_tables", block_tables), ("cu_seqlens_q", cu_seqlens_q),
                      ("seq_lens", seq_lens)):  # fmt: skip
        if jnp.dtype(arr.dtype) != jnp.int32:
            raise ValueError(f"{name} must be int32, got {name}.dtype={arr.dtype}")
    S = lshape[0]
    _check_nonempty("seq_lens", S, "sequence count seq_lens.shape[0]")
    if bshape[0] != S or cshape[0] != S + 1:
        raise ValueError(
            f"one row per sequence: seq_lens.shape={lshape} gives {S} sequences, so "
            f"block_tables.shape[0] must be {S} and cu_seqlens_q.shape[0] {S + 1}; got "
            f"block_tables.shape={bshape}, cu_seqlens_q.shape={cshape}"
        )
    if bshape[1] < 1 or num_blocks < 1 or page_size < 1:
        raise ValueError(
            f"need at least one page: block_tables.shape[1]={bshape[1]}, "
            f"k_cache.shape[:2]={kshape[:2]}"
        )
    _check_float_option("sm_scale", sm_scale, positive=False)
    _check_float_option("softcap", softcap, positive=True)
    if window_size is not None and (not _is_int(window_size) or window_size < 1):
        raise ValueError(
            f"window_size must be None or an int >= 1 (each query sees the window_size most "
            f"recent keys, itself included), got {window_size=!r}"
        )
    if sinks is not None:
        sshape = _shape("sinks", sinks, 1, f"[num_q_heads] (one logit per query head, {Hq})")
        if sshape != (Hq,) or not jnp.issubdtype(sinks.dtype, jnp.floating):
            raise ValueError(
                f"sinks must be a floating array of shape ({Hq},) (q.shape[1]), got "
                f"sinks.dtype={sinks.dtype}, sinks.shape={sshape}"
            )
        if _is_concrete(sinks) and not np.all(np.isfinite(np.asarray(sinks, np.float32))):
            raise ValueError(f"sinks must be finite, got sinks={np.asarray(sinks).tolist()}")

    if q_dtype not in _SUPPORTED:
        raise NotImplementedError(f"q.dtype={q_dtype} is not supported; use f32, bf16 or f16")
    kv_dtype = jnp.dtype(k_cache.dtype)
    if v_cache is not None and kv_dtype != jnp.dtype(v_cache.dtype):
        raise ValueError(
            f"k_cache and v_cache must share a dtype, got k_cache.dtype={k_cache.dtype} and "
            f"v_cache.dtype={v_cache.dtype}"
        )
    if kv_dtype == FP8_DTYPE:
        check_kv_scale("k_scale", k_scale, Hkv)
        check_kv_scale("v_scale", v_scale, Hkv)
    else:
        if kv_dtype != q_dtype:
            raise NotImplementedError(
                f"k_cache.dtype={kv_dtype} differs from q.dtype={q_dtype}; the prefill kernel "
                "reads a cache in q's dtype or float8_e4m3fn (with k_scale and v_scale)"
            )
        for name, val in (("k_scale", k_scale), ("v_scale", v_scale)):
            if val is not None:
                raise ValueError(
                    f"{name} applies to a float8_e4m3fn KV cache only; k_cache.dtype={kv_dtype}"
                )
    for name, d in (("head_dim", D), ("v_head_dim", Dv)):
        if d < 1:
            raise ValueError(f"{name} must be at least 1, got {name}={d} (q.shape={(T, Hq, D)})")
        if not (_is_pow2(d) or d % 8 == 0):
            raise NotImplementedError(
                f"{name}={d} must be a power of two or a multiple of 8 (the kernel works in "
                "power-of-two column chunks of at least 8)"
            )
    if q_dtype.itemsize == 2 and Dv % 2:
        raise NotImplementedError(f"v_head_dim={Dv} must be even for a 16-bit output")

    _check_finite("q", q, "every output of that query head would be NaN")
    _check_values(cu_seqlens_q, seq_lens, block_tables, T=T, page_size=page_size,
                  num_blocks=num_blocks, window_size=window_size)  # fmt: skip
    nbytes = T * Hq * Dv * q_dtype.itemsize
    if plan is None:
        return Dv

    if not isinstance(region, str):
        raise ValueError(f"region must be a region name (str), got {region=!r}")
    if not callable(getattr(plan, "check_fits", None)):
        raise ValueError(f"plan must be a jaxarena.ArenaPlan, got {type(plan).__name__}")
    note = f"{T} tokens x {Hq} heads x {Dv} values (q.shape[0] exceeds what the region holds?)"
    plan.check_fits((region, (T, Hq * Dv), q_dtype, note), arena=arena,
                    what="paged_prefill_attention_into")  # fmt: skip
    offset = plan.regions[region].offset_bytes
    if offset % 4:
        raise ValueError(
            f"paged_prefill_attention_into: region {region!r} starts at byte {offset}, not a "
            "multiple of 4; the kernel stores 32-bit words (plans align regions to 256 bytes "
            "by default)"
        )
    if nbytes >= _I32_LIMIT:
        raise NotImplementedError(
            f"paged_prefill_attention_into: {nbytes} bytes in region {region!r}: offsets "
            "inside a region are int32, so the output must stay below 2^31 bytes"
        )
    return Dv
