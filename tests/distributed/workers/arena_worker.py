"""One process of the cross-process sharded-arena check (run by tests/distributed/).

    python -m jaxarena.launch --processes 2 --devices-per-process 4 -- \\
        python tests/distributed/workers/arena_worker.py OUT_DIR

Every process: joins the launch, builds a mesh over the devices of ALL processes, allocates
the sharded arena (one arena per device), runs a sharded step that writes every device's
arena in place, checks the guards, then plants an overrun past region "a" on one device of
the LAST process and checks the guards again. It writes what it saw, as JSON, to
`OUT_DIR/arena_p<process id>.json`; the test compares the processes' files. It asserts only
what one process can know alone; cross-process agreement is the test's to check.
"""

from __future__ import annotations

import json
import os
import sys

import jaxarena.launch

info = jaxarena.launch.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from jaxarena import ArenaPlan  # noqa: E402

# Region sizes off the 256-byte row grid (1000, 700) so guards start mid-row, plus one aligned.
SIZES = {"a": 1000, "b": 700, "c": 2048}
GUARD = 64
# The device the overrun is planted on: the second device of the last process.
VICTIM = None  # set below from the mesh


def main(out_dir: str) -> None:
    assert info is not None, "run me under python -m jaxarena.launch"
    me = jax.process_index()
    devices = jax.devices()
    mesh = jax.sharding.Mesh(np.array(devices), ("x",))
    plan = ArenaPlan.sequential(SIZES, guard_bytes=GUARD)
    sharding = plan.sharding(mesh)
    rows = plan.arena_shape[0]

    # 1. Allocation: compiled per device, no collective, one arena's bytes per device.
    compiled = jax.jit(lambda: plan.allocate(sharding=sharding)).lower().compile()
    hlo = compiled.as_text()
    collectives = [op for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute")
                   if op in hlo]  # fmt: skip
    mem = compiled.memory_analysis()
    arena = plan.allocate(sharding=sharding)
    local = arena.addressable_shards
    record: dict = {
        "process": me,
        "num_processes": jax.process_count(),
        "global_devices": [d.id for d in devices],
        "local_devices": [s.device.id for s in local],
        "global_shape": list(arena.shape),
        "local_shard_shapes": [list(s.data.shape) for s in local],
        "local_shard_bytes": [int(s.data.nbytes) for s in local],
        "plan_total_bytes": plan.total_bytes,
        "alloc_output_bytes_per_device": int(mem.output_size_in_bytes),
        "alloc_temp_bytes_per_device": int(mem.temp_size_in_bytes),
        "alloc_collectives": collectives,
        "fully_addressable": bool(arena.sharding.is_fully_addressable),
    }
    fresh = np.asarray(plan.allocate()).reshape(-1)  # one unsharded arena, for comparison
    record["fresh_local_equal"] = [
        bool(np.array_equal(np.asarray(s.data).reshape(-1), fresh)) for s in local
    ]
    record["guards_fresh"] = plan.check_guards(arena)

    # 2. A sharded step writes every device's arena in place: device i stores (i+1) in "a"
    #    and its process id in "b", through plan.write.
    def local_step(a):
        i = lax.axis_index("x")
        a = plan.write(a, "a", jnp.full((SIZES["a"],), i + 1, jnp.uint8))
        return plan.write(a, "b", jnp.full((SIZES["b"] // 4,), 0, jnp.int32) + i // 4)

    step = jax.jit(
        jax.shard_map(local_step, mesh=mesh, in_specs=(sharding.spec,), out_specs=sharding.spec),
        donate_argnums=0,
    )
    before = [s.data.unsafe_buffer_pointer() for s in local]
    for _ in range(3):
        arena = step(arena)
    local = arena.addressable_shards
    record["pointers_unchanged"] = before == [s.data.unsafe_buffer_pointer() for s in local]
    shard_index = [s.index[0].start // rows for s in local]
    record["local_shard_index"] = shard_index
    a_off, b_off = plan.regions["a"].offset_bytes, plan.regions["b"].offset_bytes
    record["local_a_values"] = [
        sorted({int(v) for v in np.asarray(s.data).reshape(-1)[a_off : a_off + SIZES["a"]]})
        for s in local
    ]
    record["local_b_values"] = [
        sorted({int(v) for v in
                np.asarray(s.data).reshape(-1)[b_off : b_off + SIZES["b"] // 4 * 4].view(np.int32)})
        for s in local
    ]  # fmt: skip
    record["guards_after_step"] = plan.check_guards(arena)

    # 3. A buggy kernel on ONE device of the last process writes 3 bytes past region "a".
    victim = len(devices) - 3  # last process's second device when every process has 4
    end = plan.regions["a"].end_bytes
    r, lo = divmod(end, plan.arena_shape[1])

    def overrun(a):
        row = a[r : r + 1]
        bad = row.at[0, lo : lo + 3].set(jnp.uint8(0xEE))
        hit = lax.axis_index("x") == victim
        return lax.dynamic_update_slice(a, jnp.where(hit, bad, row), (jnp.int32(r), jnp.int32(0)))

    bug = jax.jit(
        jax.shard_map(overrun, mesh=mesh, in_specs=(sharding.spec,), out_specs=sharding.spec),
        donate_argnums=0,
    )
    arena = bug(arena)
    record["victim_device"] = {"id": devices[victim].id,
                               "process": devices[victim].process_index}  # fmt: skip
    record["guards_after_overrun"] = plan.check_guards(arena)
    report = plan.guard_report(arena)
    record["guard_report"] = {
        name: [{"id": d.id, "process": d.process_index} for d in devs]
        for name, devs in report.items()
    }
    try:
        plan.check_guards(arena, strict=True)
        record["strict_message"] = None
    except AssertionError as e:  # GuardError
        record["strict_message"] = f"{type(e).__name__}: {e}"

    # 4. A 2-D mesh (process, device): arenas sharded over "tp" only, so each of the 4 arenas
    #    has one copy per process. An overrun on process 1's copy of arena 1 only must name
    #    that device alone, not its replica on process 0.
    mesh2 = jax.sharding.Mesh(np.array(devices).reshape(jax.process_count(), -1), ("dp", "tp"))
    sharding2 = plan.sharding(mesh2, "tp")
    arena2 = plan.allocate(sharding=sharding2)
    record["replicated_global_shape"] = list(arena2.shape)
    record["replicated_local_shard_index"] = [s.index[0].start // rows
                                              for s in arena2.addressable_shards]  # fmt: skip
    record["replicated_guards_fresh"] = plan.check_guards(arena2)

    def overrun2(a):
        row = a[r : r + 1]
        bad = row.at[0, lo : lo + 3].set(jnp.uint8(0xEE))
        hit = (lax.axis_index("dp") == 1) & (lax.axis_index("tp") == 1)
        return lax.dynamic_update_slice(a, jnp.where(hit, bad, row), (jnp.int32(r), jnp.int32(0)))

    # check_vma=False: the step makes the replicas differ on purpose (a bug), which the
    # sharding's type (invariant over "dp") cannot express.
    bug2 = jax.jit(jax.shard_map(overrun2, mesh=mesh2, in_specs=(sharding2.spec,),
                                 out_specs=sharding2.spec, check_vma=False),
                   donate_argnums=0)  # fmt: skip
    arena2 = bug2(arena2)
    record["replicated_victim"] = {"id": int(mesh2.devices[1, 1].id),
                                   "process": int(mesh2.devices[1, 1].process_index)}  # fmt: skip
    record["replicated_guard_report"] = {
        name: [{"id": d.id, "process": d.process_index} for d in devs]
        for name, devs in plan.guard_report(arena2).items()
    }

    path = os.path.join(out_dir, f"arena_p{me}.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(f"process {me}: wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1])
