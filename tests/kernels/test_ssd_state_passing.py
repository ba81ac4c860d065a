"""The SSD scan's chunk-to-chunk state passing, inside `ssd_scan_kernel`, against the
sequential recurrence.

The kernel carries the running state across chunk edges in registers (no per-chunk state is
stored), resets it where a sequence starts, and writes a sequence's final state in the chunk
where it ends. These cases put boundaries on chunk edges, inside chunks, empty and length-1
sequences, and several sequences in one chunk, with head_dim split over two programs
(P = 32, 16 columns per program). Shapes stay tiny (chunks of 16 tokens) for the Pallas
interpreter.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol

from pallas_kernels.ssd_chunked_scan import ssd_chunked_scan, ssd_sequential_reference

L = 16  # chunk length
H, P, N = 2, 32, 16


def _inputs(T, S, seed):
    rng = np.random.default_rng(seed)
    return dict(
        x=rng.standard_normal((T, H, P)).astype(np.float32),
        dt=rng.uniform(0.05, 1.0, (T, H)).astype(np.float32),
        A=-np.exp(0.5 * rng.standard_normal(H)).astype(np.float32),
        B=rng.standard_normal((T, 1, N)).astype(np.float32),
        C=rng.standard_normal((T, 1, N)).astype(np.float32),
        dt_bias=rng.uniform(0.0, 0.3, H).astype(np.float32),
        initial_states=rng.standard_normal((S, H, P, N)).astype(np.float32),
    )


def _run(fn, inp, cu, softplus, **kw):
    xs = [jnp.asarray(inp[k]) for k in ("x", "dt", "A", "B", "C")]
    y, final = fn(
        *xs,
        dt_bias=jnp.asarray(inp["dt_bias"]),
        dt_softplus=softplus,
        initial_states=jnp.asarray(inp["initial_states"]),
        cu_seqlens=jnp.asarray(cu, jnp.int32),
        **kw,
    )
    return np.asarray(y), np.asarray(final)


CASES = [
    # One sequence over five chunks, the last one partly padding: the state always continues.
    pytest.param(70, [0, 70], False, id="one-sequence"),
    # A boundary on a chunk edge (16), boundaries inside chunks (20, 21, 40), an empty
    # sequence (20:20), a length-1 sequence (20:21), a sequence spanning the chunk edge at
    # 32 (21:40), and a chunk (16..31) whose first and last sequences are both fresh.
    pytest.param(70, [0, 16, 20, 20, 21, 40, 70], True, id="packed"),
    # Leading empty sequences, a sequence that fills whole chunks, one ending on an edge,
    # a trailing empty sequence.
    pytest.param(64, [0, 0, 0, 5, 48, 64, 64], True, id="leading-empty-edge-end"),
    # Several sequences starting inside one chunk, none reaching its end but the last.
    pytest.param(40, [0, 1, 2, 3, 17, 40], False, id="short-sequences"),
]


@pytest.mark.parametrize("T, cu, softplus", CASES)
def test_states_and_outputs_match_the_recurrence(T, cu, softplus):
    inp = _inputs(T, len(cu) - 1, seed=T + len(cu))
    y, final = _run(ssd_chunked_scan, inp, cu, softplus, chunk_size=L)
    y_ref, f_ref = _run(ssd_sequential_reference, inp, cu, softplus)
    np.testing.assert_allclose(final, f_ref, **tol("ssd", jnp.float32), err_msg="final")
    np.testing.assert_allclose(y, y_ref, **tol("ssd", jnp.float32), err_msg="y")


def test_each_initial_state_reaches_only_its_sequence():
    """Changing one sequence's initial state changes exactly its own tokens and final state:
    sequence 4 (tokens 21:40) starts inside chunk 1 and runs across the edge at 32."""
    T, cu = 70, [0, 16, 20, 20, 21, 40, 70]
    inp = _inputs(T, len(cu) - 1, seed=3)
    y0, f0 = _run(ssd_chunked_scan, inp, cu, True, chunk_size=L)
    moved = dict(inp, initial_states=inp["initial_states"].copy())
    moved["initial_states"][4] += 1.0
    y1, f1 = _run(ssd_chunked_scan, moved, cu, True, chunk_size=L)
    changed_tokens = np.flatnonzero(np.any(y1 != y0, axis=(1, 2)))
    np.testing.assert_array_equal(changed_tokens, np.arange(21, 40))
    np.testing.assert_array_equal(np.flatnonzero(np.any(f1 != f0, axis=(1, 2, 3))), [4])
