"""The FP8 quantizer's Mosaic GPU backend compiled for an H200 without a GPU (jax >= 0.12).

At the gate's FP8 shape (M=4096 tokens, K=7168, 1 x 128 groups) the Mosaic GPU kernel must
compile deviceless, in at most two launches (the kernel, and XLA's transpose of its
block-major scales into the `"row"` layout), and no Triton custom call left. Temp: the
kernel's block-major scales (`f32[nb, M]`, 917,504 B here) before XLA transposes them, plus at
most 4 KiB of XLA scratch; q is written straight into the output. Its registers are not reported: Mosaic GPU compiles its kernel
inside its own custom call, not through XLA's PTX (README, "Kernels").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from jaxarena.gpu_aot import compile_for_gpu
from pallas_kernels import fp8_block_quant
from pallas_kernels.fp8_block_quant.kernel_mosaic import mosaic_gpu_unavailable

KIB = 1 << 10


@pytest.mark.skipif(
    mosaic_gpu_unavailable() is not None,
    reason=f"no Pallas Mosaic GPU backend to compile: {mosaic_gpu_unavailable()}",
)
def test_mosaic_gpu_fp8_compiles_for_h200(h200):
    fn = functools.partial(fp8_block_quant, interpret=False, backend="mosaic_gpu")
    r = compile_for_gpu(fn, jax.ShapeDtypeStruct((4096, 7168), jnp.bfloat16), target=h200,
                        dump_dir=True)  # fmt: skip
    assert "mosaic_gpu" in r.hlo_text and "__gpu$xla.gpu.triton" not in r.hlo_text
    assert r.launches is not None and r.launches <= 2, r.launches
    scales_bytes = (7168 // 128) * 4096 * 4
    assert r.temp_bytes <= scales_bytes + 4 * KIB, r.temp_bytes
    print(f"\nmosaic fp8 h200: {r.launches} launches, temp {r.temp_bytes} B, "
          f"{r.compile_seconds:.1f} s")  # fmt: skip
