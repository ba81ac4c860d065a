"""The kernels' plain-`jnp` references under `jax.jit`, for the tests' comparisons.

A reference run eagerly dispatches (and on first sight of a shape compiles) each of its ~25
`jnp` ops one by one: ~1.5 s of CPU per new shape. Under `jax.jit` it is one XLA program,
compiled once per (shapes, dtypes, static options) and kept in the jit cache for the whole
session: ~0.4 s. The function is the same; the options that select code paths are static.
Tests that check a reference itself against an independent model call the eager function.
"""

from __future__ import annotations

import jax

from pallas_kernels.fp8_block_quant import fp8_block_quant_reference
from pallas_kernels.splitk_decode_attention import (
    paged_decode_attention_reference,
    paged_decode_logits_reference,
)

__all__ = ["attention_ref", "fp8_quant_ref", "logits_ref"]

attention_ref = jax.jit(
    paged_decode_attention_reference,
    static_argnames=("sm_scale", "softcap", "window_size", "v_head_dim", "return_lse"),
)
logits_ref = jax.jit(
    paged_decode_logits_reference, static_argnames=("sm_scale", "softcap", "window_size")
)
fp8_quant_ref = jax.jit(
    fp8_block_quant_reference, static_argnames=("block_size", "scale_format", "scale_layout")
)
