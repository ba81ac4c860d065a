"""Tensor and expert parallelism (`load_pretrained(..., mesh=tp, ep=)`) on the 8 CPU devices
of the test session (tests/conftest.py), against transformers' float32 outputs.

One fixture per block kind: dense attention + SwiGLU MLP (qwen3: tp 2 splits the 2 KV heads,
tp 4 replicates each on 2 devices), MoE (qwen3_moe, an untied LM head: experts split
column-/row-parallel at ep 1, whole experts per device at ep = tp), MLA + MoE (deepseek_v2),
Mamba-2 (mamba2, and the nemotron_h hybrid), Gated DeltaNet with gated attention
(qwen3_next). The fixtures' widths bound the degrees: mamba2/nemotron_h have 2 groups (the
gated RMSNorm's groups must not span devices), qwen3_next 2 key heads.

Tolerance. The sharded step computes what the one-device step does, except that every
block's output is the sum of `tp` per-device partial outputs (the row-parallel output / down
projections over disjoint shares of the heads or channels), each rounded to bf16, where the
one-device step rounds the whole output once (or not at all); the sum itself is a float32
all-reduce, whose order changes the float32 result by far less than a bf16 rounding. In the
rounding model of the fixtures' own tests (each rounding an independent uniform perturbation
of u |value|), a partial over 1/tp of the contraction has standard deviation |out| / sqrt(tp),
so the tp partial roundings add the variance of ONE rounding of the whole output: every block
is counted one rounding more than in the one-device bound of the fixture's own test module
(4 u sqrt(n / 3) max|z|, with the routing term for MoE). Both the sharded and the one-device
runs are within their bounds of the exact values, so comparing with transformers checks the
sharded logits against the single-device ones within the sum of the two bounds, as the issue
asks, and more tightly.

Greedy tokens are compared where transformers' top-2 gap exceeds twice the bound (and, for
MoE fixtures, before the first router near-tie, as their own tests do).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import test_gdn_pretrained as gdn_tests
import test_moe_models as moe_tests
import test_pretrained as dense_tests
import test_pretrained_mla as mla_tests
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, NEW_TOKENS, reference

from jaxarena import ArenaPlan, BufferSizes, MemoryBudget
from jaxarena._sizing.kv_pool import slot_bytes
from jaxarena.models import load_pretrained
from jaxarena.models.blocks.moe import MoE
from jaxarena.models.tensor_parallel import AXIS, per_device_bytes

# (fixture, tp, ep, kernels): the Pallas kernels (interpreted) once, XLA's elsewhere.
CASES = [
    ("qwen3", 2, 1, "pallas"),
    ("qwen3", 4, 1, "xla"),
    ("qwen3_moe", 2, 1, "xla"),
    ("qwen3_moe", 4, 4, "xla"),
    ("deepseek_v2", 2, 2, "xla"),
    ("mamba2", 2, 1, "xla"),
    ("nemotron_h", 2, 1, "xla"),
    ("qwen3_next", 2, 1, "xla"),
]
IDS = [f"{n}-tp{t}-ep{e}-{k}" for n, t, e, k in CASES]


def base_count(name: str, config):
    """`block -> stored roundings` of the fixture's own test module."""
    if name in dense_tests.BF16_FAMILIES:
        return lambda b: dense_tests.ROUNDINGS[b.act if b.kind == "mlp" else b.kind]
    if name == "deepseek_v2":
        return mla_tests.block_counter(config)
    if name == "qwen3_next":
        return lambda b: gdn_tests.ROUNDINGS[b.kind]
    return moe_tests.block_roundings


class _Runs(dict):
    """Each case loaded and run once, when a test first asks: prefill logits per prompt,
    greedy tokens and logits."""

    def __missing__(self, case):
        name, tp, ep, kernels = case
        lm = load_pretrained(CHECKPOINTS / name, **LIMITS, kernels=kernels, mesh=tp, ep=ep,
                             compiler_options=FAST_CPU_COMPILE)  # fmt: skip
        ref = reference(name)
        prefill = [lm.prefill_logits(p) for p in ref["prompts"]]
        tokens, logits = lm.generate(ref["prompts"], NEW_TOKENS, return_logits=True)
        self[case] = dict(lm=lm, ref=ref, prefill=prefill, tokens=np.asarray(tokens),
                          logits=logits)  # fmt: skip
        return self[case]


@pytest.fixture(scope="module")
def sharded():
    return _Runs()


def bound(lm, ref, name: str, tp: int):
    count = base_count(name, lm.config)

    def sharded_count(b):
        return count(b) + 1

    return moe_tests.bf16_atol(lm, ref, sharded_count), sharded_count


