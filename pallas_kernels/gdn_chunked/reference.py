"""Independent reference: the Gated DeltaNet recurrence token by token, in NumPy.

Nothing here is shared with the kernels: no chunks, no `A` matrix, no bf16 storage. The
recurrence is run in float64 (the default) or float32 (`dtype`), one token at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["gdn_sequential_reference"]


def _l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def gdn_sequential_reference(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    *,
    cu_seqlens: Any = None,
    initial_states: Any = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    dtype: Any = np.float64,
) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule, sequentially, per sequence of a packed stream.

    For each value head `i` (key head `i // (HV / H)`) and token t of a sequence, from its
    initial state `h [K, V]` (zeros if absent): `h *= exp(g_t)`, `v' = beta_t (v_t - h^T k_t)`,
    `h += k_t v'^T`, `o_t = scale h^T q_t` (q, k L2-normalised first with `use_qk_l2norm`,
    `scale = K ** -0.5` when None).

    Args: q, k `[T, H, K]`; v `[T, HV, V]`; g, beta `[T, HV]`; cu_seqlens `[S + 1]` ints or
      None (one sequence); initial_states `[S, HV, K, V]` or None. Any array-likes.

    Returns:
      `(o [T, HV, V], final_states [S, HV, K, V])` in `dtype`.
    """
    q, k, v, g, beta = (np.asarray(a, dtype=np.float64).astype(dtype) for a in (q, k, v, g, beta))
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    cu = [0, T] if cu_seqlens is None else [int(c) for c in np.asarray(cu_seqlens)]
    S = len(cu) - 1
    scale = K**-0.5 if scale is None else scale
    if use_qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    q = q * dtype(scale)
    rep = HV // H
    o = np.zeros((T, HV, V), dtype)
    final = np.zeros((S, HV, K, V), dtype)
    if initial_states is not None:
        final[:] = np.asarray(initial_states, np.float64).astype(dtype)
    for s in range(S):
        for i in range(HV):
            h = final[s, i].copy()
            for t in range(cu[s], cu[s + 1]):
                kt, qt = k[t, i // rep], q[t, i // rep]
                h *= np.exp(g[t, i])
                vp = beta[t, i] * (v[t, i] - kt @ h)
                h += np.outer(kt, vp)
                o[t, i] = qt @ h
            final[s, i] = h
    return o, final
