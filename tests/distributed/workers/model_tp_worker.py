"""One process of the cross-process tensor-parallel model check (tests/distributed/).

    python -m jaxarena.launch --processes 2 --devices-per-process 4 -- \\
        python tests/distributed/workers/model_tp_worker.py CKPT_DIR OUT_DIR

Loads the 8-head checkpoint `write_checkpoint` made in CKPT_DIR with `load_pretrained(...,
mesh=...)` over the 8 devices of both processes (so every all-reduce of the step crosses
processes), runs the qwen3 fixture's reference prompts (prefill logits of each, then 8 greedy
tokens of the batch) and writes what it saw to `OUT_DIR/model_tp_p<id>.npz`: the logits and
tokens (replicated: every process reads its own copy) and its local devices and bytes.
`run_model` is also what the test runs in one process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "qwen3"
# The fixture's tensors read as 8 heads of 8 (4 KV heads): every width divides by 8.
HEADS = dict(num_attention_heads=8, num_key_value_heads=4, head_dim=8)
LIMITS = dict(max_batch_tokens=64, max_seq_len=32, kv_block_size=16, max_batch_size=4)
NEW_TOKENS = 8


def prompts() -> list[list[int]]:
    with np.load(FIXTURE / "reference.npz") as r:
        return [r["prompt_ids"][i, :m].tolist() for i, m in enumerate(r["prompt_lengths"])]


def write_checkpoint(path: Path) -> None:
    """The qwen3 fixture's weights as an 8-head model (`HEADS`; the q/k norms cut to 8)."""
    import json
    import struct

    import ml_dtypes

    from jaxarena.models.checkpoint import open_checkpoint

    src = open_checkpoint(FIXTURE)
    config = {**json.loads((FIXTURE / "config.json").read_text()), **HEADS}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    header, blobs, at = {}, [], 0
    for name in sorted(src):
        a = np.asarray(src[name])
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            a = a[: HEADS["head_dim"]]
        b = np.ascontiguousarray(a.astype(ml_dtypes.bfloat16)).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    head = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def run_model(ckpt: Path, devices: list[Any]) -> dict[str, Any]:
    """The checkpoint over a "tp" mesh of `devices`: prefill logits per prompt, greedy tokens
    and their logits, and this process's share of the model."""
    import jax

    from jaxarena.models import load_pretrained

    mesh = jax.sharding.Mesh(np.array(devices), ("tp",))
    lm = load_pretrained(ckpt, **LIMITS, kernels="xla", mesh=mesh,
                         compiler_options={"xla_backend_optimization_level": 0})  # fmt: skip
    out: dict[str, Any] = {f"prefill_{i}": lm.prefill_logits(p) for i, p in enumerate(prompts())}
    tokens, logits = lm.generate(prompts(), NEW_TOKENS, return_logits=True)
    out["tokens"], out["logits"] = np.asarray(tokens), np.asarray(logits)
    out["local_devices"] = np.array([s.device.id for s in lm.arena.addressable_shards])
    out["weight_bytes"] = np.array(lm.weight_bytes)
    out["local_param_bytes"] = np.array(sum(s.data.nbytes for leaf in jax.tree.leaves(lm.params)
                                            for s in leaf.addressable_shards))  # fmt: skip
    return out


def main(ckpt: str, out_dir: str) -> None:
    import jaxarena.launch

    info = jaxarena.launch.initialize()
    assert info is not None, "run me under python -m jaxarena.launch"
    import jax

    me = jax.process_index()
    mesh_devices = jax.devices()  # every process's
    seen = run_model(Path(ckpt), mesh_devices)
    np.savez(os.path.join(out_dir, f"model_tp_p{me}.npz"), **seen)
    print(f"process {me}: the model over {len(mesh_devices)} devices of "
          f"{jax.process_count()} processes done")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
