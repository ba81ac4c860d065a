"""One process of the cross-process tensor-parallel attention check (tests/distributed/).

    python -m jaxarena.launch --processes 2 --devices-per-process 4 -- \\
        python tests/distributed/workers/tp_worker.py OUT_DIR

Runs `STEPS` steps of the TP attention block (`jaxarena.models.reference.tp_attention`) with tp over the
devices of ALL processes, so the row-parallel `psum` crosses processes, and writes the outputs
(`tp_y_p<id>.npy`, one `[STEPS, M, H]` array) and what it saw of its own devices
(`tp_p<id>.json`) to OUT_DIR. `run_block` is also what the test runs in ONE process, on one
device and on eight, for the reference results: the same code, only the mesh differs.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

STEPS = 3
M = 17  # tokens per step; one past a multiple of 16
MAX_M = 17
SEQ, KV_BLOCK, BATCH = 4096, 16, 8
# 8 query heads over tp=8: one query head per device; 2 KV heads: each device holds a
# replicated copy of the one its query head reads. Gated queries exercise the gate path.
CONFIG_FIELDS = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                     intermediate_size=128, vocab_size=96, attn_gated=True)  # fmt: skip
GUARD = 64


def inputs() -> np.ndarray:
    """The `[STEPS, M, H]` float32 inputs, the same in every process."""
    rng = np.random.default_rng(1)
    return rng.standard_normal((STEPS, M, CONFIG_FIELDS["hidden_size"])).astype(np.float32)


def run_block(devices: list[Any]) -> dict[str, Any]:
    """`STEPS` steps of the TP block over `devices` (a 1-D "tp" mesh); returns what it saw.

    Returns a dict: `y` (`[STEPS, M, H]` float32 outputs), `plan_total_bytes` (one device's
    arena), `local_devices`, `local_shard_bytes`, `pointers_unchanged` (every local shard of
    the arena kept its buffer across the steps) and `guards` (broken guards after the steps).
    """
    import jax
    import jax.numpy as jnp

    from jaxarena import BufferSizes, Levers, ModelConfig, Target
    from jaxarena.models.reference.tp_attention import (
        attention_arena_plan,
        init_attention_weights,
        make_tp_attention_step,
        shard_attention_weights,
    )

    cfg = ModelConfig(**CONFIG_FIELDS)
    local_cfg = cfg.shard(tp=len(devices))
    mesh = jax.sharding.Mesh(np.array(devices), ("tp",))
    sizes = BufferSizes.from_config(
        local_cfg, MAX_M, SEQ, KV_BLOCK, BATCH, levers=Levers(),
        target=Target.preset("gb10"),
    )  # fmt: skip
    plan = attention_arena_plan(sizes, dtype=jnp.float32, guard_bytes=GUARD)
    step = make_tp_attention_step(cfg, plan, mesh, dtype=jnp.float32)
    weights = shard_attention_weights(init_attention_weights(0, cfg), cfg, mesh)
    arena = plan.allocate(sharding=plan.sharding(mesh, "tp"))
    local = arena.addressable_shards
    before = [s.data.unsafe_buffer_pointer() for s in local]
    # The compiled step, per device: the arena aliased (donated, in place), and its sizes.
    mem = step.lower(arena, weights, jnp.asarray(inputs()[0])).compile().memory_analysis()
    ys = []
    for x in inputs():
        arena, y = step(arena, weights, jnp.asarray(x))
        ys.append(np.asarray(y))  # y is replicated: every process reads its own copy
    local = arena.addressable_shards
    return {
        "y": np.stack(ys),
        "plan_total_bytes": plan.total_bytes,
        "local_devices": [s.device.id for s in local],
        "local_shard_bytes": [int(s.data.nbytes) for s in local],
        "pointers_unchanged": before == [s.data.unsafe_buffer_pointer() for s in local],
        "guards": plan.check_guards(arena),
        "local_weight_bytes": [
            sum(int(leaf.addressable_shards[i].data.nbytes) for leaf in weights)
            for i in range(len(local))
        ],
        "step_alias_bytes_per_device": int(mem.alias_size_in_bytes),
        "step_argument_bytes_per_device": int(mem.argument_size_in_bytes),
        "step_temp_bytes_per_device": int(mem.temp_size_in_bytes),
    }


def main(out_dir: str) -> None:
    import jaxarena.launch

    info = jaxarena.launch.initialize()
    assert info is not None, "run me under python -m jaxarena.launch"
    import jax

    me = jax.process_index()
    seen = run_block(jax.devices())
    np.save(os.path.join(out_dir, f"tp_y_p{me}.npy"), seen.pop("y"))
    seen["process"] = me
    with open(os.path.join(out_dir, f"tp_p{me}.json"), "w") as f:
        json.dump(seen, f, indent=1)
    print(f"process {me}: {STEPS} TP steps over {len(jax.devices())} devices done")


if __name__ == "__main__":
    main(sys.argv[1])
