"""The sharded arena and the tensor-parallel attention step with a mesh spanning processes:
2 processes x 4 CPU devices on localhost, started by `jaxarena.launch`, gloo collectives.

The workers (tests/distributed/workers/arena_worker.py, tp_worker.py) run in the launched processes
and write what they saw to a temporary folder; these tests compare the processes' records
with each other and with single-process runs of the same code.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
import pytest
from _helpers.launch import GRACE_S, JAX_TIMEOUT_S, WORKERS, load_worker
from _helpers.launch import explain as _explain
from _helpers.tolerances import tol

from jaxarena import launch as L

PROCESSES, DEVICES = 2, 4


def test_guard_report_names_the_device_in_one_process_too():
    # The same report without processes: 8 devices of this process, an overrun on device 5,
    # and an unsharded arena on device 3.
    from jaxarena import ArenaPlan, GuardError

    plan = ArenaPlan.sequential({"a": 1000, "b": 700}, guard_bytes=64)
    devices = jax.devices()[:8]
    mesh = jax.sharding.Mesh(np.array(devices), ("x",))
    arena = plan.allocate(sharding=plan.sharding(mesh))
    shards = [np.array(s.data) for s in arena.addressable_shards]
    shards[5].reshape(-1)[plan.regions["b"].end_bytes + 10] ^= 0xFF
    broken = jax.make_array_from_single_device_arrays(
        arena.shape, arena.sharding,
        [jax.device_put(a, s.device) for a, s in zip(shards, arena.addressable_shards, strict=True)],
    )  # fmt: skip
    assert plan.guard_report(arena) == {}
    assert plan.guard_report(broken) == {"b": (devices[5],)}
    with pytest.raises(GuardError, match=rf"^guard bands overwritten after regions: b on device "
                       rf"{devices[5].id} \(process 0\)$"):  # fmt: skip
        plan.check_guards(broken, strict=True)
    one = np.array(plan.allocate())
    one.reshape(-1)[plan.regions["a"].end_bytes] ^= 1
    assert plan.guard_report(jax.device_put(one, devices[3])) == {"a": (devices[3],)}


@pytest.fixture(scope="module")
def arena_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("arena")
    result = L.launch([sys.executable, str(WORKERS / "arena_worker.py"), str(out)],
                      processes=PROCESSES, devices_per_process=DEVICES, timeout=JAX_TIMEOUT_S,
                      grace_s=GRACE_S)  # fmt: skip
    assert result.ok, _explain(result)
    return [json.loads((out / f"arena_p{i}.json").read_text()) for i in range(PROCESSES)]


def test_sharded_arena_spans_processes_with_local_shards_only(arena_records):
    n = PROCESSES * DEVICES
    for me, rec in enumerate(arena_records):
        total = rec["plan_total_bytes"]
        assert rec["process"] == me and rec["num_processes"] == PROCESSES
        assert len(rec["global_devices"]) == n and not rec["fully_addressable"]
        assert rec["global_shape"] == [n * total // 256, 256]
        # This process holds exactly its 4 devices' arenas, one whole arena each ...
        assert rec["local_devices"] == rec["global_devices"][me * DEVICES : (me + 1) * DEVICES]
        assert rec["local_shard_index"] == list(range(me * DEVICES, (me + 1) * DEVICES))
        assert rec["local_shard_shapes"] == [[total // 256, 256]] * DEVICES
        assert rec["local_shard_bytes"] == [total] * DEVICES
        # ... and the compiled allocation makes one arena per device, no temporaries and no
        # communication: nothing builds or moves the global array.
        assert rec["alloc_output_bytes_per_device"] == total
        assert rec["alloc_temp_bytes_per_device"] == 0
        assert rec["alloc_collectives"] == []
        assert rec["fresh_local_equal"] == [True] * DEVICES  # zeros + guard patterns
        assert rec["guards_fresh"] == []


def test_sharded_step_writes_every_devices_arena_in_place(arena_records):
    for me, rec in enumerate(arena_records):
        assert rec["pointers_unchanged"]
        # Device i of the mesh stored i + 1 in "a" and its process id in "b".
        assert rec["local_a_values"] == [[i + 1] for i in rec["local_shard_index"]]
        assert rec["local_b_values"] == [[me]] * DEVICES
        assert rec["guards_after_step"] == []


def test_an_overrun_on_a_remote_device_is_named_by_every_process(arena_records):
    victim = arena_records[0]["victim_device"]
    assert victim["process"] == PROCESSES - 1  # a device of the last process ...
    assert victim["id"] not in arena_records[0]["local_devices"]  # ... remote to process 0
    for rec in arena_records:
        assert rec["guards_after_overrun"] == ["a"]
        assert rec["guard_report"] == {"a": [victim]}
        assert rec["strict_message"] == (
            "GuardError: guard bands overwritten after regions: "
            f"a on device {victim['id']} (process {victim['process']})"
        )


def test_a_broken_replica_is_named_alone(arena_records):
    # Mesh (dp=2 processes, tp=4), arenas sharded over "tp": process 0 and 1 each hold a copy
    # of arenas 0..3. Only process 1's copy of arena 1 was overrun.
    victim = arena_records[0]["replicated_victim"]
    assert victim["process"] == 1
    for rec in arena_records:
        assert rec["replicated_global_shape"] == [DEVICES * rec["plan_total_bytes"] // 256, 256]
        assert rec["replicated_local_shard_index"] == list(range(DEVICES))
        assert rec["replicated_guards_fresh"] == []
        assert rec["replicated_guard_report"] == {"a": [victim]}


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    result = L.launch([sys.executable, str(WORKERS / "tp_worker.py"), str(out)],
                      processes=PROCESSES, devices_per_process=DEVICES, timeout=JAX_TIMEOUT_S,
                      grace_s=GRACE_S)  # fmt: skip
    assert result.ok, _explain(result)
    return [
        (json.loads((out / f"tp_p{i}.json").read_text()), np.load(out / f"tp_y_p{i}.npy"))
        for i in range(PROCESSES)
    ]


def test_tp_attention_across_processes_matches_one_process(tp_runs):
    tp_worker = load_worker("tp_worker")

    n = PROCESSES * DEVICES
    assert len(jax.devices()) >= n, "conftest.py gives this process 8 CPU devices"
    # The same code in THIS process: tp=8 over its own 8 devices, and tp=1 on one device.
    one_process = tp_worker.run_block(jax.devices()[:n])
    one_device = tp_worker.run_block(jax.devices()[:1])
    # Only the all-reduce's summation order differs (gloo across processes vs XLA's in-process
    # all-reduce, vs no reduction at tp=1): f32 rounding, inside the model tolerance.
    for rec, y in tp_runs:
        assert y.shape == one_process["y"].shape
        np.testing.assert_allclose(y, one_process["y"], **tol("model", "float32"))
        np.testing.assert_allclose(y, one_device["y"], **tol("model", "float32"))
        # The arena of each of this process's devices kept its buffer over the steps.
        assert rec["pointers_unchanged"] and rec["guards"] == []
        total = one_process["plan_total_bytes"]
        assert rec["plan_total_bytes"] == total
        assert rec["local_shard_bytes"] == [total] * DEVICES
        # Each device's weight slices, by hand (f32, H=64, hd=16, tp=8): norm_w [64], one gated
        # query head wq [64, 2*16], the replicated KV head wk, wv [64, 16], wo [16, 64].
        per_device_weights = 4 * (64 + 64 * 32 + 64 * 16 + 64 * 16 + 16 * 64)
        assert per_device_weights == 20736
        assert rec["local_weight_bytes"] == [per_device_weights] * DEVICES
        # The compiled cross-process step, per device: its arguments are one arena, its weight
        # slices and the replicated x [17, 64]; the whole arena is aliased (updated in place).
        x_bytes = 4 * tp_worker.M * 64
        assert rec["step_argument_bytes_per_device"] == total + per_device_weights + x_bytes
        assert rec["step_alias_bytes_per_device"] == total
    np.testing.assert_array_equal(tp_runs[0][1], tp_runs[1][1])  # one replicated result


def test_the_readme_several_hosts_command_runs():
    # README "Several hosts": the launch command, as written there, on examples/several_hosts.py.
    readme = (WORKERS.parents[2] / "README.md").read_text()
    command = (
        "python -m jaxarena.launch --processes 2 --devices-per-process 4 -- "
        "python examples/several_hosts.py"
    )
    assert command in readme
    example = WORKERS.parents[2] / "examples" / "several_hosts.py"
    result = L.launch([sys.executable, str(example)], processes=PROCESSES,
                      devices_per_process=DEVICES, timeout=JAX_TIMEOUT_S,
                      grace_s=GRACE_S)  # fmt: skip
    assert result.ok, _explain(result)
    for me, p in enumerate(result.processes):
        (line,) = [s for s in p.stdout if s.startswith("process ")]
        assert line.startswith(f"process {me} of {PROCESSES}: devices ")
        assert "of 8; arena " in line and "in place: True; broken guards: none" in line
