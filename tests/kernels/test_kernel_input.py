"""Issue 17, the kernels' side: stale bytes never reach an output (select, not multiply), NaN
in is never a plausible 0 out, and the argument checks refuse what the kernels would mangle
(a NaN query, A = -inf, float or past-int32 `cu_seqlens`, a batch of 0).

Shapes are small and shared between cases (interpret mode on CPU: each new shape compiles).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol

from pallas_kernels.splitk_decode_attention import (
    paged_decode_attention_reference,
    splitk_decode_attention,
)
from pallas_kernels.ssd_chunked_scan import ssd_chunked_scan

# -- split-K: B=2, Hq=4, Hkv=1, D=64, pages of 16, sequence lengths 20 and 7 -------------------

B, HQ, HKV, D, BS, NB, MAXP = 2, 4, 1, 64, 16, 4, 2
LENS = [20, 7]


def _splitk_case(seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, HQ, D)), jnp.float32)
    k = rng.standard_normal((NB, BS, HKV, D)).astype(np.float32)
    v = rng.standard_normal((NB, BS, HKV, D)).astype(np.float32)
    table = np.array([[0, 1], [2, 3]], np.int32)
    return q, k, v, table


def _poison_tails(k, v, table):
    """NaN in every masked slot: the tail of each sequence's last page and unused pages."""
    k, v = k.copy(), v.copy()
    for b, n in enumerate(LENS):
        for t in range(n, MAXP * BS):
            page, row = table[b, t // BS], t % BS
            k[page, row] = np.nan
            v[page, row] = np.nan
    return k, v


@pytest.mark.parametrize("splits", [1, 2])
def test_splitk_stale_nan_never_reaches_the_output_and_real_nan_is_never_0(splits):
    # One jitted function per split count (one compile) runs every case.
    q, k, v, table = _splitk_case()
    tables, lens = jnp.asarray(table), jnp.asarray(LENS, jnp.int32)
    run = jax.jit(lambda q, k, v: splitk_decode_attention(q, k, v, tables, lens,
                                                         num_splits=splits))  # fmt: skip
    clean = np.asarray(run(q, jnp.asarray(k), jnp.asarray(v)))
    ref = paged_decode_attention_reference(q, jnp.asarray(k), jnp.asarray(v), tables, lens)
    np.testing.assert_allclose(clean, np.asarray(ref), **tol("attention", "float32"))

    # Defect 2: NaN in every masked slot (the tail of each sequence's last page). Masked keys
    # got weight 0 and 0 * NaN = NaN, in the kernel AND the reference: now bit-identical.
    kn, vn = _poison_tails(k, v, table)
    stale = np.asarray(run(q, jnp.asarray(kn), jnp.asarray(vn)))
    np.testing.assert_array_equal(stale, clean)
    ref_stale = paged_decode_attention_reference(q, jnp.asarray(kn), jnp.asarray(vn), tables, lens)
    np.testing.assert_array_equal(np.asarray(ref_stale), np.asarray(ref))

    # Defect 11: a NaN query (traced, so not checked) or an infinite valid key came out as a
    # plausible 0. Now the affected head is NaN and every other head is unchanged.
    got = np.asarray(run(q.at[1, 2].set(jnp.nan), jnp.asarray(k), jnp.asarray(v)))
    assert np.isnan(got[1, 2]).all()
    mask = np.ones(got.shape[:2], bool)
    mask[1, 2] = False
    np.testing.assert_array_equal(got[mask], clean[mask])
    k_inf = k.copy()
    k_inf[table[0, 1], 3] = np.inf  # token 19 of sequence 0: a valid key
    got = np.asarray(run(q, jnp.asarray(k_inf), jnp.asarray(v)))
    assert np.isnan(got[0]).all() and not np.isnan(got[1]).any()
    ref_inf = paged_decode_attention_reference(q, jnp.asarray(k_inf), jnp.asarray(v), tables, lens)
    assert np.isnan(np.asarray(ref_inf)[0]).all()


def test_splitk_refuses_a_concrete_nan_query_and_a_batch_of_0():
    q, k, v, table = _splitk_case()
    args = (jnp.asarray(k), jnp.asarray(v), jnp.asarray(table), jnp.asarray(LENS, jnp.int32))
    with pytest.raises(ValueError, match=r"q\[1, 2, 5\]=nan is not finite"):
        splitk_decode_attention(q.at[1, 2, 5].set(jnp.nan), *args)
    with pytest.raises(ValueError, match=r"batch size q.shape\[0\] = 0; it must be >= 1"):
        splitk_decode_attention(
            q[:0], jnp.asarray(k), jnp.asarray(v), jnp.zeros((0, MAXP), jnp.int32),
            jnp.zeros((0,), jnp.int32),
        )  # fmt: skip


# -- SSD: T=20 tokens in two sequences [0, 8) and [8, 20), one 64-token chunk --------------------

T, H, P, G, N = 20, 2, 16, 1, 16
CU = [0, 8, 20]


def _ssd_inputs(seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        x=rng.standard_normal((T, H, P)).astype(np.float32),
        dt=rng.uniform(0.05, 1.0, (T, H)).astype(np.float32),
        A=-np.exp(0.5 * rng.standard_normal(H)).astype(np.float32),
        B=rng.standard_normal((T, G, N)).astype(np.float32),
        C=rng.standard_normal((T, G, N)).astype(np.float32),
        init=rng.standard_normal((2, H, P, N)).astype(np.float32),
    )


def _ssd(inp, **kw):
    xs = [jnp.asarray(inp[k]) for k in ("x", "dt", "A", "B", "C")]
    return ssd_chunked_scan(*xs, initial_states=jnp.asarray(inp["init"]),
                            cu_seqlens=jnp.asarray(CU, jnp.int32), **kw)  # fmt: skip


def test_ssd_nan_and_stale_bytes_stay_in_their_sequence():
    inp = _ssd_inputs()
    y0, f0 = (np.asarray(a) for a in _ssd(inp)[:2])
    assert np.isfinite(y0).all() and np.isfinite(f0).all()
    # A NaN token of sequence 0: sequence 1's final state is unchanged; sequence 0's own final
    # state is NaN (honest).
    bad = dict(inp, x=inp["x"].copy())
    bad["x"][3] = np.nan
    _, f = (np.asarray(a) for a in _ssd(bad)[:2])
    assert np.isnan(f[0]).all()
    np.testing.assert_array_equal(f[1], f0[1])
    # A NaN initial state of sequence 1 (which starts inside the chunk): sequence 0's outputs
    # and final state are unchanged; before the fix 0 * NaN reached every token of the chunk.
    bad = dict(inp, init=inp["init"].copy())
    bad["init"][1] = np.nan
    y, f = (np.asarray(a) for a in _ssd(bad)[:2])
    np.testing.assert_array_equal(y[:8], y0[:8])
    np.testing.assert_array_equal(f[0], f0[0])
    assert np.isnan(f[1]).all() and np.isnan(y[8:]).all()
    # Stale scratch: a workspace full of NaN (an earlier tenant's bytes) changes nothing.
    per_chunk = 2 * H * 64 + G * 64 * 64
    y, f, _ = _ssd(inp, workspace=jnp.full((2 * per_chunk,), np.nan, jnp.float32))
    np.testing.assert_array_equal(np.asarray(y), y0)
    np.testing.assert_array_equal(np.asarray(f), f0)


@pytest.mark.parametrize(
    ("cu", "needle"),
    [
        ([0, 10.7, 20], r"cu_seqlens\[1\]=10.7 must be an int, got float"),
        ([0, 10.0, 20], r"cu_seqlens\[1\]=10.0 must be an int"),
        ([0, True, 20], r"cu_seqlens\[1\]=True must be an int, got bool"),
        ([0, 2**40], r"cu_seqlens\[1\]=1099511627776 is outside \[0, 2147483647\]"),
        ([0, -1, 20], r"cu_seqlens\[1\]=-1 is outside"),
    ],
)
def test_ssd_cu_seqlens_lists_are_never_truncated_or_overflowed(cu, needle):
    # Defects 10 and 11: [0, 10.7, 50] became [0, 10, 50]; 2**40 raised OverflowError.
    inp = _ssd_inputs()
    xs = [jnp.asarray(inp[k]) for k in ("x", "dt", "A", "B", "C")]
    with pytest.raises(ValueError, match=needle):
        ssd_chunked_scan(*xs, cu_seqlens=cu)


@pytest.mark.parametrize("a", [-np.inf, np.nan, np.inf])
def test_ssd_refuses_a_concrete_non_finite_A(a):
    # Defect 11: A = -inf gave all-NaN outputs (differences of -inf cumulative sums) although
    # exp(dt A) = 0 is finite math.
    inp = _ssd_inputs()
    inp["A"] = inp["A"].copy()
    inp["A"][1] = a
    with pytest.raises(ValueError, match=r"A\[1\]=.* is not finite.*A must be finite"):
        _ssd(inp)
