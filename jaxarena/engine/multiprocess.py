"""The engine across several JAX processes (multi-controller): one leader, the others follow.

In multi-controller JAX every process must run the same jitted executables, in the same
order, on the same inputs. The engine's host side (scheduler, page pool, requests, HTTP) is
not replicated: process 0, the leader, runs it alone. Only the `Runner` touches devices, and
its every device operation is a call with small host inputs (`Runner._call(name, *inputs)`:
the step's tokens, tables and `SlotParams`; `reset_slot`; `load_adapter`). On the leader each
of them is first sent down a `Channel`, then run; every other process runs `follow`, which
receives the operations in order and runs the same ones on its own `Runner`, until the
leader sends `STOP` (`Engine.close`).

```python
import jaxarena.launch
jaxarena.launch.initialize()          # under python -m jaxarena.launch, or jax.distributed's env
engine = Engine.from_pretrained(path, tp=jax.device_count(), ...)  # in every process
if jax.process_index() == 0:
    outs = engine.generate(prompts, params)
    engine.close()                    # the followers return
else:
    engine.follow()
```

The channel (`KVChannel`) is the key-value store of JAX's coordination service (the one
`jax.distributed.initialize` starts; a private API, reached only through `_client`): message
`n` is the key `jaxarena/engine<g>/<n // BLOCK>/<n>` (a pickled tuple; only the trusted
coordination service carries it). A follower that has read the last message of a block adds
1 to that block's counter; the one that completes the count deletes the block (one directory
delete), so the store holds at most the blocks some follower has not finished. Followers never
lag far: each step's collectives need every process, so a follower is at most the messages of
one step behind the leader's last completed step.

One process (no `jax.distributed`): the engine has no channel and nothing here runs.
"""

from __future__ import annotations

import contextlib
import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

__all__ = [
    "BLOCK",
    "STOP",
    "Channel",
    "FollowerError",
    "KVChannel",
    "check_processes",
    "follow",
    "same_program",
]

STOP = "stop"
"""The operation that ends `follow` (sent once by the leader's `Engine.close`)."""

BLOCK = 64
"""Messages per key-store directory; a directory is deleted once every follower read it."""

# The Runner methods a follower may be asked to run (nothing else is looked up by name).
_OPS = ("_call", "reset_slot", "load_adapter")


class Channel(Protocol):
    """An ordered, reliable one-to-many message stream from the leader to the followers."""

    def send(self, message: tuple[Any, ...]) -> None:
        """Leader: appends `message` (`(op, *args)`, picklable) to the stream."""

    def receive(self) -> tuple[Any, ...]:
        """Follower: the next message, waiting for it as long as it takes."""


class FollowerError(RuntimeError):
    """A follower could not run an operation the leader sent (the message names it)."""


def _client() -> Any:
    """The coordination service's client of `jax.distributed.initialize`."""
    try:
        from jax._src import distributed

        client = distributed.global_state.client
    except (ImportError, AttributeError) as e:  # a JAX without the private API we use
        raise RuntimeError("the multi-process engine needs JAX's coordination-service client "
                           f"(jax._src.distributed.global_state.client), which this JAX "
                           f"does not have: {e}") from None  # fmt: skip
    if client is None:
        raise RuntimeError("the multi-process engine needs jax.distributed.initialize() first "
                           "(jaxarena.launch.initialize() under python -m jaxarena.launch)")  # fmt: skip
    return client


_generations: dict[str, int] = {}


