"""The scheduler's rules one at a time (validation at the door, FIFO admission, slots, the token
budget with decodes first and chunked prefill, preemption of the most recently admitted, stop
reasons, abort, prefix hits), then a seeded random workload on a pool small enough to preempt,
against a fake device that keeps the KV pages' contents and samples from what it reads back."""

from __future__ import annotations

import collections
import hashlib
import random
from array import array

import pytest

from jaxarena.engine.pages import BlockManager
from jaxarena.engine.scheduler import Request, RequestStatus, Scheduler
from jaxarena.engine.types import RequestError, SamplingParams

WAITING, RUNNING, FINISHED = RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.FINISHED


def _sched(*, num_pages=32, page_size=4, max_batch_size=4, max_batch_tokens=16,
           max_seq_len=64, prefix_caching=False) -> Scheduler:  # fmt: skip
    bm = BlockManager(num_pages, page_size, prefix_caching)
    return Scheduler(bm, max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens,
                     max_seq_len=max_seq_len, page_size=page_size,
                     prefix_caching=prefix_caching)  # fmt: skip


def _req(rid, prompt, max_tokens=4, **kw) -> Request:
    eos = kw.pop("eos_ids", frozenset())
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, **kw), eos_ids=eos)


def _step(s: Scheduler, token=7):
    """One engine step whose device samples `token` (or token(request)) for every item that
    reaches the end of its tokens. Returns (plan, finished)."""
    plan = s.schedule()
    s.pages.check()
    sampled = {it.request.request_id: token(it.request) if callable(token) else token
               for it in plan.items if it.samples}  # fmt: skip
    return plan, s.update(plan, sampled)


def _items(plan):
    return [(it.request.request_id, it.slot, it.start, it.num_tokens) for it in plan.items]


