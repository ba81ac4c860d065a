"""Mamba-2 decode step (`ssd_state_update`): kernel vs its independent reference and vs one step
of the sequential SSD recurrence, in-place slot semantics, the options' edge cases, validation
and CUDA lowering.

Tolerances come from the suite's table (`tol("ssd", dtype)`). The kernel and the reference both
work in float32 and differ only in the order of the `N`-term sum `state @ C` (the kernel sums
power-of-two column pieces): a few f32 ulps of `sum |h C|`, far inside the f32 bound. With
bf16 inputs both read the same bf16 values; the bf16 output (and a bf16 cache) is one rounding
of f32 values that agree to ~1e-6, so they differ by at most one bf16 ulp (at most 2^-7
relative), the bf16 bound's rtol.

Shapes stay small: the Pallas interpreter copies whole operands on every grid step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol
from hypothesis import given, settings
from hypothesis import strategies as st

from pallas_kernels import ssd_state_update
from pallas_kernels.ssd_chunked_scan import ssd_sequential_reference
from pallas_kernels.ssd_state_update import ssd_state_update_reference

F32, BF16 = jnp.float32, jnp.bfloat16


def _inputs(S, Bt, H, P, G, N, *, seed=0, dtype=F32, state_dtype=F32):
    """Random inputs as a Mamba-2 layer sees them at decode (A < 0, dt around softplus's knee)."""
    rng = np.random.default_rng(seed)

    def normal(*shape, dt=F32):
        return jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dt)

    return dict(
        state=normal(S, H, P, N, dt=state_dtype),
        x=normal(Bt, H, P, dt=dtype),
        dt=jnp.asarray(rng.uniform(-2.0, 2.0, (Bt, H)).astype(np.float32)),
        A=jnp.asarray(-np.exp(0.5 * rng.standard_normal(H)).astype(np.float32)),
        B=normal(Bt, G, N, dt=dtype),
        C=normal(Bt, G, N, dt=dtype),
        z=normal(Bt, H, P, dt=dtype),
        D=normal(H),
        D2=normal(H, P),
        dt_bias=jnp.asarray(rng.uniform(0.0, 0.5, H).astype(np.float32)),
        idx=rng.permutation(S)[:Bt].astype(np.int32),
    )


def _run(inp, **kw):
    """Kernel and reference on the same inputs; the kernel gets its own copy of the cache."""
    args = (inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"])
    y_ref, s_ref = ssd_state_update_reference(inp["state"], *args, **kw)
    y, s = ssd_state_update(jnp.array(inp["state"], copy=True), *args, **kw)
    return (y, s), (y_ref, s_ref)


def _close(got, want, dtype):
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), **tol("ssd", dtype)
    )


@pytest.mark.parametrize(
    "dtype, state_dtype, d, z, bias, softplus, limit",
    [
        (F32, F32, "H", True, True, True, (0.0, float("inf"))),
        (F32, F32, "HP", False, False, True, (0.2, 1.5)),
        (F32, F32, None, True, True, False, (0.0, float("inf"))),
        (BF16, F32, "HP", True, True, True, (0.0, float("inf"))),
        (BF16, BF16, "H", True, True, True, (0.1, 2.0)),
        (F32, BF16, None, False, False, True, (0.0, float("inf"))),
    ],
)
def test_matches_reference(dtype, state_dtype, d, z, bias, softplus, limit):
    S, Bt, H, P, G, N = 7, 4, 4, 8, 2, 16
    inp = _inputs(S, Bt, H, P, G, N, dtype=dtype, state_dtype=state_dtype)
    kw = dict(dt_softplus=softplus, state_indices=inp["idx"], dt_limit=limit)
    if d is not None:
        kw["D"] = inp["D"] if d == "H" else inp["D2"]
    if z:
        kw["z"] = inp["z"]
    if bias:
        kw["dt_bias"] = inp["dt_bias"]
    (y, s), (y_ref, s_ref) = _run(inp, **kw)
    assert y.dtype == dtype and y.shape == (Bt, H, P)
    assert s.dtype == state_dtype and s.shape == (S, H, P, N)
    _close(y, y_ref, dtype)
    _close(s, s_ref, state_dtype)
    # Slots no row names keep their bytes exactly.
    others = np.setdiff1d(np.arange(S), inp["idx"])
    np.testing.assert_array_equal(np.asarray(s)[others], np.asarray(inp["state"])[others])
    # The updated slots did change (the test would pass on a no-op otherwise).
    assert not np.allclose(np.asarray(s, np.float32)[inp["idx"]],
                           np.asarray(inp["state"], np.float32)[inp["idx"]])  # fmt: skip


