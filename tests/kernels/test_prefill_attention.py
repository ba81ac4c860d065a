"""Paged prefill attention (issue 23): against the independent dense reference in interpret
mode, for packed variable-length prompts, chunked prefill, GQA/MQA, `D_qk != D_v` (and MLA's
latent cache), window / sinks / soft-cap, padding rows, stale NaN in the cache, and the arena
form writing only its region in place.

Shapes are small and shared: each distinct (shapes, dtype, options) is one interpret-mode
compile of a few seconds; the reference is jitted once per shape.

Tolerances (`_helpers/tolerances.py`, "prefill"): FlashAttention's varlen tests bound the
error of the kernel by twice that of a same-dtype PyTorch reference; vLLM's prefix-prefill
test uses inputs of size 1e-3 with an absolute 1e-4 (about 10% of the output). Both are
relative to each library's numerics; here the bound is derived from the arithmetic (see the
table's comments): f32 differs from the reference only in summation order, bf16 adds the
rounding of the probabilities before `P.V` and of the output.
"""

from __future__ import annotations

import importlib
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.lowering import cuda_lowering_text
from _helpers.tolerances import tol
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxarena import ArenaPlan
from pallas_kernels.prefill_attention import (
    paged_prefill_attention,
    paged_prefill_attention_into,
    paged_prefill_attention_reference,
)

ref = jax.jit(
    paged_prefill_attention_reference,
    static_argnames=("sm_scale", "window_size", "softcap", "v_head_dim"),
)

QLENS = [1, 15, 17, 33]  # one token; not multiples of anything; one past 2 tiles' worth
PAD = 3  # padding rows after the last sequence
MAX_PAGES = 10  # one table width for every case: the plain and chunked cases share a compile


def f32(x):
    return np.asarray(x, np.float32)


def close(actual, expected, dtype):
    np.testing.assert_allclose(f32(actual), f32(expected), **tol("prefill", dtype))


