"""The `jaxarena` command line: plan, fit, errors, JSON, packing, sharding, the plot."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from jaxarena import (
    ArenaPlan,
    BufferSizes,
    ConfigError,
    Levers,
    MemoryBudget,
    ModelConfig,
    Target,
)
from jaxarena._sizing.budget import BUDGET_KEYS
from jaxarena.cli import main, parse_memory


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_default_model_prints_every_region(capsys):
    code, out, _ = run(capsys, "plan", "--target", "gb10")
    assert code == 0
    sizes = BufferSizes.from_config(ModelConfig.preset("qwen3-8b"), 8192, 32768, 16, 64,
                                    levers=Levers.from_env(), target=Target.preset("gb10"))  # fmt: skip
    plan = ArenaPlan.sequential(sizes)
    for name in plan.regions:
        assert name in out
    assert f"total: {plan.total_bytes:,} bytes" in out


def test_plan_json_matches_the_library(capsys):
    code, out, _ = run(capsys, "plan", "qwen3-next-80b-a3b", "--json", "--target", "hopper",
                       "--max-batch-tokens", "2176", "--max-seq-len", "2048",
                       "--max-batch-size", "128")  # fmt: skip
    assert code == 0
    data = json.loads(out)
    sizes = BufferSizes.from_config(ModelConfig.preset("qwen3-next-80b-a3b"), 2176, 2048, 16,
                                    128, levers=Levers.from_env(), target=Target.preset("hopper"))  # fmt: skip
    assert data["buffers"] == sizes.as_dict()
    assert data["total_bytes"] == ArenaPlan.sequential(sizes).total_bytes
    assert {r["name"] for r in data["regions"]} == {k for k, v in sizes.as_dict().items() if v}


def test_plan_packed_json_can_be_checked_independently(capsys):
    code, out, _ = run(capsys, "plan", "qwen3-30b-a3b", "--packed", "--json", "--target", "gb10")
    assert code == 0
    data = json.loads(out)
    for key in ("sequential_bytes", "packed_bytes", "lower_bound_bytes", "regions"):
        assert key in data
    assert data["lower_bound_bytes"] <= data["packed_bytes"] <= data["sequential_bytes"]
    regions = data["regions"]
    assert all({"name", "offset_bytes", "nbytes", "live"} <= set(r) for r in regions)

    # Independent check: two regions live at the same (mode, step) never share a byte.
    def live_at(r, mode, step):
        return any(m == mode and s <= step < e for m, s, e in r["live"])

    steps = {(m, s) for r in regions for m, s, _ in r["live"]}
    for i, a in enumerate(regions):
        for b in regions[i + 1 :]:
            overlap = (a["offset_bytes"] < b["offset_bytes"] + b["nbytes"]
                       and b["offset_bytes"] < a["offset_bytes"] + a["nbytes"])  # fmt: skip
            if overlap:
                assert not any(live_at(a, m, s) and live_at(b, m, s) for m, s in steps), (
                    a["name"],
                    b["name"],
                )


def test_plan_tp_gives_the_per_device_arena(capsys):
    code, out, _ = run(capsys, "plan", "qwen3-8b", "--tp", "4", "--json", "--target", "gb10")
    assert code == 0
    data = json.loads(out)
    per_device = ModelConfig.preset("qwen3-8b").shard(tp=4)
    sizes = BufferSizes.from_config(per_device, 8192, 32768, 16, 64, levers=Levers.from_env(),
                                    target=Target.preset("gb10"))  # fmt: skip
    assert data["buffers"] == sizes.as_dict() and data["tp"] == 4


def test_plan_from_a_config_file_and_directory(capsys, tmp_path):
    cfg = tmp_path / "m"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps(
        {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
         "num_hidden_layers": 2}))  # fmt: skip
    for source in (str(cfg), str(cfg / "config.json")):
        code, out, _ = run(capsys, "plan", source, "--json")
        assert code == 0 and json.loads(out)["buffers"]["qkv_output"] > 0


@pytest.mark.parametrize(
    "argv,needle",
    [
        (("plan", "no-such-model"), "no preset or file named 'no-such-model'"),
        (("plan", "qwen3-8b", "--max-batch-tokens", "0"), "max_batch_tokens=0"),
        (("plan", "qwen3-8b", "--target", "tpu"), "unknown target 'tpu'"),
        (("plan", "qwen3-8b", "--tp", "3"), "not divisible by tp=3"),
        (("fit", "qwen3-8b", "--memory", "lots"), "--memory 'lots' is not a size"),
        (("fit", "qwen3-8b", "--memory", "1KiB"), "even max_batch_tokens=1 needs"),
    ],
)
def test_errors_are_one_line_without_traceback(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("jaxarena: error: ") and needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_config_file_is_one_clear_line(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    code, _, err = run(capsys, "plan", str(bad))
    assert code == 2 and str(bad) in err and err.count("\n") == 1


@pytest.mark.parametrize("packed", [False, True])
def test_fit_finds_the_largest_batch_that_fits(capsys, packed):
    extra = ("--packed",) if packed else ()
    code, out, _ = run(capsys, "fit", "qwen3-8b", "--memory", "3GiB", "--json", "--arena-only",
                       "--target", "gb10", *extra)  # fmt: skip
    assert code == 0
    got = json.loads(out)
    budget = 3 * 1024**3
    assert got["budget_bytes"] == budget

    def arena(m):
        sizes = BufferSizes.from_config(ModelConfig.preset("qwen3-8b"), m, 32768, 16, 64,
                                        levers=Levers.from_env(), target=Target.preset("gb10"))  # fmt: skip
        if packed:
            from jaxarena import Lifetimes, packing_report

            lt = Lifetimes.standard(ModelConfig.preset("qwen3-8b"))
            return packing_report(sizes, lt)["packed_bytes"]
        return ArenaPlan.sequential(sizes).total_bytes

    m = got["max_batch_tokens"]
    assert arena(m) == got["arena_bytes"] <= budget < arena(m + 1)


@pytest.mark.parametrize(
    "text,expected",
    [("24GiB", 24 * 1024**3), ("80GB", 80 * 10**9), ("1.5 TiB", int(1.5 * 1024**4)),
     ("4096", 4096), ("512mib", 512 * 1024**2)],
)  # fmt: skip
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize(
    "name, written, packed", [("map.png", "map.png", True), ("map", "map.png", False)]
)
def test_plot_writes_the_file_and_reports_its_path(capsys, tmp_path, name, written, packed):
    # Issue 19 (and issue 17 item 8): the line names the file really written, `.png` added
    # when the path has no extension; exactly that one file appears.
    pytest.importorskip("matplotlib", reason="the plot is an optional extra: jaxarena[plot]")
    argv = ["plan", "qwen3-8b", "--target", "gb10", "--plot", str(tmp_path / name)]
    code, _, err = run(capsys, *argv, *(["--packed"] if packed else []))
    assert code == 0
    path = tmp_path / written
    assert err.strip().splitlines()[-1] == f"memory map written to {path}"
    assert sorted(tmp_path.iterdir()) == [path]
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    # The packed map has three mode panels beside the strip; the sequential plan one strip.
    assert (width > 1200) == packed and height > 500


def test_plan_budget_fit_and_their_pictures_never_import_jax(tmp_path):
    # Issue 19: importing jax is ~0.6 s of the 2 s that `jaxarena plan --packed --plot` may
    # take, and sizing, packing and drawing need none of it: `jaxarena` imports jax only when
    # an arena is allocated, viewed or written (`jaxarena._arena.device`) or a target is
    # detected from a device. A fresh interpreter runs the commands and lists what it loaded.
    pytest.importorskip("matplotlib", reason="the plot is an optional extra: jaxarena[plot]")
    script = f"""
