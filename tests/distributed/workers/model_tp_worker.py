"""One process of the cross-process tensor-parallel model check (tests/distributed/).

    python -m jaxarena.launch --processes 2 --devices-per-process 4 -- \\
        python tests/distributed/workers/model_tp_worker.py OUT_DIR

Loads the qwen3 fixture checkpoint with `load_pretrained(..., mesh=...)` over a 4-device mesh
made of two devices of EACH process (so every all-reduce of the step crosses processes), runs
the fixture's reference prompts (prefill logits of each, then 8 greedy tokens of the batch) and
writes what it saw to `OUT_DIR/model_tp_p<id>.npz`: the logits and tokens (replicated: every
process reads its own copy) and its local devices and bytes. `run_model` is also what the test
runs in one process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "qwen3"
LIMITS = dict(max_batch_tokens=64, max_seq_len=32, kv_block_size=16, max_batch_size=4)
NEW_TOKENS = 8


def prompts() -> list[list[int]]:
    with np.load(FIXTURE / "reference.npz") as r:
        return [r["prompt_ids"][i, :m].tolist() for i, m in enumerate(r["prompt_lengths"])]


def run_model(devices: list[Any]) -> dict[str, Any]:
    """The fixture over a "tp" mesh of `devices`: prefill logits per prompt, greedy tokens and
    their logits, and this process's share of the model."""
    import jax

    from jaxarena.models import load_pretrained

    mesh = jax.sharding.Mesh(np.array(devices), ("tp",))
    lm = load_pretrained(FIXTURE, **LIMITS, kernels="xla", mesh=mesh,
                         compiler_options={"xla_backend_optimization_level": 0})  # fmt: skip
    out: dict[str, Any] = {f"prefill_{i}": lm.prefill_logits(p) for i, p in enumerate(prompts())}
    tokens, logits = lm.generate(prompts(), NEW_TOKENS, return_logits=True)
    out["tokens"], out["logits"] = np.asarray(tokens), np.asarray(logits)
    out["local_devices"] = np.array([s.device.id for s in lm.arena.addressable_shards])
    out["weight_bytes"] = np.array(lm.weight_bytes)
    out["local_param_bytes"] = np.array(sum(s.data.nbytes for leaf in jax.tree.leaves(lm.params)
                                            for s in leaf.addressable_shards))  # fmt: skip
    return out


def main(out_dir: str) -> None:
    import jaxarena.launch

    info = jaxarena.launch.initialize()
    assert info is not None, "run me under python -m jaxarena.launch"
    import jax

    me = jax.process_index()
    devs = jax.devices()
    per = len(devs) // jax.process_count()
    # Two devices of each process: the mesh spans both.
    mesh_devices = [d for p in range(jax.process_count()) for d in devs[p * per : p * per + 2]]
    seen = run_model(mesh_devices)
    np.savez(os.path.join(out_dir, f"model_tp_p{me}.npz"), **seen)
    print(f"process {me}: the model over {len(mesh_devices)} devices of "
          f"{jax.process_count()} processes done")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
