"""The serving engine: continuous batching on the fixed workspace (a page pool the budget
sizes, a block manager with prefix caching, a scheduler with preemption, sampling on the
device) and its offline and asynchronous Python API."""

from jaxarena.engine.types import MAX_LOGPROBS, RequestError, SamplingParams, TokenEvent

__all__ = ["MAX_LOGPROBS", "RequestError", "SamplingParams", "TokenEvent"]