import contextlib, io, sys
from jaxarena.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    codes = [
        main(["plan", "tiny-hybrid", "--packed", "--target", "hopper", "--plot", {str(tmp_path / "m.png")!r}]),
        main(["budget", "qwen3-8b", "--memory", "80GiB", "--target", "hopper", "--plot", {str(tmp_path / "b.png")!r}]),
        main(["fit", "qwen3-8b", "--memory", "80GiB", "--target", "hopper"]),
        # Issue 30: the default target is named (gb10), so no flag still means no jax.
        main(["plan", "tiny-hybrid"]),
        main(["budget", "tiny-hybrid", "--memory", "80GiB"]),
        main(["fit", "tiny-hybrid", "--memory", "8GiB", "--arena-only"]),
    ]
print(codes, sorted(m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jaxlib"))))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 0, 0, 0, 0, 0] []", done.stdout
    assert (tmp_path / "m.png").stat().st_size > 0 and (tmp_path / "b.png").stat().st_size > 0


def test_demo_runs_and_reports(capsys):
    code, out, err = run(capsys, "demo", "--steps", "3", "--batch", "2")
    assert code == 0
    assert "\rdecode" not in err  # the progress bar is for a terminal; this stderr is not one
    assert "arena buffer moved in 0 of 3 steps" in out
    assert "traced 1x" in out and "guards broken: none" in out


# -- budget and fit (issue 14) ------------------------------------------------------------------


def _budget(name, memory, **kw):
    return MemoryBudget(config=ModelConfig.preset(name), memory_bytes=memory,
                        levers=Levers.from_env(), target=Target.preset("hopper"), **kw)  # fmt: skip


def test_budget_json_has_exactly_the_budget_keys(capsys):
    code, out, _ = run(capsys, "budget", "qwen3-30b-a3b", "--memory", "141GB", "--tp", "8",
                       "--ep", "8", "--weights", "fp8", "--kv-dtype", "fp8", "--target",
                       "hopper", "--json")  # fmt: skip
    assert code == 0
    got = json.loads(out)
    expected = _budget("qwen3-30b-a3b", "141GB", tp=8, ep=8, weights="fp8", kv_dtype="fp8")
    # `model` is the name given, as `plan --json` has it (issue 40); the file is the table's.
    assert got == {**expected.as_dict(), "model": "qwen3-30b-a3b"}
    assert tuple(got) == BUDGET_KEYS


def test_budget_table_shows_every_part_and_the_answers(capsys):
    code, out, _ = run(capsys, "budget", "llama3.1-8b", "--memory", "141GB", "--target", "hopper")
    assert code == 0
    b = _budget("llama3.1-8b", "141GB")
    for label, value in (("weights", b.weight_bytes), ("arena", b.arena_bytes),
                         ("reserve", b.reserve_bytes), ("free for KV + state", b.free_bytes),
                         ("KV per token", b.kv_bytes_per_token)):  # fmt: skip
        assert f"{value:,}" in out, label
    assert f"max_sequences {b.max_sequences:,}" in out and "fits:" in out


def test_budget_that_does_not_fit_says_what_would(capsys):
    code, out, _ = run(capsys, "budget", "qwen3-next-80b-a3b", "--memory", "141GB",
                       "--target", "hopper")  # fmt: skip
    assert code == 0
    assert "does not fit: short by" in out and "FP8 weights (--weights fp8)" in out
    assert "tp=2" in out


def test_budget_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot is an optional extra: jaxarena[plot]")
    path = tmp_path / "budget"  # no extension: .png is added and reported
    code, _, err = run(capsys, "budget", "qwen3-8b", "--memory", "80GB", "--tp", "2",
                       "--plot", str(path))  # fmt: skip
    assert code == 0
    written = tmp_path / "budget.png"
    assert str(written) in err
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fit_leaves_room_for_the_sequences(capsys):
    code, out, _ = run(capsys, "fit", "qwen3-8b", "--memory", "40GB", "--sequences", "8",
                       "--max-seq-len", "16384", "--target", "hopper", "--json")  # fmt: skip
    assert code == 0
    got = json.loads(out)
    m = got["max_batch_tokens"]
    b = _budget("qwen3-8b", "40GB", max_seq_len=16384, max_batch_size=64)
    assert b.replace(max_batch_tokens=m).required_bytes(8) <= 40 * 10**9
    assert b.replace(max_batch_tokens=m + 1).required_bytes(8) > 40 * 10**9
    assert got["required_bytes"] == b.replace(max_batch_tokens=m).required_bytes(8)


def test_fit_arena_only_is_unbounded(capsys):
    # Issue 17 item 7: the arena-only search used to stop at 2**25 - 1.
    code, out, _ = run(capsys, "fit", "tiny-hybrid", "--memory", "1000TiB", "--arena-only",
                       "--json", "--target", "gb10")  # fmt: skip
    assert code == 0
    assert json.loads(out)["max_batch_tokens"] > 1 << 25


@pytest.mark.parametrize(
    "argv,needle",
    [
        (("budget", "qwen3-8b", "--memory", "lots"), "--memory 'lots' is not a size"),
        (("budget", "qwen3-8b", "--memory", "0"), "must be positive"),
        (("budget", "qwen3-8b", "--memory=-8GB"), "must be positive"),
        (("budget", "qwen3-8b", "--memory", "1" + "0" * 400), "not a size"),
        (("budget", "qwen3-8b", "--memory", "80GB", "--tp", "3"), "not divisible by tp=3"),
        (("budget", "qwen3-8b", "--memory", "80GB", "--ep", "2"), "ep=2 needs a model"),
        (("budget", "qwen3-8b", "--memory", "80GB", "--reserve", "x"), "--reserve 'x'"),
        (("fit", "qwen3-32b", "--memory", "24GB"), "even max_batch_tokens=1 needs"),
        (("fit", "qwen3-8b", "--memory", "80GB", "--sequences", "100", "--max-batch-size",
          "10"), "--sequences 100 exceeds --max-batch-size 10"),
    ],
)  # fmt: skip
def test_budget_and_fit_errors_are_one_line(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("jaxarena: error: ") and needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_budget_and_fit_work_on_every_preset(capsys):
    from jaxarena import presets

    for name in presets():
        # 8,192 tokens, or the model's context when shorter (past it is refused, issue 40)
        seq = min(8192, ModelConfig.preset(name).max_position_embeddings or 8192)
        code, out, err = run(capsys, "budget", name, "--memory", "141GB", "--tp", "1",
                             "--weights", "fp8", "--max-seq-len", str(seq), "--json")  # fmt: skip
        assert code == 0, (name, err)
        assert tuple(json.loads(out)) == BUDGET_KEYS
        # 4 TB: Kimi K2's 1.03 T parameters are 2.05 TB in bf16.
        code, out, err = run(capsys, "fit", name, "--memory", "4TB", "--sequences", "4",
                             "--max-seq-len", str(seq), "--json")  # fmt: skip
        assert code == 0, (name, err)
        assert json.loads(out)["max_batch_tokens"] >= 1


def test_budget_reads_kimi_k2_as_its_architecture(capsys):
    # Issue 31: transformers' count of Kimi-K2-Instruct read as DeepSeek-V3 (its architecture).
    code, out, _ = run(capsys, "budget", "kimi-k2-instruct", "--memory", "141GB", "--tp", "8",
                       "--ep", "8", "--target", "hopper")  # fmt: skip
    assert code == 0
    assert "1,026,408,209,408 parameters" in out and "[deepseek_v3]" in out


# -- issue 30: small defects --------------------------------------------------------------------


def test_budget_state_dtype_reaches_the_budget(capsys):
    # Before: --state-dtype was parsed and dropped (77,266,944 state bytes either way).
    got = {}
    for dtype in ("f32", "bf16"):
        code, out, _ = run(capsys, "budget", "qwen3-next-80b-a3b", "--memory", "141GB",
                           "--target", "hopper", "--state-dtype", dtype, "--json")  # fmt: skip
        assert code == 0
        got[dtype] = json.loads(out)["state_bytes_per_sequence"]
        expected = _budget("qwen3-next-80b-a3b", "141GB", state_dtype=dtype)
        assert got[dtype] == expected.state_bytes_per_sequence
    assert got["f32"] == 77_266_944 and got["bf16"] < got["f32"]


def test_auto_target_is_resolved_once_per_command(capsys, monkeypatch):
    # `fit --arena-only` sizes the arena at every bisection step; `auto` is asked once.
    calls = []

    def detect(device=None):
        calls.append(device)
        return Target.preset("hopper")

    monkeypatch.setattr(Target, "detect", staticmethod(detect))
    code, out, _ = run(capsys, "fit", "qwen3-8b", "--memory", "8GiB", "--arena-only",
                       "--target", "auto")  # fmt: skip
    assert code == 0 and "largest max_batch_tokens" in out
    assert len(calls) == 1
    code, out, _ = run(capsys, "plan", "qwen3-8b", "--target", "auto")
    assert code == 0 and "target hopper" in out and len(calls) == 2
    code, out, _ = run(capsys, "plan", "qwen3-8b")
    assert code == 0 and "target gb10" in out and len(calls) == 2  # the default is named


def test_user_errors_are_one_line_and_bugs_keep_their_traceback(capsys, monkeypatch):
    from jaxarena import cli

    monkeypatch.delenv("JAXARENA_TRACEBACK", raising=False)
    code, _, err = run(capsys, "plan", "tiny-hybrid", "--tp", "3")  # a ConfigError
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err

    def broken(*args, **kwargs):
        raise ValueError("an internal inconsistency")

    monkeypatch.setattr(cli, "_sizes", broken)  # a bug inside the project, not the input
    with pytest.raises(ValueError, match="an internal inconsistency"):
        main(["plan", "tiny-hybrid"])
    monkeypatch.setenv("JAXARENA_TRACEBACK", "1")  # input errors keep their traceback too
    with pytest.raises(ConfigError, match="tp=3"):
        main(["plan", "tiny-hybrid", "--tp", "3"])


def test_help_documents_jaxarena_traceback(capsys):
    for argv in (["--help"], ["plan", "--help"], ["budget", "--help"]):
        assert main(argv) == 0
        assert "JAXARENA_TRACEBACK=1" in capsys.readouterr().out


def test_counts_of_one_read_in_the_singular(capsys):
    code, out, _ = run(capsys, "fit", "qwen3-8b", "--memory", "24GB", "--max-seq-len", "1",
                       "--target", "hopper")  # fmt: skip
    assert code == 0 and "with 1 sequence of 1 token within" in out
    # A budget with room for exactly one sequence (no reserve: the arithmetic is exact).
    b = _budget("qwen3-8b", "141GB", reserve=0)
    memory = b.weight_bytes + b.arena_bytes + b.sequence_bytes * 3 // 2
    code, out, _ = run(capsys, "budget", "qwen3-8b", "--memory", str(memory), "--reserve", "0",
                       "--target", "hopper", "--max-seq-len", "32768")  # fmt: skip
    assert code == 0 and "1 sequence of 32,768 tokens" in out and "1 sequences" not in out
    code, out, _ = run(capsys, "budget", "qwen3-8b", "--memory", "24GB", "--max-seq-len", "1",
                       "--target", "hopper")  # fmt: skip
    assert "(of 1 token)" in out and "1 token + state" in out and "1 tokens" not in out


def test_plan_and_budget_read_a_transformers_5_nemotron_h_config(capsys):
    # Issue 24: the config.json transformers 5.x writes for Nemotron-H (layers_block_type with
    # linear_attention / full_attention / moe) was refused; it now plans like the preset.
    path = "tests/fixtures/nemotron_h_transformers5/config.json"
    # The same limits: the saved file states transformers' default context (4,096), which the
    # default --max-seq-len keeps within (issue 40); the preset states none.
    limits = ["--max-seq-len", "4096"]
    code, out, err = run(capsys, "plan", path, "--json", *limits)
    assert code == 0, err
    preset_plan = run(capsys, "plan", "nemotron-3-nano-30b-a3b", "--json", *limits)[1]
    assert json.loads(out)["buffers"] == json.loads(preset_plan)["buffers"]
    code, out, err = run(capsys, "budget", path, "--memory", "141GB", "--json")
    assert code == 0, err
    preset = json.loads(run(capsys, "budget", "nemotron-3-nano-30b-a3b", "--memory", "141GB",
                            "--json")[1])  # fmt: skip
    assert json.loads(out)["param_count"] == preset["param_count"] > 0
