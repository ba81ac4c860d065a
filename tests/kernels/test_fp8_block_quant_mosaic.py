"""The FP8 block quantizer's Mosaic GPU backend (`backend="mosaic_gpu"`) against the reference,
and the Pallas-Triton deprecation the backend prepares for.

The Mosaic GPU kernel runs in jax's Mosaic GPU interpreter on the CPU (jax >= 0.12: SMEM, TMA
copies and barriers simulated) and must match the plain-jnp reference bit for bit, as the
Triton kernel does: same arithmetic, and in interpret mode the same XLA divisions. Each case is
one to three 64-row tiles (the interpreter runs every grid step through host callbacks). On a
jax without the interpreter the backend raises NotImplementedError and the comparisons skip
with the reason.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.lowering import cuda_lowering_text

from pallas_kernels.fp8_block_quant import fp8_block_quant, fp8_block_quant_reference
from pallas_kernels.fp8_block_quant.kernel_mosaic import mosaic_gpu_unavailable

UNAVAILABLE = mosaic_gpu_unavailable()
needs_mosaic = pytest.mark.skipif(
    UNAVAILABLE is not None, reason=f"no Mosaic GPU interpreter: {UNAVAILABLE}"
)


def _activations(seed: int, m: int, k: int, dtype, block_size: int) -> jax.Array:
    """Rows and columns spread over 2^-10..2^10 (e4m3 subnormals inside a block), an all-zero
    block (the floor scale) and a block with one value near the dtype's max."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-5, 5, (m, 1)))
    x *= np.exp2(rng.integers(-5, 5, (1, k)))
    x[1, :block_size] = 0.0
    x[2, block_size // 2] = float(jnp.finfo(dtype).max) * 0.75
    return jnp.asarray(x.astype(np.float32), dtype)


def _bits(a: jax.Array) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32)


CASES = {
    # name: (M, K, dtype, block_size, scale_format, scale_layout)
    "bf16_b128_row": (20, 300, jnp.bfloat16, 128, "f32", "row"),
    "f32_b64_ue8m0_col": (70, 128, jnp.float32, 64, "ue8m0", "col"),
    "f16_b48_packed": (9, 96, jnp.float16, 48, "ue8m0", "packed_ue8m0"),
}


@needs_mosaic
@pytest.mark.parametrize("name", list(CASES))
def test_mosaic_gpu_matches_the_reference_bit_for_bit(name):
    m, k, dtype, block, fmt, layout = CASES[name]
    x = _activations(len(name), m, k, dtype, block)
    kw = dict(block_size=block, scale_format=fmt, scale_layout=layout)
    q, s = fp8_block_quant(x, backend="mosaic_gpu", interpret=True, **kw)
    q_ref, s_ref = fp8_block_quant_reference(x, **kw)
    assert q.dtype == jnp.float8_e4m3fn and q.shape == (m, k)
    assert s.dtype == s_ref.dtype and s.shape == s_ref.shape
    np.testing.assert_array_equal(_bits(q), _bits(q_ref))
    np.testing.assert_array_equal(_bits(s), _bits(s_ref))


@pytest.mark.skipif(UNAVAILABLE is None, reason="this jax has the Mosaic GPU interpreter")
def test_mosaic_gpu_without_the_interpreter_says_so():
    x = jnp.ones((4, 128), jnp.bfloat16)
    with pytest.raises(NotImplementedError, match="mosaic_gpu"):
        fp8_block_quant(x, backend="mosaic_gpu", interpret=True)


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="backend must be one of"):
        fp8_block_quant(jnp.ones((4, 128), jnp.bfloat16), backend="cuda")


def test_triton_still_lowers_and_its_deprecation_is_a_warning():
    """The trigger of the README's migration plan: jax 0.12 deprecates Pallas-Triton with a
    DeprecationWarning (pyproject's filter silences exactly this message). This fails when a
    jax removes the backend (no Triton custom call), makes the warning an error, or rewords
    it (then the filter no longer matches): time to switch the default backend."""
    x = jax.ShapeDtypeStruct((20, 256), jnp.bfloat16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        text = cuda_lowering_text(functools.partial(fp8_block_quant, interpret=False), x)
    assert "__gpu$xla.gpu.triton" in text
    triton = [w for w in seen if "Pallas Triton backend is deprecated" in str(w.message)]
    if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 12):
        assert triton, [str(w.message) for w in seen]
    assert all(w.category is DeprecationWarning for w in triton)
