"""The server's Prometheus metrics (`GET /metrics`), in a registry of its own per app (two
servers in one process, as in the tests, do not share counters).

Gauges read the engine's `stats()` at scrape time: `jaxarena_kv_pages_total`,
`jaxarena_kv_pages_in_use` (pages held by requests), `jaxarena_requests_running`,
`jaxarena_requests_waiting`, and `jaxarena_kv_pages_cached` where the engine has a prefix
cache. Counters: `jaxarena_prompt_tokens_total`,
`jaxarena_generation_tokens_total`, `jaxarena_requests_total{finish_reason}`. Histograms:
`jaxarena_time_to_first_token_seconds`, `jaxarena_inter_token_latency_seconds`,
`jaxarena_request_latency_seconds`.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The engine's stats() keys and what each gauge says.
GAUGES = {
    "kv_pages_total": "KV-cache pages in the pool",
    "kv_pages_in_use": "KV-cache pages held by requests (pages only the prefix cache holds "
    "are not counted)",
    "requests_running": "requests in the running batch",
    "requests_waiting": "requests admitted but waiting for a slot or pages",
    "kv_pages_cached": "KV-cache pages only the prefix cache holds (free to evict)",
}
# Latency buckets: a token is milliseconds on a GPU, seconds on a CPU under load.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _EngineCollector:
    """Reads the pool and queue gauges from `stats()` when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], dict]):
        self._stats = stats

    def collect(self):
        stats = self._stats()
        for key, doc in GAUGES.items():
            if key not in stats and key == "kv_pages_cached":  # an engine without a cache
                continue
            g = GaugeMetricFamily(f"jaxarena_{key}", doc)
            g.add_metric([], float(stats.get(key, 0)))
            yield g


class ServerMetrics:
    """The counters and histograms the request handlers update, and the engine gauges.

    `stats` is the engine's `stats()` (called at each scrape, from the event loop)."""

    def __init__(self, stats: Callable[[], dict]):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(stats))
        r = self.registry
        self.prompt_tokens = Counter("jaxarena_prompt_tokens", "prompt tokens admitted",
                                     registry=r)  # fmt: skip
        self.generation_tokens = Counter("jaxarena_generation_tokens",
                                         "tokens generated", registry=r)  # fmt: skip
        self.requests = Counter("jaxarena_requests", "requests finished, by finish reason",
                                ["finish_reason"], registry=r)  # fmt: skip
        self.ttft = Histogram("jaxarena_time_to_first_token_seconds",
                              "seconds from a request's arrival to its first token",
                              buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.itl = Histogram("jaxarena_inter_token_latency_seconds",
                             "seconds between a request's consecutive tokens",
                             buckets=ITL_BUCKETS, registry=r)  # fmt: skip
        self.e2e = Histogram("jaxarena_request_latency_seconds",
                             "seconds from a request's arrival to its end",
                             buckets=E2E_BUCKETS, registry=r)  # fmt: skip

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
