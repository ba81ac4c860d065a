"""Split-K decode attention's options (issue 15) against the extended independent reference,
in interpret mode, standalone and in place in an arena.

Every case checks one option at f32 and at bf16 (the suite's attention tolerances: the kernel
and the reference differ in summation order and, for bf16, in the output's rounding; the
kernel keeps the probabilities to 16 mantissa bits before the P.V dot), plus the option's edge cases. Each distinct (shapes, dtype,
split count, option) is one interpret-mode compile of a few seconds, so the cases are few and
small; the arena cases combine the options and check the arena bytes bit for bit against the
standalone form.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol

from jaxarena import ArenaPlan
from pallas_kernels.splitk_decode_attention import (
    paged_decode_attention_reference,
    paged_decode_logits_reference,
    splitk_decode_attention,
    splitk_decode_attention_into,
    splitk_slots_needed,
)
from pallas_kernels.splitk_decode_attention.ops import _run

BS = 16  # tokens per page
LENS = [50, 0, 9]  # 4 pages (last one partial); an empty sequence; shorter than a page
MAX_PAGES = 4


def make(
    *, Hq=4, Hkv=2, D=32, Dv=None, dtype=jnp.float32, kv_dtype=None, lens=LENS, latent=False,
    seed=0, q_mult=1.0,
):  # fmt: skip
    """q, k, v, block_tables, seq_lens with pages DISJOINT between sequences, in shuffled
    order (a poisoned page then belongs to one sequence only)."""
    rng = np.random.default_rng(seed)
    B = len(lens)
    nb = B * MAX_PAGES + 1
    q = jnp.asarray(q_mult * rng.standard_normal((B, Hq, D)), dtype)
    kvd = dtype if kv_dtype is None else kv_dtype
    if kvd == jnp.float8_e4m3fn:  # random e4m3 values well inside the finite range

        def draw(shape):
            return jnp.asarray(np.clip(4 * rng.standard_normal(shape), -448, 448), jnp.float32
                               ).astype(kvd)  # fmt: skip
    else:

        def draw(shape):
            return jnp.asarray(rng.standard_normal(shape), kvd)

    k = draw((nb, BS, Hkv, D))
    v = None if latent else draw((nb, BS, Hkv, Dv or D))
    table = rng.permutation(nb)[: B * MAX_PAGES].reshape(B, MAX_PAGES)
    return q, k, v, jnp.asarray(table, jnp.int32), jnp.asarray(lens, jnp.int32)


def close(actual, expected, dtype):
    np.testing.assert_allclose(
        np.asarray(actual, np.float32), np.asarray(expected, np.float32), **tol("attention", dtype)
    )


def f32(x):
    return np.asarray(x, np.float32)


# -- sliding window --------------------------------------------------------------------------


def visible_pages(lens, window):
    """Pages holding at least one key of `[max(0, len - window), len)`."""
    out = []
    for n in lens:
        t0 = 0 if window is None else max(0, n - window)
        out.append(-(-n // BS) - t0 // BS if n else 0)
    return np.asarray(out)


def test_window_shorter_than_a_page_reads_only_its_pages_and_ignores_nan_elsewhere():
    """window 5: sequence 0 sees keys 45..49 (the tail of page 2, the head of page 3); the
    pages before the window are never visited (counted by the kernel's loop), and NaN in them
    or past the sequence's end in its last page does not reach the output."""
    q, k, v, bt, sl = make()
    window = 5
    clean_ref = paged_decode_attention_reference(q, k, v, bt, sl, window_size=window)
    table = np.asarray(bt)
    kn, vn = np.asarray(k).copy(), np.asarray(v).copy()
    for b, n in enumerate(LENS):
        t0 = max(0, n - window)
        for t in list(range(0, t0)) + list(range(n, MAX_PAGES * BS)):
            kn[table[b, t // BS], t % BS] = np.nan
            vn[table[b, t // BS], t % BS] = np.nan
    kn, vn = jnp.asarray(kn), jnp.asarray(vn)
    out, _, _, pages = _run(
        q, kn, vn, bt, sl, None, splits=3, d_v=32, sm_scale=None, softcap=None,
        window_size=window, sinks=None, k_scale=None, v_scale=None, return_lse=False,
        interpret=True, arena_offsets=None, count_pages=True,
    )  # fmt: skip
    assert np.all(np.isfinite(f32(out)))
    close(out, clean_ref, jnp.float32)
    # pages[b, kv, head_block, split]: every program of a sequence visits the window's pages
    # once in all (2, 0, 1), never the 4, 0, 1 pages of the whole sequence.
    per_seq = np.asarray(pages).sum(axis=3)
    expect = visible_pages(LENS, window)
    assert expect.tolist() == [2, 0, 1] and visible_pages(LENS, None).tolist() == [4, 0, 1]
    np.testing.assert_array_equal(per_seq, np.broadcast_to(expect[:, None, None], per_seq.shape))
    # The window matters for sequence 0 (50 keys) and not for sequence 2 (9 keys, window 5
    # drops 4 of them: it matters there too), and the empty sequence stays 0.
    full = paged_decode_attention_reference(q, k, v, bt, sl)
    assert np.abs(f32(full[0]) - f32(clean_ref[0])).max() > 0.01
    np.testing.assert_array_equal(f32(out[1]), 0.0)


def test_window_longer_than_the_sequence_is_no_window_bf16_d80():
    """Also a head dim that is not a power of two (80 = 64 + 16 column chunks) in bf16."""
    q, k, v, bt, sl = make(D=80, dtype=jnp.bfloat16, seed=1)
    out = splitk_decode_attention(q, k, v, bt, sl, num_splits=2, window_size=1000)
    close(out, paged_decode_attention_reference(q, k, v, bt, sl, window_size=1000), jnp.bfloat16)


# -- attention sinks (gpt-oss) -----------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "splits"), [(jnp.float32, 1), (jnp.bfloat16, 3)])
def test_sinks_join_the_denominator_and_lse(dtype, splits):
    q, k, v, bt, sl = make(dtype=dtype, seed=2)
    sinks = jnp.asarray([-1.5, 0.0, 2.0, 30.0], jnp.float32)  # the last one dominates
    out, lse = splitk_decode_attention(
        q, k, v, bt, sl, num_splits=splits, sinks=sinks, return_lse=True
    )
    ref, ref_lse = paged_decode_attention_reference(q, k, v, bt, sl, sinks=sinks, return_lse=True)
    close(out, ref, dtype)
    np.testing.assert_allclose(f32(lse), f32(ref_lse), **tol("attention", jnp.float32))
    # Hand-derived: the sink only rescales: out_sink = out_plain * S / (S + e^sink) with
    # S = sum_t e^{x_t} = e^{lse_plain}.
    plain, plain_lse = paged_decode_attention_reference(q, k, v, bt, sl, return_lse=True)
    frac = 1.0 / (1.0 + np.exp(f32(sinks)[None, :] - f32(plain_lse)))
    np.testing.assert_allclose(f32(ref), f32(plain) * frac[..., None], rtol=1e-5, atol=1e-6)
    # seq_len 0: no key, only the sink: output 0, LSE = the sink.
    np.testing.assert_array_equal(f32(out[1]), 0.0)
    np.testing.assert_allclose(f32(lse[1]), f32(sinks), rtol=1e-6, atol=1e-6)
    # Head 3's sink (30) swamps every logit: its output is ~0.
    assert np.abs(f32(out[0, 3])).max() < 1e-6


# -- logit soft-cap (Gemma-2) ------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "splits"), [(jnp.float32, 2), (jnp.bfloat16, 1)])
def test_softcap_with_huge_logits(dtype, splits):
    """Logits of order 1e3 (q scaled by 300) capped at 20: finite, equal to the reference; a
    cap changes the result (the uncapped softmax is nearly one-hot)."""
    q, k, v, bt, sl = make(dtype=dtype, seed=3, q_mult=300.0)
    cap = 20.0
    out = splitk_decode_attention(q, k, v, bt, sl, num_splits=splits, softcap=cap)
    ref = paged_decode_attention_reference(q, k, v, bt, sl, softcap=cap)
    assert np.all(np.isfinite(f32(out)))
    close(out, ref, dtype)
    logits, _ = paged_decode_logits_reference(q, k, bt, sl, softcap=cap)
    assert float(jnp.max(jnp.abs(logits))) <= cap  # tanh saturates, never exceeds the cap
    uncapped = paged_decode_attention_reference(q, k, v, bt, sl)
    assert np.abs(f32(uncapped) - f32(ref)).max() > 0.1


# -- FP8 KV cache (vLLM) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "splits", "per_head"), [(jnp.float32, 2, False), (jnp.bfloat16, 3, True)]
)
def test_fp8_kv_cache_dequantized_in_the_kernel(dtype, splits, per_head):
    q, k, v, bt, sl = make(dtype=dtype, kv_dtype=jnp.float8_e4m3fn, seed=4)
    if per_head:
        ks, vs = jnp.asarray([0.05, 0.2], jnp.float32), jnp.asarray([0.5, 0.125], jnp.float32)
    else:
        ks, vs = 0.1, 0.25
    out = splitk_decode_attention(q, k, v, bt, sl, num_splits=splits, k_scale=ks, v_scale=vs)
    ref = paged_decode_attention_reference(q, k, v, bt, sl, k_scale=ks, v_scale=vs)
    close(out, ref, dtype)
    # The scales matter: the unscaled cache gives another answer.
    assert np.abs(f32(paged_decode_attention_reference(q, k, v, bt, sl)) - f32(ref)).max() > 0.1


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(k_scale=0.0, v_scale=1.0), r"k_scale must be finite and > 0.*scale of 0.*k_scale=0"),
        (dict(k_scale=1.0, v_scale=jnp.asarray([1.0, 0.0])), r"v_scale must be finite and > 0"),
        (dict(k_scale=1.0), r"v_scale is required with a float8_e4m3fn KV cache"),
        (dict(k_scale=jnp.ones((3,)), v_scale=1.0), r"k_scale.shape=\(3,\) must be \(\), \(1,\)"),
        (dict(k_scale=float("nan"), v_scale=1.0), r"k_scale must be finite"),
    ],
)
def test_fp8_scales_are_checked(kw, needle):
    q, k, v, bt, sl = make(kv_dtype=jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match=needle):
        splitk_decode_attention(q, k, v, bt, sl, num_splits=2, **kw)


# -- head sizes that are not powers of two, D_qk != D_v, MLA's latent cache ----------------


HEADS = {
    # name: (D_qk, D_v, latent, Hq, Hkv, dtype, splits)
    # (D=80: bf16 in the window test, f32 in the arena test; D=96: the bf16 arena test.)
    "dqk192_dv128_f32": (192, 128, False, 4, 2, jnp.float32, 3),
    "mla_latent_576_512_bf16": (576, 512, True, 4, 1, jnp.bfloat16, 2),
}


@pytest.mark.parametrize("name", list(HEADS))
def test_head_sizes(name):
    D, Dv, latent, Hq, Hkv, dtype, splits = HEADS[name]
    q, k, v, bt, sl = make(Hq=Hq, Hkv=Hkv, D=D, Dv=Dv, dtype=dtype, latent=latent, seed=5)
    kw = dict(v_head_dim=Dv) if latent else {}
    out = splitk_decode_attention(q, k, v, bt, sl, num_splits=splits, **kw)
    assert out.shape == (3, Hq, Dv) and out.dtype == dtype
    close(out, paged_decode_attention_reference(q, k, v, bt, sl, **kw), dtype)
    if latent:  # the values really are the keys' first 512 columns
        close(out, paged_decode_attention_reference(q, k, k[..., :Dv], bt, sl), dtype)


# -- log-sum-exp: merging partial attentions (cascade / prefix caching) ------------------------


def test_lse_merges_disjoint_key_sets_into_the_whole():
    """Row 0 attends all 50 keys; row 1 the first 32 (pages 0-1 of row 0), row 2 the last 18
    (pages 2-3): merging rows 1 and 2 through their LSEs gives row 0."""
    q, k, v, bt, _ = make(seed=6)
    table = np.array(bt)
    table[1, :2], table[2, :2] = table[0, :2], table[0, 2:]
    q = q.at[1].set(q[0]).at[2].set(q[0])
    sl = jnp.asarray([50, 32, 18], jnp.int32)
    bt = jnp.asarray(table)
    out, lse = splitk_decode_attention(q, k, v, bt, sl, num_splits=2, return_lse=True)
    ref_out, ref_lse = paged_decode_attention_reference(q, k, v, bt, sl, return_lse=True)
    close(out, ref_out, jnp.float32)
    np.testing.assert_allclose(f32(lse), f32(ref_lse), **tol("attention", jnp.float32))
    la, lb = f32(lse[1]), f32(lse[2])
    mx = np.maximum(la, lb)
    wa, wb = np.exp(la - mx), np.exp(lb - mx)
    merged = (wa[:, None] * f32(out[1]) + wb[:, None] * f32(out[2])) / (wa + wb)[:, None]
    close(merged, out[0], jnp.float32)
    np.testing.assert_allclose(mx + np.log(wa + wb), f32(lse[0]), rtol=1e-6)
    # Natural log: exp(lse) is the sum of exp(logits) over the keys.
    logits = f32(jnp.einsum("hd,thd->ht", q[0], jnp.repeat(
        k[bt[0]].reshape(-1, 2, 32)[:50], 2, axis=1))) / math.sqrt(32)  # fmt: skip
    np.testing.assert_allclose(np.log(np.exp(logits).sum(1)), f32(lse[0]), rtol=1e-5)


# -- the arena form, every option at once ----------------------------------------------------


# A large region the kernels never touch: a copy of the whole arena would show in the temp.
FILLER = 4 << 20 | 300


def _plan(slots, d_v, out_bytes):
    return ArenaPlan.sequential(
        {"before": FILLER, "splitk_workspace": slots * (d_v + 2) * 4 + 36,
         "attn_output": out_bytes + 40, "after": 200},
        guard_bytes=64,
    )  # fmt: skip


ARENA = {
    # name: (dtype, splits, make kwargs, option kwargs)
    "f32_3splits_window_sinks_softcap_fp8_d80": (
        jnp.float32, 3, dict(D=80, kv_dtype=jnp.float8_e4m3fn),
        dict(window_size=20, softcap=8.0, k_scale=jnp.asarray([0.1, 0.3]), v_scale=0.5),
    ),
    "bf16_1split_mla_latent_window_sinks_fp8": (
        jnp.bfloat16, 1, dict(Hkv=1, D=96, latent=True, kv_dtype=jnp.float8_e4m3fn),
        dict(window_size=7, v_head_dim=64, k_scale=0.2, v_scale=0.4),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(ARENA))
def test_arena_form_is_the_standalone_form_in_place(name):
    dtype, splits, mk, opts = ARENA[name]
    q, k, v, bt, sl = make(dtype=dtype, seed=7, **mk)
    B, Hq = q.shape[:2]
    d_v = opts.get("v_head_dim", q.shape[2])
    opts = dict(opts, sinks=jnp.asarray([0.5, -1.0, 3.0, 0.0], jnp.float32), return_lse=True)
    slots = B * Hq * 16
    plan = _plan(slots, d_v, B * Hq * d_v * jnp.dtype(dtype).itemsize)
    rng = np.random.default_rng(8)
    flat = np.array(plan.allocate()).reshape(-1)  # guard bands kept; regions random
    for r in plan.regions.values():
        flat[r.offset_bytes : r.end_bytes] = rng.integers(0, 256, r.nbytes, dtype=np.uint8)
    before = flat.copy()
    arena = jnp.asarray(flat.reshape(plan.arena_shape))
    ws0 = plan.view(arena, "splitk_workspace", (slots, d_v + 2), jnp.float32)

    step = jax.jit(
        lambda a, *x: splitk_decode_attention_into(a, plan, *x, num_splits=splits, **opts),
        donate_argnums=0,
    )
    compiled = step.lower(arena, q, k, v, bt, sl).compile()
    # In place on CPU too: the interpreted kernels get windows of rows, so XLA's temp holds
    # the interpreter's copies of the small inputs and windows (measured 157-267 KB), never
    # the 4 MB arena.
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp < plan.total_bytes // 2, (temp, plan.total_bytes)
    arena, lse = compiled(arena, q, k, v, bt, sl)
    assert plan.check_guards(arena) == []
    out, lse_s, ws = splitk_decode_attention(
        q, k, v, bt, sl, num_splits=splits, workspace=ws0, **opts
    )
    # Bit for bit the standalone form's output and workspace rows.
    got = plan.view(arena, "attn_output", (B, Hq, d_v), dtype)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(out).view(np.uint8))
    # The LSE to 1 f32 ulp: XLA's CPU `log` may be vectorised differently in the two
    # interpreted programs (measured: 1 ulp in 1 of 12 values); on a GPU both run one kernel.
    np.testing.assert_array_max_ulp(np.asarray(lse), np.asarray(lse_s), maxulp=1)
    used = splitk_slots_needed(B, Hq, splits)
    got_ws = np.asarray(plan.view(arena, "splitk_workspace", (slots, d_v + 2), jnp.float32))
    np.testing.assert_array_equal(got_ws.view(np.uint32), np.asarray(ws).view(np.uint32))
    # And the reference's values.
    ref, ref_lse = paged_decode_attention_reference(q, k, v, bt, sl, **opts)
    close(got, ref, dtype)
    np.testing.assert_allclose(f32(lse), f32(ref_lse), **tol("attention", jnp.float32))
    # Nothing outside the used workspace rows and the output changed.
    after = np.asarray(arena).reshape(-1)
    changed = np.flatnonzero(after != before)
    w0 = plan.regions["splitk_workspace"].offset_bytes
    o0 = plan.regions["attn_output"].offset_bytes
    nbytes = B * Hq * d_v * jnp.dtype(dtype).itemsize
    allowed = ((changed >= w0) & (changed < w0 + used * (d_v + 2) * 4)) | (
        (changed >= o0) & (changed < o0 + nbytes)
    )
    assert changed.size and allowed.all(), changed[~allowed][:10]


# -- validation of the options ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "exc", "needle"),
    [
        (dict(window_size=0), ValueError, r"window_size must be None or an int >= 1.*=0"),
        (dict(window_size=2.5), ValueError, r"window_size must be None or an int"),
        (dict(softcap=0.0), ValueError, r"softcap must be finite and > 0, got softcap=0.0"),
        (dict(softcap=float("inf")), ValueError, r"softcap must be finite and > 0"),
        (dict(sinks=jnp.zeros((3,))), ValueError, r"sinks must be a floating array of shape \(4,\)"),
        (dict(sinks=jnp.asarray([0.0, np.nan, 0, 0])), ValueError, r"sinks must be finite"),
        (dict(k_scale=1.0, v_scale=1.0), ValueError, r"k_scale applies to a float8_e4m3fn"),
        (dict(v_cache=None), ValueError, r"v_cache=None reads the values.*v_head_dim=None"),
        (dict(v_cache=None, v_head_dim=33), ValueError, r"v_head_dim must be an int in 1\.\.32"),
        (dict(v_head_dim=16), ValueError, r"v_head_dim=16 disagrees with v_cache.shape\[3\]=32"),
        (dict(return_lse=1), ValueError, r"return_lse must be True or False"),
        (dict(D=20), NotImplementedError, r"head_dim=20 must be a power of two or a multiple of 8"),
    ],
)  # fmt: skip
def test_bad_options_are_rejected_before_tracing(change, exc, needle):
    change = dict(change)
    D = change.pop("D", 32)
    q, k, v, bt, sl = make(D=D)
    if "v_cache" in change:
        v = change.pop("v_cache")
    with pytest.raises(exc, match=needle):
        splitk_decode_attention(q, k, v, bt, sl, num_splits=2, **change)


