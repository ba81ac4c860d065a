"""Which tokens of which requests run in the next engine step (continuous batching with chunked
prefill under one token budget, preemption by recompute), as vLLM's V1 scheduler does it.

Pure Python, no jax. The engine loop is:

    plan = scheduler.schedule()          # StepPlan: items (request, slot, start, num_tokens)
    sampled = runner.step(plan)          # the device runs every item, samples where one ends
    finished = scheduler.update(plan, sampled)

Each item runs the tokens `all_ids[start : start + num_tokens]` of its request at positions
`start ..` into the pages `BlockManager.pages(request_id)`; an item whose tokens reach the end
of the request's tokens (`Item.samples`) produces the request's next token.

Policy, per step: one budget of `max_batch_tokens` tokens is spent first on the RUNNING requests
in admission order (a decode is one token, a partial prefill its next chunk), then on WAITING
requests in FIFO order. A waiting request is admitted only when no request was preempted this
step, a slot is free and its pages (after a prefix-cache hit) can be had; the head of the queue
blocks the rest, so nobody is overtaken forever. When a running request cannot get the pages
for its tokens, the most recently admitted running request is preempted (pages and slot freed,
its computed tokens forgotten, its output kept, back to the FRONT of the queue, recomputed
later) and the allocation retried; if it was itself the victim, it waits. The oldest running
request is never preempted while another runs, and a lone request always fits (`add` rejects
one that could not), so every request finishes.

LoRA (`adapters`, an `AdapterSlots`): a request naming an adapter is admitted only with its
adapter in a device slot (`AdapterSlots.acquire`, which may load it into a free slot); when
every slot is held by running requests of other adapters it is passed over, keeping its place
at the head of the queue, and the requests behind it may be admitted (as vLLM does: blocking
the queue would idle the batch until an adapter's requests drain). Its slot is released when
it finishes or is preempted.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import heapq

from jaxarena.engine.adapters import AdapterSlots
from jaxarena.engine.pages import BlockManager
from jaxarena.engine.types import RequestError, SamplingParams

__all__ = ["Item", "Request", "RequestStatus", "Scheduler", "StepPlan"]


class RequestStatus(enum.Enum):
    """Where a request is: queued, holding a slot and pages, or done."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


WAITING = RequestStatus.WAITING
RUNNING = RequestStatus.RUNNING
FINISHED = RequestStatus.FINISHED


@dataclasses.dataclass(eq=False)
class Request:
    """One request's state, which the scheduler mutates.

    Attributes:
      request_id: unique among the scheduler's unfinished requests.
      prompt_ids: the prompt's token ids.
      params: how it samples and when it stops (`max_tokens`, `stop_token_ids`, `ignore_eos`).
      eos_ids: the model's EOS ids (they end the request unless `params.ignore_eos`).
      output_ids: tokens generated so far (kept across preemption).
      num_computed: leading tokens of `all_ids` whose KV is in the request's pages.
      slot: its row in the batch (0..max_batch_size-1) while RUNNING, else None.
      status: WAITING, RUNNING or FINISHED.
      finish_reason: "stop", "length" or "abort" once FINISHED.
      num_preemptions: times it was preempted (its computed tokens recomputed).
      arrival: its index in the order requests were added (set by `Scheduler.add`).
      extra_key: mixed into the prefix-cache hashes (e.g. an adapter name: the same tokens
        under another adapter are another KV); None for the base model.
      adapter: the LoRA adapter it runs with (a name the scheduler's `adapters` know), or
        None for the base model.
      lora_slot: the adapter's device slot while RUNNING (-1: none).
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int] = frozenset()
    output_ids: list[int] = dataclasses.field(default_factory=list)
    num_computed: int = 0
    slot: int | None = None
    status: RequestStatus = WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    arrival: int = -1
    extra_key: str | None = None
    adapter: str | None = None
    lora_slot: int = -1

    @property
    def all_ids(self) -> list[int]:
        """Prompt then output (a new list)."""
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        """len(all_ids), without building it."""
        return len(self.prompt_ids) + len(self.output_ids)

    def token_ids(self, start: int, stop: int) -> list[int]:
        """all_ids[start:stop] without copying the whole sequence."""
        p = len(self.prompt_ids)
        if stop <= p:
            return self.prompt_ids[start:stop]
        if start >= p:
            return self.output_ids[start - p : stop - p]
        return self.prompt_ids[start:] + self.output_ids[: stop - p]


@dataclasses.dataclass(frozen=True, eq=False)
class Item:
    """One request's share of a step: its tokens `all_ids[start : start + num_tokens]` at
    positions `start ..`, in batch row `slot`."""

    request: Request
    slot: int
    start: int
    num_tokens: int
    samples: bool = dataclasses.field(init=False)
    """True when the step reaches the end of the request's tokens (as planned), so the logits
    of its last token give the request's next token (a decode, or a prompt's last chunk)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples", self.end == self.request.num_tokens)

    @property
    def end(self) -> int:
        """start + num_tokens: the request's computed tokens after this step."""
        return self.start + self.num_tokens

    @property
    def token_ids(self) -> list[int]:
        """The tokens this item runs."""
        return self.request.token_ids(self.start, self.end)


