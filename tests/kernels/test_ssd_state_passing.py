"""The SSD scan's state passing kernel (phase 2) against the sequential recurrence.

`pass_states` gets each chunk's own state contribution and `dA_cumsum`, both derived from the
references (the kernel's phase 1 plays no part), and must return, for every chunk, the state
of the sequence running at the chunk's first token before that token: what the sequential
recurrence (`ssd_sequential_reference`) holds there. Shapes stay tiny (chunks of 16 tokens,
H = 2, P = N = 16) for the Pallas interpreter.
"""

from __future__ import annotations

import importlib

import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol

from pallas_kernels.ssd_chunked_scan import ssd_chunk_quantities, ssd_sequential_reference

# `from pallas_kernels.ssd_chunked_scan import state_passing` would find the package's
# re-exported function of the same prefix first on some import paths; import the module.
pass_states = importlib.import_module("pallas_kernels.ssd_chunked_scan.state_passing").pass_states

L = 16  # chunk length
H, P, N = 2, 16, 16


def _inputs(T, S, seed):
    rng = np.random.default_rng(seed)
    return dict(
        x=rng.standard_normal((T, H, P)).astype(np.float32),
        dt=rng.uniform(0.05, 1.0, (T, H)).astype(np.float32),
        A=-np.exp(0.5 * rng.standard_normal(H)).astype(np.float32),
        B=rng.standard_normal((T, 1, N)).astype(np.float32),
        C=rng.standard_normal((T, 1, N)).astype(np.float32),
        dt_bias=rng.uniform(0.0, 0.3, H).astype(np.float32),
        init=rng.standard_normal((S, H, P, N)).astype(np.float32),
    )


def _seq_of_tokens(cu, n):
    """Sequence of each of `n` tokens: the last s with cu[s] <= t (padding -> the last one)."""
    S = len(cu) - 1
    t = np.arange(n)
    return np.minimum(np.searchsorted(np.asarray(cu), t, side="right") - 1, S - 1)


def _sequential(inp, rows, cu, init, softplus):
    """Final states of `ssd_sequential_reference` on the tokens `rows`, split by `cu`."""
    _, finals = ssd_sequential_reference(
        inp["x"][rows],
        inp["dt"][rows],
        inp["A"],
        inp["B"][rows],
        inp["C"][rows],
        dt_bias=inp["dt_bias"],
        dt_softplus=softplus,
        initial_states=init,
        cu_seqlens=jnp.asarray(cu, jnp.int32),
    )
    return np.asarray(finals)


def _case(T, cu, softplus, seed):
    """Kernel inputs from the references, and the expected `h_in` of every chunk."""
    S = len(cu) - 1
    nc = -(-T // L)
    inp = _inputs(T, S, seed)
    seq = _seq_of_tokens(cu, nc * L)
    _, dA_cs, _ = ssd_chunk_quantities(
        inp["dt"],
        inp["A"],
        inp["B"],
        inp["C"],
        chunk_size=L,
        dt_bias=inp["dt_bias"],
        dt_softplus=softplus,
    )
    # Chunk c's own contribution: the recurrence over the tokens of its last sequence inside
    # it, from a zero state. All chunks' pieces in one packed call, one piece per sequence.
    pieces = []
    for c in range(nc):
        start = max(c * L, int(cu[seq[c * L + L - 1]]))
        pieces.append(np.arange(min(start, T), min(c * L + L, T)))
    cu_pieces = np.concatenate([[0], np.cumsum([len(p) for p in pieces])])
    zeros = np.zeros((nc, H, P, N), np.float32)
    states = _sequential(inp, np.concatenate(pieces), cu_pieces, zeros, softplus)
    # Expected: the state before token c*L of that token's sequence, from the recurrence run
    # on the prefix [0, c*L) with the sequences cut there (one not yet started keeps its
    # initial state); chunk 0 starts from the initial state of token 0's sequence.
    want = np.empty((nc, H, P, N), np.float32)
    want[0] = inp["init"][seq[0]]
    for c in range(1, nc):
        cu_prefix = np.minimum(np.asarray(cu), c * L)
        finals = _sequential(inp, np.arange(c * L), cu_prefix, inp["init"], softplus)
        want[c] = finals[seq[c * L]]
    args = (
        jnp.asarray(states),
        jnp.asarray(dA_cs),
        jnp.asarray(seq, jnp.int32),
        jnp.asarray(cu, jnp.int32),
        jnp.asarray(inp["init"]),
    )
    return args, want


CASES = [
    # One sequence over five chunks, the last one partly padding: the state always continues.
    pytest.param(70, [0, 70], False, id="one-sequence"),
    # A boundary on a chunk edge (16), boundaries inside chunks (20, 21, 40), an empty
    # sequence (20:20), a length-1 sequence (20:21), a sequence spanning the chunk edge at
    # 32 (21:40), and a chunk (16..31) whose first and last sequences are both fresh.
    pytest.param(70, [0, 16, 20, 20, 21, 40, 70], True, id="packed"),
    # Leading empty sequences, a sequence that fills whole chunks, one ending on an edge.
    pytest.param(64, [0, 0, 0, 5, 48, 64], True, id="leading-empty-edge-end"),
    # Several sequences starting inside one chunk, none reaching its end but the last.
    pytest.param(40, [0, 1, 2, 3, 17, 40], False, id="short-sequences"),
]


@pytest.mark.parametrize("T, cu, softplus", CASES)
@pytest.mark.parametrize("block", [256, 64], ids=["one-block", "four-blocks"])
def test_h_in_matches_the_recurrence(T, cu, softplus, block):
    args, want = _case(T, cu, softplus, seed=T + len(cu))
    got = pass_states(*args, interpret=True, block=block)
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, **tol("ssd", jnp.float32))


def test_h_in_uses_each_initial_state():
    """Changing one sequence's initial state changes exactly the chunks it enters."""
    T, cu = 70, [0, 16, 20, 20, 21, 40, 70]
    args, _ = _case(T, cu, True, seed=3)
    base = np.asarray(pass_states(*args, interpret=True))
    init = np.asarray(args[4]).copy()
    init[4] += 1.0  # sequence 4 (tokens 21:40) runs across the edge at 32 only
    moved = np.asarray(pass_states(*args[:4], jnp.asarray(init), interpret=True))
    changed = np.any(moved != base, axis=(1, 2, 3))
    np.testing.assert_array_equal(changed, [False, False, True, False, False])


def test_rejects_a_block_that_does_not_tile_the_state():
    args, _ = _case(40, [0, 40], False, seed=0)
    with pytest.raises(ValueError, match=r"block=96 must be a power of two dividing P \* N"):
        pass_states(*args, interpret=True, block=96)