@pytest.mark.parametrize("gated", [False, True])
def test_equals_one_step_of_the_sequential_recurrence(gated):
    """Row b as a one-token sequence starting from its slot's state: `ssd_sequential_reference`
    with T = Bt, cu_seqlens = 0..Bt and initial_states = state[idx] gives the same y and new
    state; with D [H] and the defaults, and with D [H, P], z and an active dt_limit."""
    S, Bt, H, P, G, N = 6, 5, 4, 8, 2, 16
    inp = _inputs(S, Bt, H, P, G, N, seed=3)
    kw = dict(D=inp["D"], dt_bias=inp["dt_bias"], dt_softplus=True)
    if gated:
        kw.update(D=inp["D2"], z=inp["z"], dt_limit=(0.3, 1.2))
    args = (inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"])
    y_seq, finals = ssd_sequential_reference(
        *args, **kw, initial_states=inp["state"][inp["idx"]], cu_seqlens=jnp.arange(Bt + 1)
    )
    y, s = ssd_state_update(jnp.array(inp["state"], copy=True), *args, **kw,
                            state_indices=jnp.asarray(inp["idx"]))  # fmt: skip
    _close(y, y_seq, F32)
    _close(np.asarray(s)[inp["idx"]], finals, F32)


@settings(max_examples=12, deadline=None)
@given(slots=st.permutations(range(6)), seed=st.integers(0, 2**16))
def test_any_distinct_slots(slots, seed):
    """Any 3 distinct slots of 6, in any order, with any values: one compile (the indices are
    an array argument), the reference's result every time."""
    inp = _inputs(6, 3, 2, 8, 1, 16, seed=seed)
    idx = jnp.asarray(slots[:3], jnp.int32)
    (y, s), (y_ref, s_ref) = _run(inp, z=inp["z"], D=inp["D"], dt_softplus=True,
                                  state_indices=idx)  # fmt: skip
    _close(y, y_ref, F32)
    _close(s, s_ref, F32)
    rest = list(slots[3:])
    np.testing.assert_array_equal(np.asarray(s)[rest], np.asarray(inp["state"])[rest])


def test_default_slots_and_odd_shapes():
    """No state_indices: row b updates slot b (Bt < S leaves the tail alone). P = 6 (blocks of
    2 rows) and N = 24 (pieces 16 + 8) exercise the non-power-of-two paths; G = H."""
    S, Bt, H, P, G, N = 4, 3, 2, 6, 2, 24
    inp = _inputs(S, Bt, H, P, G, N, seed=5)
    (y, s), (y_ref, s_ref) = _run(inp, D=inp["D2"], z=inp["z"], dt_softplus=True)
    _close(y, y_ref, F32)
    _close(s, s_ref, F32)
    np.testing.assert_array_equal(np.asarray(s)[3], np.asarray(inp["state"])[3])


def test_default_limit_clamps_negative_dt_to_zero():
    """Without softplus a negative dt' is clamped to lo = 0 (mamba_ssm's fused path): the state
    keeps its value exactly (decay exp(0) = 1, input term 0) and y = state C + D x."""
    S, Bt, H, P, G, N = 3, 2, 2, 4, 1, 16
    inp = _inputs(S, Bt, H, P, G, N, seed=7)
    dt = -jnp.abs(inp["dt"]) - 0.1
    state = inp["state"]
    y, s = ssd_state_update(jnp.array(state, copy=True), inp["x"], dt, inp["A"], inp["B"],
                            inp["C"], D=inp["D"], state_indices=[2, 0])  # fmt: skip
    np.testing.assert_array_equal(np.asarray(s), np.asarray(state))
    h = np.asarray(state)[[2, 0]]
    want = np.einsum("bhpn,bn->bhp", h, np.asarray(inp["C"])[:, 0])
    want += np.asarray(inp["D"])[None, :, None] * np.asarray(inp["x"])
    _close(y, want, F32)
    # An explicit upper limit below every dt' makes dt' = hi everywhere.
    hi = 0.05
    (y2, s2), (y2_ref, s2_ref) = _run(inp, dt_softplus=True, dt_limit=(0.0, hi))
    (_, s3), _ = _run(inp, dt_softplus=True, dt_limit=(hi, hi))
    _close(y2, y2_ref, F32)
    np.testing.assert_array_equal(np.asarray(s2), np.asarray(s3))  # same dt' = hi in both


def test_large_dt_and_large_gate():
    """softplus above its threshold (dt + bias = 30: dt' = 30, the state decays to ~0) and
    |z| = 1e4 (silu(-1e4) = -0, silu(1e4) = 1e4) stay finite and match the reference."""
    S, Bt, H, P, G, N = 2, 2, 2, 4, 1, 16
    inp = _inputs(S, Bt, H, P, G, N, seed=9)
    dt = jnp.full((Bt, H), 30.0, F32)
    z = jnp.where(jnp.arange(P) % 2 == 0, 1e4, -1e4) * jnp.ones((Bt, H, P), F32)
    args = (inp["x"], dt, inp["A"], inp["B"], inp["C"])
    kw = dict(z=z, dt_softplus=True)
    y_ref, s_ref = ssd_state_update_reference(inp["state"], *args, **kw)
    y, s = ssd_state_update(jnp.array(inp["state"], copy=True), *args, **kw)
    assert np.isfinite(np.asarray(y)).all()
    _close(y, y_ref, F32)
    _close(s, s_ref, F32)
    assert (np.asarray(y)[..., 1::2] == 0).all()


def test_nan_stays_in_its_row_and_slot():
    """A NaN in x[0, 1, 2] makes NaN exactly the state row [slot0, 1, 2, :] and y[0, 1, 2]
    (the recurrence's reach); the reference agrees, and no other row, head or slot is touched
    (programs never mix rows, and padding pieces are never multiplied by 0)."""
    S, Bt, H, P, G, N = 4, 2, 2, 8, 1, 16
    inp = _inputs(S, Bt, H, P, G, N, seed=13)
    inp["x"] = inp["x"].at[0, 1, 2].set(jnp.nan)
    (y, s), (y_ref, s_ref) = _run(inp, D=inp["D2"], z=inp["z"], dt_softplus=True,
                                  state_indices=[3, 1])  # fmt: skip
    bad_y = np.zeros((Bt, H, P), bool)
    bad_y[0, 1, 2] = True
    bad_s = np.zeros((S, H, P, N), bool)
    bad_s[3, 1, 2, :] = True
    np.testing.assert_array_equal(np.isnan(np.asarray(y)), bad_y)
    np.testing.assert_array_equal(np.isnan(np.asarray(s)), bad_s)
    np.testing.assert_array_equal(np.isnan(np.asarray(y_ref)), bad_y)
    _close(np.where(bad_y, 0, y), np.where(bad_y, 0, y_ref), F32)
    _close(np.where(bad_s, 0, s), np.where(bad_s, 0, s_ref), F32)


def test_in_place_under_jit_and_traced_bad_slot():
    """Inside a jit that donates the cache, it is an aliased operand (input_output_alias in
    the compiled HLO). A traced out-of-range slot is never written; its row's y is NaN."""
    S, Bt, H, P, G, N = 3, 2, 2, 4, 1, 16
    inp = _inputs(S, Bt, H, P, G, N, seed=11)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, idx):
        return ssd_state_update(state, inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"],
                                dt_softplus=True, state_indices=idx)  # fmt: skip

    idx = jnp.asarray([1, S], jnp.int32)
    assert "input_output_alias" in step.lower(inp["state"], idx).compile().as_text()
    y, s = step(jnp.array(inp["state"], copy=True), idx)
    y_ref, s_ref = ssd_state_update_reference(
        inp["state"][:2], inp["x"][:1], inp["dt"][:1], inp["A"], inp["B"][:1], inp["C"][:1],
        dt_softplus=True, state_indices=[1],
    )  # fmt: skip
    _close(y[:1], y_ref, F32)
    assert np.isnan(np.asarray(y[1])).all()
    _close(s[:2], s_ref, F32)
    np.testing.assert_array_equal(np.asarray(s)[[0, 2]], np.asarray(inp["state"])[[0, 2]])


