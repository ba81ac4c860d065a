"""LoRA adapter slots (`AdapterSlots`) and the scheduler with adapters: loads on demand into an
empty slot first, then evicts the least recently used slot no running request holds; a
request whose adapter finds every slot held is passed over (keeping its place) while the
requests behind it run; preemption and finishing release slots; a seeded random workload
keeps the bookkeeping equal to what the running requests name. Pure Python, no device."""

from __future__ import annotations

import random

import pytest

from jaxarena.engine.adapters import AdapterSlots
from jaxarena.engine.pages import BlockManager
from jaxarena.engine.scheduler import Request, RequestStatus, Scheduler
from jaxarena.engine.types import RequestError, SamplingParams

RUNNING = RequestStatus.RUNNING


def _slots(n=2, names=("a", "b", "c")):
    loads = []
    s = AdapterSlots(n, lambda slot, name: loads.append((slot, name)))
    for x in names:
        s.register(x, f"data-{x}")
    return s, loads


def test_loads_into_empty_slots_then_evicts_the_least_recently_used_idle_one():
    s, loads = _slots()
    assert s.acquire("a") == 0 and s.acquire("b") == 1
    assert s.acquire("c") is None  # both held
    assert s.acquire("a") == 0  # a hit: no load
    assert loads == [(0, "a"), (1, "b")] and s.holders("a") == 2
    s.release("b")  # b idle (slot 1)
    s.release("a")
    s.release("a")  # a idle after b: b is the least recently used
    assert s.acquire("c") == 1 and s.slot("b") is None and loads[-1] == (1, "c")
    assert s.acquire("b") == 0 and s.slot("a") is None  # a was idle: evicted
    assert s.acquire("a") is None  # both held
    s.check(["c", "b"])


def test_eviction_takes_the_idle_slot_and_hits_need_no_slot():
    s, loads = _slots()
    s.acquire("a")
    s.release("a")  # a loaded, idle
    assert s.acquire("b") == 1  # the empty slot before evicting a
    assert s.acquire("a") == 0 and s.loads == 2  # still loaded: a hit
    s.release("b")
    assert s.acquire("c") == 1 and s.slot("b") is None
    s.check(["a", "c"])


def test_registry_errors():
    s, _ = _slots()
    with pytest.raises(ValueError, match="already registered"):
        s.register("a", None)
    with pytest.raises(ValueError, match="non-empty"):
        s.register("", None)
    with pytest.raises(KeyError, match="not registered"):
        s.acquire("zzz")
    with pytest.raises(RuntimeError, match="no request holds"):
        s.release("a")
    with pytest.raises(ValueError, match="max_loras"):
        AdapterSlots(0, lambda *a: None)
    assert s.names == ("a", "b", "c") and s.data("b") == "data-b"


def _sched(adapters, *, num_pages=64, max_batch_size=4, max_batch_tokens=16):
    bm = BlockManager(num_pages, 4, False)
    return Scheduler(bm, max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens,
                     max_seq_len=64, page_size=4, prefix_caching=False,
                     adapters=adapters)  # fmt: skip


def _req(rid, adapter, n=3, max_tokens=3):
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens),
                   adapter=adapter)  # fmt: skip


def _step(s):
    plan = s.schedule()
    s.update(plan, {it.request.request_id: 7 for it in plan.items if it.samples})
    return plan


def test_a_request_without_a_slot_is_passed_over_and_keeps_its_place():
    slots, _ = _slots()
    s = _sched(slots)
    for rid, a in (("r0", "a"), ("r1", "b"), ("r2", "c"), ("r3", None), ("r4", "a")):
        s.add(_req(rid, a))
    plan = _step(s)
    ran = {it.request.request_id: it.request.lora_slot for it in plan.items}
    assert ran == {"r0": 0, "r1": 1, "r3": -1, "r4": 0}  # r2 (adapter c) passed over
    assert [r.request_id for r in s.waiting] == ["r2"]
    while s.has_unfinished:
        _step(s)
        slots.check(r.adapter for r in s.running if r.adapter is not None)
    assert all(slots.holders(x) == 0 for x in "abc") and slots.slot("c") is not None


def test_unknown_adapter_is_refused_at_the_door():
    s = _sched(None)
    with pytest.raises(RequestError, match="no LoRA adapter named 'a'") as e:
        s.add(_req("r", "a"))
    assert e.value.param == "model" and not s.has_unfinished


def test_random_workload_keeps_the_slots_equal_to_the_running_requests():
    rng = random.Random(3)
    slots, loads = _slots(2, names=("a", "b", "c", "d"))
    s = _sched(slots, num_pages=7, max_batch_size=3, max_batch_tokens=8)
    n = 0
    for _ in range(400):
        if n < 60 and rng.random() < 0.5:
            s.add(_req(f"r{n}", rng.choice(["a", "b", "c", "d", None]), rng.randint(1, 12),
                       rng.randint(1, 10)))  # fmt: skip
            n += 1
        if rng.random() < 0.05 and s.running:
            s.abort(rng.choice(s.running).request_id)
        _step(s)
        s.pages.check()
        running = s.running
        slots.check(r.adapter for r in running if r.adapter is not None)
        for r in running:
            if r.adapter is not None:
                assert slots.slot(r.adapter) == r.lora_slot
            else:
                assert r.lora_slot == -1
    while s.has_unfinished:
        _step(s)
    assert n == 60 and s.num_preemptions > 0 and len(loads) > 4
    assert all(slots.holders(x) == 0 for x in "abcd")
