"""A Gated DeltaNet model prefilling the mix a serving engine sends: more sequences than the
`gdn_fla_scratch` region has chunk slots, most of them empty and continuing from the cache.

The `qwen3_5_text` fixture at `max_batch_size = 40`, `max_batch_tokens = 64`: the seed's
region holds `ceil(64 / 64) + 16 = 17` chunk slots, and every prefill has `S = 41`
sequences, each non-empty one padded to a whole chunk. Before `gdn_chunked_into` ran in
rounds, any such prefill was refused at trace time ("need up to ... 41 chunk slots").

Bound: the GDN block computes a sequence the same way wherever it sits in the batch (the
same kernels on the same rows; a round boundary carries the f32 state bit for bit), as do
attention and the MLPs; what may differ between two passes is the GEMMs' row placement. Each
pass is within `atol` (test_gdn_pretrained's derivation, with this pass's max |logit| for
max |z|) of the exact values, hence within `2 atol` of each other; the states, which no
logit reads, within FLA's chunk rule (RMS ratio 0.005) of each other, twice it for two runs.
A sequence with no token keeps its cache rows bit for bit.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS
from test_gdn_pretrained import ROUNDINGS
from test_pretrained import U_BF16

from jaxarena.models import load_pretrained

B, T = 40, 64
S = B + 1
CHUNK_RATIO = 0.005  # tests/kernels/test_gdn_chunked.py


def _rms_ratio(got, want) -> float:
    d = np.asarray(got, np.float64) - np.asarray(want, np.float64)
    return float(np.sqrt(np.mean(d * d) / np.mean(np.asarray(want, np.float64) ** 2)))


def test_prefill_with_empty_cached_sequences_and_more_than_the_region_holds():
    """A first pass gives all 40 sequences one token (two for the last) and the padding
    sequence 23 (41 chunk slots, three rounds: `max_batch_size` one-token sequences). The
    engine's pass then continues from the cache: 20 sequences get no token, 19 one token, one
    37, and the padding sequence the last 8 (21 slots, two rounds). Against the same sequences continued from the same cache in two
    separate passes of 10 (each one round, the others empty): logits within 2 atol, GDN
    states within 2x FLA's rule, conv windows equal; the empty sequences' GDN rows unchanged.
    (Measured: logits and states equal bit for bit, atol = 0.133.)"""
    lm = load_pretrained(CHECKPOINTS / "qwen3_5_text",
                         **dict(LIMITS, max_batch_size=B, max_seq_len=64),
                         compiler_options=FAST_CPU_COMPILE)  # fmt: skip
    rng = np.random.default_rng(0)

    def prefill(seqs, cached):
        """One `ArenaLM.prefill` pass of `seqs[s]` (token arrays, possibly empty) for the
        first B sequences; the padding sequence takes the rest of the T tokens."""
        lens = [len(x) for x in seqs] + [T - sum(map(len, seqs))]
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        toks = np.concatenate([*seqs, np.zeros(lens[-1], np.int64)]).astype(np.int32)
        (logits,) = lm._run("prefill_chunk", lm.model.prefill, jnp.asarray(toks),
                            jnp.asarray(cu), lm.block_tables[:S],
                            jnp.asarray(cached, jnp.int32))  # fmt: skip
        gdn = {k: np.asarray(a) for k, a in lm.caches["gdn.000"].items()}
        return np.asarray(logits, np.float32), gdn

    def tokens(n):
        return rng.integers(0, lm.config.vocab_size, n)

    first = [tokens(1) for _ in range(B - 1)] + [tokens(2)]
    _, before = prefill(first, np.zeros(S))
    cached = np.r_[np.ones(B - 1), 2, 0]
    snapshot = jax.tree.map(np.asarray, lm.caches)  # the run donates the caches

    lens = np.ones(B, np.int64)
    empty = np.arange(0, B, 2)
    lens[empty] = 0
    lens[B - 1] = 37
    filled = np.flatnonzero(lens)
    assert len(filled) + 1 > 17 and lens.sum() < T  # more slots than the region; padding
    seqs = [tokens(n) for n in lens]
    logits, gdn = prefill(seqs, cached)

    want_logits = np.zeros_like(logits)
    want = {k: np.zeros_like(a) for k, a in gdn.items()}
    for group in (filled[:10], filled[10:]):
        lm.caches = jax.tree.map(jnp.asarray, snapshot)
        alone = [x if s in group else x[:0] for s, x in enumerate(seqs)]
        lg, g = prefill(alone, cached)
        want_logits[group] = lg[group]
        for k in want:
            want[k][group] = g[k][group]

    n = 1 + sum(ROUNDINGS[k] for k in lm.model.arch.kinds)
    atol = 4 * U_BF16 * math.sqrt(n / 3) * float(np.abs(want_logits[filled]).max())
    np.testing.assert_allclose(logits[filled], want_logits[filled], atol=2 * atol, rtol=0)
    for s in filled:
        assert _rms_ratio(gdn["state"][s], want["state"][s]) < 2 * CHUNK_RATIO, s
    np.testing.assert_array_equal(gdn["conv"][filled], want["conv"][filled])
    for k in ("state", "conv"):
        np.testing.assert_array_equal(gdn[k][empty], before[k][empty])
        assert not np.array_equal(gdn[k][filled], before[k][filled]), k
