"""The leader/follower protocol of the engine across processes (jaxarena.engine.multiprocess),
in one process: a leader `Runner` sends each device operation down a channel before running
it, `follow` runs the same operations in the same order on another `Runner`; the key-value
channel keeps its store bounded; failures name the operation. The launched run over a mesh
spanning two processes is tests/distributed/test_serve_across_processes.py.

The runners here hold a stand-in model: no compiled executables, each "executable" records
its inputs (the penalty-state reset is the real jitted one, on a 16-token vocabulary).
"""

from __future__ import annotations

import argparse
import pickle
import types
from collections import deque

import numpy as np
import pytest

import jaxarena.engine.runner as runner_module
from jaxarena.engine import multiprocess as mp
from jaxarena.engine.runner import Runner
from jaxarena.engine.sampling import slot_params
from jaxarena.engine.types import SamplingParams

ROWS, VOCAB, PAGES = 2, 16, 3


class PickledQueue:
    """A `Channel` in memory, each message pickled as the key-value channel sends it."""

    def __init__(self) -> None:
        self.messages: deque[bytes] = deque()

    def send(self, message):
        self.messages.append(pickle.dumps(message))

    def receive(self):
        return pickle.loads(self.messages.popleft())


def _runner() -> tuple[Runner, list]:
    model = types.SimpleNamespace(max_batch_size=ROWS, vocab_size=VOCAB)
    lm = types.SimpleNamespace(model=model, block_tables=np.zeros((ROWS, PAGES)), lora=None,
                               params="params", arena="arena", caches="caches")  # fmt: skip
    r = Runner(lm, token_buckets=(8,), log=lambda _m: None)
    calls: list = []

    def exe(name):
        def run(params, arena, caches, pen, *inputs):
            calls.append((name, inputs, np.asarray(pen.prompt_mask), np.asarray(pen.output_counts)))
            tokens = np.full(ROWS, len(calls), np.int32)
            return arena, caches, pen, tokens, None, None, None

        return run

    r._exe = {"decode": exe("decode"), "mixed@8": exe("mixed@8")}
    return r, calls


