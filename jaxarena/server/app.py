"""The FastAPI app of `jaxarena serve`: `POST /v1/completions`, `POST /v1/chat/completions`,
`GET /v1/models`, `GET /health`, `GET /metrics`.

Every bad request is a 400 in OpenAI's error shape naming the field (pydantic's validation
errors included: never FastAPI's 422), an unknown model a 404; a request the engine fails is a
500 for that request only. Streams are server-sent events ending in `data: [DONE]`; an error
after the stream started is an error event, then `[DONE]`. A client that goes away aborts its
engine requests (streaming: Starlette cancels the body iterator; otherwise a watcher task
cancels the handler), which frees their pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from jaxarena.engine.types import RequestError
from jaxarena.server.metrics import CONTENT_TYPE, ServerMetrics
from jaxarena.server.outputs import (
    ChoiceRun,
    EngineFailure,
    chat_logprobs,
    completion_logprobs,
    merge,
)
from jaxarena.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    new_id,
    now,
)
from jaxarena.server.tokenizer import ServerTokenizer

__all__ = ["ServerState", "create_app"]

# Completions' default max_tokens (OpenAI's); chat's default is the rest of the context.
COMPLETION_MAX_TOKENS = 16


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


class ServerState:
    """What the handlers share: the engine (an `AsyncEngine`), the tokenizer, the served
    model name, the metrics, and `draining` (set at shutdown: new requests get 503)."""

    def __init__(self, engine: Any, tokenizer: ServerTokenizer, model_name: str,
                 metrics: ServerMetrics):  # fmt: skip
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.metrics = metrics
        self.draining = False
        self.created = now()

    @property
    def max_seq_len(self) -> int:
        """The engine's longest sequence (prompt + output)."""
        return self.engine.engine.max_seq_len

    @property
    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters a request may name as its `model`."""
        slots = getattr(self.engine.engine, "adapters", None)
        return slots.names if slots is not None else ()


def create_app(engine: Any, tokenizer: ServerTokenizer, *, model_name: str,
               shutdown_timeout: float = 30.0) -> FastAPI:  # fmt: skip
    """The app serving `engine` (an `AsyncEngine`, started at app start-up and shut down,
    draining its running requests for at most `shutdown_timeout` seconds, at app shutdown)
    under the model name `model_name`. `app.state.server` is the `ServerState`."""
    state = ServerState(engine, tokenizer, model_name, ServerMetrics(engine.engine.stats))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        state.draining = True
        await engine.shutdown(timeout=shutdown_timeout)

    app = FastAPI(title="jaxarena", lifespan=lifespan)
    app.state.server = state

    def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
        return JSONResponse(error_body(status, message, param), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        param = next((x for x in reversed(loc) if not x.isdigit()), None)
        where = ".".join(loc) or "body"
        return _error(400, f"{where}: {first.get('msg')}", param)

    @app.exception_handler(RequestError)
    async def _bad(request: Request, exc: RequestError) -> JSONResponse:
        return _error(400, str(exc), exc.param)

    @app.exception_handler(_HTTPError)
    async def _http(request: Request, exc: _HTTPError) -> JSONResponse:
        return _error(exc.status, str(exc), exc.param)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(EngineFailure)
    async def _failed(request: Request, exc: EngineFailure) -> JSONResponse:
        return _error(500, f"the engine failed the request: {exc}")

    @app.get("/health")
    async def health() -> Response:
        failed = getattr(engine, "error", None) is not None  # the engine thread died
        return Response(status_code=503 if state.draining or failed else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": state.created,
                "owned_by": "jaxarena", "max_model_len": state.max_seq_len}  # fmt: skip
        # A LoRA adapter is a model of its own whose parent is the base model (as vLLM lists).
        cards = [card] + [{**card, "id": a, "parent": model_name} for a in state.adapters]
        return {"object": "list", "data": cards}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        adapter = _admit(state, body.model)
        body.check()
        stop = body.stop_strings()
        prompts = [_prompt_ids(state, p, "prompt") for p in body.prompts()]
        max_tokens = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        params = body.sampling_params(max_tokens, body.logprobs)
        runs = _submit(state, prompts, params, stop, adapter)
        rid, created = new_id("cmpl"), now()
        head = {"id": rid, "object": "text_completion", "created": created,
                "model": adapter or model_name}  # fmt: skip
        want_lp = body.logprobs is not None
        tok = state.tokenizer

        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)

            async def events() -> AsyncIterator[dict]:
                offsets = [0] * len(runs)
                async for p in merge(runs):
                    lp = completion_logprobs(tok, p.logprobs, offsets[p.index]) if want_lp else None
                    offsets[p.index] += sum(len(t) for t in (lp or {}).get("tokens", ()))
                    choice = {"index": p.index, "text": p.text, "logprobs": lp,
                              "finish_reason": p.finish_reason}  # fmt: skip
                    yield {**head, "choices": [choice]}
                if usage:
                    yield {**head, "choices": [], "usage": _usage(runs)}

            return _sse(events())

        async def collect() -> dict[str, Any]:
            results = await asyncio.gather(*(r.collect() for r in runs))
            choices = []
            for r, (text, entries) in zip(runs, results, strict=True):
                lp = completion_logprobs(tok, entries, 0) if want_lp else None
                choices.append({"index": r.index, "text": text, "logprobs": lp,
                                "finish_reason": r.finish_reason})  # fmt: skip
            return {**head, "choices": choices, "usage": _usage(runs)}

        return JSONResponse(await _unless_disconnected(request, collect(), runs))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        adapter = _admit(state, body.model)
        body.check()
        stop = body.stop_strings()
        messages = [m.for_template() for m in body.messages]
        text = state.tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt)
        ids = state.tokenizer.encode(text, add_special_tokens=False)
        _check_length(state, ids, "messages")
        max_tokens = body.requested_max_tokens()
        if max_tokens is None:
            max_tokens = state.max_seq_len - len(ids)
        params = body.sampling_params(max_tokens, body.num_logprobs())
        runs = _submit(state, [ids], params, stop, adapter)
        rid, created = new_id("chatcmpl"), now()
        head = {"id": rid, "object": "chat.completion.chunk", "created": created,
                "model": adapter or model_name}  # fmt: skip
        tok = state.tokenizer

        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)

            async def events() -> AsyncIterator[dict]:
                first = {"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": None, "finish_reason": None}  # fmt: skip
                yield {**head, "choices": [first]}
                async for p in merge(runs):
                    lp = chat_logprobs(tok, p.logprobs) if body.logprobs else None
                    delta = {"content": p.text} if p.text or not p.finish_reason else {}
                    choice = {"index": 0, "delta": delta, "logprobs": lp,
                              "finish_reason": p.finish_reason}  # fmt: skip
                    yield {**head, "choices": [choice]}
                if usage:
                    yield {**head, "choices": [], "usage": _usage(runs)}

            return _sse(events())

        async def collect() -> dict[str, Any]:
            text, entries = await runs[0].collect()
            message = {"role": "assistant", "content": text}
            lp = chat_logprobs(tok, entries) if body.logprobs else None
            choice = {"index": 0, "message": message, "logprobs": lp,
                      "finish_reason": runs[0].finish_reason}  # fmt: skip
            return {**head, "object": "chat.completion", "choices": [choice],
                    "usage": _usage(runs)}  # fmt: skip

        return JSONResponse(await _unless_disconnected(request, collect(), runs))

    return app


def _admit(state: ServerState, model: str | None) -> str | None:
    """The LoRA adapter the request's `model` names (None: the base model); 404 for a name
    the server does not serve, 503 while it shuts down."""
    if state.draining:
        raise _HTTPError(503, "the server is shutting down")
    if model is None or model == state.model_name:
        return None
    if model in state.adapters:
        return model
    served = [state.model_name, *state.adapters]
    raise _HTTPError(404, f"model {model!r} does not exist; this server serves {served}", "model")


def _check_length(state: ServerState, ids: Sequence[int], param: str) -> None:
    if not ids:
        raise RequestError(f"{param} is empty (no tokens)", param)
    if len(ids) >= state.max_seq_len:
        raise RequestError(f"{param} has {len(ids)} tokens; the model's max_seq_len is "
                           f"{state.max_seq_len} (prompt + at least one new token)",
                           param)  # fmt: skip


def _prompt_ids(state: ServerState, prompt: str | list[int], param: str) -> list[int]:
    if isinstance(prompt, str):
        ids = state.tokenizer.encode(prompt)
    else:
        vocab = state.engine.engine.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"{param} holds token id {bad[0]}, outside the vocabulary "
                               f"0..{vocab - 1}", param)  # fmt: skip
        ids = list(prompt)
    _check_length(state, ids, param)
    return ids


def _submit(state: ServerState, prompts: list[list[int]], params: Any, stop: tuple[str, ...],
            adapter: str | None = None) -> list[ChoiceRun]:  # fmt: skip
    """Submits every prompt with LoRA adapter `adapter` (None: the base model); all or none:
    a refused one aborts those already in."""
    arrival = time.monotonic()
    runs: list[ChoiceRun] = []
    try:
        for i, ids in enumerate(prompts):
            stream = state.engine.submit(ids, params, adapter=adapter)
            runs.append(ChoiceRun(i, stream, state.tokenizer, ids, stop, state.metrics, arrival))
    except RequestError as e:
        for r in runs:
            r.stream.abort()
        if "shutting down" in str(e):
            raise _HTTPError(503, str(e)) from None
        raise
    state.metrics.prompt_tokens.inc(sum(len(p) for p in prompts))
    return runs


def _usage(runs: Sequence[ChoiceRun]) -> dict[str, int]:
    prompt = sum(r.prompt_tokens for r in runs)
    completion = sum(r.completion_tokens for r in runs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


def _sse(events: AsyncIterator[dict]) -> StreamingResponse:
    """Server-sent events: one `data: {json}` per chunk, `data: [DONE]` last; a failure after
    the stream began is an error event before `[DONE]`."""

    async def body() -> AsyncIterator[str]:
        try:
            async for chunk in events:
                yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        except (EngineFailure, RequestError) as e:
            status = 400 if isinstance(e, RequestError) else 500
            yield f"data: {json.dumps(error_body(status, str(e)))}\n\n"
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})  # fmt: skip


async def _unless_disconnected(request: Request, work: Awaitable[Any],
                               runs: Sequence[ChoiceRun]) -> Any:  # fmt: skip
    """Awaits `work`; if the client disconnects first, cancels it (the runs abort their
    engine requests) and raises CancelledError."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            for r in runs:
                r.stream.abort()
    if not task.done() or task.cancelled():
        raise asyncio.CancelledError
    return task.result()
