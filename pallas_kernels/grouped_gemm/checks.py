"""Argument checks of the grouped GEMM wrappers: every message names the argument, shows its
value and states the rule; nothing is traced before they pass."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from pallas_kernels._args import check_rank, is_concrete

__all__ = [
    "check_dense",
    "check_fp8",
    "check_group_offset",
    "check_group_sizes",
    "check_row_ids",
]

_FLOATS = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32), jnp.dtype(jnp.float16))
_FP8 = jnp.dtype(jnp.float8_e4m3fn)


def check_group_sizes(group_sizes: Any, groups: int, m: int) -> None:
    """`group_sizes` must be a 1-D integer array of `groups` entries; a concrete one is also
    checked for negative entries and a sum above the `m` rows."""
    (g,) = check_rank("group_sizes", group_sizes, 1, "[G] (rows per group)")
    if g != groups:
        raise ValueError(
            f"group_sizes.shape={(g,)} must have one entry per group of rhs ({groups})"
        )
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"group_sizes.dtype={group_sizes.dtype} must be an integer dtype")
    if is_concrete(group_sizes) and g:
        host = np.asarray(group_sizes).astype(np.int64)
        if (host < 0).any():
            i = int(np.argmax(host < 0))
            raise ValueError(f"group_sizes[{i}]={int(host[i])} must be >= 0")
        if host.sum() > m:
            raise ValueError(
                f"sum(group_sizes)={int(host.sum())} exceeds the {m} rows of lhs; the rows "
                "must be sorted by group and counted once"
            )


def _check_float(name: str, v: Any) -> None:
    dtype = jnp.dtype(v.dtype)
    if dtype not in _FLOATS:
        raise ValueError(f"{name}.dtype={dtype} must be bfloat16, float16 or float32")


def check_dense(lhs: Any, rhs: Any) -> tuple[int, int, int, int]:
    """`lhs [M, K]`, `rhs [G, K, N]`, both float; returns `(M, K, N, G)`."""
    m, k = check_rank("lhs", lhs, 2, "[M, K] (rows sorted by group)")
    g, k2, n = check_rank("rhs", rhs, 3, "[G, K, N] (one weight per group)")
    _check_float("lhs", lhs)
    _check_float("rhs", rhs)
    if k2 != k:
        raise ValueError(f"rhs.shape={(g, k2, n)} must have K={k} (lhs.shape={(m, k)})")
    if g < 1:
        raise ValueError(f"rhs.shape={(g, k2, n)} must have at least one group")
    return m, k, n, g


def check_fp8(lhs: Any, w: Any, scale_inv: Any, block: int) -> tuple[int, int, int, int]:
    """`lhs [M, K]` float, `w float8_e4m3fn[G, N, K]`, `scale_inv f32[G, ceil(N/b), ceil(K/b)]`;
    returns `(M, K, N, G)`."""
    m, k = check_rank("x", lhs, 2, "[M, K] (activations)")
    _check_float("x", lhs)
    g, n, k2 = check_rank("w", w, 3, "[G, N, K] (block-FP8 expert weights, N-major)")
    if jnp.dtype(w.dtype) != _FP8:
        raise ValueError(f"w.dtype={jnp.dtype(w.dtype)} must be float8_e4m3fn")
    if k2 != k:
        raise ValueError(f"w.shape={(g, n, k2)} must have K={k} (x.shape={(m, k)})")
    if g < 1:
        raise ValueError(f"w.shape={(g, n, k2)} must have at least one group")
    want = (g, -(-n // block), -(-k // block))
    shape = check_rank("scale_inv", scale_inv, 3, "[G, ceil(N/128), ceil(K/128)]")
    if shape != want:
        raise ValueError(
            f"scale_inv.shape={shape} must be {want}: one f32 per {block}x{block} block of w"
        )
    if jnp.dtype(scale_inv.dtype) != jnp.dtype(jnp.float32):
        raise ValueError(f"scale_inv.dtype={jnp.dtype(scale_inv.dtype)} must be float32")
    return m, k, n, g


def check_row_ids(row_ids: Any, m_tokens: int) -> int:
    """`row_ids int[R]`: the token row each sorted row reads; returns R. A concrete array is
    checked to stay inside `[0, m_tokens)`."""
    (r,) = check_rank("row_ids", row_ids, 1, "[R] (token row of each sorted row)")
    if not jnp.issubdtype(row_ids.dtype, jnp.integer):
        raise ValueError(f"row_ids.dtype={row_ids.dtype} must be an integer dtype")
    if is_concrete(row_ids) and r:
        host = np.asarray(row_ids).astype(np.int64)
        bad = (host < 0) | (host >= m_tokens)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"row_ids[{i}]={int(host[i])} must be in [0, {m_tokens})")
    return r


def check_group_offset(group_offset: Any, group_sizes: Any, rhs_groups: int) -> Any:
    """The weights `group_sizes`' groups read: `None` (all `rhs_groups`, one per group) or an
    `int32[1]` first weight `group_offset` of `len(group_sizes)` consecutive ones in the
    `rhs_groups` the weight holds. A concrete offset must keep them inside the weight (a traced
    one is clipped into `[0, rhs_groups - len(group_sizes)]` by the kernel)."""
    (g,) = check_rank("group_sizes", group_sizes, 1, "[G] (rows per group)")
    if group_offset is None:
        return None
    if g > rhs_groups:
        raise ValueError(f"group_sizes.shape={(g,)} must have at most one entry per weight of "
                         f"the layer-stacked rhs ({rhs_groups})")  # fmt: skip
    try:
        off = jnp.asarray(group_offset)
    except TypeError as e:
        raise ValueError(f"group_offset={group_offset!r} must be one integer") from e
    if off.size != 1 or off.ndim > 1 or not jnp.issubdtype(off.dtype, jnp.integer):
        raise ValueError(f"group_offset (shape {off.shape}, dtype {off.dtype}) must be one "
                         "integer: the weight group 0 reads")  # fmt: skip
    if is_concrete(group_offset):
        v = int(np.asarray(group_offset).reshape(()))
        if not 0 <= v <= rhs_groups - g:
            raise ValueError(f"group_offset={v} must be in [0, {rhs_groups - g}]: groups "
                             f"{v}..{v + g - 1} of the {rhs_groups} weights of rhs")  # fmt: skip
    return off.reshape(1).astype(jnp.int32)
