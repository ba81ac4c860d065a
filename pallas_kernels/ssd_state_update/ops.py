"""Public wrapper: the Mamba-2 decode step (one token per sequence) as an in-place kernel.

The state cache goes into one `pallas_call` aliased to its output (`input_output_aliases`), so
under a `jit` that donates the cache, or with the cache donated to this call, the update is
in place: only the `[H, P, N]` slots the call names are read and written. The semantics follow
vLLM's `selective_state_update` (Mamba-2 layout: one `dt` and `A` per head, `B, C` per group,
the slot of row `b` chosen by `state_indices[b]`, `y` from the float32 state before it is
rounded to the cache's dtype, `y * silu(z)` after `D x`), plus `dt_limit` as mamba_ssm's fused
scan clamps `dt'`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._args import resolve_interpret
from pallas_kernels._cost import declare_fixed, nbytes
from pallas_kernels.ssd_state_update.checks import validate
from pallas_kernels.ssd_state_update.kernel import StateUpdateConfig, ssd_state_update_kernel

__all__ = ["ssd_state_update"]

# Largest f32 tile `[block_p, piece]` one program holds (4 warps: 16 values per thread), and
# the widest state-dim piece: keeps the update free of register spills (see the GPU test).
_TILE_ELEMS = 2048
_MAX_PIECE = 128


def _pieces(n: int) -> tuple[tuple[int, int], ...]:
    """`[0, n)` as power-of-two pieces of at most `_MAX_PIECE` columns, widest first."""
    out, c = [], 0
    while c < n:
        w = min(_MAX_PIECE, 1 << ((n - c).bit_length() - 1))
        out.append((c, w))
        c += w
    return tuple(out)


def _block_p(p: int, widest: int, interpret: bool) -> int:
    """Largest power of two dividing `p`, with `block_p * widest <= _TILE_ELEMS` when compiled.

    The interpreter has no register limit but pays per grid step (about 4 ms on a CPU
    core for a 3 MB cache), so it takes whole heads: 4x fewer steps at P=64, N=128.
    """
    bp = p & -p
    while not interpret and bp > 1 and bp * widest > _TILE_ELEMS:
        bp //= 2
    return bp


@functools.partial(jax.jit, static_argnames=("cfg", "interpret"), donate_argnums=(0,))
def _update(state, idx, x, dt, A, bias, B, C, D, z, *, cfg: StateUpdateConfig, interpret: bool):
    Bt, H, P = x.shape
    whole = pl.no_block_spec
    operands = [idx, x, dt, A] + ([bias] if cfg.has_bias else []) + [B, C]
    if cfg.has_d:
        operands.append(D)
    if cfg.has_z:
        operands.append(z)
    operands.append(state)
    # Each sequence's state row read and written once, its inputs read, y written.
    declare_fixed("ssd_state_update", (Bt, H, P // cfg.block_p), operands,
                  bytes=nbytes(*operands[:-1]) + 2 * Bt * nbytes(state) // state.shape[0]
                  + nbytes(x))  # fmt: skip
    y, state = pl.pallas_call(
        functools.partial(ssd_state_update_kernel, cfg=cfg),
        grid=(Bt, H, P // cfg.block_p),
        in_specs=[whole] * len(operands),
        out_specs=[whole, whole],
        out_shape=[
            jax.ShapeDtypeStruct((Bt, H, P), x.dtype),
            jax.ShapeDtypeStruct(state.shape, state.dtype),
        ],
        input_output_aliases={len(operands) - 1: 1},
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="ssd_state_update",
    )(*operands)
    return y, state


def ssd_state_update(
    state: jax.Array,
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    *,
    D: jax.Array | None = None,
    z: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = False,
    state_indices: jax.Array | Sequence[int] | None = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Mamba-2 decode step: one token per sequence, the state cache updated in place.

    For each row `b` (one sequence), slot `s = state_indices[b]` (`b` without indices), head
    `h`, group `g = h // (H // G)`:

        dt' = clamp(dt[b, h] + dt_bias[h] -> softplus if dt_softplus, dt_limit)
        state[s, h] = exp(dt' A[h]) state[s, h] + dt' x[b, h][:, None] B[b, g][None, :]
        y[b, h] = state[s, h] @ C[b, g] + D[h] x[b, h]        then  y *= silu(z[b, h])

    vLLM's `selective_state_update` semantics (Mamba-2 form: `dt`, `A`, `dt_bias` per head):
    `y` is computed from the float32 updated state (before it is rounded to the cache dtype),
    `z` gates after `D x`. `dt_limit` is applied always, after the softplus, as mamba_ssm's
    fused scan does: with the default `(0, inf)` a negative `dt'` (possible only without
    softplus) becomes 0. The gated RMSNorm of a Mamba-2 block (`norm_before_gate=False` in
    mamba_ssm / transformers) is `rmsnorm(y * silu(z))`: pass `z` here and apply the norm
    after; with `norm_before_gate=True` pass `z=None` and gate after the norm yourself.

    Args:
      state: `[S, H, P, N]` float32 / bfloat16 / float16, the cache. DONATED: the call updates
        it in place; use the returned state (inside a `jit`, donate the cache to that `jit`).
      x: `[Bt, H, P]` float32 / bfloat16 / float16, 1 <= Bt.
      dt: `[Bt, H]` float (raw). A: `[H]` float, finite (checked when concrete).
      B, C: `[Bt, G, N]` float, `H % G == 0`.
      D: optional `[H]` or `[H, P]` skip term. z: optional `[Bt, H, P]` gate.
      dt_bias: optional `[H]`. dt_softplus: softplus on `dt + dt_bias`.
      state_indices: optional integer `[Bt]` (array or list of ints): the slot each row
        updates; absent means row `b` updates slot `b` (then `Bt <= S`). Concrete indices are
        checked: every entry in `[0, S)` and no slot twice (ValueError naming the entry).
        Traced indices are not checked here: an out-of-range slot is never read past the cache
        nor written (its row's `y` is NaN); a repeated slot gives an unspecified result.
        vLLM's padding slot (-1, "skip this row") is not supported.
      dt_limit: `(lo, hi)`, `lo <= hi`, the clamp of `dt'`.
      interpret: None = interpret on CPU, compiled (Triton) on GPU.

    Non-finite values: a NaN or infinity in row `b`'s inputs (or its slot's state) reaches only
    what the recurrence reaches (e.g. `x[b, h, p]` -> state row `[s, h, p, :]` and `y[b, h, p]`;
    `B[b, g]` -> the group's heads), never another row or slot; it never becomes a finite value.

    Returns:
      `(y [Bt, H, P] in x.dtype, state [S, H, P, N] in the cache's dtype)`. Slots no row names
      keep their bytes.

    Raises:
      ValueError: bad shapes or dtypes, `H % G != 0`, bad `state_indices` (not `[Bt]`, not
        integer, out of range, repeated), a bad `dt_limit`, a concrete non-finite `A`, an
        empty batch; all before tracing.
      NotImplementedError: `state` or `x` in a floating dtype other than f32/bf16/f16.
    """
    S, H, P, N, G, (lo, hi), idx = validate(
        state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
        state_indices=state_indices, dt_limit=dt_limit,
    )  # fmt: skip
    pieces = _pieces(N)
    interpret = resolve_interpret(interpret)
    cfg = StateUpdateConfig(
        num_slots=S,
        heads_per_group=H // G,
        block_p=_block_p(P, pieces[0][1], interpret),
        n_pieces=pieces,
        dt_softplus=dt_softplus,
        dt_min=lo,
        dt_max=hi,
        has_bias=dt_bias is not None,
        d_per_row=D is not None and len(D.shape) == 2,
        has_d=D is not None,
        has_z=z is not None,
    )
    # The kernel converts every float to f32 itself: no conversion launches here.
    return _update(
        state, idx, x, dt, A, dt_bias, B, C, D, z,
        cfg=cfg, interpret=interpret,
    )  # fmt: skip