class KVChannel:
    """A `Channel` over the coordination service's key-value store (module docstring).

    Every process builds its channels in the same order (one per engine), so the `g`-th
    channel of the leader and of each follower share the key prefix `jaxarena/engine<g>`.

    Args:
      num_processes: the processes of the launch (None: `jax.process_count()`).
      poll_ms: a follower's wait per request to the store; it waits again after each (an
        idle server's followers wait indefinitely).
      client: the key-value client (tests); None: `jax.distributed`'s.
    """

    def __init__(self, num_processes: int | None = None, *, poll_ms: int = 10_000,
                 client: Any = None) -> None:  # fmt: skip
        import jax

        self._client = _client() if client is None else client
        self.num_followers = (jax.process_count() if num_processes is None else num_processes) - 1
        g = _generations.get("engine", 0)
        _generations["engine"] = g + 1
        self.prefix = f"jaxarena/engine{g}"
        self.poll_ms = poll_ms
        self.sent = 0
        self.received = 0

    def _key(self, n: int) -> str:
        return f"{self.prefix}/{n // BLOCK}/{n}"

    def send(self, message: tuple[Any, ...]) -> None:
        self._client.key_value_set_bytes(self._key(self.sent), pickle.dumps(message, protocol=5))
        self.sent += 1

    def receive(self) -> tuple[Any, ...]:
        n = self.received
        while True:
            try:
                raw = self._client.blocking_key_value_get_bytes(self._key(n), self.poll_ms)
                break
            except Exception as e:  # the JAX runtime's error type differs by version
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise
        self.received += 1
        if n % BLOCK == BLOCK - 1:
            self._finish_block(n // BLOCK)
        return pickle.loads(raw)

    def _finish_block(self, block: int) -> None:
        counter = f"{self.prefix}/read/{block}"
        if self._client.key_value_increment(counter, 1) == self.num_followers:
            self._client.key_value_delete(f"{self.prefix}/{block}")
            self._client.key_value_delete(counter)


@contextlib.contextmanager
def same_program(mesh: Any) -> Iterator[None]:
    """Lower an executable of a `mesh` that spans processes inside this, so that every process
    gets the same program: the source locations in it then name only the innermost frame
    (jaxarena's own code), not the whole call stack (`jax_include_full_tracebacks_in_locations`),
    which differs between the leader (the engine) and a follower (`follow`). On JAX 0.12 a
    difference there is enough to keep the processes' collectives from meeting: the step
    hangs. Does nothing for a mesh within one process (or None)."""
    if mesh is None or all(d.process_index == mesh.devices.flat[0].process_index
                           for d in mesh.devices.flat):  # fmt: skip
        yield
        return
    try:
        from jax._src.config import include_full_tracebacks_in_locations as full
    except ImportError:  # the private switch moved: the public one, restored after
        import jax

        before = jax.config.jax_include_full_tracebacks_in_locations
        jax.config.update("jax_include_full_tracebacks_in_locations", False)
        try:
            yield
        finally:
            jax.config.update("jax_include_full_tracebacks_in_locations", before)
        return
    with full(False):
        yield


def check_processes(tp: int) -> str | None:
    """The role of this process for an engine over the first `tp` devices of `jax.devices()`:
    None in one process, else "leader" (process 0) or "follower".

    Raises:
      ValueError: several processes, and some hold none of the first `tp` devices (every
        process must take part in every step).
    """
    import jax

    if jax.process_count() == 1:
        return None
    devices = jax.devices()
    used = {d.process_index for d in devices[:tp]}
    left_out = sorted(set(range(jax.process_count())) - used)
    if left_out:
        per = {p: sum(d.process_index == p for d in devices) for p in range(jax.process_count())}
        raise ValueError(f"tp={tp}: the engine runs over the first {tp} devices of "
                         f"jax.devices(), and processes {left_out} hold none of them; across "
                         f"{jax.process_count()} processes (devices per process: {per}) every "
                         f"process must hold some: use tp={len(devices)}, every device")  # fmt: skip
    return "leader" if jax.process_index() == 0 else "follower"


def follow(runner: Any, channel: Channel,
           log: Callable[[str], None] | None = None) -> int:  # fmt: skip
    """Runs the leader's device operations on `runner` (this process's `Runner`), in the
    order `channel` delivers them, until `STOP`; returns how many it ran.

    Raises:
      FollowerError: an operation failed, or a message is not one the leader sends (the
        message names the operation and its number; the cause is chained).
    """
    done = 0
    t0 = time.monotonic()
    while True:
        message = channel.receive()
        op = message[0] if isinstance(message, tuple) and message else message
        if op == STOP:
            if log is not None:
                log(f"followed {done} device operations in {time.monotonic() - t0:.1f} s")
            return done
        if op not in _OPS:
            raise FollowerError(f"message {done} is {op!r}, not one of {_OPS + (STOP,)}")
        what = f"{op} {message[1]!r}" if op == "_call" else op
        try:
            getattr(runner, op)(*message[1:])
        except Exception as e:
            raise FollowerError(f"operation {done} ({what}) failed: "
                                f"{type(e).__name__}: {e}") from e  # fmt: skip
        done += 1
