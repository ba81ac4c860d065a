"""The serving engine with LoRA adapters (`Engine.from_pretrained(loras=...)`, a request's
`adapter`): requests naming three PEFT adapters (tests/fixtures/lora/qwen3: `all`, `attn`,
`mlp`) and the base model arrive at random steps on an engine with only TWO adapter slots,
so adapters are loaded on demand and evicted, and requests wait for a slot; each request's
greedy tokens are those `CausalLM.generate` gives it alone with its adapter in a slot.

Tolerance: as tests/models/test_engine_serving.py, both sides within the family's bound
`atol` of the exact logits, so where the engine chooses `e` and the reference `b`,
ref[b] - ref[e] <= 4 atol; `atol` is test_lora.py's bound for the `all` adapter (the most
roundings: 38 more than the base model's 25), the largest of the four.
"""

from __future__ import annotations

import numpy as np
import pytest
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS
from test_lora import (
    ADAPTERS,
    LORA,
    atol_for,
    lm,  # noqa: F401 (the reference: each adapter in its own slot)
    lora_reference,
)

from jaxarena.engine import Engine, RequestError, SamplingParams

REQUESTS = 16


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained(
        CHECKPOINTS / "qwen3", **LIMITS, kv_pages=8, token_buckets=(LIMITS["max_batch_tokens"],),
        compiler_options=FAST_CPU_COMPILE, log=None, kernels="pallas",
        loras={name: LORA / "qwen3" / name for name in ADAPTERS}, max_loras=2,
    )  # fmt: skip


def _check(engine, ref, work, got, atol):
    full = 0
    for i, prompt, adapter, max_tokens in work:
        slot = -1 if adapter is None else ADAPTERS.index(adapter)
        want, logits = ref.generate([prompt], max_tokens, return_logits=True, lora_slots=[slot])
        g = got[i]
        assert len(g) == max_tokens
        diff = [j for j in range(max_tokens) if g[j] != want[0][j]]
        if not diff:
            full += 1
            continue
        row = np.asarray(logits[0][diff[0]], np.float32)
        assert row.max() - row[g[diff[0]]] < 4 * atol, (i, adapter, g, want[0])
    return full


def test_adapters_and_the_base_model_in_one_batch_with_two_slots(engine, lm):  # noqa: F811
    atol = atol_for("all", lora_reference("all"))
    rng = np.random.default_rng(41)
    choices = [*ADAPTERS, None]
    work = []
    for i in range(REQUESTS):
        prompt = rng.integers(0, engine.vocab_size, int(rng.integers(1, 12))).tolist()
        work.append((i, prompt, choices[i % 4], int(rng.integers(2, 9))))
    arrive = {i: int(rng.integers(0, 6)) for i in range(REQUESTS)}
    params = {i: SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
              for i, _, _, m in work}  # fmt: skip
    got, ids, step, done = {i: [] for i in range(REQUESTS)}, {}, 0, set()
    together = 0  # steps whose batch ran two adapters and the base model at once
    while len(done) < REQUESTS:
        for i, prompt, adapter, _ in work:
            if arrive[i] == step:
                ids[engine.add_request(prompt, params[i], adapter=adapter)] = i
        for ev in engine.step():
            got[ids[ev.request_id]].extend(ev.token_ids)
            if ev.finished:
                done.add(ids[ev.request_id])
        running = engine.scheduler.running
        engine.adapters.check(r.adapter for r in running if r.adapter is not None)
        kinds = {r.adapter for r in running}
        together += len(kinds - {None}) == 2 and None in kinds
        step += 1
        assert step < 500, "the engine made no progress"
    full = _check(engine, lm, work, got, atol)
    assert full >= 0.6 * REQUESTS, f"only {full} of {REQUESTS} requests match in full"
    assert together > 0
    # Three adapters through two slots: at least one eviction and reload.
    assert engine.stats()["lora_loads"] > len(ADAPTERS)
    assert engine.stats()["kv_pages_in_use"] == 0
    assert all(c.count == 1 for c in engine.runner.counters.values())  # no recompile
    # Steps with an adapter row ran the +lora forms; steps without one the base model's own.
    runs = engine.runner.runs
    assert runs.get("decode+lora", 0) > 0 and runs.get("mixed@64+lora", 0) > 0
    assert "decode" not in runs  # every step of the workload had an adapter row
    base = [(0, [9, 8, 7], None, 4)]
    out = engine.generate([base[0][1]], SamplingParams(temperature=0, max_tokens=4,
                                                        ignore_eos=True))  # fmt: skip
    assert runs["decode"] == 3 and runs["mixed@64"] == 1  # the plain forms, once compiled
    assert _check(engine, lm, base, {0: out[0].token_ids}, atol) == 1


def test_prefix_cache_is_keyed_by_the_adapter(engine, lm):  # noqa: F811
    """A full page of prompt cached under one adapter is a hit for the same adapter only."""
    page = list(range(5, 5 + LIMITS["kv_block_size"]))
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    s = engine.scheduler
    engine.generate([page + [1]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    work, got = [], {}
    for i, adapter in enumerate(("attn", None, "attn", "mlp")):
        before = s.prefix_hit_tokens
        rid = engine.add_request(page + [2 + i], params, adapter=adapter)
        while engine.has_unfinished():
            for ev in engine.step():
                if ev.request_id == rid:
                    got.setdefault(i, []).extend(ev.token_ids)
        hit = s.prefix_hit_tokens - before
        # base: the first generate's page; attn: its own earlier page (the second attn);
        # the first attn and mlp: nothing cached under their key.
        assert hit == (LIMITS["kv_block_size"] if i in (1, 2) else 0), (i, adapter, hit)
        work.append((i, page + [2 + i], adapter, 3))
    _check(engine, lm, work, got, atol_for("all", lora_reference("all")))


def test_unknown_adapters_are_refused(engine):
    with pytest.raises(RequestError, match="no LoRA adapter named 'nope'") as e:
        engine.add_request([1, 2], SamplingParams(max_tokens=2), adapter="nope")
    assert e.value.param == "model"
    with pytest.raises(ValueError, match="already registered"):
        engine.add_lora("all", LORA / "qwen3" / "all")
    assert not engine.has_unfinished()
