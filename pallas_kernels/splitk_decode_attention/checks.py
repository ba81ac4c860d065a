"""Argument checks of split-K decode attention's two entry points, and the split policy.

Everything here runs before tracing: shapes, dtypes, options, concrete values (lengths, page
ids, scales, sinks), the workspace or the arena regions. Messages name the argument, show its
value and state the rule.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from jaxarena import Levers, Target
from jaxarena.workspaces import (
    MAX_DECODE_SPLITS,
    SPLITK_ATTN_REGIONS,
    splitk_policy,
    splitk_slots_needed,
)
from jaxarena.workspaces import num_splits as _policy_num_splits
from pallas_kernels._args import check_finite as _check_finite
from pallas_kernels._args import check_kv_scale as _check_scale
from pallas_kernels._args import check_nonempty as _check_nonempty
from pallas_kernels._args import check_paged_heads, paged_v_shape
from pallas_kernels._args import check_rank as _shape
from pallas_kernels._args import is_concrete as _is_concrete
from pallas_kernels._args import is_int as _is_int

__all__ = ["splitk_num_splits", "validate", "FP8_DTYPE"]

_SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
FP8_DTYPE = jnp.dtype(jnp.float8_e4m3fn)
_FP8 = FP8_DTYPE
_I32_LIMIT = 2**31


def _is_pow2(n: int) -> bool:
    return n > 0 and pl.next_power_of_2(n) == n


def splitk_num_splits(
    batch_size: int,
    num_q_heads: int,
    *,
    levers: Levers | None = None,
    target: Target | None = None,
) -> int:
    """The split count the seed's policy gives a decode step of `batch_size` sequences.

    `num_splits(splitk_policy(levers, target), target.sm_count, num_q_heads,
    legacy_ref_seqs=batch_size)`, capped at 16 (the legacy rule alone can ask for up to one
    split per SM; the cap only lowers the slots used). `levers=None` reads the environment
    (`Levers.from_env()`), `target=None` detects the device (`Target.detect()`). The slots
    used, `splitk_slots_needed(B, Hq, splits)`, never exceed what `BufferSizes.from_config`
    sizes for the same levers and target when `batch_size <= max_batch_size`.
    """
    levers = Levers.from_env() if levers is None else levers
    target = Target.detect() if target is None else target
    policy = splitk_policy(levers, target)
    n = _policy_num_splits(policy, target.sm_count, num_q_heads, legacy_ref_seqs=batch_size)
    return max(1, min(int(n), MAX_DECODE_SPLITS))


def _check_float_option(name: str, value: Any, *, positive: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ValueError(f"{name} must be a Python float or None, got {name}={value!r}")
    if not math.isfinite(float(value)) or (positive and float(value) <= 0.0):
        rule = "finite and > 0" if positive else "finite"
        raise ValueError(f"{name} must be {rule}, got {name}={value}")


def validate(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    *,
    num_splits: Any,
    sm_scale: Any,
    levers: Any,
    target: Any,
    window_size: Any,
    sinks: Any,
    softcap: Any,
    k_scale: Any,
    v_scale: Any,
    v_head_dim: Any,
    return_lse: Any,
    workspace: Any = None,
    arena: Any = None,
    plan: Any = None,
    output_in_arena: bool = True,
) -> tuple[int, int]:
    """Checks every argument of both entry points before anything is traced.

    Returns:
      `(num_splits, d_v)`: the split count to run (`num_splits`, or the policy's when it is
      None) and the value head dim.

    Raises:
      ValueError: see `splitk_decode_attention` and `splitk_decode_attention_into`.
      NotImplementedError: see `splitk_decode_attention`.
    """
    B, Hq, D = _shape("q", q, 3, "[batch, num_q_heads, head_dim]")
    _check_nonempty("q", B, "batch size q.shape[0]")
    kshape = _shape("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    vshape = paged_v_shape(kshape, v_cache, v_head_dim)
    bshape = _shape("block_tables", block_tables, 2, "[batch, max_blocks_per_seq]")
    lshape = _shape("seq_lens", seq_lens, 1, "[batch]")
    q_dtype = jnp.dtype(q.dtype)
    if not jnp.issubdtype(q_dtype, jnp.floating):
        raise ValueError(f"q must be floating (float32, bfloat16, float16), got q.dtype={q_dtype}")
    check_paged_heads(Hq, D, kshape, vshape)
    num_blocks, block_size, Hkv, _ = kshape
    Dv = vshape[3]
    kv_dtype = jnp.dtype(k_cache.dtype)
    if v_cache is not None and kv_dtype != jnp.dtype(v_cache.dtype):
        raise ValueError(
            f"k_cache and v_cache must share a dtype, got k_cache.dtype={k_cache.dtype} and "
            f"v_cache.dtype={v_cache.dtype}"
        )
    for name, arr, shape, want in (
        ("block_tables", block_tables, bshape, (B, None)),
        ("seq_lens", seq_lens, lshape, (B,)),
    ):
        if jnp.dtype(arr.dtype) != jnp.int32:
            raise ValueError(f"{name} must be int32, got {name}.dtype={arr.dtype}")
        if shape[0] != want[0]:
            raise ValueError(f"{name}.shape[0]={shape[0]} must equal the batch size q.shape[0]={B}")
    max_pages = bshape[1]
    if max_pages < 1 or num_blocks < 1 or block_size < 1:
        raise ValueError(
            f"need at least one page: block_tables.shape[1]={max_pages}, "
            f"k_cache.shape[:2]={kshape[:2]}"
        )
    if num_splits is not None:
        if not _is_int(num_splits):
            raise ValueError(f"num_splits must be an int or None, got {num_splits=!r}")
        if not 1 <= num_splits <= MAX_DECODE_SPLITS:
            raise ValueError(
                f"num_splits must be in 1..{MAX_DECODE_SPLITS} (the workspace is sized for at "
                f"most {MAX_DECODE_SPLITS} splits), got {num_splits=}"
            )
    _check_float_option("sm_scale", sm_scale, positive=False)
    _check_float_option("softcap", softcap, positive=True)
    if window_size is not None and (not _is_int(window_size) or window_size < 1):
        raise ValueError(
            f"window_size must be None or an int >= 1 (keys seen: the window_size most "
            f"recent), got {window_size=!r}"
        )
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse must be True or False, got {return_lse=!r}")
    if not isinstance(output_in_arena, bool):
        raise ValueError(f"output_in_arena must be True or False, got {output_in_arena=!r}")
    if sinks is not None:
        sshape = _shape("sinks", sinks, 1, f"[num_q_heads] (one logit per query head, {Hq})")
        if sshape != (Hq,) or not jnp.issubdtype(sinks.dtype, jnp.floating):
            raise ValueError(
                f"sinks must be a floating array of shape ({Hq},) (q.shape[1]), got "
                f"sinks.dtype={sinks.dtype}, sinks.shape={sshape}"
            )
        if _is_concrete(sinks) and not np.all(np.isfinite(np.asarray(sinks, np.float32))):
            raise ValueError(f"sinks must be finite, got sinks={np.asarray(sinks).tolist()}")
    if levers is not None and not isinstance(levers, Levers):
        raise ValueError(f"levers must be a jaxarena.Levers or None, got {levers=!r}")
    if target is not None and not isinstance(target, Target):
        raise ValueError(f"target must be a jaxarena.Target or None, got {target=!r}")

    if q_dtype not in _SUPPORTED_DTYPES:
        raise NotImplementedError(f"q.dtype={q_dtype} is not supported; use f32, bf16 or f16")
    if kv_dtype == _FP8:
        _check_scale("k_scale", k_scale, Hkv)
        _check_scale("v_scale", v_scale, Hkv)
    else:
        if kv_dtype != q_dtype:
            raise NotImplementedError(
                f"k_cache.dtype={kv_dtype} differs from q.dtype={q_dtype}; the cache must be "
                "in q's dtype or float8_e4m3fn (with k_scale and v_scale)"
            )
        for name, val in (("k_scale", k_scale), ("v_scale", v_scale)):
            if val is not None:
                raise ValueError(
                    f"{name} applies to a float8_e4m3fn KV cache only; k_cache.dtype={kv_dtype}"
                )
    for name, d in (("head_dim", D), ("v_head_dim", Dv)):
        if d < 1:
            raise ValueError(
                f"{name} must be at least 1, got {name}={d} (q.shape={tuple(q.shape)})"
            )
        if not (_is_pow2(d) or d % 8 == 0):
            raise NotImplementedError(
                f"{name}={d} must be a power of two or a multiple of 8 (the kernel works in "
                "power-of-two column chunks of at least 8)"
            )
    if q_dtype.itemsize == 2 and Dv % 2:
        raise NotImplementedError(f"v_head_dim={Dv} must be even for a 16-bit output")
    if not _is_pow2(block_size):
        raise NotImplementedError(
            f"block_size={block_size} (k_cache.shape[1]) must be a power of two (Triton tiles)"
        )

    # Values, when they are known (eager calls). Under jit the kernel clamps every length to
    # max_blocks_per_seq * block_size and every page id into [0, num_blocks).
    _check_finite("q", q, "every output of that query head would be NaN")
    if _is_concrete(seq_lens):
        lens = np.asarray(seq_lens)
        cap = max_pages * block_size
        if lens.size and lens.min() < 0:
            raise ValueError(f"seq_lens must be >= 0, got seq_lens={lens.tolist()}")
        if lens.size and lens.max() > cap:
            b = int(lens.argmax())
            raise ValueError(
                f"block_tables is too narrow: seq_lens[{b}]={int(lens[b])} needs "
                f"{-(-int(lens[b]) // block_size)} pages of {block_size} tokens but "
                f"block_tables.shape[1]={max_pages} (covers {cap} tokens)"
            )
        if _is_concrete(block_tables):
            table = np.asarray(block_tables)
            pages = np.arange(max_pages)[None, :]
            used = pages < -(-lens[:, None] // block_size)
            if window_size is not None:  # pages wholly before the window are never read
                used &= pages >= np.maximum(lens[:, None] - window_size, 0) // block_size
            bad = used & ((table < 0) | (table >= num_blocks))
            if bad.any():
                b, p = (int(i) for i in np.argwhere(bad)[0])
                raise ValueError(
                    f"block_tables[{b}, {p}]={int(table[b, p])} is out of range: page ids "
                    f"must be in [0, {num_blocks}) (k_cache.shape[0]={num_blocks})"
                )

    splits = (
        splitk_num_splits(B, Hq, levers=levers, target=target)
        if num_splits is None
        else int(num_splits)
    )
    needed = splitk_slots_needed(B, Hq, splits)
    row = f"[{Dv} + 2] f32"

    if workspace is not None:
        wshape = _shape("workspace", workspace, 2, f"[slots, head_dim_v + 2] (rows of {row})")
        if jnp.dtype(workspace.dtype) != jnp.float32 or wshape[1] != Dv + 2:
            raise ValueError(
                f"workspace must be float32[slots, {Dv + 2}] (head_dim_v + 2), got "
                f"workspace.dtype={workspace.dtype}, workspace.shape={wshape}"
            )
        if needed > wshape[0]:
            raise ValueError(
                f"workspace too small: B={B} x Hq={Hq} x num_splits={splits} needs {needed} "
                f"slots but workspace.shape[0]={wshape[0]}; use fewer splits or a larger "
                "workspace (size the arena for this batch and policy)"
            )
    if plan is None:
        return splits, Dv

    if not callable(getattr(plan, "check_fits", None)):
        raise ValueError(f"plan must be a jaxarena.ArenaPlan, got {type(plan).__name__}")
    uses = [(SPLITK_ATTN_REGIONS[1], (B, Hq * Dv), q_dtype, "the output")]
    if not output_in_arena:  # the output is a value: only the workspace is in the arena
        uses = []
    if needed:
        note = f"B={B} x Hq={Hq} x num_splits={splits} = {needed} slots of {row}"
        uses.append((SPLITK_ATTN_REGIONS[0], (needed, Dv + 2), jnp.float32, note))
    plan.check_fits(*uses, arena=arena, what="splitk_decode_attention_into")
    for name, shape, dtype, *_ in uses:
        region = plan.regions[name]
        nbytes = math.prod(shape) * jnp.dtype(dtype).itemsize
        if region.offset_bytes % 4:
            raise ValueError(
                f"splitk_decode_attention_into: region {name!r} starts at byte "
                f"{region.offset_bytes}, not a multiple of 4; the kernels store 32-bit words "
                "(plans align regions to 256 bytes by default)"
            )
        if nbytes >= _I32_LIMIT:
            raise NotImplementedError(
                f"splitk_decode_attention_into: {nbytes} bytes in region {name!r}: offsets "
                "inside a region are int32, so a region's used part must stay below 2^31 bytes"
            )
    return splits, Dv
