"""Chunked prefill: prompts longer than `max_batch_tokens` are prefilled in pieces that attend
to the earlier pieces through the KV cache, then decoded.

Bound. The chunked run and the single-pass run (the session's fixture run, larger limits) of
the same bf16 checkpoint round the same values on the same path (the prefill kernel reads
the same cached keys in the same order); only the row counts of the GEMMs differ. Each is
within `atol` (test_pretrained.bf16_atol, derived there) of the exact float32 values, hence
within `2 * atol` of each other; tokens are compared where the single pass's top-2 gap
exceeds `4 * atol` and the earlier tokens agree.
"""

from __future__ import annotations

import numpy as np
import pytest
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, NEW_TOKENS
from test_pretrained import bf16_atol, decided_and_same_context, top2_gap

from jaxarena.models import load_pretrained

# 8 tokens per prefill: with 2 of 4 sequences, 3 padding sequences take one token each, so
# a chunk holds 5 prompt tokens and the 11 + 16 prompt tokens take 6 chunks; a sequence's
# pieces straddle KV pages (16 tokens) and chunk ends.
SMALL = dict(LIMITS, max_batch_tokens=8)


@pytest.mark.parametrize("name", ["llama"])
def test_chunked_prefill_matches_one_pass(runs, name):
    ref_lm = runs.lm(name)
    prompts = [p for p in runs.run(name)["ref"]["prompts"] if len(p) > SMALL["max_batch_tokens"]]
    assert sum(map(len, prompts)) > 3 * SMALL["max_batch_tokens"]
    want_tokens, want = ref_lm.generate(prompts, NEW_TOKENS, return_logits=True)
    lm = load_pretrained(CHECKPOINTS / name, **SMALL, compiler_options=FAST_CPU_COMPILE)
    got_tokens, got = lm.generate(prompts, NEW_TOKENS, return_logits=True)
    assert "prefill_chunk" in lm.compile_seconds and "prefill" not in lm.compile_seconds
    atol = bf16_atol(ref_lm, runs.run(name)["ref"])
    got_tokens, want_tokens = np.asarray(got_tokens), np.asarray(want_tokens)
    same = decided_and_same_context(np.inf, got_tokens, want_tokens, -np.inf)
    assert same[:, 0].all()
    np.testing.assert_allclose(got[same], want[same], atol=2 * atol, rtol=0)
    mask = decided_and_same_context(top2_gap(want), got_tokens, want_tokens, 4 * atol)
    assert mask.sum() >= 0.2 * mask.size, f"only {mask.sum()} of {mask.size} choices decided"
    np.testing.assert_array_equal(got_tokens[mask], want_tokens[mask])
    # The decode step was still traced once.
    assert lm.decode_counter.count == 1


def test_chunked_prefill_of_an_mla_model_matches_one_pass(runs):
    """deepseek_v3 (MLA and a routed MoE layer): the two long prompts prefilled in 8-token
    chunks (each chunk's absorbed attention reads the earlier chunks' latents) against the
    session's one-pass run of all four prompts (lm_runs). Bound as above with
    test_pretrained_mla's atol (its MoE routing term included), on the steps
    test_pretrained_mla compares (decided router margins, earlier tokens equal to
    transformers') whose earlier tokens also agree between the two runs. (Measured: all 16
    steps compared, within 0.016 of each other against 2 atol = 1.11; the 16 tokens equal.)
    About 9 s on top of the session's deepseek_v3 run."""
    from test_pretrained_mla import atol_of, greedy_mask

    name = "deepseek_v3"
    r, ref_lm = runs.run(name), runs.lm(name)
    long = [i for i, n in enumerate(r["ref"]["prompt_lengths"]) if n > SMALL["max_batch_tokens"]]
    assert len(long) == 2
    lm = load_pretrained(CHECKPOINTS / name, **SMALL, compiler_options=FAST_CPU_COMPILE)
    got_tokens, got = lm.generate([r["ref"]["prompts"][i] for i in long], NEW_TOKENS,
                                  return_logits=True)  # fmt: skip
    assert "prefill_chunk" in lm.compile_seconds and "prefill" not in lm.compile_seconds
    want_tokens, want = r["tokens"][long], r["logits"][long]
    atol = atol_of(ref_lm, r["ref"])
    mask = greedy_mask(ref_lm, r)[long]
    mask &= decided_and_same_context(np.inf, np.asarray(got_tokens), want_tokens, -np.inf)
    assert mask[:, 0].all() and mask.sum() >= NEW_TOKENS, mask
    np.testing.assert_allclose(got[mask], want[mask], atol=2 * atol, rtol=0)
    strict = mask & (top2_gap(want) > 4 * atol)
    np.testing.assert_array_equal(np.asarray(got_tokens)[strict], want_tokens[strict])


def test_chunked_prefill_of_a_mamba_model_is_refused():
    lm = load_pretrained(CHECKPOINTS / "mamba2", **SMALL, compiler_options=FAST_CPU_COMPILE)
    with pytest.raises(NotImplementedError, match="chunked prefill.*mamba"):
        lm.generate([list(range(1, 12))], 2)
