"""The OpenAI API's request and response bodies (the fields `jaxarena serve` reads and writes),
as pydantic models, and the OpenAI error shape.

Requests ignore unknown fields (clients send many: `user`, `logit_bias`, ...), as the OpenAI
server does; the fields jaxarena reads are checked here for type, and for range where the
engine's `SamplingParams` does not check them (n, prompt shape). A failed check is a
`RequestError` naming the field, answered 400.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jaxarena.engine.types import MAX_LOGPROBS, RequestError, SamplingParams

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ErrorBody",
    "StreamOptions",
    "error_body",
    "new_id",
]

# One stop string at most this long, and at most this many: each is searched in every new
# piece of text, and streaming holds back the longest one's length.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


def new_id(prefix: str) -> str:
    """A fresh response id, OpenAI's style (`cmpl-...`, `chatcmpl-...`)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """Unix seconds: a response's `created`."""
    return int(time.time())


class ErrorBody(BaseModel):
    """The inside of OpenAI's error response `{"error": {...}}`."""

    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error JSON for HTTP `status` (400: invalid_request_error, 404: not_found,
    503: the server is shutting down)."""
    kind = {400: "invalid_request_error", 404: "NotFoundError", 503: "ServiceUnavailableError"}
    body = ErrorBody(message=message, type=kind.get(status, "server_error"), param=param,
                     code=status)  # fmt: skip
    return {"error": body.model_dump()}


class StreamOptions(BaseModel):
    """`stream_options`: `include_usage` adds a last chunk with the usage and no choices."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """The fields completions and chat share (OpenAI's plus vLLM's common extensions)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False

    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple of non-empty strings, checked against the limits."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise RequestError(f"stop holds {len(stops)} strings; at most {MAX_STOP_STRINGS}",
                               "stop")  # fmt: skip
        for s in stops:
            if len(s) > MAX_STOP_CHARS:
                raise RequestError(f"a stop string of {len(s)} characters is longer than "
                                   f"{MAX_STOP_CHARS}", "stop")  # fmt: skip
        return tuple(s for s in stops if s)

    def check_common(self) -> None:
        """What `SamplingParams` does not check: n and stream_options."""
        if self.n != 1:
            raise RequestError(f"n={self.n}: only n=1 is supported", "n")
        if self.stream_options is not None and not self.stream:
            raise RequestError("stream_options is only allowed with stream=true", "stream_options")

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """The engine's `SamplingParams` (OpenAI's defaults where a field is absent:
        temperature 1, top_p 1). Raises `RequestError` naming the bad field."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
        )


class CompletionRequest(_SamplingRequest):
    """`POST /v1/completions`: `prompt` is a string, a list of strings, a list of token ids or a
    list of lists of token ids (one choice per prompt); `logprobs` is the number of top
    tokens (0..MAX_LOGPROBS) besides the chosen one's."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a string or a list of token ids, in order."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise RequestError("prompt is empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)

    def check(self) -> None:
        """The completion-only checks (echo and suffix are not supported)."""
        self.check_common()
        if self.echo:
            raise RequestError("echo=true is not supported", "echo")
        if self.suffix:
            raise RequestError("suffix is not supported", "suffix")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise RequestError(f"logprobs={self.logprobs} must be in 0..{MAX_LOGPROBS}",
                               "logprobs")  # fmt: skip


class ChatMessage(BaseModel):
    """One chat message; `content` a string or a list of parts (text parts are joined)."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template sees it: a dict with string content."""
        out = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            texts = []
            for part in self.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(f"content part of type {part.get('type')!r}: only text "
                                       "parts are supported", "messages")  # fmt: skip
                texts.append(part["text"])
            out["content"] = "\n".join(texts)
        elif self.content is None:
            out["content"] = ""
        return out


class ChatCompletionRequest(_SamplingRequest):
    """`POST /v1/chat/completions`: `messages` rendered by the checkpoint's chat template;
    `logprobs` (bool) with `top_logprobs` (0..MAX_LOGPROBS); `max_completion_tokens` is a
    synonym of `max_tokens`."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True

    def check(self) -> None:
        """The chat-only checks."""
        self.check_common()
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise RequestError("top_logprobs needs logprobs=true", "top_logprobs")
            if not 0 <= self.top_logprobs <= MAX_LOGPROBS:
                raise RequestError(f"top_logprobs={self.top_logprobs} must be in "
                                   f"0..{MAX_LOGPROBS}", "top_logprobs")  # fmt: skip

    def num_logprobs(self) -> int | None:
        """`SamplingParams.logprobs`: None without logprobs, else top_logprobs (default 0)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens`, else `max_tokens`, else None (the rest of the context)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

