"""The Gated DeltaNet chunked prefill against the sequential recurrence (float64 / float32),
against transformers' `torch_chunk_gated_delta_rule` (a committed fixture), and its arena form.

Tolerance: FLA's own acceptance rule for its chunk kernel (tests/ops/test_gdn.py,
`assert_close`): max |diff| <= 1e-6, else RMS(diff) / RMS(ref) < 0.005. Why the kernel lands
inside it: the region stores w, u, the chunk states and v_new in bf16 (relative rounding
error RMS 2^-9 / sqrt(3) ~ 1.1e-3 each); an output sums two such terms (q S and the
intra-chunk part over v_new), each of which went through one or two earlier roundings, so the
expected RMS ratio is a few 1e-3, and a bf16 `o` adds its own rounding (unit roundoff 2^-8:
RMS ~1.5e-3). Measured: o 1.8e-3 .. 3.1e-3, final states 1.7e-3 .. 1.9e-3, under 0.005. The
products take f32 operands as hi + lo bf16 parts (kernel.py), which adds ~2^-16, negligible.

Shapes are small for interpret mode on CPU: head dim 32 (128 once, and in the arena form);
FLA's varlen case cu_seqlens = [0, 15, 100, 300, 1200, 2000] in full.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.arena import random_arena

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target
from jaxarena.workspaces import gdn_fla_scratch_layout, gdn_fla_sections
from pallas_kernels.gdn_chunked import (
    GDN_REGION,
    gdn_chunked,
    gdn_chunked_into,
    gdn_sequential_reference,
)
from pallas_kernels.gdn_state_update import gdn_state_update

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gdn_transformers.npz"
CHUNK_RATIO = 0.005  # FLA's rule for the chunk kernel (module docstring)


def fla_error(got, ref) -> float:
    """0 when FLA's max-abs test passes (<= 1e-6), else RMS(diff) / RMS(ref)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    d = got - ref
    if np.abs(d).max() <= 1e-6:
        return 0.0
    return float(np.sqrt(np.mean(d * d)) / np.sqrt(np.mean(ref * ref)))


def inputs(cu, H, HV, K, V, *, seed=0, dtype=jnp.bfloat16, init=True, unit_keys=False):
    """Random inputs: decays exp(g) in (0.9, 1), beta in (0, 1); with `unit_keys` (no L2 norm
    in the kernel) k has norm ~1 so that the delta rule is a contraction (beta |k|^2 < 2)."""
    rng = np.random.default_rng(seed)
    T, S = cu[-1], len(cu) - 1
    k = rng.standard_normal((T, H, K)) / (np.sqrt(K) if unit_keys else 1.0)
    args = dict(
        q=jnp.asarray(rng.standard_normal((T, H, K)), dtype),
        k=jnp.asarray(k, dtype),
        v=jnp.asarray(rng.standard_normal((T, HV, V)), dtype),
        g=jnp.asarray(np.log(rng.uniform(0.9, 1.0, (T, HV))), jnp.float32),
        beta=jnp.asarray(rng.uniform(0.0, 1.0, (T, HV)), jnp.float32),
    )
    h0 = jnp.asarray(0.5 * rng.standard_normal((S, HV, K, V)), jnp.float32) if init else None
    return args, h0


def test_varlen_gva_l2norm_initial_states_match_the_recurrence():
    """FLA's varlen case (sequences of 15, 85, 200, 900, 800 tokens: a chunk of one sequence
    never holds another's tokens and the last chunk of each is padded), two value heads per
    key head, q/k L2 norm, initial states; against float64 and float32 runs."""
    cu = [0, 15, 100, 300, 1200, 2000]
    args, h0 = inputs(cu, 1, 2, 32, 32)
    o, final = gdn_chunked(**args, cu_seqlens=cu, initial_states=h0, use_qk_l2norm=True)
    assert o.shape == (2000, 2, 32) and o.dtype == jnp.bfloat16
    assert final.shape == (5, 2, 32, 32) and final.dtype == jnp.float32
    for dtype in (np.float64, np.float32):
        ro, rf = gdn_sequential_reference(
            **args, cu_seqlens=cu, initial_states=h0, use_qk_l2norm=True, dtype=dtype
        )
        # The kernel's o is bf16: its own rounding (RMS ~1.1e-3) is inside the 0.005.
        assert fla_error(o, ro) < CHUNK_RATIO
        assert fla_error(final, rf) < CHUNK_RATIO
    # Every sequence is checked on its own (a mixed-up boundary would hit one sequence only).
    for s in range(5):
        rows = slice(cu[s], cu[s + 1])
        assert fla_error(o[rows], ro[rows]) < CHUNK_RATIO, s
        assert fla_error(final[s], rf[s]) < CHUNK_RATIO, s


