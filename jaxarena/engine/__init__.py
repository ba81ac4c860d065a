"""The serving engine: continuous batching on the fixed workspace (a page pool the budget
sizes, a block manager with prefix caching, a scheduler with preemption, sampling on the
device) and its offline and asynchronous Python API.

```python
from jaxarena.engine import Engine, SamplingParams

engine = Engine.from_pretrained("path/to/checkpoint", max_batch_size=8, max_seq_len=2048,
                                max_batch_tokens=512, memory="80GB")
outs = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.7, max_tokens=32))
```

`jaxarena.engine.types` (the request types) imports no jax; the rest does.
"""

from jaxarena.engine.async_engine import AsyncEngine, RequestStream
from jaxarena.engine.engine import CompletionOutput, Engine
from jaxarena.engine.types import MAX_LOGPROBS, RequestError, SamplingParams, TokenEvent

__all__ = [
    "MAX_LOGPROBS",
    "AsyncEngine",
    "CompletionOutput",
    "Engine",
    "RequestError",
    "RequestStream",
    "SamplingParams",
    "TokenEvent",
]
