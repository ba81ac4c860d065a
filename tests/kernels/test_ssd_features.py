"""Issue 15's SSD scan options: `z` gating, `dt_limit`, `D` of shape `[H, P]` and the final
states' `state_dtype`, in the standalone and the arena form, against the extended references
(`ssd_sequential_reference` / `ssd_chunked_reference`, mamba_ssm's semantics) at the suite's
f32 and bf16 tolerances (`tol("ssd", dtype)`; the derivations are in the tolerance table and in
test_ssd_chunked_scan.py: gating multiplies each output by `silu(z)` in f32 after the same sums,
adding one f32 rounding; a bf16 final state is one rounding of the f32 one).

Shapes stay small: the Pallas interpreter copies whole operands on every grid step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.arena import random_arena
from _helpers.lowering import cuda_lowering_text
from _helpers.tolerances import tol

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target
from pallas_kernels.ssd_chunked_scan import (
    ssd_chunked_reference,
    ssd_chunked_scan,
    ssd_chunked_scan_into,
    ssd_sequential_reference,
)

F32, BF16 = jnp.float32, jnp.bfloat16


def _inputs(T, H, P, G, N, S, *, seed=0, dtype=F32):
    rng = np.random.default_rng(seed)

    def normal(*shape, dt=F32):
        return jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dt)

    return dict(
        x=normal(T, H, P, dt=dtype),
        dt=jnp.asarray(rng.uniform(-1.5, 1.5, (T, H)).astype(np.float32)),
        A=jnp.asarray(-np.exp(0.5 * rng.standard_normal(H)).astype(np.float32)),
        B=normal(T, G, N, dt=dtype),
        C=normal(T, G, N, dt=dtype),
        z=normal(T, H, P, dt=dtype),
        D=normal(H),
        D2=normal(H, P),
        dt_bias=jnp.asarray(rng.uniform(0.0, 0.3, H).astype(np.float32)),
        initial_states=normal(S, H, P, N),
    )


def _xs(inp):
    return inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"]


def _close(got, want, dtype, what):
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), **tol("ssd", dtype), err_msg=what
    )


# With 32-token chunks: a boundary inside a chunk (20), one on a chunk edge (32), an empty
# sequence (32:32), a last sequence over two chunk edges.
CU = [0, 20, 32, 32, 80]


@pytest.mark.parametrize(
    "dtype, d, gate, limit",
    [
        (F32, "HP", True, (0.3, 1.2)),
        (F32, "H", True, (0.0, float("inf"))),
        (BF16, "HP", True, (0.3, 1.2)),
    ],
)
def test_options_match_both_references(dtype, d, gate, limit):
    T, H, P, G, N, chunk = 80, 2, 16, 1, 16, 32
    S = len(CU) - 1
    inp = _inputs(T, H, P, G, N, S, seed=11, dtype=dtype)
    kw = dict(
        D=inp["D2"] if d == "HP" else inp["D"],
        dt_bias=inp["dt_bias"],
        dt_softplus=True,
        initial_states=inp["initial_states"],
        cu_seqlens=jnp.asarray(CU, jnp.int32),
        dt_limit=limit,
    )
    if gate:
        kw["z"] = inp["z"]
    y, final = ssd_chunked_scan(*_xs(inp), chunk_size=chunk, **kw)
    assert y.dtype == dtype and final.dtype == F32
    y_seq, f_seq = ssd_sequential_reference(*_xs(inp), **kw)
    y_chk, f_chk = ssd_chunked_reference(*_xs(inp), chunk_size=chunk, **kw)
    _close(y, y_seq, dtype, "y vs sequential")
    _close(y, y_chk, dtype, "y vs chunked")
    _close(final, f_seq, F32, "final vs sequential")
    _close(final, f_chk, F32, "final vs chunked")
    # Each option changed the result (a kernel ignoring it would fail the comparison above,
    # but only if the reference differs from the option-free one): check that it does.
    plain = dict(kw, z=None, dt_limit=(0.0, float("inf")), D=inp["D"])
    y_plain, f_plain = ssd_sequential_reference(*_xs(inp), **plain)
    assert not np.allclose(np.asarray(y_seq), np.asarray(y_plain), atol=0.1)
    if limit != (0.0, float("inf")):
        assert not np.allclose(np.asarray(f_seq), np.asarray(f_plain), atol=0.1)


def test_default_limit_clamps_negative_dt_to_zero():
    """mamba_ssm's fused path clamps dt' to (0, inf) even without softplus: with dt' = 0 the
    state never moves (decay 1, input 0), so every final state is its initial state exactly and
    y = C h0 + D x."""
    T, H, P, G, N = 40, 2, 16, 1, 16
    cu = [0, 17, 40]
    inp = _inputs(T, H, P, G, N, 2, seed=5)
    dt = -jnp.abs(inp["dt"]) - 0.05
    kw = dict(D=inp["D"], initial_states=inp["initial_states"], cu_seqlens=cu)
    y, final = ssd_chunked_scan(inp["x"], dt, inp["A"], inp["B"], inp["C"], chunk_size=16, **kw)
    np.testing.assert_array_equal(np.asarray(final), np.asarray(inp["initial_states"]))
    y_ref, _ = ssd_sequential_reference(inp["x"], dt, inp["A"], inp["B"], inp["C"], **kw)
    _close(y, y_ref, F32, "y")


@pytest.mark.parametrize("state_dtype", [BF16])
def test_state_dtype_rounds_the_f32_final_states(state_dtype):
    """The final states come out in `state_dtype`: the f32 states rounded once (bit for bit
    the f32 call's result cast), the empty sequence's initial state included. (The shapes and
    options of the first case above: its f32 compile is reused.)"""
    T, H, P, G, N = 80, 2, 16, 1, 16
    S = len(CU) - 1
    inp = _inputs(T, H, P, G, N, S, seed=7)
    kw = dict(D=inp["D2"], dt_bias=inp["dt_bias"], dt_softplus=True, z=inp["z"],
              initial_states=inp["initial_states"], cu_seqlens=jnp.asarray(CU, jnp.int32),
              dt_limit=(0.3, 1.2))  # fmt: skip
    y32, f32 = ssd_chunked_scan(*_xs(inp), chunk_size=32, **kw)
    y, f = ssd_chunked_scan(*_xs(inp), chunk_size=32, state_dtype=state_dtype, **kw)
    assert f.dtype == state_dtype and f.shape == (S, H, P, N)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y32))
    np.testing.assert_array_equal(
        np.asarray(f.astype(F32)), np.asarray(f32.astype(state_dtype).astype(F32))
    )
    _, f_ref = ssd_sequential_reference(*_xs(inp), **kw)
    _close(f, f_ref, BF16, "final vs sequential")


# ---------------------------------------------------------------------------------------------
# Arena form

AH, AP, AG, AN, M_MAX = 4, 16, 2, 16, 100


@functools.cache
def _mamba_plan() -> ArenaPlan:
    config = ModelConfig(
        hidden_size=64, num_hidden_layers=1, layer_types=("mamba",), mamba_num_heads=AH,
        mamba_head_dim=AP, ssm_state_size=AN, n_groups=AG, num_attention_heads=1,
        num_key_value_heads=1, head_dim=16, intermediate_size=64, vocab_size=16,
    )  # fmt: skip
    sizes = BufferSizes.from_config(
        config, M_MAX, 64, 0, 1, levers=Levers(), target=Target.preset("hopper")
    )
    return ArenaPlan.sequential(sizes, guard_bytes=64)


def test_arena_form_takes_every_option():
    """`ssd_chunked_scan_into` with z, D [H, P], dt_limit and a bf16 state_dtype: matches the
    reference, equals the workspace form bit for bit, and writes only `ssd_scratch`."""
    plan = _mamba_plan()
    region = plan.regions["ssd_scratch"]
    before = random_arena(plan, seed=3)
    T = 40
    cu = [0, 20, T]
    inp = _inputs(T, AH, AP, AG, AN, 2, seed=3)
    kw = dict(D=inp["D2"], z=inp["z"], dt_bias=inp["dt_bias"], dt_softplus=True,
              dt_limit=(0.2, 1.0), initial_states=inp["initial_states"],
              cu_seqlens=jnp.asarray(cu, jnp.int32))  # fmt: skip
    step = jax.jit(
        functools.partial(ssd_chunked_scan_into, plan=plan, state_dtype=BF16, **kw),
        donate_argnums=0,
    )
    arena, y, final = step(
        jnp.asarray(before), x=inp["x"], dt=inp["dt"], A=inp["A"], B=inp["B"], C=inp["C"]
    )
    assert final.dtype == BF16
    y_ref, f_ref = ssd_sequential_reference(*_xs(inp), **kw)
    _close(y, y_ref, F32, "y")
    _close(final, f_ref, BF16, "final_states")

    per_chunk = 2 * AH * 64 + AG * 64 * 64
    n = region.nbytes // (4 * per_chunk) * per_chunk
    ws = plan.view(jnp.asarray(before), "ssd_scratch", (n,), F32)
    y_ws, f_ws, _ = ssd_chunked_scan(*_xs(inp), **kw, state_dtype=BF16, workspace=ws)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_ws))
    np.testing.assert_array_equal(np.asarray(final.astype(F32)), np.asarray(f_ws.astype(F32)))
    after, flat = np.asarray(arena).reshape(-1), before.reshape(-1)
    lo, hi = region.offset_bytes, region.end_bytes
    np.testing.assert_array_equal(after[:lo], flat[:lo])
    np.testing.assert_array_equal(after[hi:], flat[hi:])


# ---------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(z=jnp.ones((8, 2, 15))), r"z.shape=\(8, 2, 15\)"),
        (dict(z=jnp.ones((8, 2, 16), jnp.int32)), r"z.dtype=int32"),
        (dict(D=jnp.ones((2, 15))), r"D.shape=\(2, 15\)"),
        (dict(D=jnp.ones((3,))), r"D.shape=\(3,\)"),
        (dict(dt_limit=(1.0, 0.5)), "lo <= hi"),
        (dict(dt_limit=(float("nan"), 1.0)), "NaN"),
        (dict(dt_limit="big"), "pair of numbers"),
        (dict(state_dtype=jnp.int32), "state_dtype"),
    ],
)
def test_bad_options_are_refused_before_tracing(over, match):
    inp = _inputs(8, 2, 16, 1, 16, 1, seed=1)
    with pytest.raises(ValueError, match=match):
        ssd_chunked_scan(*_xs(inp), **over)
    plan = _mamba_plan()
    inp = _inputs(8, AH, AP, AG, AN, 1, seed=1)
    if "z" in over or "D" in over:
        return  # shapes above are for H=2, P=16; the arena form shares the same checks
    with pytest.raises(ValueError, match=match):
        ssd_chunked_scan_into(plan.allocate(), plan, *_xs(inp), **over)


def test_every_option_lowers_for_cuda():
    """With z, D [H, P], dt_limit and bf16 final states the scan still lowers for CUDA as
    Triton kernels only (the options are operands and constants, no extra XLA loop)."""
    T, H, P, G, N, S = 150, 4, 64, 2, 128, 3
    sds = jax.ShapeDtypeStruct
    args = dict(
        x=sds((T, H, P), BF16), dt=sds((T, H), F32), A=sds((H,), F32),
        B=sds((T, G, N), BF16), C=sds((T, G, N), BF16), D=sds((H, P), F32),
        z=sds((T, H, P), BF16), dt_bias=sds((H,), F32), initial_states=sds((S, H, P, N), F32),
        cu_seqlens=sds((S + 1,), jnp.int32),
    )  # fmt: skip

    def f(x, dt, A, B, C, **kw):
        return ssd_chunked_scan(x, dt, A, B, C, dt_softplus=True, dt_limit=(0.001, 0.1),
                                state_dtype=BF16, interpret=False, **kw)  # fmt: skip

    text = cuda_lowering_text(f, **args)
    assert "__gpu$xla.gpu.triton" in text
    assert "stablehlo.while" not in text
