"""The plain MLA step (benchmarks/plain_step.py: the arena-free reference the step rule is
measured against) on the deepseek_v2 / deepseek_v3 fixtures, held to transformers' float32
logits: the four reference prompts packed into one plain prefill (each prompt's last logits),
then one plain decode step fed transformers' first greedy token (its logits against
transformers' second greedy row). So the plain step is checked to be the same model as the
arena form (held to the same reference by tests/models/test_pretrained_mla.py), not only to
compile like it.

Bound: test_pretrained_mla.py's (test_moe_models.py's model: each bf16 rounding a uniform
relative error u = 2^-9 carried to the logits with gain <= 1, four standard deviations of the
sum, plus the MoE routing term), with the plain step's own roundings counted:
  - MLA: the pre-norm, the `o_proj` GEMM's bf16 output (it stands where the arena form rounds
    the residual `hidden_states`), the `[T, H v]` rows, the kernel's bf16 latent output; in
    prefill also the probabilities the prefill kernel rounds to bf16 for P.V (split-K keeps
    them exact) (5 at most). Before the attention logits, counted twice
    (test_pretrained_mla.py): the q GEMM output, q after RoPE, the absorbed query, the `kv_a`
    GEMM output, the bf16 latent cache (5); with a q LoRA the `q_a` GEMM output and the normed
    q latent (2 more). 5 + 2 * 5 = 15, 19 with a q LoRA.
  - The dense MLP and the MoE block: the arena form's counts (6 and 11), upper bounds of the
    plain step's (pre-norm, gate / up / product / down GEMM outputs: 5; the MoE block rounds
    only the pre-norm, the expert activations and its shared expert's four values: 6).
  - The head: the final norm's bf16 rows and the bf16 GEMM output (2; the arena form's 1).
Near-ties as test_pretrained_mla.py (positions past a router margin below `2 delta` are not
compared; the fixture prompts have none).

Measured when written (largest difference / bound; the arena form's bound, atol_of, is
0.678 / 0.556, the routing term most of it): deepseek_v2 prefill 0.104, decode 0.084 / 0.717;
deepseek_v3 prefill 0.051, decode 0.052 / 0.612; 4 of 4 decode rows compared in both.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_runs import reference
from test_moe_models import U_BF16, decided, max_abs_logit, router_sigmas
from test_moe_models import block_roundings as moe_block_roundings

from jaxarena.models.blocks.mla import MLA

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from plain_step import plain_decode_step, plain_prefill  # noqa: E402

FIXTURES = ("deepseek_v2", "deepseek_v3")


def plain_count(config):
    """`block -> bf16 roundings` of the plain step (module docstring)."""
    mla = 5 + 2 * 5 + (4 if config.q_lora_rank else 0)
    return lambda b: mla if isinstance(b, MLA) else moe_block_roundings(b)


def plain_atol(lm, ref) -> float:
    """`4 max|logit| sqrt(u^2 n / 3 + (1 - 1 / k) sum sigma_z^2)` with the plain count."""
    count = plain_count(lm.config)
    k = lm.config.num_experts_per_tok
    routing = (1 - 1 / k) * float(np.sum(router_sigmas(lm, ref, count) ** 2))
    n = 2 + sum(count(b) for b in lm.model.arch.blocks)  # + the head's 2
    return 4 * math.sqrt(U_BF16**2 * n / 3 + routing) * max_abs_logit(ref)


@pytest.mark.parametrize("name", FIXTURES)
def test_plain_mla_step_matches_transformers(runs, name):
    lm, ref = runs.lm(name), reference(name)
    m, count = lm.model, plain_count(lm.config)
    atol = plain_atol(lm, ref)
    assert atol < max_abs_logit(ref) / 8  # well below the logits' spread
    lens = np.asarray(ref["prompt_lengths"], np.int32)
    s, per = len(lens), m.max_seq_len // m.kv_block_size
    tokens = jnp.asarray(np.concatenate(ref["prompts"]), jnp.int32)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    tables = jnp.arange(s * per, dtype=jnp.int32).reshape(s, per)
    caches = m.init_caches(num_blocks=s * per, rows=s)
    caches, got = jax.jit(functools.partial(plain_prefill, m))(lm.params, caches, tokens, cu,
                                                               tables)  # fmt: skip
    want = np.stack([p[-1] for p in ref["prefill"]])
    for i, n in enumerate(lens):
        assert decided(lm, ref, i, count)[:n].all(), f"near-tie in prompt {i}"
    np.testing.assert_allclose(np.asarray(got), want, atol=atol, rtol=0)
    # One decode step on transformers' first greedy token, at position len(prompt).
    nxt = jnp.asarray(ref["greedy_tokens"][:, 0], jnp.int32)
    pos = jnp.asarray(lens)
    _, got, _ = jax.jit(functools.partial(plain_decode_step, m))(lm.params, caches, nxt, pos,
                                                                 tables, pos + 1)  # fmt: skip
    ok = np.array([decided(lm, ref, i, count)[n] for i, n in enumerate(lens)])
    assert ok.sum() >= 3, f"only {ok.sum()} of {s} decode rows free of near-ties"
    np.testing.assert_allclose(np.asarray(got)[ok], ref["greedy_logits"][ok, 1], atol=atol,
                               rtol=0)  # fmt: skip
