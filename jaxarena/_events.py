"""Trace-time events of the arena: every `ArenaPlan.view` and `ArenaPlan.write` made while a
listener is active is reported as `(kind, region name)`, in program order.

Used to record buffer lifetimes from a traced step function (see `record_lifetimes`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

_listeners: list[Callable[[str, str], None]] = []


def emit(kind: str, name: str) -> None:
    """Reports one access (`kind` is `"view"` or `"write"`) to every active listener."""
    for listener in _listeners:
        listener(kind, name)


@contextlib.contextmanager
def listening(listener: Callable[[str, str], None]) -> Iterator[None]:
    """Calls `listener(kind, name)` for every view and write traced inside the block."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
