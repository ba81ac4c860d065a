"""The one tolerance table of the suite, by kernel and dtype.

A bound moves only here, with a comment saying why; tests never loosen a tolerance locally.
"""

from __future__ import annotations

import numpy as np

# (kernel, dtype name) -> dict(atol=..., rtol=...)
TOLERANCES: dict[tuple[str, str], dict[str, float]] = {
    # Split-K attention: f32 accumulates in a different order than the dense reference
    # (per-split partial sums, then a log-sum-exp merge), so it matches to f32 rounding only.
    ("attention", "float32"): dict(atol=1e-5, rtol=0.0),
    # bf16 inputs and a bf16 output: a bf16 ulp is 2^-7 ~ 7.8e-3 on [1, 2) (8 significand
    # bits; the unit roundoff is half of it, 2^-8); the output rounding plus the reference's
    # own f32 path stay within a few ulps.
    ("attention", "bfloat16"): dict(atol=2e-2, rtol=0.0),
    # Paged prefill attention against the dense reference (tests/kernels/test_prefill_attention).
    # f32: the same products summed in another order (key blocks with online rescaling vs one
    # softmax; dot accumulation order). out = sum_t p_t v_t / sum_t p_t is a convex combination
    # of values |v| <= ~4.5 (standard normal, a few hundred draws); reordering n <= 64 terms
    # moves it by at most ~n * 2^-24 * max|v| = 1.7e-5 (worst case; a random walk gives
    # sqrt(n) * ... = 2e-6). Bound: 2e-5. Measured: <= 9.6e-7 (|out| <= 2.6).
    ("prefill", "float32"): dict(atol=2e-5, rtol=0.0),
    # bf16 inputs (exact in the f32 reference), f32 logits and sums, two roundings the
    # reference does not make: each probability to bf16 before P.V (relative 2^-9, so at most
    # 2^-9 * max|v| = 0.009 on the output) and the output to bf16 (half an ulp at |out| < 4:
    # 2^-7 = 0.008). Worst case 0.017; bound 2e-2 (the split-K table entry, same arithmetic).
    # Measured: <= 7.6e-3 (|out| <= 2.9).
    ("prefill", "bfloat16"): dict(atol=2e-2, rtol=0.0),
    # vLLM's MLA decode CPU test grid (issue 29): the tolerances vLLM's test gets from
    # `torch.testing.assert_close`'s defaults for each dtype, kept as they are so that "agrees
    # with vLLM's test" means the same thing here. The test adds one ulp of the (rounded)
    # expected value: the kernel and the reference each round an f32 value to the output
    # dtype once, and two f32 values closer than the tolerance may round to neighbours.
    ("vllm_mla", "float32"): dict(atol=1e-5, rtol=1.3e-6),
    ("vllm_mla", "float16"): dict(atol=1e-5, rtol=1e-3),
    ("vllm_mla", "bfloat16"): dict(atol=1e-5, rtol=1.6e-2),
    # SSD (chunked scan, state passing, decode step) against the sequential recurrence or the
    # chunked reference, f32 throughout: the same sums in another order. An output or a final
    # state sums at most L + N <= 384 f32 terms (a chunk's L <= 256 positions, the carried
    # state's N <= 128 components), and the decay factors exp(segment sum) reassociate
    # cumsums of <= L steps; with u = 2^-24 that moves a value by at most
    # (L + N) u sum|terms| <= 2^-16 sum|terms|. Where the terms do not cancel, sum|terms| ~ |y|:
    # rtol 2^-16; where they cancel, atol 2^-14 allows sum|terms| up to 4 around a small y
    # (a worst-case count: typical orders err by ~sqrt(L + N) u, 20x less). Measured over the
    # SSD test files: largest |difference| 5.0e-5 (at |y| <= 40), at most 2.7e-5 + 1e-5 |y|.
    ("ssd", "float32"): dict(atol=2.0**-14, rtol=2.0**-16),
    # bf16 inputs (both sides read the same bf16 values) and a bf16 output: one rounding of two
    # f32 values that agree within the f32 bound, so at most one bf16 ulp apart, and a bf16
    # ulp is at most 2^-7 |x|; plus the f32 bound for values near 0. Measured: 3.9e-3 |x|.
    ("ssd", "bfloat16"): dict(atol=2.0**-14, rtol=2.0**-7),
    # Batched LoRA matmul (pallas_kernels/lora_bgmv), bf16 inputs (exact in the f32
    # reference; a bf16 x bf16 product is exact in f32), f32 output: the same depth sum in
    # another order (64-deep blocks, then across blocks), which moves it by at most
    # K u sum|terms| (u = 2^-24). The tests draw N(0, 1) inputs of depth K <= 48:
    # sum|terms| <= ~3 K (|x w| has mean 2/pi, a tail to ~3), so <= 2^-24 * 48 * 144 = 4e-4;
    # bound 2^-11 = 4.9e-4. Measured: <= 1.9e-6.
    ("lora", "float32"): dict(atol=2.0**-11, rtol=0.0),
    # Fused decode write (pallas_kernels/qk_rope_kv_write) against its reference or the XLA
    # path: the same bf16 inputs (exact in f32), f32 arithmetic in another form (the reference
    # divides by sqrt(mean + eps) where the kernel multiplies by rsqrt; sums of squares in
    # another order: <= D u relative, u = 2^-24, D <= 128: 2^-17), so the f32 values agree to
    # ~2^-17 relative (rope's two products add at most 2 u |n| more); each side then rounds to
    # bf16 once, and two f32 values that close round to the same bf16 value or to neighbours:
    # one bf16 ulp, <= 2^-7 |y| (8 significand bits). Where rope's difference cancels to a
    # small y the f32 gap is absolute, <= 2^-21 max|n| ~ 5e-6 at the tests' |n| <= 10: atol
    # 2^-16. Measured on CPU (interpret): bit-equal to both in every test case.
    ("qk_rope", "bfloat16"): dict(atol=2.0**-16, rtol=2.0**-7),
    # The same f32 values quantized to e4m3 (FP8 cache: 3 significand bits): one e4m3 ulp,
    # <= 2^-3 |y|; near 0 the subnormal step 2^-9. Measured on CPU: bit-equal.
    ("qk_rope", "float8_e4m3fn"): dict(atol=2.0**-9, rtol=2.0**-3),
    # Reference models (end to end): f32 logits through a few layers.
    ("model", "float32"): dict(atol=1e-4, rtol=1e-4),
    # Reference models storing activations in bf16 buffers, arena vs plain (tiny-hybrid, 6
    # layers, 33 steps x 4 sequences x 512 logits): NOT a derived bound, and it cannot be below
    # the FP8 effect. Both models round at the same points, but f32 reassociation (split-K
    # merge, SSD chunking, conv and norm order) flips an occasional bf16 rounding; next to an
    # e4m3 boundary (or in a block's amax, which rescales 128 values) a flip becomes fresh
    # e4m3 noise, which the later layers carry on. So the two runs differ by quantization
    # noise of the size of the FP8 effect itself: the derivation of tests/models/
    # test_pretrained.py (sigma8 = 2^-4 / sqrt(6) per quantized input, n8 = 4 on the path,
    # max|logit| = 4.3: 4 sigma = 0.88, twice that between two noisy runs) is far above the
    # effect (arena with FP8 vs the plain model without it: max 0.113 / 0.125, RMS 0.022,
    # seeds 0 / 1). Measured arena vs plain: max 0.094 / 0.098, RMS 0.017 / 0.018; without FP8
    # on both sides: max 0.031 / 0.039 (1-2 bf16 ulps). The entry is that envelope (x1.5) and
    # guards only the composition; the FP8 round trips are pinned where they can be:
    # tests/models/test_fp8_k_rounding.py compares one-MLP-layer models with the plain one to
    # one bf16 ulp of the logits (and fails with FP8 off, or on where bf16 is claimed), and
    # tests/models/test_hybrid_e2e.py checks the last MLP's FP8 buffers bit for bit.
    ("model", "bfloat16"): dict(atol=0.15, rtol=0.0),
}


def tol(kernel: str, dtype) -> dict[str, float]:
    """Returns `dict(atol=, rtol=)` for `kernel` at `dtype` (a numpy/jax dtype or name)."""
    return TOLERANCES[(kernel, np.dtype(dtype).name)]
