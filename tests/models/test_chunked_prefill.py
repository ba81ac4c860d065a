"""Chunked prefill: prompts longer than `max_batch_tokens` are prefilled in pieces that attend
to the earlier pieces through the KV cache (attention) or continue from the cached conv window
and state (Mamba-2, Gated DeltaNet), then decoded.

Bound. The chunked run and the single-pass run (the session's fixture run, larger limits) of
the same bf16 checkpoint round the same values on the same path (the prefill kernel reads
the same cached keys in the same order); only the row counts of the GEMMs differ. Each is
within `atol` (test_pretrained.bf16_atol, derived there) of the exact float32 values, hence
within `2 * atol` of each other; tokens are compared where the single pass's top-2 gap
exceeds `4 * atol` and the earlier tokens agree. The SSM blocks round the same values too:
their conv reads the same float32 pre-conv inputs from the window, the scans start from the
float32 state the previous chunk left (the kernels' bf16 intermediates, counted in `atol`,
are the same kinds at other chunk boundaries), so the argument and bound are unchanged.
`atol` is test_pretrained.bf16_atol, or test_gdn_pretrained.atol_of for the GDN models.

`prefill_conv` alone is checked against a plain NumPy conv of the whole sequences, the
sequences cut into pieces of 0, 1, 2 and more tokens and continued through the window.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, NEW_TOKENS
from test_gdn_pretrained import atol_of
from test_pretrained import bf16_atol, decided_and_same_context, top2_gap

from jaxarena.models import load_pretrained
from jaxarena.models.blocks import Mamba2
from jaxarena.models.blocks.base import StepContext
from jaxarena.models.blocks.causal_conv import cached_or_zeros, prefill_conv

# 8 tokens per prefill: with 2 of 4 sequences, 3 padding sequences take one token each, so
# a chunk holds 5 prompt tokens and the 11 + 16 prompt tokens take 6 chunks; a sequence's
# pieces straddle KV pages (16 tokens) and chunk ends. Pieces: the 11-token prompt 5, 5, 1,
# then 0 in the last 3 chunks (its state and window must stay for decode); the 16-token one
# 0, 0, 4, 5, 5, 2, so an SSM block's conv reads 3, 3, 1 taps from the window.
SMALL = dict(LIMITS, max_batch_tokens=8)
# Fraction of the 16 greedy choices that must be decided (top-2 gap over 4 atol, same
# context), so that the token comparison is not vacuous. Measured: llama 6 of 16, qwen3_next 4
# (its first choice of prompt 0 is a near-tie, gap 0.016, that the chunk's roundings flip, so
# that row continues another sequence), mamba2 2 (the tiny fixture's gaps: median 0.16, 4
# atol 0.45). The logits themselves are compared at every same-context step.
DECIDED_FLOOR = {"llama": 0.2, "mamba2": 0.1, "qwen3_next": 0.2}


@pytest.mark.parametrize("name", list(DECIDED_FLOOR))
def test_chunked_prefill_matches_one_pass(runs, name):
    ref_lm = runs.lm(name)
    prompts = [p for p in runs.run(name)["ref"]["prompts"] if len(p) > SMALL["max_batch_tokens"]]
    assert sum(map(len, prompts)) > 3 * SMALL["max_batch_tokens"]
    want_tokens, want = ref_lm.generate(prompts, NEW_TOKENS, return_logits=True)
    lm = load_pretrained(CHECKPOINTS / name, **SMALL, compiler_options=FAST_CPU_COMPILE)
    got_tokens, got = lm.generate(prompts, NEW_TOKENS, return_logits=True)
    assert "prefill_chunk" in lm.compile_seconds and "prefill" not in lm.compile_seconds
    ref = runs.run(name)["ref"]
    atol = atol_of(ref_lm, ref) if "gdn" in ref_lm.model.arch.kinds else bf16_atol(ref_lm, ref)
    got_tokens, want_tokens = np.asarray(got_tokens), np.asarray(want_tokens)
    same = decided_and_same_context(np.inf, got_tokens, want_tokens, -np.inf)
    assert same[:, 0].all()
    np.testing.assert_allclose(got[same], want[same], atol=2 * atol, rtol=0)
    mask = decided_and_same_context(top2_gap(want), got_tokens, want_tokens, 4 * atol)
    assert mask.sum() >= DECIDED_FLOOR[name] * mask.size, (
        f"only {mask.sum()} of {mask.size} choices decided"
    )
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


def test_chunked_prefill_of_an_unchunked_block_is_refused(monkeypatch):
    """A model with a block that declares no `chunked_prefill` refuses prompts over
    `max_batch_tokens` before compiling anything (every block kind now continues chunks, so
    one is made to say it cannot)."""
    monkeypatch.setattr(Mamba2, "chunked_prefill", False)
    lm = load_pretrained(CHECKPOINTS / "mamba2", **SMALL, compiler_options=FAST_CPU_COMPILE)
    assert lm.model.unchunked_kinds == ("mamba",)
    with pytest.raises(NotImplementedError, match="chunked prefill.*mamba"):
        lm.generate([list(range(1, 12))], 2)
    assert lm.compile_seconds == {}


def _np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Causal depthwise conv of one whole sequence `x [n, D]` (zeros before it)."""
    k = w.shape[0]
    xp = np.concatenate([np.zeros((k - 1, x.shape[1])), x])
    return b + sum(xp[i : i + x.shape[0]] * w[i] for i in range(k))


