"""Shared by the server tests: the fixture checkpoint, a server in a thread, the official
`openai` client on it, and the metric reader."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "serve" / "qwen3"


def client_for(url: str):
    """The official OpenAI client on the server (no retries: a failure shows at once)."""
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def metric(url: str, name: str) -> float:
    """One sample of `/metrics` (a metric without labels)."""
    import urllib.request

    # urllib, not httpx: a new httpx client builds an SSL context (~50 ms), per poll.
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics:\n{text}"
    return float(m.group(1))


def sse_chunks(lines) -> list[str]:
    """The `data:` payloads of a server-sent-event stream, `[DONE]` included."""
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]
