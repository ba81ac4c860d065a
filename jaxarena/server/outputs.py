"""From the engine's token events to the OpenAI API's pieces: one `ChoiceRun` per prompt turns
its `RequestStream` into text deltas (incremental detokenizer, stop strings, the hold-back),
logprobs and a finish reason, updates the metrics, and aborts its engine request when it ends
early (a stop string, a client gone, a cancelled task). `merge` interleaves several runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from jaxarena.server.metrics import ServerMetrics
from jaxarena.server.tokenizer import IncrementalDetokenizer, ServerTokenizer

__all__ = ["ChoiceRun", "EngineFailure", "Piece", "chat_logprobs", "completion_logprobs",
           "merge"]  # fmt: skip


class EngineFailure(RuntimeError):
    """The engine ended a request with an error (not the request's fault): a 500, or an
    error event in a stream."""


@dataclasses.dataclass
class Piece:
    """What one choice got since its last piece.

    Attributes:
      index: the choice.
      text: new text (after the hold-back; may be empty).
      logprobs: per new token `(token id, logprob, ((id, logprob), ...) top n)`.
      finish_reason: None, "stop" or "length" on the choice's last piece.
    """

    index: int
    text: str
    logprobs: list[tuple[int, float, tuple[tuple[int, float], ...]]]
    finish_reason: str | None = None


class ChoiceRun:
    """One prompt's request on the engine, read as `Piece`s.

    Attributes:
      prompt_tokens, completion_tokens: the usage (completion tokens counted up to the one
        that completed a stop string).
      text: the whole output text so far.
    """

    def __init__(self, index: int, stream: Any, tokenizer: ServerTokenizer,
                 prompt_ids: Sequence[int], stop: Sequence[str], metrics: ServerMetrics,
                 arrival: float):  # fmt: skip
        self.index = index
        self.stream = stream
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop)
        self.metrics = metrics
        self.arrival = arrival
        self.prompt_tokens = len(prompt_ids)
        self.completion_tokens = 0
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        """The output text so far (cut before a matched stop string)."""
        return self.detok.text

    async def pieces(self) -> AsyncIterator[Piece]:
        """The choice's pieces, the last with its finish reason. The engine request is
        aborted when this ends without the engine finishing it (stop string, cancellation,
        the consumer closing it)."""
        last = None
        try:
            async for event in self.stream:
                if event.error or event.finish_reason == "abort":
                    raise EngineFailure(event.error or "the engine aborted the request")
                now = time.monotonic()
                logprobs = []
                # The token that ended a request with "stop" (EOS or a stop_token_ids id) is
                # counted but not part of the text (vLLM's default, as for stop strings).
                ended = len(event.token_ids) - 1 if event.finish_reason == "stop" else -1
                for j, token in enumerate(event.token_ids):
                    if last is None:
                        self.metrics.ttft.observe(now - self.arrival)
                    else:
                        self.metrics.itl.observe((now - last) / len(event.token_ids))
                    self.completion_tokens += 1
                    self.metrics.generation_tokens.inc()
                    if event.logprobs is not None:
                        chosen, top = event.logprobs[j]
                        logprobs.append((token, chosen, tuple(top)))
                    if j != ended and self.detok.add(token):
                        break
                last = now if event.token_ids else last
                if self.detok.stopped:
                    self.finish_reason = "stop"
                elif event.finish_reason is not None:
                    self.finish_reason = event.finish_reason
                    self.detok.flush()
                final = self.finish_reason is not None
                text = self.detok.take(final)
                if text or logprobs or final:
                    yield Piece(self.index, text, logprobs, self.finish_reason)
                if final:
                    self.metrics.requests.labels(self.finish_reason).inc()
                    self.metrics.e2e.observe(time.monotonic() - self.arrival)
                    return
            raise EngineFailure("the engine ended the request without a finish reason")
        finally:
            if self.finish_reason is None or self.detok.stopped:
                self.stream.abort()

    async def collect(self) -> tuple[str, list]:
        """Every piece: the whole text and every token's logprobs."""
        logprobs: list = []
        async for piece in self.pieces():
            logprobs += piece.logprobs
        return self.detok.text, logprobs


async def merge(runs: Sequence[ChoiceRun]) -> AsyncIterator[Piece]:
    """The pieces of several runs as they come (one run: its own pieces, no task). Ending
    early (the consumer closes it, or it is cancelled) cancels every run, which aborts their
    engine requests."""
    if len(runs) == 1:
        gen = runs[0].pieces()
        try:
            async for piece in gen:
                yield piece
        finally:
            await gen.aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(run: ChoiceRun) -> None:
        try:
            async for piece in run.pieces():
                await queue.put(piece)
        except Exception as e:  # handed to the consumer, which raises it
            await queue.put(e)
            return
        await queue.put(done)

    tasks = [asyncio.create_task(pump(r)) for r in runs]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def completion_logprobs(tokenizer: ServerTokenizer, entries: list, text_start: int
                        ) -> dict[str, Any]:  # fmt: skip
    """The completions API's `logprobs` object for `entries` (see `Piece.logprobs`);
    `text_offset` counts from `text_start`, the characters of the choice before them."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                            "text_offset": []}  # fmt: skip
    offset = text_start
    for token, logprob, top in entries:
        text = tokenizer.token_text(token)
        out["tokens"].append(text)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append({tokenizer.token_text(t): lp for t, lp in top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def chat_logprobs(tokenizer: ServerTokenizer, entries: list) -> dict[str, Any]:
    """The chat API's `logprobs` object (`{"content": [...]}`) for `entries`."""

    def one(token: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for token, logprob, top in entries:
        item = one(token, logprob)
        item["top_logprobs"] = [one(t, lp) for t, lp in top]
        content.append(item)
    return {"content": content}
