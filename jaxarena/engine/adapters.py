"""Which LoRA adapter is in which of the model's device slots (the engine's host side of
`jaxarena.models.lora`).

A model loaded with `max_loras=L` holds `L` adapter slots. The engine knows more adapters by
name than it has slots (`register`); a request naming one runs only while the adapter is in
a slot. `acquire` (the scheduler, admitting a request) puts it there: the slot it already
has, else an empty slot, else the least recently used slot no running request holds (its
adapter is evicted); when every slot is held it returns None and the request waits.
`release` (a request finished, aborted or preempted) lets the slot go once no request holds
it; the adapter stays loaded until its slot is needed, so a popular adapter is not reloaded.

Pure Python, no jax: the device write is the `load(slot, name)` callback (the engine's
`Runner.load_adapter`: one jitted update, no recompile).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["AdapterSlots"]


class AdapterSlots:
    """Adapters by name and the `max_loras` device slots they are loaded into.

    Args:
      max_loras: the model's LoRA slots.
      load: `load(slot, name)` writes adapter `name`'s weights (registered data) into `slot`.

    Attributes:
      loads: adapters written into a slot so far (a load per miss: evictions show here).
    """

    def __init__(self, max_loras: int, load: Callable[[int, str], None]) -> None:
        if isinstance(max_loras, bool) or not isinstance(max_loras, int) or max_loras < 1:
            raise ValueError(f"max_loras={max_loras!r} must be an int >= 1")
        self.max_loras = max_loras
        self._load = load
        self._known: dict[str, Any] = {}
        self._slot_of: dict[str, int] = {}
        self._name_in: list[str | None] = [None] * max_loras
        self._holders = [0] * max_loras
        # Slots no request holds, least recently used first (empty slots are used before any).
        self._idle: collections.OrderedDict[int, None] = collections.OrderedDict(
            (s, None) for s in range(max_loras)
        )
        self.loads = 0

    # -- registry -------------------------------------------------------------------------------

    def register(self, name: str, data: Any) -> None:
        """Makes adapter `name` requestable; `data` is what `load` needs (checked already).

        Raises:
          ValueError: an empty name or one already registered (a name keys the prefix cache,
            so it must always mean the same weights).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"adapter name {name!r} must be a non-empty string")
        if name in self._known:
            raise ValueError(f"adapter {name!r} is already registered")
        self._known[name] = data

    def data(self, name: str) -> Any:
        """What `register` was given for `name`."""
        return self._known[name]

    def __contains__(self, name: object) -> bool:
        return name in self._known

    @property
    def names(self) -> tuple[str, ...]:
        """The registered adapters, in registration order."""
        return tuple(self._known)

    # -- slots ----------------------------------------------------------------------------------

    def slot(self, name: str) -> int | None:
        """The slot adapter `name` is loaded in, or None."""
        return self._slot_of.get(name)

    def holders(self, name: str) -> int:
        """Requests holding adapter `name`'s slot now."""
        s = self._slot_of.get(name)
        return 0 if s is None else self._holders[s]

    def acquire(self, name: str) -> int | None:
        """A slot holding adapter `name` for one more request, loading it (evicting the least
        recently used idle adapter) when it is in none; None when every slot is held."""
        if name not in self._known:
            raise KeyError(f"adapter {name!r} is not registered")
        s = self._slot_of.get(name)
        if s is None:
            if not self._idle:
                return None
            s = self._pick_idle()
            old = self._name_in[s]
            if old is not None:
                del self._slot_of[old]
            self._load(s, name)
            self.loads += 1
            self._name_in[s] = name
            self._slot_of[name] = s
        if self._holders[s] == 0:
            del self._idle[s]
        self._holders[s] += 1
        return s

    def _pick_idle(self) -> int:
        for s in self._idle:  # an empty slot first
            if self._name_in[s] is None:
                return s
        return next(iter(self._idle))

    def release(self, name: str) -> None:
        """One request holding adapter `name` let its slot go."""
        s = self._slot_of.get(name)
        if s is None or self._holders[s] == 0:
            raise RuntimeError(f"release({name!r}): no request holds that adapter")
        self._holders[s] -= 1
        if self._holders[s] == 0:
            self._idle[s] = None  # most recently used: the last to be evicted

    def check(self, held: Iterable[str]) -> None:
        """Asserts the bookkeeping against the adapters the running requests name (a test
        helper): holders per slot equal those requests per adapter, idle = unheld slots."""
        want = collections.Counter(held)
        for name, n in want.items():
            s = self._slot_of.get(name)
            assert s is not None and self._holders[s] == n, (name, s, n)
        assert sum(self._holders) == sum(want.values()), (self._holders, want)
        assert set(self._idle) == {s for s in range(self.max_loras) if self._holders[s] == 0}
        for name, s in self._slot_of.items():
            assert self._name_in[s] == name
