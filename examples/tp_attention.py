"""Per-device arenas under tensor parallelism, and a TP attention block running in them.

    python examples/tp_attention.py [preset] [tp]

Prints how every buffer of `preset` (default qwen3-8b) scales from one device to `tp`
(default 8), then runs a small tensor-parallel attention block over `tp` devices, one arena
per device (eight virtual CPU devices when there is no accelerator), and checks it against the
same block on one device.
"""

from __future__ import annotations

import os
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxarena import BufferSizes, Levers, ModelConfig, Target, scaling_table  # noqa: E402
from jaxarena.models.reference.tp_attention import (  # noqa: E402
    attention_arena_plan,
    init_attention_weights,
    make_tp_attention_step,
    shard_attention_weights,
)

LIMITS = dict(max_batch_tokens=4096, max_seq_len=32768, kv_block_size=16, max_batch_size=64)


def run_block(cfg: ModelConfig, tp: int, x: jax.Array) -> tuple[jax.Array, int]:
    """Three steps of the TP block on `tp` devices; returns the output and per-device bytes."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:tp]), ("tp",))
    sizes = BufferSizes.from_config(
        cfg.shard(tp=tp), x.shape[0], x.shape[0], 16, 1, levers=Levers(),
        target=Target.detect(),
    )  # fmt: skip
    plan = attention_arena_plan(sizes, dtype=jnp.float32)
    step = make_tp_attention_step(cfg, plan, mesh)
    weights = shard_attention_weights(init_attention_weights(0, cfg), cfg, mesh)
    arena = plan.allocate(sharding=plan.sharding(mesh, "tp"))
    for _ in range(3):
        arena, y = step(arena, weights, x)
    return y, plan.total_bytes


def main(preset: str = "qwen3-8b", tp: int = 8) -> None:
    cfg = ModelConfig.preset(preset)
    print(f"{preset}: global vs per-device buffers at tp={tp}, {LIMITS}")
    rows = scaling_table(cfg, tp=tp, levers=Levers(), target=Target.detect(), **LIMITS)
    print(f"{'buffer':<28}{'global':>16}{'per device':>16}  scales")
    for r in rows:
        if r.kind != "absent":
            print(f"{r.name:<28}{r.global_bytes:>16,}{r.device_bytes:>16,}  {r.kind}")

    n = min(tp, len(jax.devices()))
    small = ModelConfig(hidden_size=128, num_attention_heads=8, num_key_value_heads=2,
                        head_dim=16, vocab_size=1000, intermediate_size=256)  # fmt: skip
    x = jnp.asarray(np.random.default_rng(0).standard_normal((24, 128)), jnp.float32)
    y_tp, dev_bytes = run_block(small, n, x)
    y_1, one_bytes = run_block(small, 1, x)
    err = float(np.max(np.abs(np.asarray(y_tp) - np.asarray(y_1))))
    print(f"\nTP attention block on {n} devices: arena {dev_bytes:,} B per device "
          f"(vs {one_bytes:,} B on one device); max |tp - single| = {err:.2e}")  # fmt: skip


if __name__ == "__main__":
    main(*(sys.argv[1:2]), *(int(a) for a in sys.argv[2:3]))
