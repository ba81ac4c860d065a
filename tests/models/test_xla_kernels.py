"""The models' plain-XLA kernel paths (`kernels="xla"`, `jaxarena.models.core.xla_*`) against
the kernels' independent references (`pallas_kernels/*/reference.py`), which the XLA code
does not share: paged decode and prefill attention (GQA, chunked prefill, sliding window,
sinks, soft-cap, FP8 KV, MLA's latent cache, padding rows, stale NaN pages, several key
blocks), FP8 block quantization (bit for bit) and the block-scaled product, the grouped GEMMs
(bf16 and FP8, empty groups, a group offset), the SSD scan and step (Mamba-2) and the gated
delta rule (Gated DeltaNet), with several packed sequences, an empty one and initial states.

Tolerances (`_helpers/tolerances.py`): float32 inputs, so the XLA path and the reference
compute the same products and sums in another order (key blocks with online rescaling vs
one softmax): the kernels' own float32 entries ("attention" for decode, "prefill") apply,
whose derivation is that reordering. The FP8 product: see `test_fp8_block_matmul_xla`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol

from jaxarena.models.core import xla_attention as xa
from jaxarena.models.core.xla_fp8 import fp8_block_matmul_xla, fp8_block_quant_xla
from jaxarena.models.core.xla_gdn import gdn_scan_xla, gdn_state_update_xla
from jaxarena.models.core.xla_moe import grouped_gemm_fp8_xla, grouped_gemm_xla
from jaxarena.models.core.xla_ssd import ssd_scan_xla, ssd_state_update_xla
from pallas_kernels import (
    fp8_block_quant_reference,
    gdn_sequential_reference,
    grouped_gemm_reference,
    paged_decode_attention_reference,
    paged_prefill_attention_reference,
    ssd_chunked_reference,
)
from pallas_kernels.grouped_gemm.reference import block_matmul_reference
from pallas_kernels.ssd_state_update import ssd_state_update_reference

PAGE, MAX_PAGES, HQ, HKV, D = 8, 8, 4, 2, 16
# Jitted (one compile each instead of one per primitive); the options are static.
_STATIC = ("sm_scale", "window", "softcap", "v_head_dim", "key_block", "tile")
decode_xla = jax.jit(xa.decode_attention_xla, static_argnames=_STATIC)
prefill_xla = jax.jit(xa.prefill_attention_xla, static_argnames=_STATIC)
decode_ref = jax.jit(paged_decode_attention_reference,
                     static_argnames=("sm_scale", "softcap", "window_size", "v_head_dim"))
prefill_ref = jax.jit(paged_prefill_attention_reference,
                      static_argnames=("sm_scale", "softcap", "window_size", "v_head_dim"))
KEY_BLOCK = 16  # two pages per loop iteration: the 40-key contexts take three


def paged(lens, *, dv=D, seed=0, fp8=False):
    """Caches with each sequence's `lens[s]` keys in shuffled pages, table entries past them
    -1 and NaN in every slot no sequence owns (never read into the arithmetic)."""
    rng = np.random.default_rng(seed)
    s = len(lens)
    nb = s * MAX_PAGES + 2
    k = rng.standard_normal((nb, PAGE, HKV, D)).astype(np.float32)
    v = rng.standard_normal((nb, PAGE, HKV, dv)).astype(np.float32)
    table = rng.permutation(nb)[: s * MAX_PAGES].reshape(s, MAX_PAGES)
    owned = np.zeros((nb, PAGE), bool)
    for i, n in enumerate(lens):
        for t in range(n):
            owned[table[i, t // PAGE], t % PAGE] = True
        table[i, -(-n // PAGE) :] = -1
    if fp8:  # FP8 pages: NaN has no e4m3 form without a NaN, keep the stale values finite
        k, v = (jnp.asarray(x, jnp.float8_e4m3fn) for x in (k, v))
    else:
        k[~owned], v[~owned] = np.nan, np.nan
        k, v = jnp.asarray(k), jnp.asarray(v)
    return k, v, jnp.asarray(table, jnp.int32), jnp.asarray(lens, jnp.int32)


OPTS = {
    "plain": {},
    "window_sinks_softcap": dict(window_size=5, softcap=1.5, sinks="sinks"),
}


def _opts(name):
    o = dict(OPTS[name])
    if o.get("sinks") == "sinks":
        o["sinks"] = jnp.asarray([0.5, -1.0, 2.0, 0.0], jnp.float32)
    return o


def _xla(o):
    o = dict(o)
    o["window"] = o.pop("window_size", None)
    return o


@pytest.mark.parametrize("opt", sorted(OPTS))
def test_decode_xla_matches_reference(opt):
    """Sequences of 0, 1, 17 and 40 keys (empty, one, mid-page, three key blocks)."""
    k, v, table, lens = paged([0, 1, 17, 40])
    q = jnp.asarray(np.random.default_rng(1).standard_normal((4, HQ, D)), jnp.float32)
    o = _opts(opt)
    got = decode_xla(q, k, v, table, lens, key_block=KEY_BLOCK, **_xla(o))
    want = decode_ref(q, k, v, table, lens, **o)
    assert got.shape == (4, HQ, D) and np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(got, want, **tol("attention", jnp.float32))
    assert np.abs(np.asarray(got[3])).max() > 0.1  # not vacuously zero


def test_decode_xla_fp8_kv_and_latent_cache():
    """FP8 pages with per-KV-head scales; MLA's layout (values = the first 8 key columns)."""
    k, v, table, lens = paged([3, 17, 40, 9], fp8=True)
    q = jnp.asarray(np.random.default_rng(2).standard_normal((4, HQ, D)), jnp.float32)
    sc = dict(k_scale=jnp.asarray([0.5, 2.0]), v_scale=0.25)
    got = decode_xla(q, k, v, table, lens, key_block=KEY_BLOCK, **sc)
    want = decode_ref(q, k, v, table, lens, **sc)
    np.testing.assert_allclose(got, want, **tol("attention", jnp.float32))
    got = decode_xla(q, k, None, table, lens, v_head_dim=8, key_block=KEY_BLOCK)
    want = decode_ref(q, k, None, table, lens, v_head_dim=8)
    np.testing.assert_allclose(got, want, **tol("attention", jnp.float32))