@dataclasses.dataclass
class StepPlan:
    """What one engine step runs: `items` (distinct requests, distinct slots; at most
    `max_batch_tokens` tokens in all) and the requests `preempted` while planning it (the
    runner may drop their slot state)."""

    items: list[Item]
    preempted: list[Request]

    @property
    def num_tokens(self) -> int:
        """Tokens the step runs, summed over its items."""
        return sum(it.num_tokens for it in self.items)


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Scheduler: {name}={value!r} must be an integer >= 1")
    return value


class Scheduler:
    """Continuous batching over a `BlockManager` (the policy is in the module docstring).

    Args:
      pages: the page pool (its `page_size` and `prefix_caching` must equal the ones given).
      max_batch_size: batch rows (slots 0..max_batch_size-1): most requests running at once.
      max_batch_tokens: most tokens one step runs (>= max_batch_size, so every running
        request can at least decode).
      max_seq_len: most tokens (prompt + output) of one request.
      page_size: tokens per page.
      prefix_caching: reuse cached full pages of a prompt's prefix (attention-only models).
      adapters: the LoRA adapter slots (None: no request may name an adapter).

    Attributes `num_preemptions`, `prefix_query_tokens` and `prefix_hit_tokens` count, over
    the scheduler's life, the preemptions and the admitted tokens looked up in and found in
    the prefix cache.
    """

    def __init__(self, pages: BlockManager, *, max_batch_size: int, max_batch_tokens: int,
                 max_seq_len: int, page_size: int, prefix_caching: bool,
                 adapters: AdapterSlots | None = None) -> None:  # fmt: skip
        self.max_batch_size = _positive("max_batch_size", max_batch_size)
        self.max_batch_tokens = _positive("max_batch_tokens", max_batch_tokens)
        self.max_seq_len = _positive("max_seq_len", max_seq_len)
        self.page_size = _positive("page_size", page_size)
        if max_batch_tokens < max_batch_size:
            raise ValueError(f"Scheduler: max_batch_tokens={max_batch_tokens} must be >= "
                             f"max_batch_size={max_batch_size} (one decode token per request)")  # fmt: skip
        if pages.page_size != page_size:
            raise ValueError(f"Scheduler: page_size={page_size} but the BlockManager's "
                             f"page_size is {pages.page_size}")  # fmt: skip
        if pages.prefix_caching != bool(prefix_caching):
            raise ValueError(f"Scheduler: prefix_caching={prefix_caching} but the BlockManager's "
                             f"is {pages.prefix_caching}")  # fmt: skip
        self.pages = pages
        self.prefix_caching = bool(prefix_caching)
        self.adapters = adapters
        self._waiting: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []  # admission order
        self._free_slots = list(range(max_batch_size))  # a heap: the lowest free slot first
        self._live: dict[str, Request] = {}
        self._arrivals = 0
        self.num_preemptions = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    # ----------------------------------------------------------------------- counts
    @property
    def num_running(self) -> int:
        """Requests holding a slot."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests queued (new or preempted)."""
        return len(self._waiting)

    @property
    def has_unfinished(self) -> bool:
        """Any request waiting or running."""
        return bool(self._live)

    @property
    def running(self) -> list[Request]:
        """The running requests in admission order (a copy)."""
        return list(self._running)

    @property
    def waiting(self) -> list[Request]:
        """The queue, next to admit first (a copy)."""
        return list(self._waiting)

    def max_kv_tokens(self, req: Request) -> int:
        """The most tokens whose KV the request ever holds: all its tokens but the last
        sampled one, which ends it and is never run: min(prompt + max_tokens, max_seq_len) - 1."""
        return min(len(req.prompt_ids) + req.params.max_tokens, self.max_seq_len) - 1

    # ----------------------------------------------------------------------- add / abort
    def check(self, prompt_len: int, params: SamplingParams, adapter: str | None = None,
              output_len: int = 0, what: str = "the request") -> None:  # fmt: skip
        """The checks at the door that read no queue state (so another thread may run them):
        a prompt of `prompt_len` tokens (plus `output_len` already generated) with `params`
        and `adapter` fits `max_seq_len` with one new token, its KV can fit the whole pool,
        and the adapter is known.

        Raises:
          RequestError: naming the field ("prompt", "max_tokens" or "model") and the limit.
        """
        n = prompt_len
        if n == 0:
            raise RequestError(f"{what}: the prompt is empty", "prompt")
        if n + 1 > self.max_seq_len:
            raise RequestError(f"{what}: the prompt has {n} tokens; at most "
                               f"{self.max_seq_len - 1} leave room for one new token "
                               f"(max_seq_len={self.max_seq_len})", "prompt")  # fmt: skip
        if output_len and n + output_len >= self.max_seq_len:
            raise RequestError(f"{what}: prompt + output ids reach max_seq_len="
                               f"{self.max_seq_len}", "prompt")  # fmt: skip
        if adapter is not None and (self.adapters is None or adapter not in self.adapters):
            known = list(self.adapters.names) if self.adapters is not None else []
            raise RequestError(f"{what}: no LoRA adapter named {adapter!r} (adapters: "
                               f"{known})", "model")  # fmt: skip
        # The last sampled token ends the request and is never run: its KV is not kept.
        kv = min(n + params.max_tokens, self.max_seq_len) - 1
        need = self.pages.num_pages_for(kv)
        if need > self.pages.num_pages:
            raise RequestError(
                f"{what}: {n} prompt tokens + max_tokens={params.max_tokens} (capped at "
                f"max_seq_len={self.max_seq_len}) can need KV for {kv} tokens = {need} pages "
                f"of {self.page_size}, more than the whole pool of {self.pages.num_pages} pages; "
                "lower max_tokens or shorten the prompt", "max_tokens")  # fmt: skip

    def add(self, req: Request) -> None:
        """Validate `req` (`check`, and a request id not in use) and queue it (WAITING, at the
        back).

        Raises RequestError naming the field; nothing else changes.
        """
        rid = req.request_id
        if rid in self._live:
            raise RequestError(f"request_id={rid!r} is already in use", "request_id")
        self.check(len(req.prompt_ids), req.params, req.adapter, len(req.output_ids),
                   f"request {rid!r}")  # fmt: skip
        req.status = WAITING
        req.num_computed = 0
        req.slot = None
        req.finish_reason = None
        req.arrival = self._arrivals
        self._arrivals += 1
        self._live[rid] = req
        self._waiting.append(req)

    def abort(self, request_id: str) -> Request | None:
        """End a waiting or running request now (finish_reason "abort"; pages and slot freed).
        Returns it, or None when no unfinished request has that id."""
        req = self._live.get(request_id)
        if req is None:
            return None
        if req.status is WAITING:
            self._waiting.remove(req)
        else:
            self._running.remove(req)
        self._finish(req, "abort")
        return req

    # ----------------------------------------------------------------------- schedule
    def schedule(self) -> StepPlan:
        """Plan the next step (the policy is in the module docstring). Mutates the requests'
        status, slot and pages; `num_computed` moves only in `update` (and on admission with a
        prefix hit, to the hit's length; on preemption, to 0)."""
        budget = self.max_batch_tokens
        items: list[Item] = []
        preempted: list[Request] = []

        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            while not self.pages.allocate(req.request_id, req.num_computed + n):
                victim = self._running[-1]  # never one already planned: those come before i
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if req.status is not RUNNING:
                break  # it was the last one admitted: nothing after it to plan
            items.append(Item(req, req.slot, req.num_computed, n))
            budget -= n
            i += 1

        passed: list[Request] = []  # waiting for an adapter slot: they keep their places
        while not preempted and self._waiting and budget > 0 and self._free_slots:
            req = self._waiting[0]
            lora = -1
            if req.adapter is not None:
                got = self.adapters.acquire(req.adapter)
                if got is None:
                    passed.append(self._waiting.popleft())
                    continue
                lora = got
            hit = []
            if self.prefix_caching:
                hit = self.pages.match_prefix(req.all_ids, req.extra_key)
            start = len(hit) * self.page_size
            n = min(req.num_tokens - start, budget)
            if not self.pages.allocate(req.request_id, start + n, prefix_pages=hit):
                if req.adapter is not None:
                    self.adapters.release(req.adapter)
                break
            self._waiting.popleft()
            req.lora_slot = lora
            if self.prefix_caching:
                self.prefix_query_tokens += req.num_tokens
                self.prefix_hit_tokens += start
            req.status = RUNNING
            req.slot = heapq.heappop(self._free_slots)
            req.num_computed = start
            self._running.append(req)
            items.append(Item(req, req.slot, start, n))
            budget -= n
        self._waiting.extendleft(reversed(passed))
        return StepPlan(items, preempted)

    def _preempt(self, req: Request) -> None:
        self._running.remove(req)
        self.pages.free(req.request_id)
        heapq.heappush(self._free_slots, req.slot)
        self._release_adapter(req)
        req.slot = None
        req.num_computed = 0
        req.status = WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(req)

    # ----------------------------------------------------------------------- update
    def update(self, plan: StepPlan, sampled: dict[str, int]) -> list[Request]:
        """Apply a step the device ran: advance each item's request by its tokens, register
        its newly full pages in the prefix cache, append `sampled[request_id]` where the item
        `samples` and stop the request where a rule says so (in vLLM's order: max_tokens or
        max_seq_len -> "length"; an EOS id unless ignore_eos, or a stop token id -> "stop");
        a finished request's pages and slot are freed. Items of requests aborted since the
        plan are skipped. Returns the requests finished by this step."""
        finished: list[Request] = []
        ps = self.page_size
        for it in plan.items:
            req = it.request
            if req.status is not RUNNING or req.num_computed != it.start:
                continue
            req.num_computed = it.end
            reason = None
            if it.samples:
                try:
                    token = int(sampled[req.request_id])
                except KeyError:
                    raise KeyError(f"update: no sampled token for request {req.request_id!r}, "
                                   "whose item reached the end of its tokens") from None  # fmt: skip
                req.output_ids.append(token)
                reason = self._stop_reason(req, token)
            if self.prefix_caching and it.end // ps > it.start // ps:
                self.pages.commit(req.request_id, req.all_ids, req.num_computed, req.extra_key)
            if reason is not None:
                self._running.remove(req)
                self._finish(req, reason)
                finished.append(req)
        return finished

    def _stop_reason(self, req: Request, token: int) -> str | None:
        p = req.params
        if len(req.output_ids) >= p.max_tokens or req.num_tokens >= self.max_seq_len:
            return "length"
        if (not p.ignore_eos and token in req.eos_ids) or token in p.stop_token_ids:
            return "stop"
        return None

    def _finish(self, req: Request, reason: str) -> None:
        self.pages.free(req.request_id)
        if req.slot is not None:
            heapq.heappush(self._free_slots, req.slot)
            self._release_adapter(req)
        req.slot = None
        req.status = FINISHED
        req.finish_reason = reason
        del self._live[req.request_id]

    def _release_adapter(self, req: Request) -> None:
        if req.adapter is not None and req.lora_slot >= 0:
            self.adapters.release(req.adapter)
        req.lora_slot = -1
