"""`AsyncEngine`: the engine stepped by a background thread, with one asyncio stream of
`TokenEvent`s per request (what `jaxarena serve` runs on).

The engine is not thread-safe, so only its thread touches it: `submit` validates a request
at once (a `RequestError` is raised to the caller, nothing queued), then hands it to the
thread through a queue; aborts travel the same way. The thread runs engine steps while any
request is unfinished and sleeps on a condition otherwise, and delivers each event to its
request's asyncio queue with `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from jaxarena.engine.engine import Engine
from jaxarena.engine.types import RequestError, SamplingParams, TokenEvent

__all__ = ["AsyncEngine", "RequestStream"]


class RequestStream:
    """The events of one request, as an async iterator; the last has `finish_reason` set.

    `abort()` (or `aclose()`, or leaving an `async for` early and closing it) ends the
    request in the engine and frees its pages."""

    def __init__(self, owner: AsyncEngine, request_id: str,
                 loop: asyncio.AbstractEventLoop) -> None:  # fmt: skip
        self.request_id = request_id
        self._owner = owner
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._loop = loop
        self._done = False

    def _put(self, ev: TokenEvent) -> None:  # called on the loop's thread
        self._queue.put_nowait(ev)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._done:
            raise StopAsyncIteration
        ev = await self._queue.get()
        if ev.finished:
            self._done = True
        return ev

    def abort(self) -> None:
        """Ends the request now (idempotent; nothing happens once it has finished)."""
        if not self._done:
            self._done = True
            self._owner.abort(self.request_id)

    async def aclose(self) -> None:
        """`abort()`, for `contextlib.aclosing` and async generator protocols."""
        self.abort()


class AsyncEngine:
    """Runs an `Engine` on a background thread for asyncio callers (see the module
    docstring). `start()` once, `submit()` per request, `await shutdown()` at the end."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self._streams: dict[str, RequestStream] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self._next = 0
        self.error: BaseException | None = None

    def start(self) -> None:
        """Starts the stepping thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop_forever, name="jaxarena-engine",
                                            daemon=True)  # fmt: skip
            self._thread.start()

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
               request_id: str | None = None, adapter: str | None = None) -> RequestStream:  # fmt: skip
        """Queues a request (with LoRA adapter `adapter`, a name the engine knows; None: the
        base model) and returns its stream. Call from a running event loop.

        Raises:
          RequestError: the request is invalid (`Engine.add_request`'s checks run here, on
            the caller's thread, against the engine's limits), or the engine is shutting
            down or stopped by an error.
        """
        if not self._accepting:
            raise RequestError("the server is shutting down")
        if self.error is not None:
            raise RequestError(f"the engine stopped after an error: {self.error!r}")
        params = SamplingParams() if params is None else params
        prompt_ids = self.engine.validate(prompt_ids, params, adapter)
        with self._cond:
            if request_id is None:
                request_id = f"req-{self._next}"
                self._next += 1
            if request_id in self._streams:
                raise RequestError(f"request id {request_id!r} is already in use", "request_id")
            stream = RequestStream(self, request_id, asyncio.get_running_loop())
            self._streams[request_id] = stream
            self._inbox.append(("add", (list(prompt_ids), params, request_id, adapter)))
            self._cond.notify()
        return stream

    def abort(self, request_id: str) -> None:
        """Ends a request (thread-safe; unknown or finished ids are ignored)."""
        with self._cond:
            self._inbox.append(("abort", request_id))
            self._cond.notify()

    def stats(self) -> dict[str, int]:
        """`Engine.stats()` (read from another thread: figures of about the last step)."""
        return self.engine.stats()

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Stops admitting, lets running requests finish for up to `timeout` seconds (then
        aborts the rest), and stops the thread."""
        self._accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._streams and loop.time() < deadline and self.error is None:
            await asyncio.sleep(0.05)
        for rid in list(self._streams):
            self.abort(rid)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)

    # -- the engine thread -----------------------------------------------------------------------

    def _deliver(self, ev: TokenEvent) -> None:
        stream = self._streams.get(ev.request_id)
        if stream is None:
            return
        if ev.finished:
            self._streams.pop(ev.request_id, None)
        try:
            stream._loop.call_soon_threadsafe(stream._put, ev)
        except RuntimeError:  # the caller's loop is closed: nobody listens
            pass

    def _loop_forever(self) -> None:
        e = self.engine
        try:
            while True:
                with self._cond:
                    while not self._inbox and not e.has_unfinished() and not self._stopping:
                        self._cond.wait()
                    if self._stopping and not self._inbox:
                        return
                    inbox, self._inbox = list(self._inbox), collections.deque()
                for kind, arg in inbox:
                    if kind == "add":
                        prompt, params, rid, adapter = arg
                        try:
                            e.add_request(prompt, params, rid, adapter)
                        except RequestError as err:
                            self._deliver(TokenEvent(rid, (), None, "abort", len(prompt), 0,
                                                     error=str(err)))  # fmt: skip
                    else:
                        e.abort(arg)
                for ev in e.step():
                    self._deliver(ev)
        except BaseException as err:  # a bug or a device failure: end every stream
            self.error = err
            msg = "".join(traceback.format_exception_only(type(err), err)).strip()
            for rid in list(self._streams):
                self._deliver(TokenEvent(rid, (), None, "abort", error=f"engine error: {msg}"))
            raise
