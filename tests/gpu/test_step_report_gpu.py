"""`jaxarena step-report --target h200` on the tiny hybrid preset (issue 23 item 3): the JSON
figures are those of `compile_for_gpu` on the same abstract step, copies are a part of the
launches, nothing spills, the arena and caches are aliased, and the step's temp does not depend
on the KV page pool's size (why the report may size the pool at one sequence)."""

from __future__ import annotations

import json

import jax
import pytest

from jaxarena.cli import main
from jaxarena.step_report import STEP_KEYS, abstract_model, compile_step

LIMITS = dict(max_batch_tokens=32, max_seq_len=64, kv_block_size=16, max_batch_size=2)
ARGV = ["--max-batch-tokens", "32", "--max-seq-len", "64", "--kv-block-size", "16",
        "--max-batch-size", "2"]  # fmt: skip


def test_step_report_h200(h200, capsys):
    assert main(["step-report", "tiny-hybrid", "--target", h200, "--json", *ARGV]) == 0
    r = json.loads(capsys.readouterr().out)
    assert list(r["steps"]["prefill"]) == ["tokens", *STEP_KEYS]
    lm, params, caches = abstract_model("tiny-hybrid", target=h200, **LIMITS)
    assert r["arena_bytes"] == lm.plan.total_bytes
    for kind, step in r["steps"].items():
        assert 0 <= step["copies"] < step["launches"], kind
        assert step["spills"] == 0, kind
        assert step["alias_bytes"] >= r["arena_bytes"], kind
    # Counted where they happen: decode's o_proj reads the split-K output out of the arena's
    # `attn_output` (a copy); prefill's reads the prefill kernel's output as a value (none).
    assert r["steps"]["decode"]["copies"] > 0 == r["steps"]["prefill"]["copies"]

    # A 4x larger KV page pool: the same temp and launches (the pages are written in place).
    def grow(a):
        return jax.ShapeDtypeStruct((a.shape[0] * 4, *a.shape[1:]), a.dtype)

    big = {k: jax.tree.map(grow, v) if k.startswith("attention") else v
           for k, v in caches.items()}  # fmt: skip
    for kind in ("prefill", "decode"):
        got = compile_step(lm, params, big, kind, h200)
        want = r["steps"][kind]
        assert (got["temp_bytes"], got["launches"], got["copies"]) == (
            want["temp_bytes"], want["launches"], want["copies"]), kind  # fmt: skip


@pytest.mark.parametrize("target", ["b200"])
def test_step_report_b200_decode(h200, target):
    # h200 asks for the CUDA plugin (skips without it); the B200 decode step compiles as well.
    from jaxarena.step_report import step_report

    r = step_report("tiny-hybrid", target=target, steps=("decode",), **LIMITS)
    assert list(r["steps"]) == ["decode"] and r["steps"]["decode"]["spills"] == 0


def test_budget_compiled_reserves_the_compiled_temp(h200, capsys):
    argv = ["budget", "tiny-hybrid", "--memory", "2GiB", "--target", "hopper", "--json", *ARGV]
    assert main([*argv, "--compiled"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert err.splitlines() == ["compiling prefill for h200 ...", "compiling decode for h200 ..."]
    from jaxarena.step_report import step_report

    r = step_report("tiny-hybrid", target=h200, **LIMITS)
    temp = max(s["temp_bytes"] for s in r["steps"].values())
    assert (got["reserve_source"], got["step_temp_bytes"]) == ("compiled", temp)
    assert got["reserve_bytes"] == (1 << 30) + temp
    assert main(argv) == 0  # without --compiled: estimated, and no compile
    out, err = capsys.readouterr()
    assert json.loads(out)["reserve_source"] == "estimated" and err == ""


def test_budget_compiled_runs_a_moe_model(h200, capsys, monkeypatch):
    """`budget --compiled` (through `step_report`) on a MoE checkpoint: the qwen3_moe fixture's
    shapes from its safetensors headers, both steps compiled for an H200 without spills, the
    arena and caches aliased, the reserve the larger step temp."""
    from pathlib import Path

    from jaxarena import step_report as sr

    reports = []

    def recording(*args, **kwargs):
        reports.append(real(*args, **kwargs))
        return reports[-1]

    real = sr.step_report
    monkeypatch.setattr(sr, "step_report", recording)
    ckpt = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "qwen3_moe"
    argv = ["budget", str(ckpt), "--memory", "2GiB", "--target", "hopper", "--json", "--compiled",
            *ARGV]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    (r,) = reports
    assert list(r["steps"]) == ["prefill", "decode"]
    for kind, step in r["steps"].items():
        assert step["spills"] == 0, kind
        assert step["alias_bytes"] >= r["arena_bytes"], kind
    temp = max(s["temp_bytes"] for s in r["steps"].values())
    assert (got["reserve_source"], got["step_temp_bytes"]) == ("compiled", temp)
