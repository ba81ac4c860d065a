"""The sharded arena and the tensor-parallel attention block across JAX processes.

    python -m jaxarena.launch --processes 2 --devices-per-process 4 -- \\
        python examples/several_hosts.py

Every process runs this same script (multi-controller JAX). It joins the launch
(`jaxarena.launch.initialize()`), builds ONE mesh over the devices of all processes, allocates
the sharded arena (each process creates only its own devices' arenas), runs a few steps of the
TP attention block whose all-reduce crosses processes, checks the guards (a collective: every
process calls it and gets the same answer) and prints what it holds. Run without the launcher
it uses this process's devices only.

On real hosts, start one process per host with the same script and call
`jax.distributed.initialize(coordinator_address, num_processes, process_id)` instead of
`jaxarena.launch.initialize()`; everything after it is unchanged.
"""

from __future__ import annotations

import jaxarena.launch

jaxarena.launch.initialize()  # before any other JAX work

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxarena import BufferSizes, Levers, ModelConfig, Target  # noqa: E402
from jaxarena.models.reference.tp_attention import (  # noqa: E402
    attention_arena_plan,
    init_attention_weights,
    make_tp_attention_step,
    shard_attention_weights,
)


def main() -> None:
    me, devices = jax.process_index(), jax.devices()
    cfg = ModelConfig(hidden_size=128, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=16, vocab_size=1000, intermediate_size=256)  # fmt: skip
    tp = len(devices)
    mesh = jax.sharding.Mesh(np.array(devices), ("tp",))
    sizes = BufferSizes.from_config(cfg.shard(tp=tp), 24, 24, 16, 1, levers=Levers(),
                                    target=Target.detect())  # fmt: skip
    plan = attention_arena_plan(sizes, dtype=jnp.float32, guard_bytes=64)
    step = make_tp_attention_step(cfg, plan, mesh)
    # Every process draws the same weights and inputs; each places only its devices' slices.
    weights = shard_attention_weights(init_attention_weights(0, cfg), cfg, mesh)
    arena = plan.allocate(sharding=plan.sharding(mesh, "tp"))
    mine = arena.addressable_shards
    pointers = [s.data.unsafe_buffer_pointer() for s in mine]
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = jnp.asarray(rng.standard_normal((24, cfg.hidden_size)), jnp.float32)
        arena, y = step(arena, weights, x)
    in_place = pointers == [s.data.unsafe_buffer_pointer() for s in arena.addressable_shards]
    broken = plan.check_guards(arena)  # every process must call it
    print(
        f"process {me} of {jax.process_count()}: devices {[s.device.id for s in mine]} of {tp}; "
        f"arena {plan.total_bytes:,} B per device, {plan.total_bytes * len(mine):,} B in this "
        f"process; in place: {in_place}; broken guards: {broken or 'none'}; "
        f"y[0, :3] = {np.asarray(y)[0, :3]}"
    )


if __name__ == "__main__":
    main()