def decided_positions(lm, ref, i: int, count) -> np.ndarray | None:
    """Positions of prompt `i` before its first router near-tie (MoE fixtures), else None."""
    if not any(isinstance(b, MoE) for b in lm.model.arch.blocks):
        return None
    return moe_tests.decided(lm, ref, i, count)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_sharded_logits_match_transformers(sharded, case):
    name, tp, ep, _ = case
    r = sharded[case]
    lm, ref = r["lm"], r["ref"]
    atol, count = bound(lm, ref, name, tp)
    assert atol < moe_tests.max_abs_logit(ref) / 5  # far below the logits' spread
    kept = total = 0
    for i, (got, want) in enumerate(zip(r["prefill"], ref["prefill"], strict=True)):
        assert got.shape == want.shape
        ok = decided_positions(lm, ref, i, count)
        ok = np.ones(got.shape[0], bool) if ok is None else ok[: got.shape[0]]
        kept, total = kept + ok.sum(), total + ok.size
        np.testing.assert_allclose(got[ok], want[ok], atol=atol, rtol=0, err_msg=f"prompt {i}")
    # The MoE fixtures' router margins leave a near-tie on some positions at the sharded
    # bound (measured: qwen3_moe at tp 4 all but prompt 0's one position); most are compared.
    assert kept >= 0.5 * total, f"only {kept} of {total} prompt positions free of near-ties"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_sharded_greedy_tokens_match_transformers(sharded, case):
    name, tp, ep, _ = case
    r = sharded[case]
    lm, ref = r["lm"], r["ref"]
    atol, count = bound(lm, ref, name, tp)
    want = ref["greedy_tokens"]
    same = np.cumprod(np.concatenate([np.ones((want.shape[0], 1), bool),
                                      r["tokens"][:, :-1] == want[:, :-1]], 1), 1).astype(bool)  # fmt: skip
    rows = [decided_positions(lm, ref, i, count) for i in range(want.shape[0])]
    if rows[0] is not None:
        lens = ref["prompt_lengths"]
        same &= np.stack(
            [d[n - 1 : n - 1 + want.shape[1]] for d, n in zip(rows, lens, strict=True)]
        )
    np.testing.assert_allclose(r["logits"][same], ref["greedy_logits"][same], atol=atol, rtol=0)
    strict = same & (ref["greedy_top2_gap"] > 2 * atol)
    np.testing.assert_array_equal(r["tokens"][strict], want[strict])
    # Most steps share transformers' context (a near-tie may send a row elsewhere); the MoE
    # fixtures' router near-ties leave fewer, as in their own test (at least 4 there).
    floor = 4 if rows[0] is not None else 0.4 * same.size
    assert same.sum() >= floor, f"only {same.sum()} of {same.size} greedy steps compared"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_each_device_holds_its_budget(sharded, case):
    """Weights, arena and KV cache on each device are `budget --tp N --ep M`'s per-device
    figures; every array is one slice per device, on its device, and the decode step keeps
    arena and caches in place (donated, aliased)."""
    name, tp, ep, _ = case
    lm = sharded[case]["lm"]
    budget = MemoryBudget(config=lm.config, memory_bytes="1TB", weights="bf16", tp=tp, ep=ep,
                          max_batch_tokens=LIMITS["max_batch_tokens"],
                          max_seq_len=LIMITS["max_seq_len"],
                          kv_block_size=LIMITS["kv_block_size"],
                          max_batch_size=LIMITS["max_batch_size"])  # fmt: skip
    assert lm.model.config == budget.local_config
    assert lm.weight_bytes == budget.weight_bytes == per_device_bytes(lm.params)
    assert lm.weight_bytes < jax.tree.reduce(lambda a, x: a + x.nbytes, lm.params, 0)
    mesh_devices = set(lm.mesh.devices.flat)
    for leaf in jax.tree.leaves((lm.params, lm.caches, lm.arena)):
        assert leaf.sharding.spec[0] == AXIS and leaf.sharding.mesh.shape[AXIS] == tp
        assert {s.device for s in leaf.addressable_shards} == mesh_devices
        assert all(s.data.shape[0] == leaf.shape[0] // tp for s in leaf.addressable_shards)
    sizes = BufferSizes.from_config(budget.local_config, LIMITS["max_batch_tokens"],
                                    LIMITS["max_seq_len"], LIMITS["kv_block_size"],
                                    LIMITS["max_batch_size"], levers=lm.model.levers,
                                    target=lm.model.target)  # fmt: skip
    plan = lm.model.plan
    assert plan == ArenaPlan.sequential(sizes, guard_bytes=plan.guard_bytes)
    arena_shard = lm.arena.addressable_shards[0].data
    assert arena_shard.nbytes == plan.total_bytes
    assert (
        ArenaPlan.sequential(sizes).total_bytes
        == budget.replace(levers=lm.model.levers, target=lm.model.target).arena_bytes
    )
    tables = lm.block_tables
    tokens = tables.shape[0] * tables.shape[1] * LIMITS["kv_block_size"]
    rows = LIMITS["max_batch_size"] + 1
    state = lm.cache_bytes - tokens * budget.kv_bytes_per_token
    assert lm.cache_bytes == per_device_bytes(lm.caches)
    # Recurrent states: a row per slot of the per-device states, as the engine's page pool
    # counts them (`slot_bytes`, which the engine checks against its allocation).
    assert state == rows * slot_bytes(budget.local_config)
    mem = lm.step_memory("decode")  # XLA's figures per device
    assert mem["alias"] >= arena_shard.nbytes + lm.cache_bytes


def test_bad_meshes_are_refused():
    path = CHECKPOINTS / "qwen3"
    with pytest.raises(ValueError, match="ep=2 must be 1 or equal to tp=4"):
        load_pretrained(path, **LIMITS, mesh=4, ep=2)
    with pytest.raises(ValueError, match="tp=16 needs 16 devices"):
        load_pretrained(path, **LIMITS, mesh=16)
    with pytest.raises(Exception, match="num_attention_heads=4 is not divisible by tp=8"):
        load_pretrained(path, **LIMITS, mesh=8)
    with pytest.raises(NotImplementedError, match="n_groups=2 < tp=4"):
        load_pretrained(CHECKPOINTS / "mamba2", **LIMITS, mesh=4)