@pytest.mark.parametrize("opt", sorted(OPTS))
def test_prefill_xla_matches_reference(opt):
    """Packed chunks of 1, 15, 17 and 7 queries whose sequences already hold 0, 20, 9 and 33
    tokens (chunked prefill), 3 padding rows, tiles of 8 queries (a chunk spans several)."""
    qlens, ctx = [1, 15, 17, 7], [0, 20, 9, 33]
    lens = [a + b for a, b in zip(qlens, ctx, strict=True)]
    k, v, table, sl = paged(lens, seed=3)
    t = sum(qlens) + 3
    q = jnp.asarray(np.random.default_rng(4).standard_normal((t, HQ, D)), jnp.float32)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(qlens)]), jnp.int32)
    o = _opts(opt)
    got = prefill_xla(q, k, v, table, cu, sl, tile=8, key_block=KEY_BLOCK,
                                   **_xla(o))  # fmt: skip
    want = prefill_ref(q, k, v, table, cu, sl, **o)
    assert got.shape == (t, HQ, D) and np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(got, want, **tol("prefill", jnp.float32))
    np.testing.assert_array_equal(np.asarray(got[-3:]), 0.0)
    assert np.abs(np.asarray(got[:-3])).min(axis=(1, 2)).max() > 0  # rows not zeroed


