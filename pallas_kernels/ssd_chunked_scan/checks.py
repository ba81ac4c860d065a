"""Argument checks of the SSD scan's entry points and the scratch geometry they imply."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from jaxarena._units import ROW_BYTES
from jaxarena.workspaces import SSD_CHUNK, ssd_chunk_slot_bytes, ssd_scratch_layout
from pallas_kernels._args import array_shape as _shape_of
from pallas_kernels._args import check_finite as _check_finite
from pallas_kernels._args import check_float as _check_float
from pallas_kernels._args import int_values as _int_values

SSD_REGION: str = "ssd_scratch"
"""The arena region `ssd_chunked_scan_into` uses as the kernel's f32 scratch."""

SUPPORTED_CHUNK_SIZES: tuple[int, ...] = (16, 32, 64, 128, 256)
"""Accepted `chunk_size` values (Triton tiles are powers of two, `tl.dot` needs >= 16). With a
workspace only the scratch's chunk length, 64, is accepted."""

# One arena row (256 bytes) is one row of 64 f32 of the scratch: SSD_CHUNK == ROW_BYTES // 4.
_F32_PER_ROW = ROW_BYTES // 4
assert SSD_CHUNK == _F32_PER_ROW

_X_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Dims:
    num_tokens: int
    num_heads: int
    head_dim: int
    num_groups: int
    state_dim: int
    num_seqs: int
    chunk_size: int
    num_chunks: int
    # Workspace geometry: chunk slots per section and the first row (of `chunk_size` f32) of
    # each section in the 2-D view of the scratch.
    num_chunks_ws: int
    dt_row: int
    dacs_row: int
    cb_row: int
    ws_rows: int


def _per_chunk_floats(num_heads: int, num_groups: int) -> int:
    return ssd_chunk_slot_bytes(num_heads, num_groups) // 4