def make(*, qlens=QLENS, ctx=None, Hq=4, Hkv=2, D=32, Dv=None, page=8, pad=PAD,
         dtype=jnp.float32, latent=False, seed=0, poison=True):  # fmt: skip
    """Packed queries, a paged cache holding each sequence's whole context (`ctx[s]` earlier
    tokens plus its `qlens[s]` chunk tokens), pages disjoint and shuffled, table entries past
    the context set to -1 (never read), and NaN in every cache slot no sequence owns."""
    rng = np.random.default_rng(seed)
    S = len(qlens)
    ctx = [0] * S if ctx is None else ctx
    lens = [c + n for c, n in zip(ctx, qlens, strict=True)]
    max_pages = MAX_PAGES
    nb = S * max_pages + 2
    T = sum(qlens) + pad
    Dv = Dv or D
    q = jnp.asarray(rng.standard_normal((T, Hq, D)), dtype)
    k = rng.standard_normal((nb, page, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((nb, page, Hkv, Dv)).astype(np.float32)
    table = rng.permutation(nb)[: S * max_pages].reshape(S, max_pages)
    owned = np.zeros((nb, page), bool)
    for s, n in enumerate(lens):
        for t in range(n):
            owned[table[s, t // page], t % page] = True
        table[s, -(-n // page) :] = -1
    if poison:
        k[~owned], v[~owned] = np.nan, np.nan
    cu = np.concatenate([[0], np.cumsum(qlens)])
    return (
        q,
        jnp.asarray(k, dtype),
        None if latent else jnp.asarray(v, dtype),
        jnp.asarray(table, jnp.int32),
        jnp.asarray(cu, jnp.int32),
        jnp.asarray(lens, jnp.int32),
    )


def check(args, dtype, **opts):
    out = paged_prefill_attention(*args, **opts)
    T, Hq = args[0].shape[:2]
    dv = opts.get("v_head_dim") or (args[2].shape[-1] if args[2] is not None else None)
    assert out.shape == (T, Hq, dv) and out.dtype == dtype
    assert np.all(np.isfinite(f32(out)))  # stale NaN in the cache never reaches the output
    expect = ref(*args, **opts)
    close(out, expect, dtype)
    end = int(args[4][-1])
    np.testing.assert_array_equal(f32(out[end:]), 0.0)  # padding rows are zeros
    return out, expect


# -- against the reference -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_varlen_prefill_matches_reference(dtype):
    """Sequences of 1, 15, 17 and 33 tokens in pages of 8 (a sequence ends mid-page, a key
    block spans several pages, the 33-token sequence spans two query tiles), GQA 2:1."""
    check(make(dtype=dtype), dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_chunked_prefill_is_the_tail_of_the_full_prompt(dtype):
    """Chunks whose earlier tokens (0, 20, 9, 40 of them) are already in the cache: each
    chunk's output is the last rows of the whole prompt's attention."""
    ctx = [0, 20, 9, 40]
    args = make(ctx=ctx, dtype=dtype, seed=1)
    q, k, v, bt, cu, sl = args
    out, _ = check(args, dtype)
    # The whole prompts as one plain prefill: queries of the earlier tokens are random
    # (they do not affect the chunk's rows), the chunk rows are the chunk's queries.
    rng = np.random.default_rng(2)
    lens = np.asarray(sl)
    full_cu = np.concatenate([[0], np.cumsum(lens)])
    q_full = np.asarray(rng.standard_normal((int(full_cu[-1]), *q.shape[1:])), np.float32)
    rows = []
    for s, c in enumerate(ctx):
        tail = np.arange(full_cu[s] + c, full_cu[s + 1])
        q_full[tail] = f32(q[int(cu[s]) : int(cu[s + 1])])
        rows.append(tail)
    q_full = jnp.asarray(q_full, dtype)
    full = ref(q_full, k, v, bt, jnp.asarray(full_cu, jnp.int32), sl)
    close(out[: int(cu[-1])], full[np.concatenate(rows)], dtype)
    # The context matters (the chunk alone would give something else).
    alone = ref(q[: int(cu[-1])], k, v, bt, cu, jnp.asarray(QLENS, jnp.int32))
    assert np.abs(f32(alone[20:30]) - f32(out[20:30])).max() > 0.05


GROUPS = {
    # name: make kwargs. MQA with 8 query heads (one block of 8 heads, 8 tokens per tile)
    # and a sequence with no query between two others; a group of 3 (a padded head row per
    # token) with pages of 128 (a key block within a page).
    "mqa_8_heads_empty_seq": dict(Hq=8, Hkv=1, qlens=[1, 15, 0, 17, 33]),
    "group3_page128": dict(Hq=6, Hkv=2, page=128),
}


@pytest.mark.parametrize("name", list(GROUPS))
def test_gqa_and_mqa(name):
    check(make(**GROUPS[name], seed=3), jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_qk_and_v_head_dims_differ(dtype):
    """D_qk = 24 (16 + a masked 8-wide chunk), D_v = 40 (32 + 8): separate caches."""
    check(make(D=24, Dv=40, dtype=dtype, seed=4), dtype)


def test_mla_latent_cache():
    """v_cache=None: the values are the first 32 of the 48 key columns (one KV head)."""
    args = make(Hq=4, Hkv=1, D=48, latent=True, seed=5)
    check(args, jnp.float32, v_head_dim=32)


OPTIONS = {
    # name: (dtype, make kwargs, options)
    "window5_sinks_softcap_f32": (
        jnp.float32, dict(ctx=[0, 20, 9, 40]),
        dict(window_size=5, softcap=4.0, sinks=jnp.asarray([0.5, -1.0, 3.0, 0.0]), sm_scale=0.3),
    ),
    "window12_bf16": (jnp.bfloat16, dict(ctx=[3, 0, 30, 1]), dict(window_size=12)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(OPTIONS))
def test_window_sinks_softcap(name):
    """Windows shorter than a chunk and than the context, with soft-cap, sinks and a scale."""
    dtype, mk, opts = OPTIONS[name]
    args = make(dtype=dtype, seed=6, **mk)
    out, expect = check(args, dtype, **opts)
    # The options change the result (they are not silently ignored).
    plain = ref(*args)
    assert np.abs(f32(plain) - f32(expect)).max() > 0.05
    # NaN in every cached key and value that no query's window reaches (the context before
    # the first query's window): the same output, bit for bit.
    q, k, v, bt, cu, sl = args
    kn, vn = np.array(f32(k)), np.array(f32(v))
    page = k.shape[1]
    hidden = 0
    for s, c in enumerate(mk["ctx"]):
        for t in range(max(0, c - opts["window_size"] + 1)):
            kn[int(bt[s, t // page]), t % page] = np.nan
            vn[int(bt[s, t // page]), t % page] = np.nan
            hidden += 1
    assert hidden >= 19  # 57 keys with window 5, 19 with window 12
    poisoned = paged_prefill_attention(q, jnp.asarray(kn, dtype), jnp.asarray(vn, dtype), bt,
                                       cu, sl, **opts)  # fmt: skip
    np.testing.assert_array_equal(f32(poisoned), f32(out))


@settings(max_examples=8, deadline=None)
@given(
    qlens=st.lists(st.integers(0, 20), min_size=3, max_size=3).filter(lambda x: sum(x) <= 40),
    ctx=st.lists(st.integers(0, 30), min_size=3, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_random_packings_and_contexts(qlens, ctx, seed):
    """Fixed shapes (40 rows, 3 sequences, tables of 10 pages of 8), random query counts (0 or a
    decode-like 1 included), contexts and page orders: one compile for every example."""
    args = make(qlens=qlens, ctx=ctx, pad=40 - sum(qlens), seed=seed, poison=True)
    check(args, jnp.float32)


def test_traced_arguments_under_jit():
    """Offsets and lengths traced (no concrete checks): the same output as eager."""
    args = make(seed=0)
    eager = paged_prefill_attention(*args)
    jitted = jax.jit(paged_prefill_attention)(*args)
    np.testing.assert_array_equal(f32(jitted), f32(eager))


# -- the arena form ---------------------------------------------------------------------------


def _plan(out_bytes, *, align=256):
    sizes = {"before": 300, "attn_output": out_bytes + 40, "after": 200, "big": 1 << 20}
    return ArenaPlan.sequential(sizes, guard_bytes=64, align_bytes=align)


_POINTER_CHECKED = tuple(int(v) for v in jax.__version__.split(".")[:2]) >= (0, 9)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_arena_form_writes_its_region_only_in_place(dtype):
    args = make(dtype=dtype, seed=7)
    T, Hq, D = args[0].shape
    nbytes = T * Hq * D * jnp.dtype(dtype).itemsize
    plan = _plan(nbytes)
    rng = np.random.default_rng(8)
    flat = np.array(plan.allocate()).reshape(-1)  # guard bands kept; regions random
    for r in plan.regions.values():
        flat[r.offset_bytes : r.end_bytes] = rng.integers(0, 256, r.nbytes, dtype=np.uint8)
    before = flat.copy()
    arena = jnp.asarray(flat.reshape(plan.arena_shape))

    step = jax.jit(lambda a, *x: paged_prefill_attention_into(a, plan, *x), donate_argnums=0)
    compiled = step.lower(arena, *args).compile()
    assert "input_output_alias" in compiled.as_text()
    mem = compiled.memory_analysis()
    assert mem is not None and mem.alias_size_in_bytes == plan.total_bytes
    # Not a copy of the arena: the interpreted kernel gets the region's rows only, so XLA's
    # temp holds the interpreter's copies of the small inputs and of those rows, never the
    # 1 MiB region `big` that any copy of the arena would need.
    assert mem.temp_size_in_bytes < (1 << 20) // 2, mem.temp_size_in_bytes
    ptr = arena.unsafe_buffer_pointer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "donated buffers were not usable" fails the test
        arena = compiled(arena, *args)
    if _POINTER_CHECKED:  # jax 0.8.3 sometimes does not reuse a donated CPU buffer
        assert arena.unsafe_buffer_pointer() == ptr
    assert plan.check_guards(arena) == []

    got = plan.view(arena, "attn_output", (T, Hq, D), dtype)
    out = paged_prefill_attention(*args)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(out).view(np.uint8))
    close(got, ref(*args), dtype)
    after = np.asarray(arena).reshape(-1)
    changed = np.flatnonzero(after != before)
    o0 = plan.regions["attn_output"].offset_bytes
    assert changed.size and ((changed >= o0) & (changed < o0 + nbytes)).all(), changed[:10]


def test_arena_form_refuses_what_the_region_cannot_hold():
    args = make(seed=7)
    T, Hq, D = args[0].shape
    small = _plan(T * Hq * D * 4 - 200)
    with pytest.raises(ValueError, match=r"'attn_output' holds \d+ bytes but float32\[69, 128\]"):
        paged_prefill_attention_into(small.allocate(), small, *args)
    plan = _plan(T * Hq * D * 4)
    with pytest.raises(ValueError, match=r"'attn_out'"):
        paged_prefill_attention_into(plan.allocate(), plan, *args, region="attn_out")
    odd = ArenaPlan.sequential({"x": 2, "attn_output": T * Hq * D * 4}, align_bytes=2)
    with pytest.raises(ValueError, match=r"starts at byte 2, not a multiple of 4"):
        paged_prefill_attention_into(odd.allocate(), odd, *args)
    with pytest.raises(ValueError, match=r"arena must be the plan's uint8"):
        paged_prefill_attention_into(jnp.zeros((4, 256), jnp.uint8), plan, *args)


# -- validation -------------------------------------------------------------------------------


def _kw(**changes):
    q, k, v, bt, cu, sl = make(seed=0)
    kw = dict(q=q, k_cache=k, v_cache=v, block_tables=bt, cu_seqlens_q=cu, seq_lens=sl)
    kw.update(changes)
    return kw


I32 = jnp.int32


@pytest.mark.parametrize(
    ("changes", "exc", "needle"),
    [
        (dict(q=jnp.zeros((69, 4, 16))), ValueError, r"head dims differ.*q.shape\[-1\]=16"),
        (dict(q=jnp.zeros((69, 3, 32))), ValueError, r"multiple of num_kv_heads.*3"),
        (dict(q=jnp.zeros((0, 4, 32))), ValueError, r"token count q.shape\[0\] = 0"),
        (dict(q=jnp.zeros((69, 4, 32), I32)), ValueError, r"q must be floating"),
        (dict(q=jnp.full((69, 4, 32), jnp.nan)), ValueError, r"q\[0, 0, 0\]=nan is not finite"),
        (dict(seq_lens=jnp.zeros((4,), jnp.uint32)), ValueError, r"seq_lens must be int32"),
        (dict(cu_seqlens_q=jnp.asarray([0, 1, 16, 33], I32)), ValueError,
         r"cu_seqlens_q.shape\[0\] 5.*cu_seqlens_q.shape=\(4,\)"),
        (dict(cu_seqlens_q=jnp.asarray([0, 1, 16, 33, 70], I32)), ValueError,
         r"end at most at the token count q.shape\[0\]=69"),
        (dict(cu_seqlens_q=jnp.asarray([1, 1, 16, 33, 66], I32)), ValueError, r"start at 0"),
        (dict(seq_lens=jnp.asarray([1, 15, 16, 33], I32)), ValueError,
         r"seq_lens\[2\]=16 is shorter than the 17 queries"),
        (dict(seq_lens=jnp.asarray([1, 15, 17, 81], I32)), ValueError,
         r"too narrow: seq_lens\[3\]=81 needs 11 pages of 8 tokens.*shape\[1\]=10"),
        (dict(block_tables=jnp.full((4, 10), 99, I32)), ValueError,
         r"block_tables\[0, 0\]=99 is out of range"),
        (dict(v_cache=jnp.zeros((42, 8, 2, 32), jnp.bfloat16)), ValueError, r"share a dtype"),
        (dict(window_size=0), ValueError, r"window_size must be None or an int >= 1"),
        (dict(softcap=-1.0), ValueError, r"softcap must be finite and > 0"),
        (dict(sinks=jnp.zeros((3,))), ValueError, r"sinks must be a floating array of shape"),
        (dict(v_cache=None), ValueError, r"v_cache=None reads the values.*v_head_dim=None"),
        (dict(q=jnp.zeros((69, 4, 0)), k_cache=jnp.zeros((42, 8, 2, 0)),
              v_cache=jnp.zeros((42, 8, 2, 0))), ValueError, r"head_dim must be at least 1"),
        (dict(q=jnp.zeros((69, 4, 32), jnp.float8_e4m3fn)), NotImplementedError,
         r"q.dtype=float8_e4m3fn is not supported"),
        (dict(q=jnp.zeros((69, 4, 32), jnp.bfloat16)), NotImplementedError, r"k_cache.dtype"),
    ],
)  # fmt: skip
def test_bad_input_is_rejected_before_tracing(changes, exc, needle):
    with pytest.raises(exc, match=needle):
        paged_prefill_attention(**_kw(**changes))


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(st.integers(0, 5), st.integers(0, 5), st.sampled_from([0, 8, 20, 32, 80])),
    cu=st.lists(st.integers(-3, 12), max_size=4),
    lens=st.lists(st.integers(-3, 40), max_size=3),
    window=st.sampled_from([None, 0, 3, 2.5]),
)
def test_arguments_are_accepted_or_refused_with_a_message(shape, cu, lens, window):
    """Concrete queries, offsets and lengths (their values are checked), the cache abstract:
    `jax.eval_shape` traces the call without compiling it. Anything but a clean result or a
    ValueError / NotImplementedError with a message is a bug."""
    T, Hq, D = shape
    q = np.zeros((T, Hq, D), np.float32)
    k = jax.ShapeDtypeStruct((4, 8, 1, D), jnp.float32)
    table = np.zeros((len(lens), 5), np.int32)

    def call(k):
        return paged_prefill_attention(q, k, k, table, np.asarray(cu, np.int32),
                                       np.asarray(lens, np.int32), window_size=window)  # fmt: skip

    try:
        out = jax.eval_shape(call, k)
    except (ValueError, NotImplementedError) as e:
        assert str(e).strip()
        return
    assert out.shape == (T, Hq, D) and len(cu) == len(lens) + 1


# -- CUDA lowering (no GPU needed) --------------------------------------------------------------


def test_lowers_for_cuda_as_one_triton_kernel():
    sd = jax.ShapeDtypeStruct
    q, kv = sd((40, 8, 64), jnp.bfloat16), sd((12, 16, 2, 64), jnp.bfloat16)
    tables = (sd((3, 4), jnp.int32), sd((4,), jnp.int32), sd((3,), jnp.int32))

    def f(q, k, v, bt, cu, sl):
        return paged_prefill_attention(q, k, v, bt, cu, sl, interpret=False, window_size=8)

    text = cuda_lowering_text(f, q, kv, kv, *tables)
    assert len(re.findall(r"__gpu\$xla\.gpu\.triton", text)) == 1
    assert "paged_prefill_attention" in text


def test_public_names_have_docstrings():
    pkg = importlib.import_module("pallas_kernels.prefill_attention")
    for name in pkg.__all__:
        obj = getattr(pkg, name)
        assert obj.__doc__ and obj.__doc__.strip(), name
