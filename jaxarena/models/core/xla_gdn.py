"""The Gated DeltaNet delta rule in plain XLA: the `kernels="xla"` path of
`pallas_kernels.gdn_chunked_into` (prefill) and `gdn_state_update` (decode).

Semantics (the kernels'): per sequence of the packed stream, from its initial state `h`
(`[HV, K, V]`), for each token and value head `i` (key head `i // (HV / H)`): `h <- exp(g) h`,
`h <- h + k (beta (v - h^T k))^T`, `o = scale h^T q`; with `use_qk_l2norm` q and k are first
divided by `sqrt(sum x^2 + 1e-6)`. All in f32 (the chunked kernel keeps its intermediates in
bf16: this path is the more exact of the two).

How: the recurrence itself, one `lax.scan` step per token of the packed stream (a sequence's
first token starts from its initial state; its last token's state is its final state). The
chunk intermediates the kernel keeps in `gdn_fla_scratch` are not written: no block reads
them. Written independently of `gdn_sequential_reference`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["gdn_scan_xla", "gdn_state_update_xla"]

F32 = jnp.float32


def _prep(q, k, v, use_qk_l2norm: bool, scale: float | None):
    """f32 q (scaled), k expanded to the value heads, v."""
    hv, kd = v.shape[-2], q.shape[-1]
    q, k = q.astype(F32), k.astype(F32)
    if use_qk_l2norm:
        q = q / jnp.sqrt(jnp.sum(q * q, -1, keepdims=True) + 1e-6)
        k = k / jnp.sqrt(jnp.sum(k * k, -1, keepdims=True) + 1e-6)
    rep = hv // q.shape[-2]
    s = kd**-0.5 if scale is None else float(scale)
    return jnp.repeat(q * s, rep, -2), jnp.repeat(k, rep, -2), v.astype(F32)


def _delta(h, q, k, v, g, beta):
    """One token on states `h [..., HV, K, V]`: returns `(h', o [..., HV, V])`."""
    h = jnp.exp(g.astype(F32))[..., None, None] * h
    u = beta.astype(F32)[..., None] * (v - jnp.einsum("...kv,...k->...v", h, k))
    h = h + k[..., :, None] * u[..., None, :]
    return h, jnp.einsum("...kv,...k->...v", h, q)


def gdn_scan_xla(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, *,
                 cu_seqlens: jax.Array, initial_states: jax.Array | None = None,
                 scale: float | None = None,
                 use_qk_l2norm: bool = False) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`gdn_chunked`'s `(o [T, HV, V] in v.dtype, final_states f32[S, HV, K, V])`."""
    t, hv, vd = v.shape
    kd = q.shape[-1]
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    s = cu.shape[0] - 1
    init = (jnp.zeros((s, hv, kd, vd), F32) if initial_states is None
            else initial_states.astype(F32))  # fmt: skip
    tok = jnp.arange(t, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu[1:], tok, side="right"), 0, s - 1).astype(jnp.int32)
    first, last = tok == cu[seq], tok == cu[seq + 1] - 1
    qf, kf, vf = _prep(q, k, v, use_qk_l2norm, scale)

    def step(carry, inp):
        h, finals = carry
        sq, fst, lst, qt, kt, vt, gt, bt = inp
        h = jnp.where(fst, init[sq], h)
        h, o = _delta(h, qt, kt, vt, gt, bt)
        finals = jax.lax.dynamic_update_index_in_dim(finals, jnp.where(lst, h, finals[sq]),
                                                     sq, 0)  # fmt: skip
        return (h, finals), o

    (_, finals), o = jax.lax.scan(step, (jnp.zeros((hv, kd, vd), F32), init),
                                  (seq, first, last, qf, kf, vf, g, beta))  # fmt: skip
    return o.astype(v.dtype), finals


def gdn_state_update_xla(state: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array,
                         g: jax.Array, beta: jax.Array, *, scale: float | None = None,
                         use_qk_l2norm: bool = False) -> tuple[jax.Array, Any]:  # fmt: skip
    """`gdn_state_update`'s `(o [B, HV, V] in v.dtype, state)`: rows `0..B-1` of the cache
    advanced one token (o from the f32 state), the other rows unchanged."""
    b = v.shape[0]
    qf, kf, vf = _prep(q, k, v, use_qk_l2norm, scale)
    h, o = _delta(state[:b].astype(F32), qf, kf, vf, g, beta)
    return o.astype(v.dtype), state.at[:b].set(h.astype(state.dtype))
