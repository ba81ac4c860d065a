"""Mamba-2 SSD chunked scan: kernel vs two independent references, state hand-over between
calls, the workspace's contents, the arena form, validation and CUDA lowering.

Shapes stay small (H <= 4, P, N <= 16, T <= 200): the Pallas interpreter copies whole operands
on every grid step.
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.arena import random_arena
from _helpers.tolerances import tol
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target
from jaxarena.testing import assert_footprint
from jaxarena.workspaces import ssd_scratch_layout
from pallas_kernels.ssd_chunked_scan import (
    ssd_chunk_quantities,
    ssd_chunked_reference,
    ssd_chunked_scan,
    ssd_chunked_scan_into,
    ssd_sequential_reference,
)


def _inputs(T, H, P, G, N, S=1, *, seed=0, dtype=jnp.float32):
    """Random inputs in the ranges a Mamba-2 layer sees (A < 0, dt around softplus's knee).

    numpy draws them: jax.random would compile its ops again for every new shape.
    """
    rng = np.random.default_rng(seed)

    def normal(*shape, dt=np.float32):
        return jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dt)

    return dict(
        x=normal(T, H, P, dt=dtype),
        # dt > 0 and dt_bias >= 0: without softplus a negative dt' would grow the state.
        dt=jnp.asarray(rng.uniform(0.05, 1.0, (T, H)).astype(np.float32)),
        A=jnp.asarray(-np.exp(0.5 * rng.standard_normal(H)).astype(np.float32)),
        B=normal(T, G, N, dt=dtype),
        C=normal(T, G, N, dt=dtype),
        D=normal(H),
        dt_bias=jnp.asarray(rng.uniform(0.0, 0.3, H).astype(np.float32)),
        initial_states=normal(S, H, P, N),
    )


def _kwargs(inp, cu, *, d, bias, softplus, init):
    kw = dict(dt_softplus=softplus)
    if d:
        kw["D"] = inp["D"]
    if bias:
        kw["dt_bias"] = inp["dt_bias"]
    if init:
        kw["initial_states"] = inp["initial_states"]
    if cu is not None:
        kw["cu_seqlens"] = jnp.asarray(cu, jnp.int32)
    return kw


def _xs(inp):
    return inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"]


def _close(got, want, dtype, what):
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), **tol("ssd", dtype), err_msg=what
    )


# ---------------------------------------------------------------------------------------------
# Kernel vs references

# Boundaries inside a chunk (10, 100), on the chunk edge (64), a length-1 sequence (64:65),
# an empty sequence (10:10) and a trailing empty one (150:150).
PACKED = [0, 10, 10, 64, 65, 100, 150, 150]

# (T, H, P, G, N, cu_seqlens, chunk_size, D, dt_bias, softplus, initial_states)
CASES = [
    pytest.param(1, 2, 16, 1, 16, None, 64, False, False, False, False, id="T1-G1-plain"),
    pytest.param(64, 2, 16, 2, 16, None, 64, True, False, True, False, id="T64-GeqH-D-softplus"),
    pytest.param(65, 4, 16, 1, 16, None, 64, False, True, True, True, id="T65-G1-bias-init"),
    pytest.param(150, 4, 16, 2, 16, PACKED, 64, True, True, True, True, id="packed-all-options"),
    pytest.param(150, 4, 16, 4, 16, PACKED, 16, False, False, False, True, id="packed-chunk16"),
    # Several sequences starting inside one chunk, each with its own initial state.
    pytest.param(40, 2, 16, 1, 16, [0, 1, 2, 3, 40], 16, True, True, True, True, id="len1-seqs"),
    # A boundary exactly on a chunk edge two chunks in, non-power-of-two P and N (padded), H=3.
    pytest.param(200, 3, 8, 1, 5, [0, 128, 200], 64, True, True, False, True, id="edge128-P8-N5"),
    pytest.param(130, 4, 24, 4, 16, None, 64, True, False, True, False, id="T130-P24"),
    pytest.param(96, 2, 16, 2, 16, [0, 0, 50, 96], 32, False, True, True, True, id="leading-empty"),
]


@pytest.mark.parametrize("T, H, P, G, N, cu, chunk, d, bias, softplus, init", CASES)
def test_matches_both_references(T, H, P, G, N, cu, chunk, d, bias, softplus, init):
    S = 1 if cu is None else len(cu) - 1
    inp = _inputs(T, H, P, G, N, S, seed=T + S)
    kw = _kwargs(inp, cu, d=d, bias=bias, softplus=softplus, init=init)
    y, final = ssd_chunked_scan(*_xs(inp), chunk_size=chunk, **kw)
    assert y.shape == (T, H, P) and y.dtype == jnp.float32
    assert final.shape == (S, H, P, N) and final.dtype == jnp.float32
    y_seq, f_seq = ssd_sequential_reference(*_xs(inp), **kw)
    y_chk, f_chk = ssd_chunked_reference(*_xs(inp), chunk_size=chunk, **kw)
    _close(y, y_seq, jnp.float32, "y vs sequential")
    _close(final, f_seq, jnp.float32, "final_states vs sequential")
    _close(y, y_chk, jnp.float32, "y vs chunked")
    _close(final, f_chk, jnp.float32, "final_states vs chunked")
    if cu is not None:
        for s in range(S):
            if cu[s] == cu[s + 1]:  # an empty sequence keeps its initial state
                want = inp["initial_states"][s] if init else jnp.zeros((H, P, N))
                np.testing.assert_array_equal(np.asarray(final[s]), np.asarray(want))


@pytest.mark.parametrize("chunk", [16, 32, 64, 128, 256])
def test_every_power_of_two_chunk_size(chunk):
    """Issue 15: chunk sizes 16..256. Two chunks at least, a boundary inside the first chunk
    (7), one past the 128-token row blocks of a 256-token chunk (130), initial states."""
    T = chunk + 44
    cu = [0, 7, min(130, T - 1), T]
    inp = _inputs(T, 2, 16, 1, 16, 3, seed=chunk)
    kw = _kwargs(inp, cu, d=True, bias=True, softplus=True, init=True)
    y, final = ssd_chunked_scan(*_xs(inp), chunk_size=chunk, **kw)
    y_ref, f_ref = ssd_sequential_reference(*_xs(inp), **kw)
    _close(y, y_ref, jnp.float32, "y")
    _close(final, f_ref, jnp.float32, "final_states")


def test_bfloat16_inputs_and_output():
    T, H, P, G, N = 100, 4, 16, 2, 16
    cu = [0, 30, 100]
    inp = _inputs(T, H, P, G, N, 2, seed=7, dtype=jnp.bfloat16)
    kw = _kwargs(inp, cu, d=True, bias=True, softplus=True, init=True)
    y, final = ssd_chunked_scan(*_xs(inp), **kw)
    assert y.dtype == jnp.bfloat16 and final.dtype == jnp.float32
    y_ref, f_ref = ssd_sequential_reference(*_xs(inp), **kw)
    _close(y, y_ref, jnp.bfloat16, "y")
    # The final states stay f32 (both sides read the same bf16 inputs, then work in f32).
    _close(final, f_ref, jnp.float32, "final_states")


@given(
    cuts=st.lists(st.integers(0, 70), min_size=3, max_size=3),
    softplus=st.booleans(),
    seed=st.integers(0, 1000),
)
@settings(max_examples=10, deadline=None)
def test_random_sequence_boundaries(cuts, softplus, seed):
    """Any packing of 4 sequences (some empty) into 70 tokens matches the recurrence."""
    T, H, P, G, N = 70, 2, 16, 1, 16
    cu = [0, *sorted(cuts), T]
    inp = _inputs(T, H, P, G, N, 4, seed=seed)
    kw = _kwargs(inp, cu, d=True, bias=True, softplus=softplus, init=True)
    y, final = ssd_chunked_scan(*_xs(inp), chunk_size=16, **kw)
    y_ref, f_ref = ssd_sequential_reference(*_xs(inp), **kw)
    _close(y, y_ref, jnp.float32, f"y, cu_seqlens={cu}")
    _close(final, f_ref, jnp.float32, f"final_states, cu_seqlens={cu}")


def test_traced_cu_seqlens_under_jit():
    T, H, P, G, N = 80, 2, 16, 2, 16
    cu = jnp.array([0, 17, 64, 80], jnp.int32)
    inp = _inputs(T, H, P, G, N, 3, seed=3)
    kw = dict(dt_bias=inp["dt_bias"], dt_softplus=True, initial_states=inp["initial_states"])

    @jax.jit
    def run(cu_seqlens):
        return ssd_chunked_scan(*_xs(inp), cu_seqlens=cu_seqlens, **kw)

    y, final = run(cu)
    y_ref, f_ref = ssd_sequential_reference(*_xs(inp), cu_seqlens=cu, **kw)
    _close(y, y_ref, jnp.float32, "y")
    _close(final, f_ref, jnp.float32, "final_states")


def _take(inp, rows):
    """x, dt, A, B, C of the tokens `rows` (numpy gathers: nothing to compile)."""
    x, dt, A, B, C = (np.asarray(v) for v in _xs(inp))
    return x[rows], dt[rows], A, B[rows], C[rows]


def test_two_calls_equal_one():
    """Prefill in two calls, the first's final states as the second's initial states."""
    T, H, P, G, N, split = 150, 2, 16, 1, 16, 37
    inp = _inputs(T, H, P, G, N, seed=11)
    kw = dict(D=inp["D"], dt_bias=inp["dt_bias"], dt_softplus=True)
    y_all, f_all = ssd_chunked_scan(*_xs(inp), initial_states=inp["initial_states"], **kw)
    first, second = np.arange(split), np.arange(split, T)
    y1, f1 = ssd_chunked_scan(*_take(inp, first), initial_states=inp["initial_states"], **kw)
    y2, f2 = ssd_chunked_scan(*_take(inp, second), initial_states=f1, **kw)
    _close(np.concatenate([y1, y2]), y_all, jnp.float32, "y")
    _close(f2, f_all, jnp.float32, "final_states")


def test_two_calls_equal_one_packed():
    """Three sequences, each prefilled part in a first packed call and the rest in a second."""
    H, P, G, N = 2, 16, 2, 16
    lens1, lens2 = [20, 50, 1], [45, 3, 30]
    T = sum(lens1) + sum(lens2)
    inp = _inputs(T, H, P, G, N, 3, seed=5)
    starts = np.cumsum([0] + [a + b for a, b in zip(lens1, lens2, strict=True)])
    first = np.concatenate([np.arange(s, s + a) for s, a in zip(starts, lens1, strict=False)])
    second = np.concatenate(
        [np.arange(s + a, s + a + b) for s, a, b in zip(starts, lens1, lens2, strict=False)]
    )

    def cu(lens):  # a plain list of ints is accepted as cu_seqlens
        return [int(v) for v in np.cumsum([0] + lens)]

    kw = dict(dt_bias=inp["dt_bias"], dt_softplus=True, D=inp["D"])
    init = inp["initial_states"]
    y_all, f_all = ssd_chunked_scan(
        *_xs(inp), cu_seqlens=jnp.asarray(starts, jnp.int32), initial_states=init, **kw
    )
    y1, f1 = ssd_chunked_scan(*_take(inp, first), cu_seqlens=cu(lens1), initial_states=init, **kw)
    y2, f2 = ssd_chunked_scan(*_take(inp, second), cu_seqlens=cu(lens2), initial_states=f1, **kw)
    y_all = np.asarray(y_all)
    _close(y1, y_all[first], jnp.float32, "y of the first parts")
    _close(y2, y_all[second], jnp.float32, "y of the second parts")
    _close(f2, f_all, jnp.float32, "final_states")


# ---------------------------------------------------------------------------------------------
# Workspace


def _sections(ws, H, G, m):
    """The three sections of a flat f32 scratch sized by the seed for `m` tokens."""
    layout = ssd_scratch_layout(H, G, m)
    nc = -(-m // 64) + 1
    dt_off, dt_n = (v // 4 for v in layout["dt"])
    da_off, _ = (v // 4 for v in layout["dA_cumsum"])
    cb_off, cb_n = (v // 4 for v in layout["CB"])
    ws = np.asarray(ws)
    return (
        ws[dt_off : dt_off + dt_n].reshape(H, nc, 64),
        ws[da_off : da_off + dt_n].reshape(H, nc, 64),
        ws[cb_off : cb_off + cb_n].reshape(nc, G, 64, 64),
    )


@pytest.mark.parametrize("T, M", [(64, 200), (1, 1)])
def test_workspace_holds_the_chunk_quantities(T, M):
    H, P, G, N = 4, 16, 2, 16
    cu = [0, 30, T] if T > 30 else None
    S = 1 if cu is None else 2
    inp = _inputs(T, H, P, G, N, S, seed=T)
    kw = _kwargs(inp, cu, d=True, bias=True, softplus=True, init=True)
    n_floats = sum(n for _, n in ssd_scratch_layout(H, G, M).values()) // 4
    sentinel = 7.0
    ws = jnp.full((n_floats,), sentinel, jnp.float32)
    y, final, ws_out = ssd_chunked_scan(*_xs(inp), workspace=ws, **kw)
    assert ws_out.shape == ws.shape and ws_out.dtype == jnp.float32
    y_ref, f_ref = ssd_sequential_reference(*_xs(inp), **kw)
    _close(y, y_ref, jnp.float32, "y")
    _close(final, f_ref, jnp.float32, "final_states")

    nc = -(-T // 64)
    dt_ws, da_ws, cb_ws = _sections(ws_out, H, G, M)
    # dA_cumsum restarts at each sequence's first token (issue 17: no NaN across sequences).
    dt_ref, da_ref, cb_ref = ssd_chunk_quantities(
        inp["dt"], inp["A"], inp["B"], inp["C"], dt_bias=inp["dt_bias"], dt_softplus=True,
        cu_seqlens=cu,
    )  # fmt: skip
    _close(dt_ws[:, :nc], dt_ref, jnp.float32, "dt section")
    _close(da_ws[:, :nc], da_ref, jnp.float32, "dA_cumsum section")
    _close(cb_ws[:nc], cb_ref, jnp.float32, "CB section")
    # Chunk slots past ceil(T/64), the seed's spare slot included, are left untouched.
    assert np.all(dt_ws[:, nc:] == sentinel) and np.all(da_ws[:, nc:] == sentinel)
    assert np.all(cb_ws[nc:] == sentinel)


def test_workspace_update_is_aliased_when_donated():
    H, P, G, N, T = 2, 16, 1, 16, 64
    inp = _inputs(T, H, P, G, N, seed=1)
    n_floats = sum(n for _, n in ssd_scratch_layout(H, G, T).values()) // 4
    ws = jax.ShapeDtypeStruct((n_floats,), jnp.float32)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(workspace, x):
        return ssd_chunked_scan(x, *_xs(inp)[1:], workspace=workspace)[2]

    assert "input_output_alias" in step.lower(ws, inp["x"]).compile().as_text()


def test_workspace_refuses_more_tokens_than_it_was_sized_for():
    H, P, G, N = 2, 16, 1, 16
    M = 128  # nc = ceil(128/64) + 1 = 3 slots: at most 128 tokens
    n_floats = sum(n for _, n in ssd_scratch_layout(H, G, M).values()) // 4
    ws = jnp.zeros((n_floats,), jnp.float32)
    inp = _inputs(M + 1, H, P, G, N)
    with pytest.raises(ValueError, match=r"T=129 tokens need 3 chunks.*at most 128 tokens"):
        ssd_chunked_scan(*_xs(inp), workspace=ws)
    with pytest.raises(ValueError, match="workspace length"):
        ssd_chunked_scan(*_xs(_inputs(8, H, P, G, N)), workspace=ws[:-1])
    with pytest.raises(ValueError, match="chunk_size=32 must be 64 with a workspace"):
        ssd_chunked_scan(*_xs(_inputs(8, H, P, G, N)), workspace=ws, chunk_size=32)
    with pytest.raises(ValueError, match="flat float32"):
        ssd_chunked_scan(*_xs(_inputs(8, H, P, G, N)), workspace=ws.astype(jnp.bfloat16))


# ---------------------------------------------------------------------------------------------
# Arena form

M_MAX = 100  # the plan's max_batch_tokens
AH, AP, AG, AN = 4, 16, 2, 16  # the tiny Mamba-2 layer's heads, head dim, groups, state


@functools.cache
def _mamba_plan(guard_bytes: int = 64) -> ArenaPlan:
    """The whole seed layout of a one-layer Mamba-2 model, sized by `BufferSizes`."""
    config = ModelConfig(
        hidden_size=64,
        num_hidden_layers=1,
        layer_types=("mamba",),
        mamba_num_heads=AH,
        mamba_head_dim=AP,
        ssm_state_size=AN,
        n_groups=AG,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        vocab_size=16,
    )
    sizes = BufferSizes.from_config(
        config, M_MAX, 64, 0, 1, levers=Levers(), target=Target.preset("hopper")
    )
    return ArenaPlan.sequential(sizes, guard_bytes=guard_bytes)


@pytest.mark.parametrize("T", [M_MAX, 33])
def test_arena_form_writes_only_ssd_scratch(T):
    plan = _mamba_plan()
    before = random_arena(plan, seed=T)
    inp = _inputs(T, AH, AP, AG, AN, 2, seed=T)
    kw = _kwargs(inp, [0, 20, T], d=True, bias=True, softplus=True, init=True)
    step = jax.jit(functools.partial(ssd_chunked_scan_into, plan=plan, **kw), donate_argnums=0)
    arena, y, final = step(
        jnp.asarray(before), x=inp["x"], dt=inp["dt"], A=inp["A"], B=inp["B"], C=inp["C"]
    )
    y_ref, f_ref = ssd_sequential_reference(*_xs(inp), **kw)
    _close(y, y_ref, jnp.float32, "y")
    _close(final, f_ref, jnp.float32, "final_states")

    region = plan.regions["ssd_scratch"]
    ws = plan.view(arena, "ssd_scratch", (region.nbytes // 4,), jnp.float32)
    _, da_ws, cb_ws = _sections(ws, AH, AG, M_MAX)
    _, da_ref, cb_ref = ssd_chunk_quantities(
        inp["dt"], inp["A"], inp["B"], inp["C"], dt_bias=inp["dt_bias"], dt_softplus=True,
        cu_seqlens=[0, 20, T],
    )  # fmt: skip
    nc = -(-T // 64)
    _close(da_ws[:, :nc], da_ref, jnp.float32, "dA_cumsum in the arena")
    _close(cb_ws[:nc], cb_ref, jnp.float32, "CB in the arena")

    after = np.asarray(arena).reshape(-1)
    flat = before.reshape(-1)
    lo, hi = region.offset_bytes, region.end_bytes
    np.testing.assert_array_equal(after[:lo], flat[:lo], err_msg="bytes before ssd_scratch")
    np.testing.assert_array_equal(after[hi:], flat[hi:], err_msg="bytes after ssd_scratch")
    assert plan.check_guards(arena) == []


def test_arena_form_aliases_the_donated_arena():
    plan = _mamba_plan()
    inp = _inputs(M_MAX, AH, AP, AG, AN)
    arena = jax.ShapeDtypeStruct(plan.arena_shape, jnp.uint8)
    step = jax.jit(functools.partial(ssd_chunked_scan_into, plan=plan), donate_argnums=0)
    args = dict(x=inp["x"], dt=inp["dt"], A=inp["A"], B=inp["B"], C=inp["C"])
    assert "input_output_alias" in step.lower(arena, **args).compile().as_text()
    assert_footprint(step, arena, fn_kwargs=args, min_alias_bytes=plan.total_bytes)


@pytest.mark.parametrize(
    "T, cu, init", [(M_MAX, [0, 20, M_MAX], True), (33, None, False)], ids=["packed", "one"]
)
def test_arena_form_equals_the_workspace_form_bit_for_bit(T, cu, init):
    """The in-place form (kernels addressing the scratch inside the whole arena) against the
    standalone form run on a view of the same region: same y, final states and scratch bytes."""
    plan = _mamba_plan()
    region = plan.regions["ssd_scratch"]
    assert region.offset_bytes > 0  # the scratch sits between other regions
    before = random_arena(plan, seed=T)
    S = 1 if cu is None else len(cu) - 1
    inp = _inputs(T, AH, AP, AG, AN, S, seed=T)
    kw = _kwargs(inp, cu, d=True, bias=True, softplus=True, init=init)
    step = jax.jit(functools.partial(ssd_chunked_scan_into, plan=plan, **kw), donate_argnums=0)
    arena, y, final = step(
        jnp.asarray(before), x=inp["x"], dt=inp["dt"], A=inp["A"], B=inp["B"], C=inp["C"]
    )
    per_chunk = 2 * AH * 64 + AG * 64 * 64
    n = region.nbytes // (4 * per_chunk) * per_chunk
    ws = plan.view(jnp.asarray(before), "ssd_scratch", (n,), jnp.float32)
    y_ws, f_ws, ws_after = ssd_chunked_scan(*_xs(inp), **kw, workspace=ws)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_ws), err_msg="y")
    np.testing.assert_array_equal(np.asarray(final), np.asarray(f_ws), err_msg="final_states")
    got = plan.view(arena, "ssd_scratch", (n,), jnp.float32)
    np.testing.assert_array_equal(
        np.asarray(got).view(np.uint32), np.asarray(ws_after).view(np.uint32), err_msg="scratch"
    )


def test_arena_form_refuses_a_foreign_arena_and_an_unaligned_region():
    plan = _mamba_plan()
    arena = plan.allocate()
    x = _xs(_inputs(8, AH, AP, AG, AN))
    rows = plan.arena_shape[0]
    with pytest.raises(ValueError, match=rf"arena must be the plan's uint8\[{rows}, 256\]"):
        ssd_chunked_scan_into(arena[:-1], plan, *x)
    with pytest.raises(ValueError, match="arena must be the plan's uint8"):
        ssd_chunked_scan_into(jax.lax.bitcast_convert_type(arena, jnp.int8), plan, *x)
    scratch = sum(n for _, n in ssd_scratch_layout(AH, AG, 64).values())
    odd = ArenaPlan.sequential({"a": 64, "ssd_scratch": scratch}, align_bytes=64)
    assert odd.regions["ssd_scratch"].offset_bytes % 256
    with pytest.raises(ValueError, match="not on a 256-byte arena row"):
        ssd_chunked_scan_into(odd.allocate(), odd, *x)
    tiny = ArenaPlan.sequential({"ssd_scratch": 256})
    with pytest.raises(ValueError, match="region 'ssd_scratch' holds 256 bytes"):
        ssd_chunked_scan_into(tiny.allocate(), tiny, *x)


def test_arena_form_rejects_what_does_not_fit():
    plan = _mamba_plan()
    arena = plan.allocate()
    inp = _inputs(M_MAX + 64, AH, AP, AG, AN)
    with pytest.raises(ValueError, match="at most 128 tokens"):
        ssd_chunked_scan_into(arena, plan, *_xs(inp))
    no_ssd = ArenaPlan.sequential({"other": 4096})
    with pytest.raises(ValueError, match="no 'ssd_scratch' region"):
        ssd_chunked_scan_into(no_ssd.allocate(), no_ssd, *_xs(_inputs(8, AH, AP, AG, AN)))


# ---------------------------------------------------------------------------------------------
# Validation


def _bad(**over):
    inp = _inputs(10, 4, 16, 2, 16, 2)
    args = dict(
        x=inp["x"],
        dt=inp["dt"],
        A=inp["A"],
        B=inp["B"],
        C=inp["C"],
        cu_seqlens=jnp.array([0, 4, 10], jnp.int32),
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(x=jnp.zeros((10, 4))), r"x.shape=\(10, 4\) must be \[T, H, P\]"),
        (dict(x=jnp.zeros((10, 4, 16), jnp.int32)), "x.dtype=int32 must be a floating"),
        (dict(dt=jnp.zeros((9, 4))), r"dt.shape=\(9, 4\) must be \[T, H\]"),
        (dict(A=jnp.zeros((3,))), r"A.shape=\(3,\) must be \[H\]"),
        (dict(B=jnp.zeros((10, 3, 16)), C=jnp.zeros((10, 3, 16))), "H=4.*multiple of G=3"),
        (dict(C=jnp.zeros((10, 2, 8))), "C.shape=.* must equal B.shape"),
        (dict(B=jnp.zeros((10, 2, 16), jnp.int8)), "B.dtype=int8 must be a floating"),
        (dict(D=jnp.zeros((5,))), r"D.shape=\(5,\) must be \[H\]"),
        (dict(dt_bias=jnp.zeros((4,), jnp.int32)), "dt_bias.dtype=int32"),
        (dict(chunk_size=48), "chunk_size=48 must be one of"),
        (dict(chunk_size=512), r"chunk_size=512 must be one of \(16, 32, 64, 128, 256\)"),
        (dict(dt_softplus=1), "dt_softplus=1 must be a bool"),
        (dict(cu_seqlens=jnp.array([0, 6, 4, 10])), "must be non-decreasing from 0 to T=10"),
        (dict(cu_seqlens=jnp.array([0, 4, 9])), "must be non-decreasing from 0 to T=10"),
        (dict(cu_seqlens=jnp.array([1, 4, 10])), "must be non-decreasing from 0 to T=10"),
        (dict(cu_seqlens=jnp.array([0.0, 10.0])), "cu_seqlens.dtype=float32"),
        (dict(cu_seqlens=jnp.array([10])), r"cu_seqlens.shape=\(1,\) must be \[S \+ 1\]"),
        (dict(initial_states=jnp.zeros((1, 4, 16, 16))), r"initial_states.shape=\(1, 4, 16, 16\)"),
        (
            dict(
                x=jnp.zeros((0, 4, 16)),
                dt=jnp.zeros((0, 4)),
                B=jnp.zeros((0, 2, 16)),
                C=jnp.zeros((0, 2, 16)),
                cu_seqlens=None,
            ),
            "T, H and P must all be >= 1",
        ),
    ],
)
def test_rejects_bad_input_before_tracing(over, match):
    args = _bad(**over)
    x, dt, A, B, C = (args.pop(k) for k in ("x", "dt", "A", "B", "C"))
    with pytest.raises(ValueError, match=match):
        ssd_chunked_scan(x, dt, A, B, C, **args)


def test_float64_is_valid_but_unsupported():
    x = jax.ShapeDtypeStruct((10, 4, 16), jnp.float64)
    inp = _inputs(10, 4, 16, 2, 16)
    with pytest.raises(NotImplementedError, match="x.dtype=float64"):
        ssd_chunked_scan(x, inp["dt"], inp["A"], inp["B"], inp["C"])


# ---------------------------------------------------------------------------------------------
# GPU lowering and API


def test_lowers_for_cuda_as_triton_kernels():
    T, H, P, G, N, S = 150, 4, 64, 2, 128, 3
    f32, bf16 = jnp.float32, jnp.bfloat16
    shapes = dict(
        x=((T, H, P), bf16),
        dt=((T, H), f32),
        A=((H,), f32),
        B=((T, G, N), bf16),
        C=((T, G, N), bf16),
        D=((H,), f32),
        dt_bias=((H,), f32),
        initial_states=((S, H, P, N), f32),
        cu_seqlens=((S + 1,), jnp.int32),
        workspace=((sum(n for _, n in ssd_scratch_layout(H, G, T).values()) // 4,), f32),
    )
    args = {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in shapes.items()}

    def f(x, dt, A, B, C, **kw):
        return ssd_chunked_scan(x, dt, A, B, C, dt_softplus=True, interpret=False, **kw)

    lowered = jax.jit(f).trace(**args).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    # Both phases compile as Triton kernels (phase 1 with the aliased scratch; phase 2 walks
    # the chunks inside the kernel): no per-chunk XLA loop is left.
    assert text.count("__gpu$xla.gpu.triton") == 2
    for name in ("ssd_cumsum_cb", "ssd_scan"):
        assert name in text, name
    assert "stablehlo.while" not in text


def test_public_names_have_docstrings():
    # `import pallas_kernels.ssd_chunked_scan as m` would give the re-exported function.
    ssd_pkg = importlib.import_module("pallas_kernels.ssd_chunked_scan")
    assert "ssd_chunked_scan" in ssd_pkg.__all__ and "ssd_chunked_scan_into" in ssd_pkg.__all__
    for name in ssd_pkg.__all__:
        obj = getattr(ssd_pkg, name)
        if callable(obj):
            assert obj.__doc__ and obj.__doc__.strip(), name
