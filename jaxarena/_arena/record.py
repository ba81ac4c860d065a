"""Recording buffer lifetimes from a traced step: trace-time events of the arena and
`record_lifetimes`.

Trace-time events of the arena: every `ArenaPlan.view` and `ArenaPlan.write` made while a
listener is active is reported as `(kind, region name)`, in program order.

Used to record buffer lifetimes from a traced step function (see `record_lifetimes`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jaxarena._arena.lifetimes import Lifetimes
from jaxarena._errors import ArenaError

# Listeners are per thread: JAX traces in the calling thread, so a view or write traced in one
# thread belongs to that thread's recordings only. (One list for the process made two
# concurrent recordings each pick up the other's events: wrong lifetimes, a wrong packed plan.)
_local = threading.local()


def _listeners() -> list[Callable[[str, str], None]]:
    listeners = getattr(_local, "listeners", None)
    if listeners is None:
        listeners = _local.listeners = []
    return listeners


def emit(kind: str, name: str) -> None:
    """Reports one access (`kind` is `"view"` or `"write"`) to every listener active in the
    calling thread."""
    for listener in tuple(_listeners()):
        listener(kind, name)


@contextlib.contextmanager
def listening(listener: Callable[[str, str], None]) -> Iterator[None]:
    """Calls `listener(kind, name)` for every view and write traced inside the block by the
    calling thread (other threads' traces are not reported)."""
    listeners = _listeners()
    listeners.append(listener)
    try:
        yield
    finally:
        listeners.remove(listener)


def record_lifetimes(
    fn: Callable[..., Any],
    *args: Any,
    mode: str = "decode",
    live_out: Iterable[str] = (),
) -> Lifetimes:
    """Records buffer lifetimes by tracing `fn(*args)` once, listening to the arena.

    Every `plan.view` and `plan.write` traced is one step (`Lifetimes.from_events` gives the
    rule). The trace runs under `jax.disable_jit()` inside `jax.make_jaxpr`, so nested and
    already-compiled `jax.jit` functions are traced again instead of coming from JAX's cache
    (which would skip their events), and `lax.scan`/`fori_loop` bodies are unrolled: a
    48-layer scan records 48 layers. A `lax.cond` records both branches, one after the other;
    a `while_loop` with a traced condition records its body once. Nothing is compiled or run.
    Thread-safe: each recording hears only the views and writes traced by its own thread.

    Typical use: record with a sequential plan, pack, then run with the packed plan:

        seq = ArenaPlan.sequential(sizes)
        lt = record_lifetimes(functools.partial(step, seq), seq_arena, tokens, mode="decode")
        plan = ArenaPlan.packed(sizes, lt)        # then call step(plan, plan.allocate(), ...)

    Args:
      fn: the step; bind non-array arguments (the plan, static ints) with `functools.partial`.
      *args: its arguments: arrays or `jax.ShapeDtypeStruct`s (nothing is read).
      mode: the name of the mode this pass runs in.
      live_out: regions the caller reads after the step; they stay live to its end.

    Returns:
      `Lifetimes` with the single mode `mode`. Regions `fn` never touches are not named, so a
      plan treats them as live always.
    """
    if not callable(fn):
        raise ArenaError(
            f"fn must be the step function (callable), got {type(fn).__name__}; bind the plan "
            "and static arguments with functools.partial"
        )
    events: list[tuple[str, str]] = []
    import jax  # here, not at the top: `import jaxarena` stays free of jax (see plan._device)

    with listening(lambda kind, name: events.append((kind, name))), jax.disable_jit():
        jax.make_jaxpr(fn)(*args)
    return Lifetimes.from_events(events, mode=mode, live_out=live_out)
