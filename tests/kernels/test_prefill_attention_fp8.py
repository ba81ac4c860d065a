"""Paged prefill attention over an FP8 KV cache (issue 37: vLLM's `kv_cache_dtype="fp8"`):
`float8_e4m3fn` pages with f32 scales per tensor or per KV head, against the independent
dense reference, which dequantizes the pages (`scale * page`, f32) before anything else.

Tolerance: the table's "prefill" entry for q's dtype, unchanged. The kernel converts each
e4m3 page to q's dtype, which is exact (3 mantissa bits and exponents 2^-9..2^8 are bf16,
f16 and f32 values), so the dots are those of a cache in q's dtype holding the same values;
the scales add one f32 rounding to each logit (`sm_scale * k_scale` is one factor) and one to
each output (`l / v_scale`), 2^-24 relative, far below either entry. Shapes are the prefill
test's (tiny, interpret mode).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.lowering import cuda_lowering_text
from _helpers.tolerances import tol
from test_prefill_attention import f32, make

from pallas_kernels.prefill_attention import (
    paged_prefill_attention,
    paged_prefill_attention_reference,
)

F8 = jnp.float8_e4m3fn


def fp8_case(dtype, *, seed, **mk):
    """`make`'s case with its cache cast to e4m3 (its NaN poison stays NaN in e4m3fn)."""
    q, k, v, bt, cu, sl = make(dtype=jnp.float32, seed=seed, **mk)
    return q.astype(dtype), k.astype(F8), v.astype(F8), bt, cu, sl


CASES = {
    # name: (q dtype, make kwargs, options). Chunked contexts; per-tensor scales with bf16
    # queries; per-KV-head scales with f32 queries, a window and a group of 3.
    "bf16_per_tensor_chunked": (jnp.bfloat16, dict(ctx=[0, 20, 9, 40]),
                                dict(k_scale=0.1, v_scale=jnp.asarray(0.25, jnp.float32))),
    "f32_per_head_window_group3": (jnp.float32, dict(Hq=6, Hkv=2, ctx=[3, 0, 30, 1]),
                                   dict(k_scale=jnp.asarray([0.05, 0.2], jnp.float32),
                                        v_scale=jnp.asarray([0.5, 0.125], jnp.float32),
                                        window_size=12)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_fp8_cache_matches_the_dequantizing_reference(name):
    dtype, mk, opts = CASES[name]
    args = fp8_case(dtype, seed=7, **mk)
    out = paged_prefill_attention(*args, **opts)
    assert out.dtype == dtype and np.all(np.isfinite(f32(out)))  # stale NaN never read
    expect = paged_prefill_attention_reference(*args, **opts)
    np.testing.assert_allclose(f32(out), f32(expect), **tol("prefill", dtype))
    end = int(args[4][-1])
    np.testing.assert_array_equal(f32(out[end:]), 0.0)  # padding rows
    # The scales are applied (unit scales give another answer).
    unit = {**opts, "k_scale": 1.0, "v_scale": 1.0}
    other = paged_prefill_attention_reference(*args, **unit)
    assert np.abs(f32(other) - f32(expect)).max() > 0.1


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(), r"k_scale is required with a float8_e4m3fn KV cache"),
        (dict(k_scale=1.0), r"v_scale is required with a float8_e4m3fn KV cache"),
        (dict(k_scale=jnp.ones((3,)), v_scale=1.0), r"k_scale.shape=\(3,\) must be \(\), \(1,\)"),
        (dict(k_scale=1.0, v_scale=0.0), r"v_scale must be finite and > 0"),
    ],
)
def test_fp8_scales_are_checked(kw, needle):
    args = fp8_case(jnp.bfloat16, seed=0)
    with pytest.raises(ValueError, match=needle):
        paged_prefill_attention(*args, **kw)


def test_scales_are_refused_for_a_float_cache():
    args = make(seed=0)
    with pytest.raises(ValueError, match=r"k_scale applies to a float8_e4m3fn KV cache only"):
        paged_prefill_attention(*args, k_scale=1.0, v_scale=1.0)


def test_fp8_cache_lowers_for_cuda_as_one_triton_kernel():
    """bf16 queries over e4m3 pages (the model's prefill): one Triton kernel, no XLA-side
    conversion of the cache (the pages reach the kernel as e4m3)."""
    sd = jax.ShapeDtypeStruct
    q, kv = sd((40, 8, 64), jnp.bfloat16), sd((12, 16, 2, 64), F8)
    tables = (sd((3, 4), jnp.int32), sd((4,), jnp.int32), sd((3,), jnp.int32))

    def f(q, k, v, bt, cu, sl):
        return paged_prefill_attention(q, k, v, bt, cu, sl, interpret=False,
                                       k_scale=jnp.float32(0.5), v_scale=jnp.float32(2.0))  # fmt: skip

    text = cuda_lowering_text(f, q, kv, kv, *tables)
    assert len(re.findall(r"__gpu\$xla\.gpu\.triton", text)) == 1
    # The kernel's operands are the e4m3 pages (2-D views); XLA converts nothing.
    assert "tensor<384x64xf8E4M3FN>" in text
    assert not [ln for ln in text.splitlines() if "stablehlo.convert" in ln and "f8E4M3FN" in ln]