def test_prefill_conv_continues_from_the_window():
    """Three sequences (20, 3 and 7 inputs) prefilled in four passes, each pass packing every
    sequence's next piece (0, 1, 2, ... tokens; a fourth, padding sequence fills the pass to
    14 rows, as the runtime pads), match the conv of the whole sequences; the window after the
    last pass is each sequence's last K - 1 inputs. A sequence's stale cache row (an earlier
    request's) is ignored while it has no cached token."""
    rng = np.random.default_rng(0)
    k, d, t = 4, 3, 14
    w, b = rng.normal(size=(k, d)), rng.normal(size=d)
    seqs = [rng.normal(size=(n, d)) for n in (20, 3, 7)]
    pieces = [(9, 1, 0), (1, 0, 2), (0, 2, 1), (10, 0, 4)]  # tokens per sequence and pass
    cache = rng.normal(size=(5, k - 1, d))  # stale rows, one spare

    @jax.jit
    def step(x, cache, ctx):
        window = cached_or_zeros(cache, ctx)
        return prefill_conv(x, jnp.asarray(w, jnp.float32), ctx,
                            bias=jnp.asarray(b, jnp.float32), window=window)  # fmt: skip

    done, got = [0, 0, 0], [[], [], []]
    for lens in pieces:
        lens = (*lens, t - sum(lens))
        parts = [x[n0 : n0 + n] for x, n0, n in zip(seqs, done, lens, strict=False)]
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        seq_ids = np.repeat(np.arange(4, dtype=np.int32), lens)
        ctx = StepContext(positions=jnp.zeros(t, jnp.int32), seq_ids=jnp.asarray(seq_ids),
                          block_tables=jnp.zeros((4, 1), jnp.int32), cu_seqlens=jnp.asarray(cu),
                          cached_lens=jnp.asarray([*done, 0], jnp.int32))  # fmt: skip
        x = np.concatenate([*parts, rng.normal(size=(lens[3], d))])
        conv, win = step(jnp.asarray(x, jnp.float32), jnp.asarray(cache, jnp.float32), ctx)
        conv = np.asarray(conv)
        for s in range(3):
            got[s].append(conv[cu[s] : cu[s + 1]])
            done[s] += lens[s]
        cache[:4] = np.asarray(win)
    for s, x in enumerate(seqs):
        # float32 products of O(1) values summed over 4 taps plus a bias: a few ulp.
        np.testing.assert_allclose(np.concatenate(got[s]), _np_conv(x, w, b), atol=1e-5, rtol=0)
        want = np.concatenate([np.zeros((k - 1, d)), x])[-(k - 1) :]
        np.testing.assert_allclose(cache[s], want, atol=1e-6, rtol=0)
