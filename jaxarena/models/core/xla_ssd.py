"""The Mamba-2 SSD scan and decode step in plain XLA: the `kernels="xla"` path of
`pallas_kernels.ssd_chunked_scan_into` and `ssd_state_update`.

Semantics (the kernels'): per sequence of the packed stream, from its initial state,
`dt' = clamp(softplus(dt + dt_bias), dt_limit)`, `h_t = exp(dt'_t A) h_{t-1} +
dt'_t x_t B_t^T`, `y_t = h_t C_t + D x_t`; head `h` reads group `h // (H / G)`; f32 state.

How: the recurrence itself, one `lax.scan` step per token over the packed stream (a
sequence's first token starts from its initial state, its last token's state is its final
state), where the kernel cuts the stream into 64-token chunks and runs the quadratic chunk
form. For the CPU: no interpreter; a prefill of T tokens is T small steps (the decode step is
one). The scratch the chunked kernel keeps in `ssd_scratch` (dt', dA_cumsum, CB) is not
written: no block reads it. Written independently of `ssd_sequential_reference`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["ssd_scan_xla", "ssd_state_update_xla"]

F32 = jnp.float32


def _dt(dt, dt_bias, dt_softplus, dt_limit):
    d = dt.astype(F32) + (0.0 if dt_bias is None else dt_bias.astype(F32))
    if dt_softplus:
        d = jax.nn.softplus(d)
    return jnp.clip(d, dt_limit[0], dt_limit[1])


def _heads(v: jax.Array, h: int) -> jax.Array:
    """`[..., G, N]` -> `[..., H, N]` (head `h` reads group `h // (H / G)`)."""
    return jnp.repeat(v.astype(F32), h // v.shape[-2], axis=-2)


def _skip(D, x):
    if D is None:
        return 0.0
    d = D.astype(F32)
    return (d[:, None] if d.ndim == 1 else d) * x


def ssd_scan_xla(x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array, *,
                 D: jax.Array | None = None, dt_bias: jax.Array | None = None,
                 dt_softplus: bool = False, initial_states: jax.Array | None = None,
                 cu_seqlens: jax.Array, dt_limit: tuple[float, float] = (0.0, float("inf")),
                 state_dtype: Any = F32) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`ssd_chunked_scan`'s `(y [T, H, P] in x.dtype, final_states [S, H, P, N])` for the
    packed stream `x [T, H, P]`, `dt [T, H]`, `B, C [T, G, N]`, sequences `cu_seqlens`."""
    t, h, p = x.shape
    n = B.shape[-1]
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    s = cu.shape[0] - 1
    init = (jnp.zeros((s, h, p, n), F32) if initial_states is None
            else initial_states.astype(F32))  # fmt: skip
    tok = jnp.arange(t, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu[1:], tok, side="right"), 0, s - 1).astype(jnp.int32)
    first = tok == cu[seq]
    last = tok == cu[seq + 1] - 1
    dtp = _dt(dt, dt_bias, dt_softplus, dt_limit)  # [T, H]
    decay = jnp.exp(dtp * A.astype(F32))
    xs = x.astype(F32)
    inputs = (seq, first, last, decay, dtp[..., None] * xs, _heads(B, h), _heads(C, h))

    def step(carry, inp):
        state, finals = carry
        sq, fst, lst, dec, dx, b, c = inp
        state = jnp.where(fst, init[sq], state)
        state = dec[:, None, None] * state + dx[:, :, None] * b[:, None, :]
        y = jnp.einsum("hpn,hn->hp", state, c)
        finals = jax.lax.dynamic_update_index_in_dim(
            finals, jnp.where(lst, state, finals[sq]), sq, 0)
        return (state, finals), y

    (_, finals), y = jax.lax.scan(step, (jnp.zeros((h, p, n), F32), init), inputs)
    y = y + _skip(D, xs)
    return y.astype(x.dtype), finals.astype(state_dtype)


def ssd_state_update_xla(state: jax.Array, x: jax.Array, dt: jax.Array, A: jax.Array,
                         B: jax.Array, C: jax.Array, *, D: jax.Array | None = None,
                         dt_bias: jax.Array | None = None, dt_softplus: bool = False,
                         dt_limit: tuple[float, float] = (0.0, float("inf")),
                         ) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`ssd_state_update`'s `(y [Bt, H, P] in x.dtype, state)`: rows `0..Bt-1` of the state
    cache advanced one token (y from the f32 state before it is rounded to the cache's
    dtype); the other rows keep their values."""
    bt, h, _ = x.shape
    dtp = _dt(dt, dt_bias, dt_softplus, dt_limit)
    xs = x.astype(F32)
    old = state[:bt].astype(F32)
    new = (jnp.exp(dtp * A.astype(F32))[..., None, None] * old
           + (dtp[..., None] * xs)[..., None] * _heads(B, h)[:, :, None, :])  # fmt: skip
    y = jnp.einsum("bhpn,bhn->bhp", new, _heads(C, h)) + _skip(D, xs)
    return y.astype(x.dtype), state.at[:bt].set(new.astype(state.dtype))