def _same(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if a is None or isinstance(a, str):
        return a == b
    return np.array_equal(np.asarray(a), np.asarray(b))


def test_the_follower_runs_the_leaders_operations_in_order(monkeypatch):
    adapters = []
    monkeypatch.setattr(runner_module, "set_slot",
                        lambda params, layout, slot, adapter: adapters.append((slot, adapter)) or params)  # fmt: skip
    leader, led = _runner()
    follower, followed = _runner()
    leader.channel = channel = PickledQueue()
    slots = slot_params(ROWS, {0: (SamplingParams(temperature=0.5, seed=3), 3, 1)})
    tables = np.arange(ROWS * PAGES, dtype=np.int32).reshape(ROWS, PAGES)
    leader.reset_slot(1, [2, 5, 5], [7, 7, 9])
    leader.decode(np.array([4, 0], np.int32), np.array([3, 0], np.int32), tables, slots,
                  np.array([True, False]))  # fmt: skip
    leader.load_adapter(0, {"q": np.ones(2)})
    leader.mixed(np.arange(8, dtype=np.int32), np.array([0, 3, 3, 8], np.int32),
                 np.zeros((ROWS + 1, PAGES), np.int32), np.array([0, 2, 0], np.int32), slots,
                 np.array([True, True]))  # fmt: skip
    channel.send((mp.STOP,))
    assert [m[0] for m in map(pickle.loads, channel.messages)] == [
        "reset_slot", "_call", "load_adapter", "_call", mp.STOP]  # fmt: skip
    assert mp.follow(follower, channel) == 4
    assert not channel.messages  # STOP was the last message read
    # The same executables on the same inputs, and the same penalty state before each.
    assert [c[0] for c in led] == ["decode", "mixed@8"]
    assert _same(led, followed)
    assert led[0][2][1].tolist() == [i in (2, 5) for i in range(VOCAB)]  # the reset ran first
    assert led[0][3][1, 7] == 2 and led[0][3][1, 9] == 1
    assert len(adapters) == 2 and adapters[0][0] == adapters[1][0] == 0
    assert _same(adapters[0][1]["q"], adapters[1][1]["q"])
    assert leader.runs == follower.runs == {"decode": 1, "mixed@8": 1}


def test_a_failed_operation_is_named():
    class Failing:
        def _call(self, name, *inputs):
            raise ValueError("boom")

        def reset_slot(self, *args):
            pass

    channel = PickledQueue()
    for m in [("reset_slot", 0, [1], []), ("_call", "mixed@8", np.zeros(8)), (mp.STOP,)]:
        channel.send(m)
    with pytest.raises(mp.FollowerError, match=r"operation 1 \(_call 'mixed@8'\) failed: "
                       r"ValueError: boom"):  # fmt: skip
        mp.follow(Failing(), channel)
    channel = PickledQueue()
    channel.send(("__init__",))
    with pytest.raises(mp.FollowerError, match="message 0 is '__init__', not one of"):
        mp.follow(Failing(), channel)


class FakeStore:
    """The coordination service's key-value client, in memory (a delete removes a key and
    everything under it as a directory, as the service does)."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}
        self.misses = 0

    def key_value_set_bytes(self, key, value):
        assert key not in self.kv, key
        self.kv[key] = value

    def blocking_key_value_get_bytes(self, key, timeout_ms):
        if key not in self.kv:
            self.misses += 1
            raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
        return self.kv[key]

    def key_value_increment(self, key, n):
        self.kv[key] = int(self.kv.get(key, 0)) + n
        return self.kv[key]

    def key_value_delete(self, key):
        for k in [k for k in self.kv if k == key or k.startswith(key + "/")]:
            del self.kv[k]


def test_the_key_value_channel_deletes_what_every_follower_read():
    store = FakeStore()
    leader, *followers = (mp.KVChannel(3, client=store) for _ in range(3))
    # Channels are numbered per process in creation order; here all three live in one.
    for f in followers:
        f.prefix = leader.prefix
    n = 2 * mp.BLOCK + 3
    for i in range(n):
        leader.send(("_call", "decode", np.full(2, i)))
    got = [followers[0].receive() for _ in range(n)]
    assert [int(m[2][0]) for m in got] == list(range(n))
    messages = [k for k in store.kv if "/read/" not in k]
    assert len(messages) == n  # the other follower has read none yet
    for i in range(n):
        assert int(followers[1].receive()[2][0]) == i
    # Both read the two full blocks: deleted, counters too; the last 3 messages stay.
    assert sorted(store.kv) == sorted(leader._key(i) for i in range(2 * mp.BLOCK, n))
    # A follower waits on (and retries) a message not sent yet.
    with pytest.raises(RuntimeError, match="DEADLINE"):
        store.blocking_key_value_get_bytes("absent", 1)
    calls = iter([False, True])
    real_get = store.blocking_key_value_get_bytes

    def slow_get(key, timeout_ms):
        if next(calls):
            leader.send((mp.STOP,))
        return real_get(key, timeout_ms)

    store.blocking_key_value_get_bytes = slow_get
    assert followers[0].receive() == (mp.STOP,)


def test_every_process_must_hold_mesh_devices(monkeypatch):
    import jax

    assert mp.check_processes(8) is None  # one process
    devices = [types.SimpleNamespace(process_index=i // 4) for i in range(8)]
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "devices", lambda: devices)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with pytest.raises(ValueError, match=r"tp=4: .* processes \[1\] hold none of them.*use tp=8"):
        mp.check_processes(4)
    assert mp.check_processes(8) == "follower"
    assert mp.check_processes(5) == "follower"
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    assert mp.check_processes(8) == "leader"


def test_a_failed_follower_prints_one_line_and_exits(monkeypatch, capsys):
    pytest.importorskip("uvicorn")
    from jaxarena.server import run

    class Engine:
        def follow(self, log):
            raise mp.FollowerError("operation 7 (_call 'decode') failed: RuntimeError: lost")

    class CliError(Exception):
        pass

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(run.os, "_exit", exit_)
    info = types.SimpleNamespace(process_id=1, num_processes=2)
    args = argparse.Namespace(memory=None)
    factory = lambda args, memory, log: types.SimpleNamespace(engine=Engine())  # noqa: E731
    with pytest.raises(SystemExit) as e:
        run._serve_in_process(info, args, CliError, lambda _m: None, factory)
    assert e.value.code == 1  # not a user error (CliError: 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["jaxarena serve: process 1: operation 7 (_call 'decode') failed: "
                   "RuntimeError: lost"]  # fmt: skip


def test_same_program_names_one_frame_only_when_the_mesh_spans_processes():
    import jax

    def mesh(*processes):
        devices = np.array([types.SimpleNamespace(process_index=p) for p in processes])
        return types.SimpleNamespace(devices=devices)

    def full() -> bool:
        return jax.config.jax_include_full_tracebacks_in_locations

    before = full()
    for local in (None, mesh(0, 0, 0, 0), mesh(1, 1)):
        with mp.same_program(local):
            assert full() == before
    with mp.same_program(mesh(0, 0, 1, 1)):
        assert full() is False
    assert full() == before
