"""`jaxarena step-report --tp N --ep M` (issue 42 item 3): one device's step of a tensor- /
expert-parallel model compiled for N compile-only H200s (a `1x1xN` topology) on this CPU
machine; its collectives counted per step and their bytes per device, against the hand count
of the design (`jaxarena.models.tensor_parallel`): one all-reduce per block (of the block's
bf16 partial sums), one of the embedding's bf16 rows, one all-gather of the bf16 logits."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jaxarena import ModelConfig
from jaxarena.cli import main
from jaxarena.gpu_aot import compile_for_gpu, gpu_devices, gpu_mesh
from jaxarena.step_collectives import collectives
from jaxarena.step_report import STEP_KEYS, ModelSource, step_report_details

CHECKPOINTS = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
B, T = 2, 32  # decode sequences, prefill tokens
ARGV = ["--max-batch-tokens", str(T), "--max-seq-len", "64", "--kv-block-size", "16",
        "--max-batch-size", str(B)]  # fmt: skip
P = jax.sharding.PartitionSpec


def test_eight_h200s_compile_an_all_reduce(h200):
    """The issue author's check: a program sharded over a `1x1x8` H200 topology compiles here
    with its all-reduce; the figures are one device's (its arguments: one slice each)."""
    mesh = gpu_mesh(8, h200)
    assert len(set(gpu_devices(h200, 8))) == 8 and gpu_mesh(8, h200) == mesh

    def f(x, w):
        def local(x, w):
            return jax.lax.psum(x[0] @ w[0], "tp")[None]

        return jax.shard_map(local, mesh=mesh, in_specs=(P("tp"), P("tp")), out_specs=P("tp"),
                             check_vma=False)(x, w)  # fmt: skip

    sharded = jax.sharding.NamedSharding(mesh, P("tp"))
    x = jax.ShapeDtypeStruct((8, 4, 64), jnp.bfloat16, sharding=sharded)
    w = jax.ShapeDtypeStruct((8, 64, 128), jnp.bfloat16, sharding=sharded)
    res = compile_for_gpu(f, x, w, mesh=mesh, dump_dir=True)
    assert res.argument_bytes == (4 * 64 + 64 * 128) * 2  # one device's slices
    c = collectives(res.dump_hlo_text, res.thunks, res.thunk_names)
    assert c["by_kind"] == {"all-reduce": {"count": 1, "bytes": 4 * 128 * 2}}
    assert c["unknown"] == 0


def _per_device_weight_bytes(name: Path, tp: int, ep: int) -> int:
    """Bytes device 0 reads of the checkpoint (`tensor_parallel.device_slices`): the loaded
    model's, to hold the abstract per-device weights against."""
    from jaxarena.models.checkpoint import fp8_spec
    from jaxarena.models.families.registry import family_for
    from jaxarena.models.tensor_parallel import device_slices

    src = ModelSource(str(name))
    family = family_for(src.raw["model_type"], src.path)
    arch = family.arch(src.raw["model_type"], src.raw, src.config, src.path, 64)
    host, _ = device_slices(family, src.checkpoint, fp8_spec(src.raw, src.path), src.config,
                            arch, tp, 0, ep)  # fmt: skip
    return sum(a.nbytes for a in jax.tree.leaves(host))


def _expected(cfg: ModelConfig, tp: int, blocks: int, rows: int, logit_rows: int) -> dict:
    """The design's collectives of one step, by hand: `blocks` all-reduces of `[rows, hidden]`
    bf16 partial sums plus the embedding's of `[rows, hidden]` bf16; one all-gather of each
    device's `[logit_rows, vocab / tp]` bf16 logits."""
    h, local_vocab = cfg.hidden_size, -(-cfg.vocab_size // tp)
    return {
        "all-gather": {"count": 1, "bytes": logit_rows * local_vocab * 2},
        "all-reduce": {"count": blocks + 1, "bytes": (blocks + 1) * rows * h * 2},
    }


def test_step_report_tp2_dense(h200, capsys):
    """qwen3 fixture (2 layers, hidden 64, vocab 256) over 2 H200s: both steps' collectives
    as counted by hand, per-device arena and weights, no spills, the text table."""
    ckpt = CHECKPOINTS / "qwen3"
    assert main(["step-report", str(ckpt), "--target", h200, "--tp", "2", "--json", *ARGV]) == 0
    out, err = capsys.readouterr()
    r = json.loads(out)
    assert err.splitlines() == [f"compiling {k} for 2 x h200 (tp=2, ep=1) ..."
                                for k in ("prefill", "decode")]  # fmt: skip
    cfg = ModelConfig.from_hf(ckpt)
    assert (r["tp"], r["ep"]) == (2, 1)
    assert r["weight_bytes"] == _per_device_weight_bytes(ckpt, 2, 1)
    blocks = 2 * cfg.num_hidden_layers  # attention + MLP per layer
    for kind, rows, logit_rows in (("decode", B, B), ("prefill", T, B + 1)):
        s = r["steps"][kind]
        assert list(s)[1:] == list(STEP_KEYS), kind
        assert s["spills"] == 0 and s["temp_bytes"] > 0, kind
        assert s["alias_bytes"] >= r["arena_bytes"], kind  # the per-device arena, donated
        c = s["collectives"]
        assert c["by_kind"] == _expected(cfg, 2, blocks, rows, logit_rows), kind
        assert (c["count"], c["bytes"]) == (c["design_count"], c["design_bytes"]), kind
        assert (c["min_count"], c["min_bytes"]) == (blocks, blocks * rows * cfg.hidden_size * 2)
        # bandwidth only: a ring all-reduce sends 2 (tp-1)/tp of it, an all-gather (tp-1) x
        sent = c["by_kind"]["all-reduce"]["bytes"] + c["by_kind"]["all-gather"]["bytes"]
        assert c["link_seconds"] == pytest.approx(sent / 450e9)
    # The text form: the collectives' table, its decode row.
    details = {"report": r, "argument_bytes": {"prefill": 1, "decode": 1}, "cache_bytes": 0,
               "layers": 2, "model_type": "qwen3"}  # fmt: skip
    from jaxarena.step_report import format_report

    text = format_report(details, "q", {}).splitlines()
    assert "2 x h200 (tp=2, ep=1; figures per device)" in text[0]
    row = next(line.split() for line in text if line.split()[:2] == ["decode", "6"])
    assert row[2:4] == ["1.75", "KiB"]  # 1,280 (5 bf16 all-reduces of [2, 64]) + 512 B


def test_step_report_ep2_moe_decode(h200):
    """qwen3_moe fixture over 2 H200s with its 8 experts split whole (ep=2): each device holds
    4 experts' weights, the decode step's collectives are the dense design's (the experts'
    partial outputs ride the block's all-reduce: no all-to-all)."""
    ckpt = CHECKPOINTS / "qwen3_moe"
    d = step_report_details(ckpt, target=h200, steps=("decode",), tp=2, ep=2,
                            max_batch_tokens=T, max_seq_len=64, max_batch_size=B)  # fmt: skip
    r = d["report"]
    cfg = ModelConfig.from_hf(ckpt)
    assert r["weight_bytes"] == _per_device_weight_bytes(ckpt, 2, 2)
    s = r["steps"]["decode"]
    assert s["spills"] == 0
    blocks = 2 * cfg.num_hidden_layers
    assert s["collectives"]["by_kind"] == _expected(cfg, 2, blocks, B, B)
