"""Wall-clock timing shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax


def median_seconds(fn: Callable[[], object], *, min_seconds: float, max_iters: int) -> float:
    """Median seconds per call of `fn()`, after one warm-up call (compilation).

    Runs at least 3 calls, then keeps going until `min_seconds` have passed or `max_iters`
    calls were made. Every call is waited for with `jax.block_until_ready`.
    """
    jax.block_until_ready(fn())
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < min_seconds and len(times) < max_iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
