"""Issue 17 (defects 2 and 11), SSD scan: a NaN in one packed sequence stays in that sequence.

The rule, as the sequential recurrence (the authority) has it: a non-finite `x`, `dt`, `B` or
`C` at token k of sequence s makes NaN exactly what the recurrence makes NaN there (for `x`:
that head and column of s from token k on; `dt`: that head from k on; `B`: the group's heads
from k on; `C`: token k only), and nothing else: never a token before k (causality), never
another sequence, never another head or column. Every other output and final state is
BIT-identical to a run without the NaN: masked positions must never reach the arithmetic (a
select, not a multiply by 0), so nothing of the NaN token's value, not even rounding, is seen.

Two sequences share one chunk (T = 20 in [0, 8) and [8, 20), chunk 64), and at chunk 16 the
second sequence also runs across a chunk edge. NaN is planted at token 3 (sequence 0) and at
token 12 (sequence 1). The chunked reference must follow the same rule (it is the kernel tests'
second oracle).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol

from pallas_kernels.ssd_chunked_scan import ssd_chunked_scan
from pallas_kernels.ssd_chunked_scan.reference import (
    ssd_chunked_reference,
    ssd_sequential_reference,
)

T, H, P, G, N = 20, 2, 16, 1, 16
CU = [0, 8, 20]
# (argument, index of the planted NaN): one element each, at token 3 (sequence 0) or 12
# (sequence 1); head 1, column 5, state column 3 where the argument has those axes.
CASES = [
    (name, (tok,) + rest)
    for tok in (3, 12)
    for name, rest in (("x", (1, 5)), ("dt", (1,)), ("B", (0, 3)), ("C", (0, 3)))
]


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        x=rng.standard_normal((T, H, P)).astype(np.float32),
        dt=rng.uniform(0.05, 1.0, (T, H)).astype(np.float32),
        B=rng.standard_normal((T, G, N)).astype(np.float32),
        C=rng.standard_normal((T, G, N)).astype(np.float32),
    )


_RNG = np.random.default_rng(1)
A = jnp.asarray(-np.exp(0.5 * _RNG.standard_normal(H)).astype(np.float32))
INIT = jnp.asarray(_RNG.standard_normal((2, H, P, N)).astype(np.float32))
D_SKIP = jnp.asarray(_RNG.standard_normal(H).astype(np.float32))


def _kw():
    return dict(D=D_SKIP, initial_states=INIT, cu_seqlens=jnp.asarray(CU, jnp.int32))


@pytest.fixture(scope="module", params=[64, 16], ids=["chunk64", "chunk16"])
def kernel(request):
    """One jitted kernel per chunk size: every case reuses its compile."""
    L = request.param
    return jax.jit(lambda x, dt, B, C: ssd_chunked_scan(x, dt, A, B, C, chunk_size=L, **_kw()))


def _planted(name, index):
    bad = _inputs()
    bad[name] = bad[name].copy()
    bad[name][index] = np.nan
    return bad


def _run(fn, inp):
    y, f = fn(*(jnp.asarray(inp[k]) for k in ("x", "dt", "B", "C")))[:2]
    return np.asarray(y, np.float32), np.asarray(f, np.float32)


def _sequential(inp):
    return _run(lambda x, dt, B, C: ssd_sequential_reference(x, dt, A, B, C, **_kw()), inp)


def _check(got, clean, want, *, bit_identical: bool):
    """`got` is NaN exactly where the recurrence `want` is not finite; elsewhere it equals the
    clean run (bit for bit, or at the SSD tolerance for the reference)."""
    for g, c, w, what in zip(got, clean, want, ("y", "final states"), strict=True):
        poisoned = ~np.isfinite(w)
        np.testing.assert_array_equal(np.isnan(g), poisoned, err_msg=f"NaN pattern of {what}")
        if bit_identical:
            np.testing.assert_array_equal(g[~poisoned], c[~poisoned], err_msg=what)
        else:
            np.testing.assert_allclose(g[~poisoned], c[~poisoned], **tol("ssd", "float32"))


@pytest.mark.parametrize(("name", "index"), CASES, ids=[f"{n}{i}" for n, i in CASES])
def test_kernel_nan_stays_in_its_sequence_and_after_its_token(kernel, name, index):
    clean = _run(kernel, _inputs())
    bad = _planted(name, index)
    want = _sequential(bad)
    # The recurrence's own pattern, spelled out for the sequence without the NaN.
    other = slice(8, 20) if index[0] < 8 else slice(0, 8)
    seq_other = 1 if index[0] < 8 else 0
    assert np.isfinite(want[0][other]).all() and np.isfinite(want[1][seq_other]).all()
    assert np.isfinite(want[0][: index[0]]).all()
    assert not np.isfinite(want[0]).all()
    got = _run(kernel, bad)
    _check(got, clean, want, bit_identical=True)


@pytest.mark.parametrize(("name", "index"), CASES, ids=[f"{n}{i}" for n, i in CASES])
def test_chunked_reference_follows_the_same_rule(name, index):
    # Chunk 16 in the reference: sequence 1 (12 tokens) fits one chunk, so the NaN token has
    # masked (future) positions after it in its own chunk.
    def ref(x, dt, B, C):
        return ssd_chunked_reference(x, dt, A, B, C, chunk_size=16, **_kw())

    bad = _planted(name, index)
    _check(_run(ref, bad), _run(ref, _inputs()), _sequential(bad), bit_identical=False)


def test_a_concrete_non_finite_A_is_refused_also_inside_a_callers_jit():
    # The SSD checks use the shared `_args.check_finite` (NumPy): a concrete A closed over by
    # the caller's jit is still read and refused by name, not a tracer-conversion error. A
    # traced A (an argument of that jit) cannot be read and is documented as not checked.
    inp = {k: jnp.asarray(v) for k, v in _inputs().items()}
    bad_a = A.at[1].set(jnp.inf)

    @jax.jit
    def step(x):
        return ssd_chunked_scan(x, inp["dt"], bad_a, inp["B"], inp["C"], **_kw())[0]

    with pytest.raises(ValueError, match=r"A\[1\]=inf is not finite .*A must be finite"):
        step(inp["x"])