def test_head_dim_128_float32_scale_and_empty_sequence():
    """128x128 heads, float32 inputs, no L2 norm (unit-norm keys), a given scale, no initial
    states and an empty sequence in the middle (its final state is zeros)."""
    cu = [0, 70, 70, 100]
    args, _ = inputs(cu, 1, 1, 128, 128, seed=1, dtype=jnp.float32, init=False, unit_keys=True)
    o, final = gdn_chunked(**args, cu_seqlens=np.array(cu), scale=0.3)
    ro, rf = gdn_sequential_reference(**args, cu_seqlens=cu, scale=0.3)
    assert fla_error(o, ro) < CHUNK_RATIO
    assert fla_error(final, rf) < CHUNK_RATIO
    assert not np.asarray(final[1]).any()


def test_matches_transformers_chunked_gated_delta_rule():
    """The committed output of transformers' `torch_chunk_gated_delta_rule` (float32, q/k L2
    norm, GVA, initial states; tools/make_gdn_fixture.py): the kernel within FLA's rule, and
    the float64 recurrence within float32 chunked round-off (1e-4: a 64-step chunk in f32
    accumulates ~64 * 2^-24 relative per product, far below it) -- the two share semantics."""
    fx = dict(np.load(FIXTURE))
    args = {n: jnp.asarray(fx[n], jnp.bfloat16 if n in "qkv" else jnp.float32) for n in "qkv"}
    args |= {n: jnp.asarray(fx[n]) for n in ("g", "beta")}
    cu, h0 = fx["cu_seqlens"], jnp.asarray(fx["initial_states"])
    o, final = gdn_chunked(**args, cu_seqlens=cu, initial_states=h0, use_qk_l2norm=True)
    assert fla_error(o, fx["o"]) < CHUNK_RATIO
    assert fla_error(final, fx["final_states"]) < CHUNK_RATIO
    ro, rf = gdn_sequential_reference(**args, cu_seqlens=cu, initial_states=h0, use_qk_l2norm=True)
    assert fla_error(ro, fx["o"]) < 1e-4
    assert fla_error(rf, fx["final_states"]) < 1e-4


def test_chunked_final_state_feeds_the_recurrent_update():
    """Prefill 69 tokens of each of two sequences, then decode the 70th with
    `gdn_state_update` from the prefill's final states: the decoded output and state equal
    those of prefilling all 70 tokens (both within FLA's chunk rule of each other)."""
    fx = dict(np.load(FIXTURE))
    full = {n: jnp.asarray(fx[n], jnp.bfloat16 if n in "qkv" else jnp.float32) for n in "qkv"}
    full |= {n: jnp.asarray(fx[n]) for n in ("g", "beta")}
    h0 = jnp.asarray(fx["initial_states"])
    o_all, f_all = gdn_chunked(**full, cu_seqlens=[0, 70, 140], initial_states=h0,
                               use_qk_l2norm=True)  # fmt: skip
    head = np.r_[0:69, 70:139]
    last = np.array([69, 139])
    o_pre, f_pre = gdn_chunked(**{n: a[head] for n, a in full.items()}, cu_seqlens=[0, 69, 138],
                               initial_states=h0, use_qk_l2norm=True)  # fmt: skip
    assert fla_error(o_pre, o_all[head]) < CHUNK_RATIO
    o_dec, f_dec = gdn_state_update(f_pre, **{n: a[last] for n, a in full.items()},
                                    use_qk_l2norm=True)  # fmt: skip
    assert fla_error(o_dec, o_all[last]) < CHUNK_RATIO
    assert fla_error(f_dec, f_all) < CHUNK_RATIO