def _validate(
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    *,
    chunk_size: Any,
    D: Any,
    dt_bias: Any,
    dt_softplus: Any,
    initial_states: Any,
    cu_seqlens: Any,
    workspace: Any,
    z: Any = None,
    dt_limit: Any = (0.0, float("inf")),
    state_dtype: Any = jnp.float32,
) -> _Dims:
    """Checks every argument of both entry points; raises before anything is traced.

    `cu_seqlens` values are checked only when concrete (not a tracer).
    """
    xs = _shape_of("x", x)
    if len(xs) != 3:
        raise ValueError(f"x.shape={xs} must be [T, H, P] (3-D)")
    T, H, P = xs
    if T < 1 or H < 1 or P < 1:
        raise ValueError(f"x.shape={xs}: T, H and P must all be >= 1")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"x.dtype={x.dtype} must be a floating dtype")
    if jnp.dtype(x.dtype) not in _X_DTYPES:
        raise NotImplementedError(
            f"x.dtype={x.dtype} is not supported; use float32, bfloat16 or float16"
        )
    if _shape_of("dt", dt) != (T, H):
        raise ValueError(f"dt.shape={tuple(dt.shape)} must be [T, H] = {(T, H)}")
    if _shape_of("A", A) != (H,):
        raise ValueError(f"A.shape={tuple(A.shape)} must be [H] = {(H,)}")
    bs = _shape_of("B", B)
    if len(bs) != 3 or bs[0] != T:
        raise ValueError(f"B.shape={bs} must be [T, G, N] with T={T}")
    G, N = bs[1], bs[2]
    if G < 1 or N < 1:
        raise ValueError(f"B.shape={bs}: G and N must be >= 1")
    if _shape_of("C", C) != bs:
        raise ValueError(f"C.shape={tuple(C.shape)} must equal B.shape={bs}")
    if H % G != 0:
        raise ValueError(
            f"H={H} (x.shape[1]) must be a multiple of G={G} (B.shape[1]): "
            "head h uses group h // (H // G)"
        )
    for name, v in (("dt", dt), ("A", A), ("B", B), ("C", C)):
        _check_float(name, v)
    # exp(dt' A) with A = -inf is 0 (the state forgets at once), but the chunked form takes
    # differences of cumulative sums, -inf - -inf = NaN: every output would be NaN although
    # the math is finite. Refused when known; see the docstring for traced values.
    _check_finite_A(A)
    if dt_bias is not None:
        if _shape_of("dt_bias", dt_bias) != (H,):
            raise ValueError(f"dt_bias.shape={tuple(dt_bias.shape)} must be [H] = {(H,)}")
        _check_float("dt_bias", dt_bias)
    if D is not None:
        if _shape_of("D", D) not in ((H,), (H, P)):
            raise ValueError(f"D.shape={tuple(D.shape)} must be [H] = {(H,)} or [H, P] = {(H, P)}")
        _check_float("D", D)
    if z is not None:
        if _shape_of("z", z) != (T, H, P):
            raise ValueError(f"z.shape={tuple(z.shape)} must be [T, H, P] = {(T, H, P)} like x")
        _check_float("z", z)
    _dt_limit(dt_limit)
    _state_dtype(state_dtype)
    if not isinstance(dt_softplus, bool):
        raise ValueError(f"{dt_softplus=} must be a bool")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise ValueError(f"{chunk_size=} must be an int")
    if chunk_size not in SUPPORTED_CHUNK_SIZES:
        raise ValueError(f"{chunk_size=} must be one of {SUPPORTED_CHUNK_SIZES}")

    if cu_seqlens is None:
        S = 1
    else:
        cs = _shape_of("cu_seqlens", cu_seqlens)
        if len(cs) != 1 or cs[0] < 2:
            raise ValueError(f"cu_seqlens.shape={cs} must be [S + 1] with S >= 1")
        if not jnp.issubdtype(cu_seqlens.dtype, jnp.integer):
            raise ValueError(f"cu_seqlens.dtype={cu_seqlens.dtype} must be an integer dtype")
        S = cs[0] - 1
        if not isinstance(cu_seqlens, jax.core.Tracer):
            cu = np.asarray(cu_seqlens).astype(np.int64)
            if cu[0] != 0 or cu[-1] != T or np.any(np.diff(cu) < 0):
                raise ValueError(
                    f"cu_seqlens={cu.tolist()} must be non-decreasing from 0 to T={T} "
                    "(sequence s holds tokens cu_seqlens[s]:cu_seqlens[s + 1])"
                )
    if initial_states is not None:
        if _shape_of("initial_states", initial_states) != (S, H, P, N):
            raise ValueError(
                f"initial_states.shape={tuple(initial_states.shape)} must be "
                f"[S, H, P, N] = {(S, H, P, N)} (S = len(cu_seqlens) - 1, or 1)"
            )
        _check_float("initial_states", initial_states)

    L = chunk_size
    nc = pl.cdiv(T, L)
    if workspace is None:
        ncw = nc
    else:
        ws = _shape_of("workspace", workspace)
        if workspace.dtype != jnp.float32 or len(ws) != 1:
            raise ValueError(
                f"workspace (shape={ws}, dtype={workspace.dtype}) must be a flat float32 array: "
                "the f32 view of the arena's ssd_scratch region"
            )
        if chunk_size != SSD_CHUNK:
            raise ValueError(
                f"{chunk_size=} must be {SSD_CHUNK} with a workspace: the scratch holds chunks "
                f"of {SSD_CHUNK} tokens"
            )
        per_chunk = _per_chunk_floats(H, G)
        if ws[0] == 0 or ws[0] % per_chunk:
            raise ValueError(
                f"workspace length {ws[0]} must be a positive multiple of {per_chunk} "
                f"(2*H*64 + G*64*64 f32 per chunk slot for H={H}, G={G}): it is not an SSD "
                "scratch sized for these heads and groups"
            )
        ncw = ws[0] // per_chunk
        if nc > ncw - 1:
            raise ValueError(
                f"T={T} tokens need {nc} chunks of {L}, but the workspace holds {ncw} chunk "
                f"slots, sized for at most {L * (ncw - 1)} tokens (nc = ceil(M / 64) + 1 for "
                "M = max_batch_tokens): size the arena for more tokens or split the call"
            )
    if workspace is None:
        dt_off, dacs_off, cb_off = 0, H * ncw * L, 2 * H * ncw * L
    else:
        layout = ssd_scratch_layout(H, G, L * (ncw - 1))
        dt_off, dacs_off, cb_off = (layout[k][0] // 4 for k in ("dt", "dA_cumsum", "CB"))
    rows = ncw * (2 * H + G * L)
    return _Dims(
        num_tokens=T,
        num_heads=H,
        head_dim=P,
        num_groups=G,
        state_dim=N,
        num_seqs=S,
        chunk_size=L,
        num_chunks=nc,
        num_chunks_ws=ncw,
        dt_row=dt_off // L,
        dacs_row=dacs_off // L,
        cb_row=cb_off // L,
        ws_rows=rows,
    )


def _dt_limit(dt_limit: Any) -> tuple[float, float]:
    """`dt_limit` as `(lo, hi)` floats; a `ValueError` unless it is two numbers, no NaN,
    `lo <= hi`."""
    ok = isinstance(dt_limit, tuple | list) and len(dt_limit) == 2
    ok = ok and all(
        isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)
        for v in dt_limit
    )
    if not ok:
        raise ValueError(f"dt_limit={dt_limit!r} must be a pair of numbers (lo, hi)")
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    if np.isnan(lo) or np.isnan(hi) or lo > hi:
        raise ValueError(f"dt_limit={dt_limit!r} must satisfy lo <= hi (no NaN)")
    return lo, hi


def _state_dtype(state_dtype: Any) -> str:
    """The name of a supported final-state dtype (float32, bfloat16, float16)."""
    try:
        dt = jnp.dtype(state_dtype)
    except TypeError:
        dt = None
    if dt not in _X_DTYPES:
        raise ValueError(
            f"state_dtype={state_dtype!r} must be float32, bfloat16 or float16 (the dtype of "
            "the returned final states)"
        )
    return dt.name


def _check_finite_A(A: Any) -> None:
    """A concrete non-finite `A` is refused: exp(dt' A) with A = -inf is 0 (the state forgets
    at once), but the chunked form takes differences of cumulative sums, -inf - -inf = NaN, so
    every output would be NaN although the math is finite. The shared check (NumPy, so also a
    concrete `A` inside a caller's `jit`); a traced `A` is not checked."""
    _check_finite("A", A, "A must be finite (a very negative A, e.g. -1e4, forgets at once)")


def _as_cu(cu_seqlens: Any) -> Any:
    """A list or tuple of ints becomes an int32 array (a float or an int past int32 entry is a
    `ValueError`, never truncated or an `OverflowError`); anything else is left to
    `_validate`."""
    if isinstance(cu_seqlens, list | tuple):
        return _int_values("cu_seqlens", cu_seqlens)
    return cu_seqlens