# ----------------------------------------------------------------------------- validation
def test_config_is_validated():
    bm = BlockManager(8, 4, False)
    kw = dict(max_batch_size=4, max_batch_tokens=16, max_seq_len=32, page_size=4,
              prefix_caching=False)  # fmt: skip
    for key, value, match in [("max_batch_tokens", 3, "max_batch_tokens=3 must be >= max_batch"),
                              ("max_seq_len", 0, "max_seq_len"), ("page_size", 8, "page_size=8"),
                              ("prefix_caching", True, "prefix_caching=True")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            Scheduler(bm, **{**kw, key: value})


def test_add_rejects_bad_requests_alone():
    s = _sched(num_pages=3, page_size=4, max_seq_len=16)
    s.add(_req("ok", [1] * 5, max_tokens=8))  # KV of 5 + 8 - 1 = 12 tokens: 3 pages, the pool
    cases = [
        (_req("empty", []), "prompt", "empty"),
        (_req("long", [1] * 16), "prompt", "max_seq_len=16"),
        (_req("big", [1] * 5, max_tokens=9), "max_tokens", "4 pages of 4, more than the whole pool of 3"),
        (_req("ok", [1]), "request_id", "already in use"),
    ]  # fmt: skip
    for req, param, match in cases:
        with pytest.raises(RequestError, match=match) as e:
            s.add(req)
        assert e.value.param == param
    assert [r.request_id for r in s.waiting] == ["ok"] and s.num_waiting == 1


def test_add_cap_at_max_seq_len():
    s = _sched(num_pages=3, page_size=4, max_seq_len=13)
    s.add(_req("a", [1] * 5, max_tokens=1000))  # at most 13 tokens, the last never run: 3 pages
    with pytest.raises(RequestError, match="pool"):
        _sched(num_pages=3, page_size=4, max_seq_len=14).add(_req("a", [1] * 5, max_tokens=1000))


# ----------------------------------------------------------------------------- admission
def test_fifo_admission_and_lowest_free_slot():
    s = _sched(max_batch_size=2)
    s.add(_req("a", [1, 2, 3], max_tokens=1))
    s.add(_req("b", [1, 2, 3], max_tokens=3))
    s.add(_req("c", [1, 2, 3], max_tokens=1))
    plan, done = _step(s)
    assert _items(plan) == [("a", 0, 0, 3), ("b", 1, 0, 3)] and s.num_waiting == 1
    assert [r.request_id for r in done] == ["a"] and done[0].finish_reason == "length"
    plan, _ = _step(s)
    assert _items(plan) == [("b", 1, 3, 1), ("c", 0, 0, 3)]  # b decodes first; c gets slot 0


def test_budget_decodes_first_then_prefill_chunks():
    s = _sched(max_batch_tokens=8)
    s.add(_req("a", [1, 2, 3], max_tokens=10))
    s.add(_req("b", list(range(20)), max_tokens=10))
    plans = [_step(s)[0] for _ in range(4)]
    assert [_items(p) for p in plans] == [
        [("a", 0, 0, 3), ("b", 1, 0, 5)],
        [("a", 0, 3, 1), ("b", 1, 5, 7)],
        [("a", 0, 4, 1), ("b", 1, 12, 7)],
        [("a", 0, 5, 1), ("b", 1, 19, 1)],  # b's prompt done at 20: it samples, then decodes
    ]
    assert [it.samples for it in plans[3].items] == [True, True]
    assert not plans[2].items[1].samples and len(s.running[1].output_ids) == 1
    assert all(p.num_tokens <= 8 for p in plans)
    assert plans[1].items[1].token_ids == list(range(5, 12))


def test_waiting_head_blocks_the_queue_until_its_pages_fit():
    s = _sched(num_pages=4, page_size=4, max_batch_size=4)
    s.add(_req("a", [1] * 9, max_tokens=1))  # 3 pages
    s.add(_req("b", [1] * 8, max_tokens=1))  # 2 pages: waits for a
    s.add(_req("c", [1] * 2, max_tokens=1))  # 1 page would fit, but b is first
    plan, done = _step(s)
    assert _items(plan) == [("a", 0, 0, 9)] and [r.request_id for r in s.waiting] == ["b", "c"]
    assert [r.request_id for r in done] == ["a"]
    plan, _ = _step(s)
    assert _items(plan) == [("b", 0, 0, 8), ("c", 1, 0, 2)]


# ----------------------------------------------------------------------------- preemption
def test_preempts_the_most_recently_admitted_and_requeues_it_first():
    s = _sched(num_pages=4, page_size=2, max_batch_size=2, max_batch_tokens=8)
    s.add(_req("a", [1, 2, 3], max_tokens=6))  # KV of 8 tokens at most: the whole pool
    s.add(_req("b", [4, 5, 6], max_tokens=6))
    _step(s)  # both prompts: 2 pages each, the pool is full
    _step(s)  # both decode position 3 into their second page
    s.add(_req("c", [9], max_tokens=1))  # would fit after the preemption, but must wait
    plan, _ = _step(s)  # a needs a third page: b (admitted last) is preempted
    b = plan.preempted[0]
    assert _items(plan) == [("a", 0, 4, 1)] and [r.request_id for r in plan.preempted] == ["b"]
    assert (b.status, b.num_computed, b.slot, b.num_preemptions) == (WAITING, 0, None, 1)
    assert b.output_ids == [7, 7] and s.pages.pages("b") == []
    assert [r.request_id for r in s.waiting] == ["b", "c"] and s.num_preemptions == 1
    # b recomputes its prompt and its two tokens once there is room (a finishes first).
    done = []
    while not done:
        plan, done = _step(s)
        assert [i[0] for i in _items(plan)] == ["a"]  # c (1 page) waits behind b (3 pages)
    assert [r.request_id for r in done] == ["a"] and len(done[0].output_ids) == 6
    assert _items(s.schedule()) == [("b", 0, 0, 5), ("c", 1, 0, 1)]


def test_the_victim_may_be_the_request_that_needs_the_page():
    s = _sched(num_pages=4, page_size=2, max_batch_size=2, max_batch_tokens=8)
    s.add(_req("a", [1, 2, 3], max_tokens=6))  # next token still in its second page
    s.add(_req("b", [4, 5, 6, 7], max_tokens=5))  # next token needs a third page
    _step(s)
    plan, _ = _step(s)
    assert _items(plan) == [("a", 0, 3, 1)] and [r.request_id for r in plan.preempted] == ["b"]
    assert s.num_running == 1 and s.pages.num_in_use == 2


def test_a_preempted_request_resumes_from_its_cached_pages():
    s = _sched(num_pages=5, page_size=2, max_batch_size=2, max_batch_tokens=8,
               prefix_caching=True)  # fmt: skip
    s.add(_req("a", [1, 2, 3], max_tokens=4))  # 3 pages at most
    s.add(_req("b", [4, 5, 6, 7, 8], max_tokens=4))  # 4 pages at most
    _step(s)  # 2 + 3 pages: the pool is full
    _step(s)  # a decodes into its second page, b into its third: b's 3 pages full, hashed
    plan, _ = _step(s)  # a needs a third page: b is preempted, a evicts b's (cached) tail page
    assert [r.request_id for r in plan.preempted] == ["b"] and s.pages.num_cached == 2
    _step(s)  # a's last token
    assert not s.running
    plan = s.schedule()  # b: 7 tokens; its first two pages still cached
    assert _items(plan) == [("b", 0, 4, 3)] and s.prefix_hit_tokens == 4
    s.pages.check()


# ----------------------------------------------------------------------------- stops
@pytest.mark.parametrize("kw, max_seq_len, want, reason", [
    (dict(max_tokens=3), 64, [5, 6, 7], "length"),
    (dict(max_tokens=5, eos_ids=frozenset({6})), 64, [5, 6], "stop"),
    (dict(max_tokens=3, eos_ids=frozenset({6}), ignore_eos=True), 64, [5, 6, 7], "length"),
    (dict(max_tokens=5, stop_token_ids=(7,)), 64, [5, 6, 7], "stop"),
    (dict(max_tokens=2, eos_ids=frozenset({6})), 64, [5, 6], "length"),  # vLLM: length first
    (dict(max_tokens=9), 6, [5, 6, 7], "length"),  # 3 prompt + 3 = max_seq_len
])  # fmt: skip
def test_stop_reasons(kw, max_seq_len, want, reason):
    s = _sched(max_seq_len=max_seq_len)
    s.add(_req("a", [1, 2, 3], **kw))
    done = []
    for _ in range(10):
        _, done = _step(s, token=lambda r: 5 + len(r.output_ids))
        if done:
            break
    (a,) = done
    assert (a.output_ids, a.finish_reason, a.status) == (want, reason, FINISHED)
    assert not s.has_unfinished and s.pages.num_in_use == 0


# ----------------------------------------------------------------------------- abort
def test_abort_in_any_state():
    s = _sched(max_batch_size=1)
    s.add(_req("a", [1, 2], max_tokens=5))
    s.add(_req("b", [1, 2], max_tokens=5))
    _step(s)
    assert s.abort("b").finish_reason == "abort" and s.num_waiting == 0
    a = s.abort("a")
    assert (a.status, a.finish_reason, a.slot) == (FINISHED, "abort", None)
    assert s.pages.num_in_use == 0 and s.abort("a") is None and s.abort("zzz") is None
    s.add(_req("c", [1, 2]))
    assert _items(s.schedule()) == [("c", 0, 0, 2)]  # the slot came back


def test_abort_between_schedule_and_update_is_skipped():
    s = _sched()
    s.add(_req("a", [1, 2], max_tokens=5))
    s.add(_req("b", [1, 2], max_tokens=5))
    plan = s.schedule()
    s.abort("a")
    done = s.update(plan, {"a": 3, "b": 3})
    assert done == [] and s.running[0].output_ids == [3]
    assert _items(s.schedule()) == [("b", 1, 2, 1)]
    s.pages.check()


def test_update_names_a_missing_sample():
    s = _sched()
    s.add(_req("a", [1, 2]))
    with pytest.raises(KeyError, match="no sampled token for request 'a'"):
        s.update(s.schedule(), {})


# ----------------------------------------------------------------------------- prefix cache
@pytest.mark.parametrize("on", [True, False])
def test_prefix_hit_starts_past_the_cached_pages(on):
    s = _sched(page_size=4, prefix_caching=on)
    shared = list(range(10, 19))  # two full pages and one token
    s.add(_req("a", shared, max_tokens=1))
    _step(s)
    s.add(_req("b", shared[:8] + [1, 2, 3], max_tokens=1))
    plan = s.schedule()
    assert _items(plan) == ([("b", 0, 8, 3)] if on else [("b", 0, 0, 11)])
    assert plan.items[0].request.num_computed == plan.items[0].start
    assert (s.prefix_query_tokens, s.prefix_hit_tokens) == ((9 + 11, 8) if on else (0, 0))
    s.pages.check()


def test_prefix_hits_need_the_same_extra_key():
    s = _sched(page_size=4, prefix_caching=True)
    s.add(Request("a", list(range(9)), SamplingParams(max_tokens=1), extra_key="lora-a"))
    _step(s)
    s.add(Request("b", list(range(9)), SamplingParams(max_tokens=1), extra_key="lora-b"))
    s.add(Request("c", list(range(9)), SamplingParams(max_tokens=1), extra_key="lora-a"))
    assert _items(s.schedule()) == [("b", 0, 0, 9), ("c", 1, 8, 1)]


# ----------------------------------------------------------------------------- workload
VOCAB = 24
EOS = frozenset({0})


def _sample(context: list[int]) -> int:
    """The fake model: the next token is a hash of every token before it."""
    return hashlib.blake2b(array("q", context).tobytes(), digest_size=4).digest()[0] % VOCAB


def _alone(prompt: list[int], params: SamplingParams, max_seq_len: int):
    """The request's tokens run alone (the stop rules, written out again)."""
    out = []
    while True:
        out.append(_sample(prompt + out))
        if len(out) >= params.max_tokens or len(prompt) + len(out) >= max_seq_len:
            return out, "length"
        if (not params.ignore_eos and out[-1] in EOS) or out[-1] in params.stop_token_ids:
            return out, "stop"


class _FakeDevice:
    """Writes each item's tokens into its pages (slot = position % page_size), then samples
    from the context it reads back through the request's page list: a page shared, evicted
    or reused wrongly changes the context and so the tokens."""

    def __init__(self, s: Scheduler):
        self.s, ps = s, s.page_size
        self.kv = [[None] * ps for _ in range(s.pages.num_pages + 1)]

    def run(self, plan) -> dict[str, int]:
        ps, bm = self.s.page_size, self.s.pages
        holders = collections.Counter(p for r in self.s.running for p in bm.pages(r.request_id))
        sampled = {}
        for it in plan.items:
            pages = bm.pages(it.request.request_id)
            assert len(pages) * ps >= it.end, "the pages do not cover the item"
            for pos, tok in zip(range(it.start, it.end), it.token_ids, strict=True):
                page = pages[pos // ps]
                assert page != 0 and holders[page] == 1, f"write into shared page {page}"
                self.kv[page][pos % ps] = tok
            if it.samples:
                ctx = [self.kv[pages[q // ps]][q % ps] for q in range(it.end)]
                sampled[it.request.request_id] = _sample(ctx)
        return sampled


def _workload(seed: int, prefix_caching: bool):
    rng = random.Random(seed)
    ps, num_pages, max_seq_len, mbs, mbt = 4, 11, 48, 5, 12
    s = _sched(num_pages=num_pages, page_size=ps, max_batch_size=mbs, max_batch_tokens=mbt,
               max_seq_len=max_seq_len, prefix_caching=prefix_caching)  # fmt: skip
    dev = _FakeDevice(s)
    stems = [[rng.randrange(1, VOCAB) for _ in range(16)] for _ in range(3)]
    arrivals = collections.defaultdict(list)
    reqs, aborts = {}, collections.defaultdict(list)
    for i in range(60):
        n = rng.randint(1, 40)
        head = rng.choice(stems)[: rng.randint(4, 16)] if rng.random() < 0.7 else []
        prompt = (head + [rng.randrange(1, VOCAB) for _ in range(n)])[:n]
        params = SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=rng.random() < 0.3,
                                stop_token_ids=(rng.randrange(VOCAB),) if rng.random() < 0.3 else ())  # fmt: skip
        step = rng.randrange(80)
        arrivals[step].append(Request(f"r{i}", prompt, params, eos_ids=EOS))
        if rng.random() < 0.1:
            aborts[step + rng.randrange(25)].append(f"r{i}")
    rejected, aborted, first_admitted = set(), set(), []
    step = 0
    while step < 80 or s.has_unfinished:
        assert step < 3000, "the workload did not finish: a deadlock or a starved request"
        for req in arrivals[step]:
            try:
                s.add(req)
                reqs[req.request_id] = req
            except RequestError:
                kv = min(len(req.prompt_ids) + req.params.max_tokens, max_seq_len) - 1
                assert -(-kv // ps) > num_pages or len(req.prompt_ids) >= max_seq_len
                rejected.add(req.request_id)
        for rid in aborts[step]:
            aborted.add(rid) if s.abort(rid) is not None else None
        plan = s.schedule()
        s.pages.check()
        assert plan.num_tokens <= mbt
        assert len({it.request.request_id for it in plan.items}) == len(plan.items)
        slots = [r.slot for r in s.running]
        assert len(set(slots)) == len(slots) <= mbs and all(0 <= x < mbs for x in slots)
        for it in plan.items:
            assert it.slot == it.request.slot and it.start == it.request.num_computed
            assert it.num_tokens >= 1 and it.end <= it.request.num_tokens
            if it.request.request_id not in first_admitted and it.request.num_preemptions == 0:
                first_admitted.append(it.request.request_id)
        for r in plan.preempted:
            assert (r.status, r.num_computed, r.slot) == (WAITING, 0, None)
        sampled = dev.run(plan)
        if plan.items and rng.random() < 0.03:  # an abort while the device runs the step
            rid = rng.choice(plan.items).request.request_id
            aborted.add(rid) if s.abort(rid) is not None else None
        s.update(plan, sampled)
        s.pages.check()
        step += 1
    arrival_order = sorted(first_admitted, key=lambda r: reqs[r].arrival)
    assert first_admitted == arrival_order, "a new request overtook an earlier one"
    for rid, req in reqs.items():
        want, reason = _alone(req.prompt_ids, req.params, max_seq_len)
        assert req.status is FINISHED
        if rid in aborted:
            assert req.finish_reason == "abort" and req.output_ids == want[: len(req.output_ids)]
        else:
            assert (req.output_ids, req.finish_reason) == (want, reason), rid
    assert s.pages.num_in_use == 0 and s.num_running == s.num_waiting == 0
    return s, len(reqs) - len(aborted), len(rejected)


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_workload_equals_running_alone(seed, prefix_caching):
    s, finished, rejected = _workload(seed, prefix_caching)
    # The cases under test happened: preemption, finished requests, prefix hits where on.
    assert s.num_preemptions > 0 and finished >= 30 and rejected > 0
    assert (s.prefix_hit_tokens > 0) == prefix_caching
