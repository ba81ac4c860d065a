"""Argument checks of the GDN chunked prefill (both entry points); all raise before tracing."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena.workspaces import GDN_CHUNK, gdn_fla_sections
from pallas_kernels._args import check_rank, int_values

GDN_REGION: str = "gdn_fla_scratch"
"""The arena region `gdn_chunked_into` keeps W, U, S, uc and gc in."""

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
"""Key / value head dims the kernels take (powers of two: Triton tiles; at most one row)."""

_FLOATS = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
ROW_BYTES = 256


@dataclasses.dataclass(frozen=True)
class Dims:
    """Shapes of one call."""

    num_tokens: int
    num_heads: int
    num_value_heads: int
    key_dim: int
    value_dim: int
    num_seqs: int

    @property
    def chunk_slots(self) -> int:
        """Chunk slots the call may use: each sequence padded to whole chunks of 64 needs at
        most `sum ceil(len / 64) <= floor((T + 63 S) / 64)` of them."""
        return max((self.num_tokens + (GDN_CHUNK - 1) * self.num_seqs) // GDN_CHUNK, 1)


def as_cu(cu_seqlens: Any) -> Any:
    """A list or tuple of ints becomes an int32 array (entries checked); arrays pass through."""
    if isinstance(cu_seqlens, list | tuple):
        return int_values("cu_seqlens", cu_seqlens)
    return cu_seqlens


def _float(name: str, v: Any, shape: tuple[int, ...], layout: str) -> None:
    got = check_rank(name, v, len(shape), layout)
    if got != shape:
        raise ValueError(f"{name}.shape={got} must be {layout} = {shape}")
    if jnp.dtype(v.dtype) not in _FLOATS:
        if not jnp.issubdtype(v.dtype, jnp.floating):
            raise ValueError(f"{name}.dtype={v.dtype} must be a floating dtype")
        raise NotImplementedError(
            f"{name}.dtype={v.dtype} is not supported; use float32, bfloat16 or float16"
        )


def validate(q, k, v, g, beta, *, cu_seqlens, initial_states, scale, use_qk_l2norm) -> Dims:
    """Checks every argument; returns the shapes."""
    T, H, K = check_rank("q", q, 3, "[T, H, K]")
    V = check_rank("v", v, 3, "[T, HV, V]")[2]
    HV = v.shape[1]
    if T < 1:
        raise ValueError(f"q has T={T} tokens; at least one is required")
    _float("q", q, (T, H, K), "[T, H, K]")
    _float("k", k, (T, H, K), "[T, H, K] like q")
    _float("v", v, (T, HV, V), "[T, HV, V] with q's T")
    if H < 1 or HV % H:
        raise ValueError(f"v has HV={HV} value heads; it must be a multiple of q's H={H} heads")
    _float("g", g, (T, HV), "[T, HV] (log of the per-token decay, <= 0)")
    _float("beta", beta, (T, HV), "[T, HV]")
    for name, d in (("K (q.shape[2])", K), ("V (v.shape[2])", V)):
        if d not in SUPPORTED_HEAD_DIMS:
            raise NotImplementedError(f"head dim {name}={d} is not one of {SUPPORTED_HEAD_DIMS}")
    if not isinstance(use_qk_l2norm, bool):
        raise ValueError(f"use_qk_l2norm={use_qk_l2norm!r} must be a bool")
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale)
    ):
        raise ValueError(f"scale={scale!r} must be None or a finite Python number")
    if cu_seqlens is None:
        S = 1
    else:
        cs = check_rank("cu_seqlens", cu_seqlens, 1, "[S + 1]")
        S = cs[0] - 1
        if S < 1:
            raise ValueError(f"cu_seqlens.shape={cs} must be [S + 1] with S >= 1")
        if not jnp.issubdtype(cu_seqlens.dtype, jnp.integer):
            raise ValueError(f"cu_seqlens.dtype={cu_seqlens.dtype} must be an integer dtype")
        if not isinstance(cu_seqlens, jax.core.Tracer):
            cu = np.asarray(cu_seqlens).astype(np.int64)
            if cu[0] != 0 or cu[-1] != T or (np.diff(cu) < 0).any():
                raise ValueError(f"cu_seqlens={cu.tolist()} must be non-decreasing from 0 to T={T}")
    if initial_states is not None:
        _float("initial_states", initial_states, (S, HV, K, V), "[S, HV, K, V]")
    return Dims(T, H, HV, K, V, S)


def section_rows(dims: Dims, num_chunks: int) -> dict[str, int]:
    """First row (of 256 bytes) of each section for `num_chunks` slots, and `rows` in all."""
    layout = gdn_fla_sections(dims.num_value_heads, num_chunks, dims.key_dim)
    out = {name: off // ROW_BYTES for name, (off, _) in layout.items()}
    out["rows"] = sum(n for _, n in layout.values()) // ROW_BYTES
    return out


def region_chunk_slots(nbytes: int, num_value_heads: int) -> int:
    """Chunk slots a `gdn_fla_scratch` region of `nbytes` holds (128x128 heads)."""
    per_slot = sum(n for _, n in gdn_fla_sections(num_value_heads, 1).values())
    return nbytes // per_slot