def test_prefill_xla_latent_cache():
    """MLA's latent layout in prefill (values = the first 8 of the 16 key columns)."""
    qlens = [5, 12]
    k, _, table, sl = paged(qlens, seed=5)
    q = jnp.asarray(np.random.default_rng(6).standard_normal((17, HQ, D)), jnp.float32)
    cu = jnp.asarray([0, 5, 17], jnp.int32)
    got = prefill_xla(q, k, None, table, cu, sl, v_head_dim=8, tile=8,
                                   key_block=KEY_BLOCK)  # fmt: skip
    want = prefill_ref(q, k, None, table, cu, sl, v_head_dim=8)
    np.testing.assert_allclose(got, want, **tol("prefill", jnp.float32))


def test_fp8_block_quant_xla_is_the_reference_bit_for_bit():
    """Rows with a zero block (the 1e-4 floor), a block past 448 x the floor, a partial last
    block (K = 200); bf16 input as `linear` gives it."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 200)).astype(np.float32) * np.array([[1e-3], [1], [30], [1], [1]])
    x[3, :128] = 0.0
    x = jnp.asarray(x, jnp.bfloat16)
    q, s = fp8_block_quant_xla(x)
    rq, rs = fp8_block_quant_reference(x)
    np.testing.assert_array_equal(np.asarray(s), np.asarray(rs))
    np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32)),
                                  np.asarray(rq.astype(jnp.float32)))  # fmt: skip


def test_fp8_block_matmul_xla():
    """Against the grouped GEMM folder's block-matmul reference (vLLM's
    `native_w8a8_block_matmul`). Tolerance: both sum the same K = 384 f32 terms (an e4m3
    value times an f32 scale, per block) in different orders and groupings, so they differ by
    at most about K * 2^-24 * sum|terms| per output; the test computes sum|terms| and allows
    twice that (the scale products themselves are rounded once more on either side)."""
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.standard_normal((6, 384)), jnp.bfloat16)
    xq, xs = fp8_block_quant_reference(x)
    wq = jnp.asarray(rng.standard_normal((200, 384)) * 100, jnp.float8_e4m3fn)
    ws = jnp.asarray(rng.uniform(0.001, 0.01, (2, 3)), jnp.float32)
    got = fp8_block_matmul_xla(xq, xs, {"w": wq, "scale_inv": ws})
    want = block_matmul_reference(xq, wq, xs, ws)
    xd = np.asarray(xq.astype(jnp.float32)) * np.repeat(np.asarray(xs), 128, 1)
    wd = np.asarray(wq.astype(jnp.float32)) * np.repeat(np.repeat(np.asarray(ws), 128, 0),
                                                        128, 1)[:200]  # fmt: skip
    bound = 384 * 2.0**-24 * (np.abs(xd) @ np.abs(wd).T)
    assert np.all(np.abs(np.asarray(got) - want) <= 2 * bound)
    assert np.abs(want).max() > 1.0


def test_jit_shapes_only_trace():
    """The XLA attention traces under `jit` with abstract lengths (what the steps do)."""
    k, v, table, lens = paged([3, 9])
    q = jnp.zeros((2, HQ, D), jnp.float32)
    out = jax.jit(xa.decode_attention_xla)(q, k, v, table, lens)
    assert out.shape == (2, HQ, D)


def test_grouped_gemm_xla():
    """Groups of 0, 5, 0, 17 and 3 rows (an empty first and middle group, a group over two
    tiles), 2 padding rows (zeros), weights read at an offset of 2 (a scanned layer's
    experts). bf16 inputs: the f32 products are exact, the sums differ from the float64
    reference by the f32 accumulation (K = 48 terms: 48 * 2^-24 relative to sum|terms|)."""
    rng = np.random.default_rng(9)
    sizes = jnp.asarray([0, 5, 0, 17, 3], jnp.int32)
    lhs = jnp.asarray(rng.standard_normal((27, 48)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((7, 48, 24)), jnp.bfloat16)
    got = jax.jit(grouped_gemm_xla, static_argnames="out_dtype")(
        lhs, rhs, sizes, out_dtype=jnp.float32, group_offset=2)
    want = grouped_gemm_reference(lhs, rhs[2:], sizes)
    terms = grouped_gemm_reference(np.abs(np.asarray(lhs, np.float32)),
                                   np.abs(np.asarray(rhs[2:], np.float32)), sizes)  # fmt: skip
    assert np.all(np.abs(np.asarray(got) - want) <= 48 * 2.0**-24 * terms + 1e-30)
    np.testing.assert_array_equal(np.asarray(got[25:]), 0.0)
    assert np.abs(want[:25]).min(axis=1).max() > 0


def test_grouped_gemm_fp8_xla():
    """The FP8 experts: rows `x[row_ids]` quantized 1 x 128, per group the block matmul of the
    reference (`block_matmul_reference` on `token_group_quant`'s reciprocal rounding, the
    kernels'). Bound as in `test_fp8_block_matmul_xla` (K = 256)."""
    rng = np.random.default_rng(10)
    x = jnp.asarray(rng.standard_normal((6, 256)), jnp.bfloat16)
    row_ids = jnp.asarray([3, 0, 5, 1, 1, 2, 4, 0], jnp.int32)
    sizes = jnp.asarray([3, 0, 5], jnp.int32)
    w = jnp.asarray(rng.standard_normal((3, 136, 256)) * 50, jnp.float8_e4m3fn)
    ws = jnp.asarray(rng.uniform(0.001, 0.01, (3, 2, 2)), jnp.float32)
    got = np.asarray(grouped_gemm_fp8_xla(x, w, ws, sizes, row_ids=row_ids,
                                          out_dtype=jnp.float32))  # fmt: skip
    xq, xs = fp8_block_quant_reference(x)
    xq, xs = np.asarray(xq)[np.asarray(row_ids)], np.asarray(xs)[np.asarray(row_ids)]
    start = 0
    for e, n in enumerate([3, 0, 5]):
        rows = slice(start, start + n)
        want = block_matmul_reference(xq[rows], w[e], xs[rows], ws[e])
        xd = xq[rows].astype(np.float32) * np.repeat(xs[rows], 128, 1)
        wd = np.asarray(w[e].astype(jnp.float32)) * np.repeat(np.repeat(np.asarray(ws[e]), 128,
                                                                        0), 128, 1)[:136]  # fmt: skip
        bound = 256 * 2.0**-24 * (np.abs(xd) @ np.abs(wd).T)
        assert np.all(np.abs(got[rows] - want) <= 2 * bound), e
        start += n


def _ssd_inputs(seed=11):
    rng = np.random.default_rng(seed)
    t, h, p, g, n = 23, 4, 8, 2, 16
    f = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    return dict(x=f(t, h, p), dt=f(t, h), A=-jnp.exp(f(h)), B=f(t, g, n), C=f(t, g, n)), dict(
        D=f(h), dt_bias=f(h), dt_softplus=True, initial_states=f(3, h, p, n),
        cu_seqlens=jnp.asarray([0, 9, 9, 23], jnp.int32))  # fmt: skip


def test_ssd_scan_xla_matches_the_chunked_reference():
    """Three sequences of 9, 0 and 14 tokens from random initial states, against the chunked
    reference (another algorithm: chunks of 8 from each sequence's start); tolerance "ssd"
    (the same sums in another order; derivation in the table)."""
    arrays, opts = _ssd_inputs()
    y, final = jax.jit(ssd_scan_xla, static_argnames="dt_softplus")(**arrays, **opts)
    ry, rf = ssd_chunked_reference(**arrays, **opts, chunk_size=8)
    np.testing.assert_allclose(y, ry, **tol("ssd", jnp.float32))
    np.testing.assert_allclose(final, rf, **tol("ssd", jnp.float32))
    np.testing.assert_array_equal(np.asarray(final[1]), np.asarray(opts["initial_states"][1]))


def test_ssd_state_update_xla():
    """The decode step on rows 0..2 of a 5-row cache (rows 3, 4 untouched)."""
    arrays, opts = _ssd_inputs(12)
    state = opts["initial_states"][jnp.asarray([0, 1, 2, 0, 1])] * 0.5
    step = {k: v[:3] for k, v in arrays.items() if k not in ("A",)}
    kw = dict(D=opts["D"], dt_bias=opts["dt_bias"], dt_softplus=True)
    y, new = ssd_state_update_xla(state, A=arrays["A"], **step, **kw)
    ry, rnew = ssd_state_update_reference(state, A=arrays["A"], **step, **kw)
    np.testing.assert_allclose(y, ry, **tol("ssd", jnp.float32))
    np.testing.assert_allclose(new, rnew, **tol("ssd", jnp.float32))
    np.testing.assert_array_equal(np.asarray(new[3:]), np.asarray(state[3:]))


def _gdn_inputs(seed=13):
    rng = np.random.default_rng(seed)
    t, h, hv, d = 13, 2, 4, 8
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return dict(q=f(t, h, d), k=f(t, h, d), v=f(t, hv, d), g=-np.abs(f(t, hv)) * 0.3,
                beta=1 / (1 + np.exp(-f(t, hv)))), f(3, hv, d, d)  # fmt: skip


def test_gdn_scan_and_step_xla_match_the_sequential_reference():
    """Sequences of 5, 0 and 8 tokens from random states (GVA 2:1, l2-normalised q and k),
    against the float64 recurrence; then one decode step on rows 0..1 of the final states.
    Tolerance: f32 against float64 over at most 8 steps of `h += k v'^T` with |h| ~ 1 and
    unit q, k: a few f32 roundings per step, 1e-5 absolute (and relative) is 80 ulps."""
    arrays, init = _gdn_inputs()
    cu = np.asarray([0, 5, 5, 13], np.int32)
    o, final = jax.jit(gdn_scan_xla, static_argnames="use_qk_l2norm")(
        **{k: jnp.asarray(v) for k, v in arrays.items()}, cu_seqlens=jnp.asarray(cu),
        initial_states=jnp.asarray(init), use_qk_l2norm=True)  # fmt: skip
    ro, rf = gdn_sequential_reference(**arrays, cu_seqlens=cu, initial_states=init,
                                      use_qk_l2norm=True)  # fmt: skip
    np.testing.assert_allclose(o, ro, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(final, rf, atol=1e-5, rtol=1e-5)
    step = {k: v[5:7] for k, v in arrays.items()}  # two rows' next tokens
    o1, s1 = gdn_state_update_xla(jnp.asarray(rf, jnp.float32), **step, use_qk_l2norm=True)
    ro1, rs1 = gdn_sequential_reference(**{k: v for k, v in step.items()},
                                        cu_seqlens=[0, 1, 2], initial_states=rf[:2],
                                        use_qk_l2norm=True)  # fmt: skip
    np.testing.assert_allclose(o1, ro1, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(s1[:2], rs1, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(s1[2]), rf[2].astype(np.float32))


def test_kernel_backend_choice_is_checked_and_auto_resolves():
    """`kernels` names the field in its error; `"auto"` is `"xla"` on this CPU backend;
    `load_pretrained` refuses a bad value before it reads the checkpoint."""
    from jaxarena.models import load_pretrained
    from jaxarena.models.core.kernels import check_kernels, resolve_kernels

    assert jax.default_backend() == "cpu"
    assert resolve_kernels("auto") == "xla"
    assert resolve_kernels("pallas") == "pallas"
    with pytest.raises(ValueError, match="Env.kernels='triton'"):
        check_kernels("triton", "Env.kernels")
    with pytest.raises(ValueError, match="kernels='cuda' must be one of"):
        load_pretrained("/nonexistent", max_batch_tokens=8, max_seq_len=8, max_batch_size=1,
                        kernels="cuda")  # fmt: skip
