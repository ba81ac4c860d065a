"""Public wrapper: the Gated DeltaNet decode step (one token per sequence), in place.

The state cache goes into one `pallas_call` aliased to its output, so under a `jit` that
donates the cache (or with the cache donated to this call) only the `[HV, K, V]` slots the
call names are read and written, as `ssd_state_update` does for Mamba-2. Semantics: FLA's
`fused_recurrent_gated_delta_rule` / transformers' `torch_recurrent_gated_delta_rule` for one
token, vLLM's slot indexing (without its -1 padding slot).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._args import check_nonempty, check_rank, resolve_interpret
from pallas_kernels._cost import declare_fixed, nbytes
from pallas_kernels.gdn_state_update.kernel import GdnUpdateConfig, gdn_state_update_kernel
from pallas_kernels.ssd_state_update.checks import _as_indices, _check_dtype, _check_indices

__all__ = ["gdn_state_update"]

# Largest f32 tile `[K, block_v]` of one compiled program (4 warps: 16 values per thread).
_TILE_ELEMS = 2048


def _check(name: str, v: Any, want: tuple[int, ...], layout: str) -> None:
    shape = check_rank(name, v, len(want), layout)
    if shape != want:
        raise ValueError(f"{name}.shape={shape} must be {layout} = {want}")
    _check_dtype(name, v)


@functools.partial(jax.jit, static_argnames=("cfg", "interpret"), donate_argnums=(0,))
def _update(state, idx, q, k, v, g, beta, *, cfg: GdnUpdateConfig, interpret: bool):
    B, HV, V = v.shape
    whole = pl.no_block_spec
    # Each sequence's state row read and written once, its inputs read, o written.
    declare_fixed("gdn_state_update", (B, HV, V // cfg.block_v), (idx, q, k, v, g, beta, state),
                  bytes=nbytes(idx, q, k, v, g, beta) + 2 * B * nbytes(state) // state.shape[0]
                  + nbytes(v))  # fmt: skip
    o, state = pl.pallas_call(
        functools.partial(gdn_state_update_kernel, cfg=cfg),
        grid=(B, HV, V // cfg.block_v),
        in_specs=[whole] * 7,
        out_specs=[whole, whole],
        out_shape=[
            jax.ShapeDtypeStruct((B, HV, V), v.dtype),
            jax.ShapeDtypeStruct(state.shape, state.dtype),
        ],
        input_output_aliases={6: 1},
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="gdn_state_update",
    )(idx, q, k, v, g, beta, state)
    return o, state


def gdn_state_update(
    state: jax.Array,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    state_indices: jax.Array | Sequence[int] | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Gated DeltaNet decode step: one token per sequence, the state cache updated in place.

    For row `b`, slot `s = state_indices[b]` (`b` without indices), value head `i`, key head
    `i // (HV / H)`, with `h = state[s, i]` (`[K, V]`):

        h *= exp(g[b, i]);  v' = beta[b, i] (v[b, i] - h^T k[b]);  h += k[b] v'^T
        o[b, i] = h^T (scale q[b])

    in float32 (q, k L2-normalised first with `use_qk_l2norm`: `x / sqrt(sum x^2 + 1e-6)`);
    `o` comes from the float32 state before it is rounded to the cache's dtype.

    Args:
      state: `[S, HV, K, V]` float32 / bfloat16 / float16, the cache. DONATED: use the returned
        state (inside a `jit`, donate the cache to that `jit`).
      q, k: `[B, H, K]` float; v: `[B, HV, V]`, `HV % H == 0`; g, beta: `[B, HV]` float.
        K and V are powers of two (Triton tiles).
      state_indices: optional integer `[B]` (array or list of ints), the slot of each row;
        absent means row b updates slot b (`B <= S`). Concrete indices are checked (in
        `[0, S)`, no slot twice); a traced out-of-range slot is never read past the cache nor
        written, and its row's `o` is NaN.
      scale: a Python number; None = `K ** -0.5`.
      use_qk_l2norm: L2-normalise q and k in the kernel.
      interpret: None = interpret on CPU, compiled (Triton) on GPU.

    Returns:
      `(o [B, HV, V] in v.dtype, state [S, HV, K, V] in the cache's dtype)`; slots no row
      names keep their bytes.

    Raises:
      ValueError: bad shapes or dtypes, `HV % H != 0`, bad `state_indices`, bad `scale` or
        `use_qk_l2norm`, an empty batch; all before tracing.
      NotImplementedError: a float dtype other than f32/bf16/f16, K or V not a power of two.
    """
    S, HV, K, V = check_rank("state", state, 4, "[S, HV, K, V] (slots, value heads, K, V)")
    _check_dtype("state", state)
    B, H = check_rank("q", q, 3, "[B, H, K]")[:2]
    check_nonempty("q", B, "rows B")
    check_nonempty("state", S * HV * K * V, "size")
    _check("q", q, (B, H, K), "[B, H, K] matching state's K")
    _check("k", k, (B, H, K), "[B, H, K] like q")
    _check("v", v, (B, HV, V), "[B, HV, V] matching q's B and state's HV, V")
    _check("g", g, (B, HV), "[B, HV]")
    _check("beta", beta, (B, HV), "[B, HV]")
    if H < 1 or HV % H:
        raise ValueError(f"state has HV={HV} value heads; it must be a multiple of q's H={H}")
    for name, d in (("K", K), ("V", V)):
        if d & (d - 1):
            raise NotImplementedError(f"head dim {name}={d} must be a power of two")
    if not isinstance(use_qk_l2norm, bool):
        raise ValueError(f"use_qk_l2norm={use_qk_l2norm!r} must be a bool")
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale)
    ):
        raise ValueError(f"scale={scale!r} must be None or a finite Python number")
    if state_indices is None:
        if B > S:
            raise ValueError(
                f"q has B={B} rows but the cache has S={S} slots; without state_indices row b "
                f"updates slot b, so B <= S (or pass state_indices)"
            )
        idx = jnp.arange(B, dtype=jnp.int32)
    else:
        state_indices = _as_indices(state_indices)
        _check_indices(state_indices, B, S)
        idx = jnp.asarray(state_indices).astype(jnp.int32)
    interpret = resolve_interpret(interpret)
    # The interpreter pays per grid step and has no register limit: whole heads there.
    block_v = V if interpret else max(1, min(V, _TILE_ELEMS // K))
    cfg = GdnUpdateConfig(
        num_slots=S,
        heads_per_key_head=HV // H,
        block_v=block_v,
        scale=float(K**-0.5 if scale is None else scale),
        l2norm=use_qk_l2norm,
    )
    return _update(state, idx, q, k, v, g, beta, cfg=cfg, interpret=interpret)
