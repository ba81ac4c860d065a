"""Public wrappers: the Mamba-2 SSD chunked scan over a packed stream of sequences.

The computation follows mamba_ssm's `ssd_combined` split, with packed sequences:

1. Pallas (`ssd_chunk_kernel`, grid chunk x head): `dt' = softplus(dt + dt_bias)` (or without
   softplus), `dA_cumsum`, `CB = C B^T` (all three stored into the f32 scratch), the
   intra-chunk output and each chunk's own contribution to the state of its last sequence.
2. jnp: the state passing, a `lax.scan` over chunks carrying the state of the sequence that
   runs across the chunk edge (reset to a sequence's initial state where it starts); it reads
   `dA_cumsum` back from the scratch. Also jnp: for every sequence that starts strictly
   inside a chunk, the output term of its initial state within that first chunk (only when
   `initial_states` is given), and every sequence's final state, taken from the chunk holding
   its last token. These are O(number of sequences x one chunk) of work.
3. Pallas (`ssd_output_kernel`, grid chunk x head): adds the inter-chunk output
   `exp(dA_cumsum) C . h_in` for the tokens of the sequence running at the chunk's start,
   and `D x`.

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
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxarena.workspaces import SSD_CHUNK, ssd_chunk_slot_bytes, ssd_scratch_layout
from pallas_kernels._args import array_shape as _shape_of
from pallas_kernels._args import check_finite as _check_finite
from pallas_kernels._args import check_float as _check_float
from pallas_kernels._args import int_values as _int_values
from pallas_kernels._args import resolve_interpret
from pallas_kernels.ssd_chunked_scan.kernel import ssd_chunk_kernel, ssd_output_kernel

__all__ = [
    "SSD_REGION",
    "SUPPORTED_CHUNK_SIZES",
    "ssd_chunked_scan",
    "ssd_chunked_scan_into",
]

SSD_REGION: str = "ssd_scratch"
"""The arena region `ssd_chunked_scan_into` uses as the kernel's f32 scratch."""

SUPPORTED_CHUNK_SIZES: tuple[int, ...] = (16, 32, 64, 128)
"""Accepted `chunk_size` values (Triton tiles are powers of two, `tl.dot` needs >= 16). With a
workspace only the scratch's chunk length, 64, is accepted."""

_X_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_HI = jax.lax.Precision.HIGHEST


def _tile(n: int) -> int:
    """Smallest power of two >= max(n, 16): Triton tiles are powers of two, `tl.dot` >= 16."""
    return max(16, pl.next_power_of_2(n))


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
    _check_finite("A", A, "A must be finite (a very negative A, e.g. -1e4, forgets at once)")
    for name, v in (("D", D), ("dt_bias", dt_bias)):
        if v is not None:
            if _shape_of(name, v) != (H,):
                raise ValueError(f"{name}.shape={tuple(v.shape)} must be [H] = {(H,)}")
            _check_float(name, v)
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


def _as_cu(cu_seqlens: Any) -> Any:
    """A list or tuple of ints becomes an int32 array (a float or an int past int32 entry is a
    `ValueError`, never truncated or an `OverflowError`); anything else is left to
    `_validate`."""
    if isinstance(cu_seqlens, list | tuple):
        return _int_values("cu_seqlens", cu_seqlens)
    return cu_seqlens


