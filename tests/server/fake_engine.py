"""A test double of the engine (`jaxarena.engine.Engine` / `AsyncEngine`, issue #37): the same
interface, deterministic tokens, no jax. The server's tests run on it in milliseconds; the
tests on the real engine run the same checks where it is present.

Tokens: greedy (temperature 0) is a fixed function of the prompt and the position; sampled
draws from `random.Random(seed)`, so a seed reproduces its tokens whatever else runs. Token
ids 0..2 are special (2 is EOS), never drawn unless a prompt asks for EOS (`EOS_TRIGGER` as
its first id). Pages: `ceil(len / kv_block_size)` per running request.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import random
import threading
import time

from jaxarena.engine.types import RequestError, SamplingParams, TokenEvent

EOS = 2
EOS_TRIGGER = 7  # a prompt starting with this id gets EOS as its 3rd token


class _Req:
    def __init__(self, rid, prompt, params):
        self.id, self.prompt, self.params, self.out = rid, list(prompt), params, []
        seed = params.seed if params.seed is not None else random.randrange(2**63)
        self.rng = random.Random(seed)


class FakeEngine:
    """The engine's interface on a deterministic token function."""

    def __init__(self, *, max_batch_size=4, max_seq_len=128, vocab_size=256, kv_block_size=16,
                 kv_pages=64):  # fmt: skip
        self.config, self.model_type = None, "fake"
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.vocab_size = vocab_size
        self.kv_block_size, self.kv_pages = kv_block_size, kv_pages
        self.eos_token_ids = frozenset({EOS})
        self._ids = itertools.count()
        self._reqs: dict[str, _Req] = {}
        self._waiting: collections.deque[str] = collections.deque()
        self._running: list[str] = []
        self._lock = threading.Lock()

    def budget_table(self) -> str:
        return f"fake pool: {self.kv_pages} pages of {self.kv_block_size} tokens"

    def _pages(self, r: _Req) -> int:
        return math.ceil((len(r.prompt) + len(r.out)) / self.kv_block_size)

    def stats(self) -> dict:
        with self._lock:
            return {"kv_pages_total": self.kv_pages,
                    "kv_pages_in_use": sum(self._pages(self._reqs[i]) for i in self._running),
                    "requests_running": len(self._running),
                    "requests_waiting": len(self._waiting)}  # fmt: skip

    def add_request(self, prompt_ids, params: SamplingParams, request_id=None) -> str:
        if not prompt_ids:
            raise RequestError("prompt is empty", "prompt")
        if len(prompt_ids) >= self.max_seq_len:
            raise RequestError(f"prompt of {len(prompt_ids)} tokens past max_seq_len", "prompt")
        if any(not 0 <= t < self.vocab_size for t in prompt_ids):
            raise RequestError("token id outside the vocabulary", "prompt")
        rid = request_id or f"fake-{next(self._ids)}"
        with self._lock:
            self._reqs[rid] = _Req(rid, prompt_ids, params)
            self._waiting.append(rid)
        return rid

    def abort(self, request_id) -> None:
        with self._lock:
            self._reqs.pop(request_id, None)
            if request_id in self._running:
                self._running.remove(request_id)
            if request_id in self._waiting:
                self._waiting.remove(request_id)

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    @staticmethod
    def greedy_token(prompt, position: int) -> int:
        """Greedy output token at `position`: a hash of the prompt and position (not 0..2)."""
        if prompt[0] == EOS_TRIGGER and position == 2:
            return EOS
        return 3 + (sum(prompt) * 131 + len(prompt) * 17 + position * 29) % 253

    def step(self) -> list[TokenEvent]:
        events = []
        with self._lock:
            while self._waiting and len(self._running) < self.max_batch_size:
                self._running.append(self._waiting.popleft())
            for rid in list(self._running):
                r = self._reqs[rid]
                p = r.params
                if p.greedy:
                    tok = self.greedy_token(r.prompt, len(r.out))
                else:
                    tok = r.rng.randrange(3, self.vocab_size)
                r.out.append(tok)
                lp = None
                if p.logprobs is not None:
                    top = tuple((3 + (tok + k) % 253, -0.5 * (k + 1)) for k in range(p.logprobs))
                    lp = ((-0.25, top),)
                finish = None
                if (tok in self.eos_token_ids and not p.ignore_eos) or tok in p.stop_token_ids:
                    finish = "stop"
                elif len(r.out) >= p.max_tokens or len(r.prompt) + len(r.out) >= self.max_seq_len:
                    finish = "length"
                events.append(TokenEvent(rid, (tok,), lp, finish, len(r.prompt), len(r.out)))
                if finish:
                    self._running.remove(rid)
                    del self._reqs[rid]
        return events

    def generate(self, prompts, params):
        """Offline: every prompt's output token ids."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        out = {i: [] for i in ids}
        while self.has_work():
            for e in self.step():
                out[e.request_id] += e.token_ids
        return [out[i] for i in ids]


class FakeStream:
    """`RequestStream`: an async iterator of one request's `TokenEvent`s."""

    def __init__(self, engine: FakeAsyncEngine, rid: str):
        self.request_id, self._engine = rid, engine
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._done = False

    def _put(self, event) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def __aiter__(self):
        return self

    async def __anext__(self) -> TokenEvent:
        if self._done:
            raise StopAsyncIteration
        event = await self._queue.get()
        self._done = event.finished
        return event

    def abort(self) -> None:
        self._engine._abort(self.request_id)


class FakeAsyncEngine:
    """`AsyncEngine` on `FakeEngine`: a thread steps the engine every `step_s` seconds."""

    def __init__(self, engine: FakeEngine, step_s: float = 0.002):
        self.engine, self.step_s = engine, step_s
        self._streams: dict[str, FakeStream] = {}
        self._wake = threading.Event()
        self._stop = False
        self._admitting = True
        self._thread: threading.Thread | None = None
        self.aborted: list[str] = []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="fake-engine")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            if not self.engine.has_work():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            for e in self.engine.step():
                s = self._streams.get(e.request_id)
                if s is not None:
                    s._put(e)
                    if e.finished:
                        self._streams.pop(e.request_id, None)
            time.sleep(self.step_s)

    def submit(self, prompt_ids, params, request_id=None, adapter=None) -> FakeStream:
        if not self._admitting:
            raise RequestError("server is shutting down")
        if adapter is not None:
            raise RequestError(f"the fake engine has no adapter {adapter!r}", "model")
        rid = self.engine.add_request(prompt_ids, params, request_id)
        stream = FakeStream(self, rid)
        self._streams[rid] = stream
        self._wake.set()
        return stream

    def _abort(self, rid: str) -> None:
        if self._streams.pop(rid, None) is not None:
            self.aborted.append(rid)
        self.engine.abort(rid)

    async def shutdown(self, timeout: float = 30.0) -> None:
        self._admitting = False
        deadline = time.monotonic() + timeout
        while self.engine.has_work() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._stop = True
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