@functools.cache
def _plan(m=64):
    """The seed's arena for a one-layer GDN model (128x128 heads, one value head) and M = m:
    `gdn_fla_scratch` as `BufferSizes` sizes it, among the other regions, with guard bands."""
    config = ModelConfig(
        hidden_size=64, num_hidden_layers=1, layer_types=("linear_attention",),
        linear_num_key_heads=1, linear_key_head_dim=128, linear_num_value_heads=1,
        linear_value_head_dim=128, num_attention_heads=1, num_key_value_heads=1, head_dim=16,
        intermediate_size=64, vocab_size=16,
    )  # fmt: skip
    sizes = BufferSizes.from_config(
        config, m, 64, 0, 1, levers=Levers(), target=Target.preset("hopper")
    )
    return ArenaPlan.sequential(sizes, guard_bytes=64), gdn_fla_scratch_layout(1, m)


def test_layout_is_the_seeds_region():
    """The sections tile the region the seed sizes (spec section 6, written out here):
    nt = ceil(M / 64) + 16; W, U, uc = nt nv 64 128 bf16; S = nt nv 128 128 bf16;
    gc = nt nv 64 f32; back to back in that order."""
    for nv, m in ((1, 64), (32, 2048), (48, 1000)):
        nt = -(-m // 64) + 16
        sizes = [nt * nv * 64 * 128 * 2] * 2 + [nt * nv * 128 * 128 * 2, nt * nv * 64 * 128 * 2]
        sizes.append(nt * nv * 64 * 4)
        layout = gdn_fla_scratch_layout(nv, m)
        assert list(layout) == ["W", "U", "S", "uc", "gc"]
        assert [n for _, n in layout.values()] == sizes
        assert [o for o, _ in layout.values()] == [sum(sizes[:i]) for i in range(5)]
    plan, _ = _plan()
    assert plan.regions[GDN_REGION].nbytes == sum(
        n for _, n in gdn_fla_scratch_layout(1, 64).values()
    )


def test_arena_form_writes_only_its_region_and_keeps_the_sections():
    """`gdn_chunked_into`: the same o and final states as `gdn_chunked` bit for bit; only
    `gdn_fla_scratch` changes; the sections hold what the layout says: gc = the chunk-local
    cumsum of g (f32), S of a sequence's first chunk = its initial state in bf16, and chunk
    slots past those in use keep their bytes."""
    plan, layout = _plan()
    cu = [0, 40, 100]  # chunks: 1 + 1 = 2 slots of the region's 17
    args, h0 = inputs(cu, 1, 1, 128, 128, seed=2)
    arena0 = random_arena(plan, 3)
    step = jax.jit(lambda a, *x: gdn_chunked_into(a, plan, *x, cu_seqlens=cu, initial_states=h0,
                                                  use_qk_l2norm=True), donate_argnums=0)  # fmt: skip
    arena, o, final = step(jnp.asarray(arena0), *args.values())
    ref_o, ref_f = gdn_chunked(**args, cu_seqlens=cu, initial_states=h0, use_qk_l2norm=True)
    np.testing.assert_array_equal(np.asarray(o), np.asarray(ref_o))
    np.testing.assert_array_equal(np.asarray(final), np.asarray(ref_f))
    new = np.asarray(arena).reshape(-1)
    old = arena0.reshape(-1)
    r = plan.regions[GDN_REGION]
    outside = np.ones(new.size, bool)
    outside[r.offset_bytes : r.end_bytes] = False
    np.testing.assert_array_equal(new[outside], old[outside])
    region = new[r.offset_bytes : r.end_bytes]

    def section(name, slot_bytes, slots):
        off, _ = layout[name]
        return region[off : off + slot_bytes * slots]

    gc = section("gc", 256, 17).view(np.float32).reshape(17, 64)
    g = np.asarray(args["g"])
    want0 = np.cumsum(g[0:40, 0])
    want1 = np.cumsum(g[40:100, 0])
    # A different summation order than np.cumsum: f32 round-off of a 64-term sum, < 64 ulp.
    np.testing.assert_allclose(gc[0, :40], want0, rtol=64 * 2**-24, atol=1e-7)
    np.testing.assert_allclose(gc[1, :60], want1, rtol=64 * 2**-24, atol=1e-7)
    np.testing.assert_array_equal(gc[0, 40:], np.full(24, gc[0, 39]))  # padded rows: g = 0
    state = section("S", 128 * 256, 17).view(jnp.bfloat16).reshape(17, 128, 128)
    for slot, s in ((0, 0), (1, 1)):
        np.testing.assert_array_equal(state[slot], np.asarray(h0[s, 0].astype(jnp.bfloat16)))
    old_region = old[r.offset_bytes : r.end_bytes]
    for name in ("W", "U", "uc"):
        off, n = layout[name]
        used = 2 * 64 * 256
        assert not np.array_equal(region[off : off + used], old_region[off : off + used]), name
        np.testing.assert_array_equal(region[off + used : off + n],
                                      old_region[off + used : off + n])  # fmt: skip


def test_arena_form_does_not_copy_the_arena_in_interpret_mode():
    """In interpret mode the kernels get the region's rows only (a CPU bitcast of the whole
    arena would copy it): with a 16 MiB region beside the 1.4 MB scratch, XLA's temporaries
    (the region window as uint16, the interpreter's aliased in/out pair, a few copies of
    1.4 MB) stay under 8 MiB; any copy of the arena would need more than 16 MiB."""
    plan, _ = _plan()
    sizes = {"before": 4096, GDN_REGION: plan.regions[GDN_REGION].nbytes, "big": 16 << 20}
    plan = ArenaPlan.sequential(sizes)
    cu = [0, 40]
    args, _ = inputs(cu, 1, 1, 128, 128, seed=4, init=False)
    fn = jax.jit(lambda a, *x: gdn_chunked_into(a, plan, *x, cu_seqlens=cu)[0], donate_argnums=0)
    mem = fn.lower(plan.allocate(), *args.values()).compile().memory_analysis()
    assert mem.alias_size_in_bytes == plan.total_bytes
    assert mem.temp_size_in_bytes < 8 << 20, mem.temp_size_in_bytes


def _arena_call(plan, cu, args, h0):
    """`gdn_chunked_into` jitted with the arena donated, on a random arena: `(arena before,
    arena after, o, final)`."""
    arena0 = random_arena(plan, 5)
    step = jax.jit(lambda a, *x: gdn_chunked_into(a, plan, *x, cu_seqlens=cu, initial_states=h0,
                                                  use_qk_l2norm=True), donate_argnums=0)  # fmt: skip
    arena, o, final = step(jnp.asarray(arena0), *args.values())
    return arena0, np.asarray(arena), o, final


def _outside_unchanged(plan, old, new):
    r = plan.regions[GDN_REGION]
    outside = np.ones(new.size, bool)
    outside[r.offset_bytes : r.end_bytes] = False
    np.testing.assert_array_equal(new.reshape(-1)[outside], old.reshape(-1)[outside])


def test_arena_form_runs_more_sequences_than_the_region_has_slots():
    """The seed's region for M = 64 (17 chunk slots) at the worst mix a batch of
    max_batch_size = 40 allows in 64 tokens: 41 sequences, 40 of one token and one of 24, so
    41 slots (each sequence padded to a chunk), three rounds of 17. Before the rounds this was
    refused ("need up to ... 41 chunk slots"). Against the float64 recurrence within FLA's
    rule, per sequence too; only the region changes."""
    plan, _ = _plan()
    cu = list(range(41)) + [64]
    args, h0 = inputs(cu, 1, 1, 128, 128, seed=6)
    old, new, o, final = _arena_call(plan, cu, args, h0)
    ro, rf = gdn_sequential_reference(**args, cu_seqlens=cu, initial_states=h0, use_qk_l2norm=True)
    assert fla_error(o, ro) < CHUNK_RATIO
    assert fla_error(final, rf) < CHUNK_RATIO
    for s in (0, 16, 17, 33, 34, 39, 40):  # each round's first and last sequences
        assert fla_error(final[s], rf[s]) < CHUNK_RATIO, s
        assert fla_error(o[cu[s] : cu[s + 1]], ro[cu[s] : cu[s + 1]]) < CHUNK_RATIO, s
    _outside_unchanged(plan, old, new)


def test_arena_form_rounds_cut_sequences_and_skip_empty_ones():
    """A region of 2 chunk slots and 9 sequences of 1, 0, 70, 1, 0, 130, 3, 0, 0 tokens: 8 slots
    in 4 rounds; the 70- and 130-token sequences are cut by round boundaries and continue from
    their f32 states, so o and the final states are `gdn_chunked`'s (one round of 8 slots) bit
    for bit; the empty sequences keep their initial states exactly (no slot, never written);
    within FLA's rule of the float64 recurrence; only the region changes."""
    per_slot = sum(n for _, n in gdn_fla_sections(1, 1).values())
    plan = ArenaPlan.sequential({"before": 4096, GDN_REGION: 2 * per_slot + 100, "after": 4096})
    lens = [1, 0, 70, 1, 0, 130, 3, 0, 0]
    cu = np.concatenate([[0], np.cumsum(lens)]).tolist()
    args, h0 = inputs(cu, 1, 1, 128, 128, seed=7)
    old, new, o, final = _arena_call(plan, cu, args, h0)
    want_o, want_f = gdn_chunked(**args, cu_seqlens=cu, initial_states=h0, use_qk_l2norm=True)
    np.testing.assert_array_equal(np.asarray(o), np.asarray(want_o))
    np.testing.assert_array_equal(np.asarray(final), np.asarray(want_f))
    for s in (1, 4, 7, 8):
        np.testing.assert_array_equal(np.asarray(final[s]), np.asarray(h0[s]))
    ro, rf = gdn_sequential_reference(**args, cu_seqlens=cu, initial_states=h0, use_qk_l2norm=True)
    assert fla_error(o, ro) < CHUNK_RATIO
    assert fla_error(final, rf) < CHUNK_RATIO
    _outside_unchanged(plan, old, new)


def test_arena_form_refuses_a_region_without_a_slot():
    """A region smaller than one chunk slot: a ValueError naming the region, before tracing."""
    per_slot = sum(n for _, n in gdn_fla_sections(1, 1).values())
    plan = ArenaPlan.sequential({GDN_REGION: per_slot - 256})
    S = jax.ShapeDtypeStruct
    xs = [S((4, 1, 128), jnp.bfloat16)] * 3 + [S((4, 1), jnp.float32)] * 2
    call = lambda a, *x: gdn_chunked_into(a, plan, *x)  # noqa: E731
    with pytest.raises(ValueError, match="holds no chunk slot"):
        jax.eval_shape(call, S(plan.arena_shape, jnp.uint8), *xs)


@pytest.mark.parametrize(
    ("over", "err", "match"),
    [
        ({"v": jnp.zeros((8, 3, 32))}, ValueError, "multiple of q's H=2"),
        ({"q": jnp.zeros((8, 2, 48)), "k": jnp.zeros((8, 2, 48))}, NotImplementedError, "K"),
        ({"g": jnp.zeros((8, 3))}, ValueError, r"g.shape=\(8, 3\)"),
        ({"cu_seqlens": [0, 5, 4, 8]}, ValueError, "non-decreasing"),
        ({"scale": float("nan")}, ValueError, "scale"),
        ({"use_qk_l2norm": 1}, ValueError, "use_qk_l2norm"),
        ({"q": jnp.zeros((8, 2, 32), jnp.int32)}, ValueError, "floating"),
    ],
)
def test_bad_arguments_are_refused(over, err, match):
    base = dict(q=jnp.zeros((8, 2, 32)), k=jnp.zeros((8, 2, 32)), v=jnp.zeros((8, 4, 32)),
                g=jnp.zeros((8, 4)), beta=jnp.zeros((8, 4)))  # fmt: skip
    kw = base | over
    pos = [kw.pop(n) for n in ("q", "k", "v", "g", "beta")]
    with pytest.raises(err, match=match):
        gdn_chunked(*pos, **kw)
