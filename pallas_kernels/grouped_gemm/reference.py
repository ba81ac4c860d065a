"""Independent NumPy references of the grouped GEMMs (no Pallas, no kernel helpers).

- `grouped_gemm_reference`: one float64 matmul per group, rows past the sum zero.
- `fp8_moe_reference`: the semantics of vLLM's block-FP8 MoE test reference
  (`tests/kernels/moe/test_block_fp8.py::torch_w8a8_block_fp8_moe`, with
  `native_per_token_group_quant_fp8` and `native_w8a8_block_matmul`), rewritten in NumPy:
  repeat every token top_k times, quantize 1 x 128 (`amax` clamped at 1e-10, scale amax/448,
  clamp to +-448, cast to e4m3), per expert `C += (A_q[:, kb] @ B[nb, kb].T) * As[:, kb] *
  Bs[nb, kb]` in f32, output in the activation dtype, `silu(gate) * up`, quantize again, the
  down projection the same way, then the routing-weighted sum over the top_k copies.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = [
    "block_matmul_reference",
    "fp8_moe_reference",
    "grouped_gemm_reference",
    "token_group_quant_reference",
]

_E4M3 = ml_dtypes.float8_e4m3fn


def grouped_gemm_reference(lhs, rhs, group_sizes) -> np.ndarray:
    """float64 `[M, N]`: `lhs[rows of g] @ rhs[g]` per group, zeros past `sum(group_sizes)`."""
    lhs = np.asarray(lhs, np.float64)
    rhs = np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for g, size in enumerate(np.asarray(group_sizes, np.int64)):
        out[start : start + size] = lhs[start : start + size] @ rhs[g]
        start += size
    return out


def token_group_quant_reference(x, block: int = 128, eps: float = 1e-10,
                                reciprocal: bool = False):  # fmt: skip
    """vLLM's `native_per_token_group_quant_fp8` (f32 math): `(q e4m3 [M, K], s f32[M, nb])`;
    `K` a multiple of `block`.

    `reciprocal=True`: `x * (1 / s)` with the block max floored at 1e-4, the rounding of
    `pallas_kernels.fp8_block_quant` (and DeepSeek-V3's `act_quant`); vLLM divides, which puts
    a few values on the other side of an e4m3 rounding boundary (one e4m3 step, up to 1/16 of
    the value in the top binade).
    """
    x = np.asarray(x, np.float32)
    m, k = x.shape
    g = x.reshape(m, k // block, block)
    floor = np.float32(1e-4 if reciprocal else eps)
    amax = np.maximum(np.abs(g).max(axis=-1, keepdims=True), floor)
    scale = (amax / np.float32(448.0)).astype(np.float32)
    scaled = g * (np.float32(1.0) / scale) if reciprocal else g / scale
    q = np.clip(scaled, -448.0, 448.0).astype(_E4M3)
    return q.reshape(m, k), scale[..., 0]


def block_matmul_reference(a_q, b_q, a_s, b_s, block: int = 128, out_dtype=np.float32):
    """vLLM's `native_w8a8_block_matmul`: `a_q [M, K]`, `b_q [N, K]` e4m3, `a_s f32[M, K/b]`,
    `b_s f32[ceil(N/b), K/b]`; f32 accumulation, result cast to `out_dtype`."""
    a = np.asarray(a_q).astype(np.float32)
    b = np.asarray(b_q).astype(np.float32)
    m, k = a.shape
    n = b.shape[0]
    c = np.zeros((m, n), np.float32)
    for kb in range(k // block):
        ks = slice(kb * block, (kb + 1) * block)
        for nb in range(-(-n // block)):
            ns = slice(nb * block, min((nb + 1) * block, n))
            c[:, ns] += (a[:, ks] @ b[ns, ks].T) * a_s[:, kb : kb + 1] * b_s[nb, kb]
    return c.astype(out_dtype)


def fp8_moe_reference(a, w1, w2, w1_s, w2_s, topk_weight, topk_ids, block: int = 128,
                      out_dtype=ml_dtypes.bfloat16, reciprocal: bool = False) -> np.ndarray:  # fmt: skip
    """`torch_w8a8_block_fp8_moe`'s result `[B, D]` (f32 array of `out_dtype` values).

    `reciprocal`: quantize the activations as `token_group_quant_reference(reciprocal=True)`.

    `a [B, D]`, `w1 e4m3[E, 2I, D]` (gate rows then up rows), `w2 e4m3[E, D, I]`, their
    `[E, ceil(./128), ceil(./128)]` scales, `topk_weight [B, k]`, `topk_ids [B, k]`.
    """
    a = np.asarray(a).astype(out_dtype)
    b, d = a.shape
    topk = topk_ids.shape[1]
    rep = np.repeat(a, topk, axis=0)
    ids = np.asarray(topk_ids).reshape(-1)
    out = np.zeros((b * topk, w2.shape[1]), out_dtype)
    a_q, a_s = token_group_quant_reference(rep, block, reciprocal=reciprocal)
    for e in range(w1.shape[0]):
        mask = ids == e
        if not mask.any():
            continue
        inter = block_matmul_reference(a_q[mask], w1[e], a_s[mask], w1_s[e], block, out_dtype)
        half = inter.shape[1] // 2
        gate, up = inter[:, :half].astype(np.float32), inter[:, half:].astype(np.float32)
        act = (gate / (1.0 + np.exp(-gate)) * up).astype(out_dtype)
        act_q, act_s = token_group_quant_reference(act, block, reciprocal=reciprocal)
        out[mask] = block_matmul_reference(act_q, w2[e], act_s, w2_s[e], block, out_dtype)
    weighted = (
        out.reshape(b, topk, -1).astype(np.float32)
        * np.asarray(topk_weight, np.float32).astype(out_dtype).astype(np.float32)[..., None]
    )
    return weighted.astype(out_dtype).sum(axis=1, dtype=np.float32)
