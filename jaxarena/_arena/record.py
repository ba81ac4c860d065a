"""Recording buffer lifetimes from a traced step: trace-time events of the arena and
`record_lifetimes`.

Trace-time events of the arena: every `ArenaPlan.view` and `ArenaPlan.write` made while a
listener is active is reported as `(kind, region name)`, in program order.

Used to record buffer lifetimes from a traced step function (see `record_lifetimes`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax

from jaxarena._arena.lifetimes import Lifetimes

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
    events: list[tuple[str, str]] = []
    with listening(lambda kind, name: events.append((kind, name))), jax.disable_jit():
        jax.make_jaxpr(fn)(*args)
    return Lifetimes.from_events(events, mode=mode, live_out=live_out)
