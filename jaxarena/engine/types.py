"""What a request is and what the engine answers: `SamplingParams` (validated once, at the
door), `RequestError` (one bad request, nothing else disturbed) and `TokenEvent` (the tokens a
request got in one engine step).

A leaf of the engine stage: imports no jax, so the server can validate requests and build its
schema without touching the device.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["FINISH_REASONS", "MAX_LOGPROBS", "RequestError", "SamplingParams", "TokenEvent"]

MAX_LOGPROBS = 20
"""The most top-n logprobs a request may ask for (the OpenAI chat API's limit; the compiled
sampler always computes this many, so asking for fewer costs nothing more)."""

FINISH_REASONS = ("stop", "length", "abort")


class RequestError(ValueError):
    """One request the engine cannot serve as given (a prompt past a limit, a sampling field
    out of range, token ids outside the vocabulary, more pages than the whole pool). The
    message names the field and the limit; the engine and every other request are untouched.
    `param` is the name of the offending field (the OpenAI error's `param`), or None."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _num(name: str, value: Any, *, integer: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (not integer and not math.isfinite(value)):
        kind = "an integer" if integer else "a finite number"
        raise RequestError(f"{name}={value!r} must be {kind}", name)
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request samples and when it stops (vLLM's fields and defaults).

    Attributes:
      max_tokens: new tokens at most (>= 1); the request also stops at `max_seq_len`.
      temperature: 0 is greedy (argmax); > 0 divides the logits.
      top_k: keep the k most likely tokens; 0 or -1: all.
      top_p: keep the smallest set of most likely tokens whose probability reaches top_p,
        in (0, 1].
      min_p: drop tokens whose probability is below min_p times the largest, in [0, 1].
      repetition_penalty: > 0; logits of tokens in the prompt or the output so far are
        divided by it where positive, multiplied where negative (1: off).
      presence_penalty, frequency_penalty: in [-2, 2]; subtracted from the logits of tokens
        the output holds, once / per occurrence (0: off).
      seed: the request's own random stream (its tokens do not depend on what else is in
        the batch); None: a random seed drawn when the request is added.
      stop_token_ids: more token ids that end the request (the token is kept in the output).
      ignore_eos: do not stop at the model's EOS ids.
      logprobs: None: no logprobs; n in 0..MAX_LOGPROBS: the chosen token's log-probability
        and the n most likely tokens' (of the model's distribution before any sampling
        processing, as vLLM returns them).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if _num("max_tokens", self.max_tokens, integer=True) < 1:
            raise RequestError(f"max_tokens={self.max_tokens} must be >= 1", "max_tokens")
        if _num("temperature", self.temperature) < 0:
            raise RequestError(f"temperature={self.temperature} must be >= 0", "temperature")
        if _num("top_k", self.top_k, integer=True) < -1:
            raise RequestError(f"top_k={self.top_k} must be -1, 0 (all tokens) or >= 1", "top_k")
        if not 0 < _num("top_p", self.top_p) <= 1:
            raise RequestError(f"top_p={self.top_p} must be in (0, 1]", "top_p")
        if not 0 <= _num("min_p", self.min_p) <= 1:
            raise RequestError(f"min_p={self.min_p} must be in [0, 1]", "min_p")
        if _num("repetition_penalty", self.repetition_penalty) <= 0:
            raise RequestError(f"repetition_penalty={self.repetition_penalty} must be > 0",
                               "repetition_penalty")  # fmt: skip
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= _num(name, getattr(self, name)) <= 2:
                raise RequestError(f"{name}={getattr(self, name)} must be in [-2, 2]", name)
        if self.seed is not None and not 0 <= _num("seed", self.seed, integer=True) < 2**63:
            raise RequestError(f"seed={self.seed} must be in [0, 2**63)", "seed")
        ids = tuple(self.stop_token_ids)
        for t in ids:
            if _num("stop_token_ids", t, integer=True) < 0:
                raise RequestError(f"stop_token_ids holds {t}, a negative id", "stop_token_ids")
        object.__setattr__(self, "stop_token_ids", ids)
        if self.logprobs is not None and not 0 <= _num("logprobs", self.logprobs,
                                                       integer=True) <= MAX_LOGPROBS:  # fmt: skip
            raise RequestError(f"logprobs={self.logprobs} must be in 0..{MAX_LOGPROBS}",
                               "logprobs")  # fmt: skip

    @property
    def greedy(self) -> bool:
        """Temperature 0: the argmax, no random draw."""
        return self.temperature == 0


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """What one request got in one engine step.

    Attributes:
      request_id: the request.
      token_ids: the new tokens (one per step while decoding; empty for an abort or an error).
      logprobs: with `SamplingParams.logprobs`: one entry per new token, `(chosen token's
        logprob, [(token id, logprob), ...] the top n, most likely first)`; else None.
      finish_reason: None while the request runs; `"stop"` (EOS or a stop token id),
        `"length"` (max_tokens or max_seq_len) or `"abort"` on its last event.
      prompt_tokens, completion_tokens: counts so far (`usage`).
      error: a message when the request failed inside the engine (finish_reason "abort").
    """

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[tuple[float, tuple[tuple[int, float], ...]], ...] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None

    @property
    def finished(self) -> bool:
        """True on the request's last event."""
        return self.finish_reason is not None