# ---------------------------------------------------------------------------------------------
# Validation: before tracing, nothing donated or changed


def _bad(**over):
    inp = _inputs(4, 2, 2, 4, 1, 16, seed=1)
    args = dict(state=inp["state"], x=inp["x"], dt=inp["dt"], A=inp["A"], B=inp["B"], C=inp["C"])
    kw = {}
    for k, v in over.items():
        (args if k in args else kw)[k] = v
    return args, kw


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(state_indices=[1, 1]), r"repeats slot 1 \(rows 0 and 1\)"),
        (dict(state_indices=[0, 4]), r"state_indices\[1\]=4 is outside \[0, 4\)"),
        (dict(state_indices=[-1, 0]), r"state_indices\[0\]=-1 .*PAD_SLOT_ID"),
        (dict(state_indices=[0, 1.0]), r"state_indices\[1\]=1.0 must be an int"),
        (dict(state_indices=[0, 1, 2]), r"state_indices.shape=\(3,\) must be \[Bt\] = \(2,\)"),
        (dict(state_indices=np.zeros((2,), np.float32)), "must be an integer dtype"),
        (dict(dt_limit=(1.0, 0.5)), "lo <= hi"),
        (dict(dt_limit=(0.0, float("nan"))), "no NaN"),
        (dict(dt_limit=0.5), "pair of numbers"),
        (dict(A=jnp.asarray([-1.0, jnp.inf])), r"A\[1\]=inf is not finite"),
        (dict(D=jnp.ones((3,))), r"D.shape=\(3,\) must be \[H\] or \[H, P\] = \(2,\)"),
        (dict(D=jnp.ones((2, 5))), r"D.shape=\(2, 5\) must be \[H\] or \[H, P\] = \(2, 4\)"),
        (dict(z=jnp.ones((2, 2, 5))), r"z.shape=\(2, 2, 5\)"),
        (dict(B=jnp.ones((2, 3, 16))), r"H=2 must be a multiple of G"),
        (dict(C=jnp.ones((2, 1, 8))), r"C.shape=\(2, 1, 8\)"),
        (dict(dt=jnp.ones((2, 3))), r"dt.shape=\(2, 3\) must be \[Bt, H\] = \(2, 2\)"),
        (dict(state=jnp.ones((1, 2, 4, 16))), r"Bt=2 rows but the cache has S=1 slots"),
        (dict(x=jnp.ones((0, 2, 4))), "rows Bt = 0"),
        (dict(state=jnp.ones((4, 2, 4, 16), jnp.int32)), "state.dtype=int32 must be a floating"),
        (dict(dt_softplus=1), "must be a bool"),
    ],
)
def test_bad_input_is_refused_before_tracing(over, match):
    args, kw = _bad(**over)
    state = args["state"]
    before = np.asarray(state).copy()
    with pytest.raises(ValueError, match=match):
        ssd_state_update(**args, **kw)
    assert not state.is_deleted()  # refused before the donating call
    np.testing.assert_array_equal(np.asarray(state), before)


def test_unsupported_cache_dtype():
    args, kw = _bad(state=jnp.ones((4, 2, 4, 16), jnp.float8_e4m3fn))
    with pytest.raises(NotImplementedError, match="state.dtype=float8_e4m3fn"):
        ssd_state_update(**args, **kw)


# ---------------------------------------------------------------------------------------------
# GPU lowering


def test_lowers_for_cuda_as_one_triton_kernel():
    S, Bt, H, P, G, N = 16, 8, 8, 64, 2, 128
    sds = jax.ShapeDtypeStruct
    args = (sds((S, H, P, N), F32), sds((Bt, H, P), BF16), sds((Bt, H), BF16), sds((H,), F32),
            sds((Bt, G, N), BF16), sds((Bt, G, N), BF16))  # fmt: skip
    kw = dict(D=sds((H,), F32), z=sds((Bt, H, P), BF16), dt_bias=sds((H,), F32),
              state_indices=sds((Bt,), jnp.int32))  # fmt: skip

    def f(*a, **k):
        return ssd_state_update(*a, **k, dt_softplus=True, interpret=False)

    text = jax.jit(f).trace(*args, **kw).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
    assert "ssd_state_update" in text
