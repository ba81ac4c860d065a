"""Fixture checkpoints with `kernels="xla"` (every Pallas kernel call of the blocks through its
plain-XLA implementation, `jaxarena.models.core.kernels`) against transformers' outputs,
within the bounds the Pallas runs are held to: qwen3 (dense), mistral_window (sliding
window), qwen3_moe (the grouped GEMM), nemotron_h (hybrid: Mamba-2, attention, relu^2 MLP),
qwen3_next (hybrid: Gated DeltaNet, gated attention), qwen3_fp8 (block-FP8 linears).

Each test loads the fixture with `pallas_call` replaced by a function that fails, so the run
provably calls no Pallas kernel, then generates 3 tokens for the four reference prompts (one
packed prefill: step 0's logits; two decode steps). The bounds and masks are the existing
tests' own (imported, not restated): test_pretrained.py (`bf16_atol`, qwen3 and
nemotron_h; `fp8_sigma` for qwen3_fp8), test_dense_variants.py (`atol`, the worst-case form), test_moe_models.py
(`bf16_atol` with the routing term and its router near-tie masks), test_gdn_pretrained.py
(`atol_of`). Logits are compared where
the sequence's earlier tokens agree with transformers' (after a near-tie flip the contexts
differ); tokens where transformers' top-2 gap exceeds twice the bound. Then
`lm_runs.check_decode_in_place`: the decode step stays one in-place executable.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_dense_variants as dense
import test_gdn_pretrained as gdn
import test_moe_models as moe
import test_pretrained as pretrained
from jax.experimental import pallas as pl
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, check_decode_in_place, reference

from jaxarena.models import load_pretrained

NEW = 3
BOUNDS = {
    "qwen3": pretrained.bf16_atol,
    "mistral_window": dense.atol,
    "qwen3_moe": moe.bf16_atol,
    "nemotron_h": pretrained.bf16_atol,
    "qwen3_next": gdn.atol_of,  # hybrid: Gated DeltaNet and gated attention
    # FP8 linears (the XLA quantizer and block-scaled product): test_pretrained's e4m3 bound.
    "qwen3_fp8": lambda lm, ref: 4 * pretrained.fp8_sigma(lm, ref) + pretrained.bf16_atol(lm, ref),
}


def _no_pallas(*args, **kwargs):
    raise AssertionError("a Pallas kernel was called with kernels='xla'")


def same_context(got, want):
    eq = np.concatenate([np.ones((got.shape[0], 1), bool), got[:, :-1] == want[:, :-1]], 1)
    return np.cumprod(eq, 1).astype(bool)


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_xla_kernels_match_transformers(name, monkeypatch):
    monkeypatch.setattr(pl, "pallas_call", _no_pallas)
    ref = reference(name)
    lm = load_pretrained(CHECKPOINTS / name, **LIMITS, compiler_options=FAST_CPU_COMPILE,
                         kernels="xla")  # fmt: skip
    assert lm.model.env.kernels == "xla"
    tokens, logits = lm.generate(ref["prompts"], NEW, return_logits=True)
    tokens = np.asarray(tokens)
    want, want_logits = ref["greedy_tokens"][:, :NEW], ref["greedy_logits"][:, :NEW]
    atol = BOUNDS[name](lm, ref)
    mask = same_context(tokens, want)
    if name == "qwen3_moe":  # positions before a router near-tie (test_moe_models.decided)
        mask &= np.stack([moe.decided(lm, ref, i)[n - 1 : n - 1 + NEW]
                          for i, n in enumerate(ref["prompt_lengths"])])  # fmt: skip
    assert mask[:, 0].sum() >= 2 and mask.sum() >= 6, mask  # prefill and decode both compared
    np.testing.assert_allclose(logits[mask], want_logits[mask], atol=atol, rtol=0)
    strict = mask & (ref["greedy_top2_gap"][:, :NEW] > 2 * atol)
    np.testing.assert_array_equal(tokens[strict], want[strict])
    # The XLA paths keep the step in place: one traced decode step, the arena at its buffer,
    # guards intact, arena and caches aliased (no "donated buffers were not usable").
    check_decode_in_place(lm, name)
