"""Public wrappers: the Mamba-2 SSD chunked scan over a packed stream of sequences.

Two Pallas kernels (see kernel.py), with packed sequences:

1. `ssd_cumsum_cb_kernel` (grid chunk x head): `dt' = softplus(dt + dt_bias)` (or without
   softplus), `dA_cumsum` (restarting at each sequence's first token) and `CB = C B^T`, all
   three stored into the f32 scratch (the arena's `ssd_scratch` in the arena form), as
   mamba_ssm's `ssd_combined` computes them.
2. `ssd_scan_kernel` (grid head x block of head_dim columns): walks the chunks in order inside
   the kernel with the running state in registers, and writes every chunk's outputs (the
   intra-chunk part from the scratch's CB, the inter-chunk part from the running state or a
   sequence's initial state, and `D x`) and the final state of every sequence that ends in
   the chunk. No per-chunk state and no intra-chunk output is ever stored: beside the scratch,
   the outputs and the inputs, the GPU temporaries are `seq` (int32 per token of the whole
   chunks) and, only where P or N is not a power of two (>= 16), padded inputs and sliced
   outputs. T is never padded: the kernels mask the last chunk's tail.

The launches per call do not depend on T (no XLA loop). The price is parallelism: phase 2
runs `H * P / block_p` programs (256 for H=64, P=64), each sequential over the chunks, where
mamba_ssm's split runs chunks in parallel and keeps per-chunk states `[nc, H, P, N]` in HBM
(67 MB at T=2048 for H=64, P=64, N=128), which the seed's scratch does not hold.

Chunks are cut from token 0 of the packed stream (a sequence boundary may fall anywhere
inside a chunk); the decay between two tokens of different sequences is masked to zero, so
the result equals the sequential recurrence that restarts every sequence from its own
initial state.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxarena._units import ROW_BYTES
from jaxarena.workspaces import SSD_CHUNK
from pallas_kernels._args import resolve_interpret
from pallas_kernels.ssd_chunked_scan.checks import (
    _F32_PER_ROW,
    SSD_REGION,
    SUPPORTED_CHUNK_SIZES,
    _as_cu,
    _Dims,
    _dt_limit,
    _per_chunk_floats,
    _state_dtype,
    _validate,
)
from pallas_kernels.ssd_chunked_scan.kernel import ssd_cumsum_cb_kernel, ssd_scan_kernel

__all__ = [
    "SSD_REGION",
    "SUPPORTED_CHUNK_SIZES",
    "ssd_chunked_scan",
    "ssd_chunked_scan_into",
]

_HI = jax.lax.Precision.HIGHEST
# Tiles of the Triton kernels (see kernel.py): the contraction slices over tokens and over
# state columns, the row blocks of a chunk, and the head_dim columns of one scan program.
_BLOCK_K = 16
_BLOCK_N = 32
_BLOCK_L = 64
_BLOCK_P = 16


def _tile(n: int) -> int:
    """Smallest power of two >= max(n, 16): Triton tiles are powers of two, `tl.dot` >= 16."""
    return max(16, pl.next_power_of_2(n))


def _pad_to(v: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    if tuple(v.shape) == shape:
        return v
    return jnp.pad(v, [(0, t - s) for s, t in zip(v.shape, shape, strict=True)])


@functools.partial(
    jax.jit,
    static_argnames=(
        "dims", "dt_softplus", "has_d", "has_init", "interpret", "dt_limit", "state_dtype"
    ),
)  # fmt: skip
def _ssd_impl(
    x,
    dt,
    A,
    B,
    C,
    D,
    dt_bias,
    initial_states,
    cu_seqlens,
    ws2d,
    z=None,
    *,
    dims: _Dims,
    dt_softplus: bool,
    has_d: bool,
    has_init: bool,
    interpret: bool,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    state_dtype: str = "float32",
):
    T, H, P = dims.num_tokens, dims.num_heads, dims.head_dim
    G, N, S = dims.num_groups, dims.state_dim, dims.num_seqs
    L, nc, ncw = dims.chunk_size, dims.num_chunks, dims.num_chunks_ws
    hpg = H // G
    Tp, Pp, Np = nc * L, _tile(P), _tile(N)
    f32 = jnp.float32

    # T is not padded (the kernels mask the last chunk's tail: a padded copy would be a GPU
    # temporary growing with T). P and N are padded to powers of two only where they are not
    # (zero padding is exact: padded P columns give zero outputs, padded N columns add zero
    # products); at P=64, N=128 nothing is copied.
    xp = _pad_to(x, (T, H, Pp))
    Bp = _pad_to(B, (T, G, Np))
    Cp = _pad_to(C, (T, G, Np))
    A32 = A.astype(f32)
    bias = jnp.zeros((H,), f32) if dt_bias is None else dt_bias.astype(f32)
    D32 = jnp.zeros((H,), f32) if D is None else D.astype(f32)
    d_per_col = D is not None and D.ndim == 2
    if d_per_col:
        D32 = _pad_to(D32, (H, Pp))
    has_z = z is not None
    zp = _pad_to(z, (T, H, Pp)) if has_z else jnp.zeros((1,), f32)  # never read without z
    cu = cu_seqlens.astype(jnp.int32)

    # Sequence of each token: the last s with cu[s] <= t, which skips empty sequences.
    # Padding tokens join the last sequence; with dt' = 0 they change nothing. (A count of
    # boundaries, not `searchsorted`, whose default method is a while loop of log2(T) steps.)
    tok = jnp.arange(Tp, dtype=jnp.int32)
    seq = jnp.sum(cu[None, 1:S] <= tok[:, None], axis=1, dtype=jnp.int32)

    # Every tile is at most [64, 64] f32 whatever L (kernel.py), so 4 warps hold them.
    params = plgpu.CompilerParams(num_warps=4, num_stages=1)
    bk, bn, bl = min(_BLOCK_K, L), min(_BLOCK_N, Np), min(_BLOCK_L, L)
    ws_geom = dict(
        chunk_size=L,
        num_chunks_ws=ncw,
        heads_per_group=hpg,
        num_groups=G,
        dt_row=dims.dt_row,
        dacs_row=dims.dacs_row,
        cb_row=dims.cb_row,
    )
    # The scratch and the per-head scalars are whole-array operands, addressed in the kernel.
    whole = pl.no_block_spec
    ws2d = pl.pallas_call(
        functools.partial(
            ssd_cumsum_cb_kernel,
            **ws_geom,
            num_tokens=T,
            dt_softplus=dt_softplus,
            block_l=bl,
            block_n=bn,
            dt_min=dt_limit[0],
            dt_max=dt_limit[1],
        ),
        grid=(nc, H),
        in_specs=[whole] * 7,
        out_specs=whole,
        out_shape=jax.ShapeDtypeStruct(ws2d.shape, f32),
        input_output_aliases={6: 0},
        compiler_params=params,
        interpret=interpret,
        name="ssd_cumsum_cb",
    )(dt, A32, bias, Bp, Cp, seq, ws2d)

    bp = min(_BLOCK_P, Pp)
    if has_init:
        init = _pad_to(initial_states, (S, H, Pp, Np))  # converted to f32 in the kernel
    else:
        init = jnp.zeros((1,), f32)  # never read
    y, final = pl.pallas_call(
        functools.partial(
            ssd_scan_kernel,
            **ws_geom,
            num_tokens=T,
            num_chunks=nc,
            num_seqs=S,
            has_d=has_d,
            has_init=has_init,
            block_l=bl,
            block_k=bk,
            block_n=bn,
            block_p=bp,
            d_per_col=d_per_col,
            has_z=has_z,
        ),
        grid=(H, Pp // bp),
        in_specs=[whole] * 9,
        out_specs=[whole, whole],
        out_shape=[
            jax.ShapeDtypeStruct((T, H, Pp), x.dtype),
            jax.ShapeDtypeStruct((S, H, Pp, Np), jnp.dtype(state_dtype)),
        ],
        compiler_params=params,
        interpret=interpret,
        name="ssd_scan",
    )(xp, Bp, Cp, seq, cu, ws2d, D32, init, zp)
    if Pp != P:
        y = y[:, :, :P]
    if (Pp, Np) != (P, N):
        final = final[:, :, :P, :N]
    return y, final, ws2d


def ssd_chunked_scan(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    *,
    chunk_size: int = 64,
    D: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = False,
    initial_states: jax.Array | None = None,
    cu_seqlens: jax.Array | None = None,
    workspace: jax.Array | None = None,
    interpret: bool | None = None,
    z: jax.Array | None = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    state_dtype: Any = jnp.float32,
) -> tuple[jax.Array, jax.Array] | tuple[jax.Array, jax.Array, jax.Array]:
    """Mamba-2 SSD scan of a packed token stream, chunked (mamba_ssm's `ssd_combined`).

    Per sequence, from its initial state: `h_t = exp(dt'_t A) h_{t-1} + dt'_t x_t B_t^T`,
    `y_t = h_t C_t + D x_t`. Two Pallas kernels: dt', dA_cumsum and CB into the scratch
    (chunks in parallel); then one program per (head, 16 head_dim columns) walking the chunks
    with the running state in registers, writing y and the final states (module docstring).
    The launches per call do not depend on T.

    Args:
      x: `[T, H, P]` float32 / bfloat16 / float16, T >= 1.
      dt: `[T, H]` float (raw; `dt' = softplus(dt + dt_bias)` with `dt_softplus`, else
        `dt + dt_bias`).
      A: `[H]` float (negative for a decaying state), finite: a concrete non-finite `A` is a
        ValueError; a traced one gives NaN outputs.
      B, C: `[T, G, N]` float; head `h` uses group `h // (H // G)`; `H % G == 0`.
      chunk_size: tokens per chunk, one of `SUPPORTED_CHUNK_SIZES`; 64 with a workspace.
      D: optional `[H]` or `[H, P]` skip term, `y += D x`.
      dt_bias: optional `[H]`.
      dt_softplus: apply softplus to `dt + dt_bias`.
      z: optional `[T, H, P]` float gate: `y = (h C + D x) * silu(z)`, as mamba_ssm's
        `mamba_chunk_scan_combined(z=...)`. The gated RMSNorm of a Mamba-2 block is NOT in the
        kernel: mamba_ssm's / transformers' `norm_before_gate=False` (the Mamba-2 default) is
        `rmsnorm(y * silu(z))` = pass `z` here, then a plain (grouped) RMSNorm;
        `norm_before_gate=True` is `rmsnorm(y) * silu(z)` = leave `z=None` and gate after
        the norm.
      dt_limit: `(lo, hi)`, `lo <= hi`: `dt'` is clamped to it after the softplus, always
        (mamba_ssm's fused path); with the default `(0, inf)` a negative `dt'` (possible only
        without softplus) becomes 0.
      state_dtype: dtype of the returned final states (float32, bfloat16 or float16): the f32
        states rounded once in the kernel.
      initial_states: optional `[S, H, P, N]` float, the state before each sequence's first
        token (zeros if absent).
      cu_seqlens: optional integer `[S + 1]` (an array or a list of ints); sequence `s` is
        tokens `cu_seqlens[s]:cu_seqlens[s + 1]`; absent means one sequence. Concrete values are
        checked (non-decreasing from 0 to T, ValueError otherwise); a traced array inside
        `jit` is not checked, and invalid values then give unspecified results (no error).
        Empty sequences are allowed and return their initial state.
      workspace: optional flat float32 view of the arena's `ssd_scratch`: `dt'[H][nc][64]`,
        `dA_cumsum[H][nc][64]`, `CB[nc][G][64][64]` back to back, its chunk-slot count `nc`
        derived from its length (`len = nc * (2*H*64 + G*64*64)`, ValueError if not a
        multiple). A call uses slots `0 .. ceil(T/64) - 1` and requires
        `ceil(T/64) <= nc - 1`, i.e. `T <= 64 * (nc - 1)`: the largest token count the scratch
        can have been sized for (`nc = ceil(M/64) + 1`); slot `nc - 1`, the seed's spare, and
        any slot past `ceil(T/64)` are left untouched. The kernel keeps its dt', dA_cumsum and
        CB there (updated through `input_output_aliases`: in place when the caller's `jit`
        donates the buffer, e.g. the arena in a donated step; otherwise XLA copies it first).
        The caller may reuse the returned workspace: after the call it holds this call's
        intermediates, which nothing else needs.
      interpret: None = interpret on CPU, compiled (Triton) on GPU.

    Non-finite values: a NaN or infinity in `x`, `dt`, `B`, `C` or `initial_states` of a
    sequence propagates as NaN into that sequence's outputs and final state; it is never turned
    into a plausible finite value. It reaches exactly what the recurrence makes NaN: for a
    NaN at token t of sequence s, outputs and final-state entries of s at and after t (x: its
    head and column; dt: its head; B: the group's heads; C: token t only). It never reaches a
    token before t nor another sequence, also when both share a chunk: the kernels mask by
    selecting (`jnp.where`), never by multiplying by 0, and every other value is bit-identical
    to a run without the NaN. The last chunk's tail past T is masked at load, never read.

    Returns:
      `(y [T, H, P] in x.dtype, final_states [S, H, P, N] in state_dtype)`, plus the updated
      workspace (same shape, float32) when one was passed.

    Raises:
      ValueError: bad shapes or dtypes, `H % G != 0`, invalid concrete `cu_seqlens` (a list
        entry that is a float or outside int32 included), a concrete non-finite `A`, an
        unsupported `chunk_size`, a workspace that does not fit. Raised before tracing.
      NotImplementedError: `x` in a floating dtype other than float32/bfloat16/float16.
    """
    cu_seqlens = _as_cu(cu_seqlens)
    dims = _validate(
        x,
        dt,
        A,
        B,
        C,
        chunk_size=chunk_size,
        D=D,
        dt_bias=dt_bias,
        dt_softplus=dt_softplus,
        initial_states=initial_states,
        cu_seqlens=cu_seqlens,
        workspace=workspace,
        z=z,
        dt_limit=dt_limit,
        state_dtype=state_dtype,
    )
    if cu_seqlens is None:
        cu_seqlens = jnp.array([0, dims.num_tokens], jnp.int32)
    if workspace is None:
        ws2d = jnp.zeros((dims.ws_rows, dims.chunk_size), jnp.float32)
    else:
        ws2d = workspace.reshape(dims.ws_rows, dims.chunk_size)
    y, final, ws2d = _ssd_impl(
        x,
        dt,
        A,
        B,
        C,
        D,
        dt_bias,
        initial_states,
        cu_seqlens,
        ws2d,
        z,
        dims=dims,
        dt_softplus=dt_softplus,
        has_d=D is not None,
        has_init=initial_states is not None,
        interpret=resolve_interpret(interpret),
        dt_limit=_dt_limit(dt_limit),
        state_dtype=_state_dtype(state_dtype),
    )
    if workspace is None:
        return y, final
    return y, final, ws2d.reshape(workspace.shape)


def ssd_chunked_scan_into(
    arena: jax.Array,
    plan: Any,
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    *,
    D: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = False,
    initial_states: jax.Array | None = None,
    cu_seqlens: jax.Array | None = None,
    interpret: bool | None = None,
    z: jax.Array | None = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    state_dtype: Any = jnp.float32,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`ssd_chunked_scan` with its scratch in the arena's `ssd_scratch` region, in place.

    `plan` is a `jaxarena.ArenaPlan` with an `ssd_scratch` region sized by the seed for these
    `H` and `G` (`jaxarena.workspaces.ssd_scratch_layout`), starting on a 256-byte arena row
    (the default alignment); the chunk length is 64. The scratch is the region's first
    `nc * (2*H*64 + G*64*64)` floats, `nc = region.nbytes // ssd_chunk_slot_bytes(H, G)`,
    laid out as `ssd_chunked_scan`'s `workspace`. Only `ssd_scratch` changes.

    In place: the WHOLE arena goes into the kernels, aliased, reinterpreted as
    `float32[rows, 64]` (a bitcast in XLA, no copy): one arena row is one 64-float scratch row,
    so the kernels address the scratch at the region's first row. Results (y, final states,
    scratch bytes) equal `ssd_chunked_scan(..., workspace=plan.view(...))`'s bit for bit.
    Offsets: Pallas forms element offsets in int32 for arrays below 2^32 bytes (the f32 view
    then has fewer than 2^30 elements) and in 64 bits beyond; row indices are int32 (arenas up
    to 2^31 rows of 256 bytes, the plan's limit).

    Args:
      arena: the plan's `uint8[rows, 256]` arena. Donate it to the enclosing `jax.jit`
        (`donate_argnums`) so the update is in place (without donation XLA copies the arena
        once); use the returned arena afterwards.
      plan: the `jaxarena.ArenaPlan` of `arena`.
      x, dt, A, B, C, D, dt_bias, dt_softplus, initial_states, cu_seqlens, interpret, z,
        dt_limit, state_dtype: as for `ssd_chunked_scan` (the chunk length is the scratch's,
        64).

    Returns:
      `(arena, y [T, H, P] in x.dtype, final_states [S, H, P, N] in state_dtype)`. The
      returned arena replaces the one passed.

    Raises:
      ArenaError (a ValueError): an arena that is not the plan's `uint8` array, a region too
        small for one chunk slot (`ArenaPlan.check_fits`).
      ValueError: what `ssd_chunked_scan` rejects, a plan without `ssd_scratch`, a region not
        on a 256-byte row, more tokens than the scratch was sized for; all before tracing.
      NotImplementedError: as `ssd_chunked_scan`.
    """
    what = "ssd_chunked_scan_into"
    if not callable(getattr(plan, "check_fits", None)):
        raise ValueError(f"{what}: plan must be a jaxarena.ArenaPlan, got {type(plan).__name__}")
    if SSD_REGION not in plan.regions:
        raise ValueError(f"plan has no {SSD_REGION!r} region; size the arena for an SSM model")
    region = plan.regions[SSD_REGION]
    cu_seqlens = _as_cu(cu_seqlens)
    args = dict(
        chunk_size=SSD_CHUNK,
        D=D,
        dt_bias=dt_bias,
        dt_softplus=dt_softplus,
        initial_states=initial_states,
        cu_seqlens=cu_seqlens,
        z=z,
        dt_limit=dt_limit,
        state_dtype=state_dtype,
    )
    dims = _validate(x, dt, A, B, C, **args, workspace=None)
    per_chunk = _per_chunk_floats(dims.num_heads, dims.num_groups)
    slots = region.nbytes // (4 * per_chunk)
    note = f"one chunk slot of the SSD scratch for H={dims.num_heads}, G={dims.num_groups}"
    # At least one slot must fit (ArenaError otherwise), and the arena must be the plan's.
    plan.check_fits(
        (SSD_REGION, (max(slots, 1), per_chunk), jnp.float32, note), arena=arena, what=what
    )
    if region.offset_bytes % ROW_BYTES:
        raise ValueError(
            f"{what}: region {SSD_REGION!r} starts at byte {region.offset_bytes}, not on a "
            f"{ROW_BYTES}-byte arena row; build the plan with align_bytes >= {ROW_BYTES}"
        )
    # T must fit the scratch (ValueError naming the token count); the section rows follow.
    ws_spec = jax.ShapeDtypeStruct((slots * per_chunk,), jnp.float32)
    dims = _validate(x, dt, A, B, C, **args, workspace=ws_spec)
    rows = plan.arena_shape[0]
    row0 = region.offset_bytes // ROW_BYTES
    dims = dataclasses.replace(
        dims,
        dt_row=dims.dt_row + row0,
        dacs_row=dims.dacs_row + row0,
        cb_row=dims.cb_row + row0,
        ws_rows=rows,
    )
    if cu_seqlens is None:
        cu_seqlens = jnp.array([0, dims.num_tokens], jnp.int32)
    # A reinterpretation of the whole arena (XLA: a bitcast, both ways).
    ws2d = jax.lax.bitcast_convert_type(arena.reshape(rows, _F32_PER_ROW, 4), jnp.float32)
    y, final, ws2d = _ssd_impl(
        x,
        dt,
        A,
        B,
        C,
        D,
        dt_bias,
        initial_states,
        cu_seqlens,
        ws2d,
        z,
        dims=dims,
        dt_softplus=dt_softplus,
        has_d=D is not None,
        has_init=initial_states is not None,
        interpret=resolve_interpret(interpret),
        dt_limit=_dt_limit(dt_limit),
        state_dtype=_state_dtype(state_dtype),
    )
    arena = jax.lax.bitcast_convert_type(ws2d, jnp.uint8).reshape(plan.arena_shape)
    return arena, y, final
