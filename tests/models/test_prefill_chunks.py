"""A prefill longer than `ArenaLM.prefill_chunk` runs as token chunks through every layer (its
XLA temp that of one chunk): the same logits and tokens as the one-pass prefill.

Bound. The chunked and the one-pass runs of the same bf16 checkpoint round the same values on
the same path: each chunk's attention reads the earlier chunks' keys from the bf16 KV cache,
where the one pass reads its own keys from the same cache (the prefill kernel reads the cache
in both); only the GEMMs' row counts differ. Each is within `atol` (test_pretrained.bf16_atol,
derived there) of the exact float32 values, hence within `2 * atol` of each other; tokens are
compared where the one pass's top-2 gap exceeds `4 * atol` and the earlier tokens agree.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, NEW_TOKENS
from test_pretrained import bf16_atol, decided_and_same_context, top2_gap

from jaxarena.models import load_pretrained

# generate's prefill is padded to max_batch_tokens = 64 tokens: 64 = 2 x 24 + 16, two chunks
# under the scan and a remainder; chunk ends fall inside prompts and inside KV pages (16).
CHUNK = 24


@pytest.mark.parametrize("name", ["llama"])
def test_prefill_in_token_chunks_matches_one_pass(runs, name):
    one = runs.run(name)
    lm = load_pretrained(CHECKPOINTS / name, **LIMITS, prefill_chunk=CHUNK,
                         compiler_options=FAST_CPU_COMPILE)  # fmt: skip
    assert lm.model.prefill_chunk_tokens(LIMITS["max_batch_tokens"]) == CHUNK
    assert runs.lm(name).model.prefill_chunk_tokens(LIMITS["max_batch_tokens"]) is None
    prompts = one["ref"]["prompts"]
    atol = bf16_atol(runs.lm(name), one["ref"])
    # Every position's logits (all_logits: the rows of every chunk), within 2 atol.
    got_rows = [lm.prefill_logits(p) for p in prompts]
    for got, want in zip(got_rows, one["prefill"], strict=True):
        np.testing.assert_allclose(got, want, atol=2 * atol, rtol=0)
    got_tokens, got = lm.generate(prompts, NEW_TOKENS, return_logits=True)
    got_tokens, want_tokens, want = np.asarray(got_tokens), one["tokens"], one["logits"]
    same = decided_and_same_context(np.inf, got_tokens, want_tokens, -np.inf)
    assert same[:, 0].all()
    np.testing.assert_allclose(got[same], want[same], atol=2 * atol, rtol=0)
    mask = decided_and_same_context(top2_gap(want), got_tokens, want_tokens, 4 * atol)
    assert mask.sum() >= 0.2 * mask.size, f"only {mask.sum()} of {mask.size} choices decided"
    np.testing.assert_array_equal(got_tokens[mask], want_tokens[mask])


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "all"])
def test_a_bad_prefill_chunk_is_refused(runs, bad):
    with pytest.raises(ValueError, match="prefill_chunk"):
        dataclasses.replace(runs.lm("llama").model, prefill_chunk=bad)
