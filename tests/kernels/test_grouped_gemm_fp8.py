"""The block-FP8 grouped GEMM: per GEMM against vLLM's `native_w8a8_block_matmul` semantics
(NumPy), and a whole MoE (gate/up, `silu * up`, down, weighted combine) against the semantics of
vLLM's `torch_w8a8_block_fp8_moe` with vLLM's tolerance (atol = rtol = 0.035).

Interpret mode (CPU), small shapes (K multiple of 128, as the checkpoints have).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallas_kernels.fp8_block_quant import fp8_block_quant_reference
from pallas_kernels.grouped_gemm import fp8_moe_reference, grouped_gemm_fp8
from pallas_kernels.grouped_gemm.reference import block_matmul_reference

E4M3 = ml_dtypes.float8_e4m3fn
FP8_MAX = 448.0


def _weights(rng, e, n, k):
    """A checkpoint-like block-FP8 weight: `randn / 10` per expert, each 128 x 128 block
    scaled by `amax / 448` and cast to e4m3 (how Qwen3-30B-A3B-FP8 / DeepSeek-V3 quantize)."""
    wf = (rng.standard_normal((e, n, k)) / 10).astype(np.float32)
    nb, kb = -(-n // 128), -(-k // 128)
    s = np.zeros((e, nb, kb), np.float32)
    w = np.zeros((e, n, k), E4M3)
    for i, j in np.ndindex(nb, kb):
        blk = wf[:, i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
        s[:, i, j] = np.abs(blk).max(axis=(1, 2)) / FP8_MAX
        q = np.clip(blk / s[:, i, j, None, None], -FP8_MAX, FP8_MAX)
        w[:, i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] = q.astype(E4M3)
    return w, s


@functools.cache
def _gemm(gather: bool):
    if gather:
        return jax.jit(lambda x, w, s, gs, ids: grouped_gemm_fp8(x, w, s, gs, row_ids=ids,
                                                                 block_m=16))  # fmt: skip
    return jax.jit(lambda x, w, s, gs: grouped_gemm_fp8(x, w, s, gs, block_m=16))


def test_one_gemm_matches_block_matmul():
    """vLLM's block matmul on the operands our quantizer makes (its own plain-jnp reference:
    `x * (1 / s)`, floor 1e-4, where vLLM divides, floor 1e-10, which moves a few e4m3
    roundings): the only differences left are the f32 sum order (<= K * 2^-24 relative to
    sum |terms|, doubled for the two sums) and the bf16 output (unit roundoff 2^-8)."""
    rng = np.random.default_rng(0)
    m, k, n, g, sizes = 40, 256, 96, 3, [11, 0, 25]
    x = (rng.standard_normal((m, k)) / 10).astype(ml_dtypes.bfloat16)
    w, s = _weights(rng, g, n, k)
    out = np.asarray(_gemm(False)(jnp.asarray(x), jnp.asarray(w), jnp.asarray(s),
                                  jnp.asarray(sizes, jnp.int32)), np.float64)  # fmt: skip
    q, qs = (np.asarray(a) for a in fp8_block_quant_reference(jnp.asarray(x)))
    ref = np.zeros((m, n))
    mag = np.zeros((m, n))
    start = 0
    for e, size in enumerate(sizes):
        rows = slice(start, start + size)
        ref[rows] = block_matmul_reference(q[rows], w[e], qs[rows], s[e])
        mag[rows] = block_matmul_reference(np.abs(q[rows].astype(np.float32)).astype(E4M3),
                                           np.abs(w[e].astype(np.float32)).astype(E4M3),
                                           qs[rows], s[e])  # fmt: skip
        start += size
    bound = 2.0**-8 * np.abs(ref) + k * 2.0**-24 * mag * 2
    assert (np.abs(out - ref) <= bound).all(), np.abs(out - ref).max()
    assert (out[sum(sizes) :] == 0).all()


def _moe(x, w1, s1, w2, s2, weights, ids):
    """The MoE through the kernel: sort the (token, k) pairs by expert, gate/up reading token
    rows (`row_ids = order // top_k`), silu * up in f32 -> bf16, down, unpermute, weighted
    f32 sum."""
    b, topk = ids.shape
    e = w1.shape[0]
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
    h = _gemm(True)(x, w1, s1, sizes, (order // topk).astype(jnp.int32))
    half = h.shape[1] // 2
    g, u = h[:, :half].astype(jnp.float32), h[:, half:].astype(jnp.float32)
    act = (jax.nn.silu(g) * u).astype(jnp.bfloat16)
    y = _gemm(False)(act, w2, s2, sizes)
    unsorted = jnp.zeros_like(y).at[order].set(y)
    wts = weights.astype(jnp.bfloat16).astype(jnp.float32)
    return jnp.sum(unsorted.reshape(b, topk, -1).astype(jnp.float32) * wts[..., None], axis=1)


@pytest.mark.parametrize("b,topk,e,seed", [(13, 2, 4, 1), (6, 3, 8, 2)])
def test_moe_matches_vllm_block_fp8_reference(b, topk, e, seed):
    rng = np.random.default_rng(seed)
    d, inter = 256, 128
    # Unit activations (a normed hidden state): outputs are O(1), so vLLM's atol is not vacuous.
    x = rng.standard_normal((b, d)).astype(ml_dtypes.bfloat16)
    w1, s1 = _weights(rng, e, 2 * inter, d)
    w2, s2 = _weights(rng, e, d, inter)
    score = rng.standard_normal((b, e)).astype(np.float32)
    ids = np.argsort(-score, axis=1, kind="stable")[:, :topk].astype(np.int32)
    p = np.exp(score - score.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    weights = np.take_along_axis(p, ids, 1).astype(np.float32)
    out = np.asarray(_moe(*map(jnp.asarray, (x, w1, s1, w2, s2, weights, ids))), np.float64)
    # vLLM's semantics with our quantizer's rounding (x * (1 / s), floor 1e-4): vLLM divides,
    # which moves an occasional value across an e4m3 rounding boundary; one such step of a
    # large activation shifts a whole output row by up to ~0.06 here, more than the tolerance.
    ref = fp8_moe_reference(x, w1, w2, s1, s2, weights, ids, reciprocal=True)
    ref = ref.astype(np.float64)
    # vLLM's tolerance for its Triton block-FP8 MoE against this reference.
    np.testing.assert_allclose(out, ref, atol=0.035, rtol=0.035)
    assert np.abs(ref).mean() > 0.035  # the outputs are not all below the atol


def test_bad_fp8_input_is_refused():
    x = jnp.zeros((4, 128), jnp.bfloat16)
    w = jnp.zeros((2, 64, 128), jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="scale_inv.shape"):
        grouped_gemm_fp8(x, w, jnp.zeros((2, 1, 2)), jnp.asarray([2, 2]))
    with pytest.raises(ValueError, match="w.dtype"):
        grouped_gemm_fp8(x, w.astype(jnp.bfloat16), jnp.zeros((2, 1, 1)), jnp.asarray([2, 2]))
    with pytest.raises(ValueError, match=r"row_ids\[1\]=4"):
        grouped_gemm_fp8(x, w, jnp.zeros((2, 1, 1)), jnp.asarray([1, 1]),
                         row_ids=jnp.asarray([0, 4]))  # fmt: skip