def _pad_to(v: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    if tuple(v.shape) == shape:
        return v
    return jnp.pad(v, [(0, t - s) for s, t in zip(v.shape, shape, strict=True)])


def _gather_chunk(v: jax.Array, chunk: jax.Array, L: int) -> jax.Array:
    """`v[chunk[s] * L : chunk[s] * L + L]` for every s: `[S, L, ...]`."""

    def one(c):
        return jax.lax.dynamic_slice_in_dim(v, c * L, L, axis=0)

    return jax.vmap(one)(chunk)


@functools.partial(
    jax.jit, static_argnames=("dims", "dt_softplus", "has_d", "has_init", "interpret")
)
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
    *,
    dims: _Dims,
    dt_softplus: bool,
    has_d: bool,
    has_init: bool,
    interpret: bool,
):
    T, H, P = dims.num_tokens, dims.num_heads, dims.head_dim
    G, N, S = dims.num_groups, dims.state_dim, dims.num_seqs
    L, nc, ncw = dims.chunk_size, dims.num_chunks, dims.num_chunks_ws
    hpg = H // G
    Tp, Pp, Np = nc * L, _tile(P), _tile(N)
    f32 = jnp.float32

    # Zero padding is exact: padded tokens get dt' = 0 in the kernel, padded P columns give
    # zero outputs, padded N columns add zero products.
    xp = _pad_to(x, (Tp, H, Pp))
    dtp = _pad_to(dt, (Tp, H))
    Bp = _pad_to(B, (Tp, G, Np))
    Cp = _pad_to(C, (Tp, G, Np))
    A32 = A.astype(f32)
    bias = jnp.zeros((H,), f32) if dt_bias is None else dt_bias.astype(f32)
    D32 = jnp.zeros((H,), f32) if D is None else D.astype(f32)
    cu = cu_seqlens.astype(jnp.int32)
    if has_init:
        init = _pad_to(initial_states.astype(f32), (S, H, Pp, Np))
    else:
        init = jnp.zeros((S, H, Pp, Np), f32)

    # Sequence of each token: the last s with cu[s] <= t, which skips empty sequences.
    # Padding tokens join the last sequence; with dt' = 0 they change nothing.
    tok = jnp.arange(Tp, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu, tok, side="right") - 1, 0, S - 1).astype(jnp.int32)

    params = plgpu.CompilerParams(num_warps=4, num_stages=1)
    chunk_kernel = functools.partial(
        ssd_chunk_kernel,
        chunk_size=L,
        num_tokens=T,
        num_chunks_ws=ncw,
        heads_per_group=hpg,
        num_groups=G,
        dt_row=dims.dt_row,
        dacs_row=dims.dacs_row,
        cb_row=dims.cb_row,
        dt_softplus=dt_softplus,
    )
    # The scratch and the per-head scalars are whole-array operands, addressed in the kernel.
    whole = pl.no_block_spec
    ws2d, y_diag, chunk_states = pl.pallas_call(
        chunk_kernel,
        grid=(nc, H),
        in_specs=[
            pl.BlockSpec((L, None, Pp), lambda c, h: (c, h, 0)),
            pl.BlockSpec((L, None), lambda c, h: (c, h)),
            whole,
            whole,
            pl.BlockSpec((L, None, Np), lambda c, h: (c, h // hpg, 0)),
            pl.BlockSpec((L, None, Np), lambda c, h: (c, h // hpg, 0)),
            pl.BlockSpec((L,), lambda c, h: (c,)),
            whole,
        ],
        out_specs=[
            whole,
            pl.BlockSpec((L, None, Pp), lambda c, h: (c, h, 0)),
            pl.BlockSpec((None, None, Pp, Np), lambda c, h: (c, h, 0, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(ws2d.shape, f32),
            jax.ShapeDtypeStruct((Tp, H, Pp), f32),
            jax.ShapeDtypeStruct((nc, H, Pp, Np), f32),
        ],
        input_output_aliases={7: 0},
        compiler_params=params,
        interpret=interpret,
        name="ssd_chunk",
    )(xp, dtp, A32, bias, Bp, Cp, seq, ws2d)

    # --- jnp: state passing over chunks, reading dt' and dA_cumsum back from the scratch.
    dt_ws = ws2d[dims.dt_row : dims.dt_row + H * ncw].reshape(H, ncw, L)[:, :nc]
    dacs = ws2d[dims.dacs_row : dims.dacs_row + H * ncw].reshape(H, ncw, L)[:, :nc]
    seq_c = seq.reshape(nc, L)
    chunk_start = jnp.arange(nc, dtype=jnp.int32) * L
    s0, s_last = seq_c[:, 0], seq_c[:, -1]
    # The first sequence of chunk c continues from chunk c - 1 iff it started before c * L.
    continues = cu[s0] < chunk_start
    # The last sequence of chunk c starts at offset p_last > 0 inside it, or continues.
    p_last = cu[s_last] - chunk_start
    fresh_last = p_last > 0
    base_last = jnp.take_along_axis(dacs, jnp.clip(p_last - 1, 0, L - 1)[None, :, None], axis=2)
    base_last = jnp.where(fresh_last[None, :], base_last[..., 0], 0.0)  # [H, nc]
    decay_chunk = jnp.exp(dacs[:, :, -1] - base_last)  # [H, nc]

    def pass_state(h_run, inp):
        state_c, decay_c, cont, fresh, a, b = inp
        h_in = jnp.where(cont, h_run, init[a])
        h_start = jnp.where(fresh, init[b], h_in)
        return decay_c[:, None, None] * h_start + state_c, h_in

    _, h_in = jax.lax.scan(
        pass_state,
        jnp.zeros((H, Pp, Np), f32),
        (chunk_states, decay_chunk.T, continues, fresh_last, s0, s_last),
    )  # h_in: [nc, H, Pp, Np]

    starts, ends = cu[:-1], cu[1:]
    l_idx = jnp.arange(L, dtype=jnp.int32)
    if has_init:
        # --- jnp: initial-state output of sequences that start strictly inside a chunk.
        c_s = jnp.clip(starts // L, 0, nc - 1)
        p = starts - c_s * L
        valid = (p > 0) & (ends > starts)
        in_seg = (l_idx[None, :] >= p[:, None]) & (l_idx[None, :] < (ends - c_s * L)[:, None])
        in_seg = in_seg & valid[:, None]  # [S, L]
        d_c = jnp.transpose(dacs[:, c_s, :], (1, 0, 2))  # [S, H, L]
        base = jnp.take_along_axis(d_c, jnp.clip(p - 1, 0, L - 1)[:, None, None], axis=2)
        seg = jnp.where(in_seg[:, None, :], d_c - base, 0.0)
        decay = jnp.where(in_seg[:, None, :], jnp.exp(seg), 0.0)  # [S, H, L]
        c_chunk = _gather_chunk(Cp, c_s, L).astype(f32)  # [S, L, G, Np]
        init_g = init.reshape(S, G, hpg, Pp, Np)
        contrib = jnp.einsum("slgn,sgkpn->slgkp", c_chunk, init_g, precision=_HI)
        contrib = contrib.reshape(S, L, H, Pp) * jnp.transpose(decay, (0, 2, 1))[..., None]
        # Select: a NaN initial state of one sequence must not reach the other sequences'
        # tokens of the chunk as 0 * NaN.
        contrib = jnp.where(in_seg[:, :, None, None], contrib, 0.0)
        y_diag = y_diag.reshape(nc, L, H, Pp).at[c_s].add(contrib).reshape(Tp, H, Pp)

    out_kernel = functools.partial(
        ssd_output_kernel,
        chunk_size=L,
        num_chunks_ws=ncw,
        dacs_row=dims.dacs_row,
        has_d=has_d,
    )
    y = pl.pallas_call(
        out_kernel,
        grid=(nc, H),
        in_specs=[
            pl.BlockSpec((L, None, Pp), lambda c, h: (c, h, 0)),
            pl.BlockSpec((L, None, Np), lambda c, h: (c, h // hpg, 0)),
            pl.BlockSpec((L,), lambda c, h: (c,)),
            pl.BlockSpec((L, None, Pp), lambda c, h: (c, h, 0)),
            pl.BlockSpec((None, None, Pp, Np), lambda c, h: (c, h, 0, 0)),
            whole,
            whole,
        ],
        out_specs=pl.BlockSpec((L, None, Pp), lambda c, h: (c, h, 0)),
        out_shape=jax.ShapeDtypeStruct((Tp, H, Pp), x.dtype),
        compiler_params=params,
        interpret=interpret,
        name="ssd_output",
    )(xp, Cp, seq, y_diag, h_in, ws2d, D32)

    # --- jnp: final state of every sequence, from the chunk that holds its last token.
    e = jnp.clip(ends - 1, 0, T - 1)
    c_e = e // L
    pe = e - c_e * L
    before = starts <= c_e * L
    p = jnp.where(before, 0, starts - c_e * L)
    h_start = jnp.where(before[:, None, None, None], h_in[c_e], init)
    d_c = jnp.transpose(dacs[:, c_e, :], (1, 0, 2))  # [S, H, L]
    dt_c = jnp.transpose(dt_ws[:, c_e, :], (1, 0, 2))
    a_end = jnp.take_along_axis(d_c, pe[:, None, None], axis=2)  # [S, H, 1]
    base = jnp.take_along_axis(d_c, jnp.clip(p - 1, 0, L - 1)[:, None, None], axis=2)
    base = jnp.where((p > 0)[:, None, None], base, 0.0)
    mask = ((l_idx[None, :] >= p[:, None]) & (l_idx[None, :] <= pe[:, None]))[:, None, :]
    # Select, not multiply: tokens of other sequences in the chunk (their x, B, dt' may be NaN)
    # must not reach this sequence's state as 0 * NaN.
    w = jnp.where(mask, jnp.exp(jnp.where(mask, a_end - d_c, 0.0)) * dt_c, 0.0)  # [S, H, L]
    tok_in = mask[:, 0, :]  # [S, L]
    x_c = _gather_chunk(xp, c_e, L).astype(f32)
    x_c = jnp.where(tok_in[:, :, None, None], x_c, 0.0).reshape(S, L, G, hpg, Pp)
    b_c = _gather_chunk(Bp, c_e, L).astype(f32)  # [S, L, G, Np]
    b_c = jnp.where(tok_in[:, :, None, None], b_c, 0.0)
    w_g = w.reshape(S, G, hpg, L)
    own = jnp.einsum("sgkl,slgkp,slgn->sgkpn", w_g, x_c, b_c, precision=_HI)
    final = jnp.exp(a_end - base)[..., None] * h_start + own.reshape(S, H, Pp, Np)
    final = jnp.where((ends > starts)[:, None, None, None], final, init)
    return y[:T, :, :P], final[:, :, :P, :N], ws2d


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
) -> tuple[jax.Array, jax.Array] | tuple[jax.Array, jax.Array, jax.Array]:
    """Mamba-2 SSD scan of a packed token stream, chunked (mamba_ssm's `ssd_combined`).

    Per sequence, from its initial state: `h_t = exp(dt'_t A) h_{t-1} + dt'_t x_t B_t^T`,
    `y_t = h_t C_t + D x_t`. Two Pallas kernels do the per-chunk work (dt', dA_cumsum, CB,
    intra-chunk output and chunk states; then the inter-chunk output); the state passing
    between chunks and the per-sequence boundary terms are jnp (see the module docstring).

    Args:
      x: `[T, H, P]` float32 / bfloat16 / float16, T >= 1.
      dt: `[T, H]` float (raw; `dt' = softplus(dt + dt_bias)` with `dt_softplus`, else
        `dt + dt_bias`).
      A: `[H]` float (negative for a decaying state), finite: a concrete non-finite `A` is a
        ValueError; a traced one gives NaN outputs.
      B, C: `[T, G, N]` float; head `h` uses group `h // (H // G)`; `H % G == 0`.
      chunk_size: tokens per chunk, one of `SUPPORTED_CHUNK_SIZES`; 64 with a workspace.
      D: optional `[H]` skip term, `y += D x`.
      dt_bias: optional `[H]`.
      dt_softplus: apply softplus to `dt + dt_bias`.
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
    into a plausible finite value. The boundary terms computed here select (`jnp.where`) rather
    than multiply by 0, so one sequence's NaN initial state or tokens do not reach the final
    state of another. (Inside a 64-token chunk the kernels still mask some terms by
    multiplication: a NaN token can reach another sequence of the same chunk; see issue 17's
    notes.) Padding tokens are zeros made here, never stale bytes.

    Returns:
      `(y [T, H, P] in x.dtype, final_states [S, H, P, N] float32)`, plus the updated
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
        dims=dims,
        dt_softplus=dt_softplus,
        has_d=D is not None,
        has_init=initial_states is not None,
        interpret=resolve_interpret(interpret),
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
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`ssd_chunked_scan` with its scratch in the arena's `ssd_scratch` region.

    `plan` is a `jaxarena.ArenaPlan` with an `ssd_scratch` region sized by the seed for these
    `H` and `G`; the chunk length is 64. The region is viewed as flat f32 (its first
    `nc * (2*H*64 + G*64*64)` floats, `nc = region.nbytes // (4 * (2*H*64 + G*64*64))`), the
    scan runs with that workspace, and the updated scratch is written back. Only
    `ssd_scratch` changes. Inside a `jit` that donates `arena` the update is in place.

    Returns `(arena, y [T, H, P] in x.dtype, final_states [S, H, P, N] float32)`. The
    returned arena replaces the one passed (which is consumed when donated).
    """
    if SSD_REGION not in getattr(plan, "regions", {}):
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
    )
    dims = _validate(x, dt, A, B, C, **args, workspace=None)
    per_chunk = _per_chunk_floats(dims.num_heads, dims.num_groups)
    ws_len = (region.nbytes // (4 * per_chunk)) * per_chunk
    if ws_len == 0:
        raise ValueError(
            f"region {SSD_REGION!r} holds {region.nbytes} bytes, less than one chunk slot "
            f"({4 * per_chunk} bytes for H={dims.num_heads}, G={dims.num_groups})"
        )
    # Checks that T fits the scratch before anything is read from the arena.
    _validate(x, dt, A, B, C, **args, workspace=jax.ShapeDtypeStruct((ws_len,), jnp.float32))
    ws = plan.view(arena, SSD_REGION, (ws_len,), jnp.float32)
    y, final, ws = ssd_chunked_scan(x, dt, A, B, C, **args, workspace=ws, interpret=interpret)
    arena = plan.write(arena, SSD_REGION, ws)
    return arena, y, final