def test_value_output_form_writes_only_the_partials():
    """`output_in_arena=False` (what the model's decode uses: the o_proj GEMM reads a value,
    no copy out of `attn_output`): the output and the partials are the standalone form's, bit
    for bit (that form is checked against the reference above), and the arena changes only in
    the used workspace rows; the plan needs no `attn_output` region. Two splits: the combine
    reads the partials from the arena and writes a buffer of its own. (One split runs the
    standalone form's single pass and leaves the arena alone; the model tests run it.)"""
    splits = 2
    q, k, v, bt, sl = make(Hq=2, Hkv=1, dtype=jnp.bfloat16, lens=[40, 0], seed=9)
    B, Hq, D = q.shape
    slots = B * Hq * 2
    plan = ArenaPlan.sequential({"before": 300, "splitk_workspace": slots * (D + 2) * 4,
                                 "after": 200}, guard_bytes=64)  # fmt: skip
    rng = np.random.default_rng(10)
    flat = np.array(plan.allocate()).reshape(-1)
    for r in plan.regions.values():
        flat[r.offset_bytes : r.end_bytes] = rng.integers(0, 256, r.nbytes, dtype=np.uint8)
    before = flat.copy()
    arena = jnp.asarray(flat.reshape(plan.arena_shape))
    ws0 = plan.view(arena, "splitk_workspace", (slots, D + 2), jnp.float32)
    out_s, ws = splitk_decode_attention(q, k, v, bt, sl, num_splits=splits, workspace=ws0)
    arena, out = jax.jit(
        lambda a, *x: splitk_decode_attention_into(a, plan, *x, num_splits=splits,
                                                   output_in_arena=False),
        donate_argnums=0,
    )(arena, q, k, v, bt, sl)  # fmt: skip
    assert out.shape == (B, Hq, D) and out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out).view(np.uint16),
                                  np.asarray(out_s).view(np.uint16))  # fmt: skip
    assert plan.check_guards(arena) == []
    changed = np.flatnonzero(np.asarray(arena).reshape(-1) != before)
    w0 = plan.regions["splitk_workspace"].offset_bytes
    used = splitk_slots_needed(B, Hq, splits) * (D + 2) * 4
    assert ((changed >= w0) & (changed < w0 + used)).all(), changed[:10]
    assert changed.size
    got_ws = np.asarray(plan.view(arena, "splitk_workspace", (slots, D + 2), jnp.float32))
    np.testing.assert_array_equal(got_ws.view(np.uint32), np.asarray(ws).view(np.uint32))
    with pytest.raises(ValueError, match=r"output_in_arena must be True or False.*=1"):
        splitk_decode_attention_into(arena, plan, q, k, v, bt, sl, output_in_arena=1)
