"""Issue 40 on the command line: block sizes by the kernels' rule, the model's context, the
CUDA plugin's noise, memory units, broken pipes, GPU names, stored weight formats (FP8,
MXFP4), the packed plan as text, the mesh header, `--target auto` without a GPU,
`--version`. Every command runs in-process (`main([...])`)."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from jaxarena import ArenaPlan, BufferSizes, Levers, Lifetimes, ModelConfig, Target, _cli_checks
from jaxarena._sizing.weights import weight_bytes
from jaxarena.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "tests" / "fixtures" / "checkpoints"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_error(code, err):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxarena: error: "), err
    return lines[0]


# -- item 3: missing dimensions, unknown families -----------------------------------------------------


def test_a_config_without_layers_is_one_line_naming_key_and_file(capsys, tmp_path):
    raw = json.loads((ROOT / "jaxarena" / "presets" / "llama3.1-8b.json").read_text())
    del raw["num_hidden_layers"]  # was: TypeError from the budget table's format string
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    line = _one_error(*run(capsys, "budget", path, "--memory", "80GB")[::2])
    assert line == (f"jaxarena: error: {path}: required key num_hidden_layers is missing (the "
                    "number of decoder layers; model_type 'llama' has no default for it)")  # fmt: skip


def test_an_unknown_family_is_said_on_stderr(capsys, tmp_path):
    raw = json.loads((ROOT / "jaxarena" / "presets" / "llama3.1-8b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(raw, model_type="my_llama", architectures=["MyModel"])))
    code, out, err = run(capsys, "budget", path, "--memory", "80GB")
    assert code == 0 and "[my_llama]" in out
    assert err.startswith(f"jaxarena: warning: {path}: model_type 'my_llama' is not a family "
                          "jaxarena knows")  # fmt: skip
    assert "read as the generic decoder" in err and len(err.strip().splitlines()) == 1


# -- item 4: block sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", CHECKPOINTS / "llama", "--kv-block-size", "0"],
        ["generate", CHECKPOINTS / "llama", "--kv-block-size", "7"],
        ["step-report", "tiny-hybrid", "--kv-block-size", "0"],
        ["step-report", "tiny-hybrid", "--kv-block-size", "24"],
        ["plan", "qwen3-8b", "--kv-block-size", "7"],
        ["budget", "qwen3-8b", "--memory", "80GB", "--kv-block-size", "12"],
        ["fit", "qwen3-8b", "--memory", "80GB", "--kv-block-size", "3"],
    ],
)
def test_a_block_size_the_kernels_refuse_is_one_line_up_front(capsys, argv):
    t0 = time.perf_counter()
    line = _one_error(*run(capsys, *argv)[::2])
    assert f"--kv-block-size {argv[-1]} must be a power of two" in line
    assert time.perf_counter() - t0 < 2  # before any load or compile (was 6 s, then a kernel)


def test_an_unpaged_cache_is_still_sized(capsys):
    code, out, _ = run(capsys, "plan", "qwen3-8b", "--kv-block-size", "0")
    assert code == 0 and "kv_block_size=0" in out


# -- item 6: the model's context -------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["budget", "qwen3-8b", "--memory", "141GB"], ["fit", "qwen3-8b", "--memory", "141GB"],
     ["plan", "qwen3-8b"], ["step-report", "qwen3-8b", "--target", "cpu"]],
)  # fmt: skip
def test_a_max_seq_len_past_the_context_is_refused(capsys, command):
    line = _one_error(*run(capsys, *command, "--max-seq-len", "1000000")[::2])
    assert "--max-seq-len 1,000,000 is past the model's context" in line
    assert "max_position_embeddings=40,960 in jaxarena/presets/qwen3-8b.json" in line


def test_past_the_context_with_rope_scaling_is_a_warning_and_the_default_fits_it(capsys):
    # gpt_oss fixture: max_position_embeddings 128 with YaRN.
    code, out, err = run(capsys, "plan", CHECKPOINTS / "gpt_oss", "--max-seq-len", "256")
    assert code == 0 and "max_seq_len=256" in out
    assert err.startswith("jaxarena: warning: --max-seq-len 256 is past the model's context")
    assert "RoPE scaling may extend it" in err and len(err.strip().splitlines()) == 1
    code, out, err = run(capsys, "plan", "tiny-hybrid")  # a 4,096-token model
    assert code == 0 and "max_seq_len=4096" in out and err == ""
    code, out, err = run(capsys, "plan", "qwen3-8b")  # 40,960: the default 32,768 stands
    assert code == 0 and "max_seq_len=32768" in out


def test_generate_past_the_context_is_refused_before_loading(capsys, monkeypatch):
    from jaxarena.models import generate_cli

    def load(*args, **kw):
        raise AssertionError("loaded the checkpoint (minutes of decoding followed, silently)")

    monkeypatch.setattr(generate_cli, "load_pretrained", load)
    line = _one_error(*run(capsys, "generate", CHECKPOINTS / "mistral_window",
                           "--max-new-tokens", "100000")[::2])  # fmt: skip
    assert "100,001 tokens is past the model's context: max_position_embeddings=128" in line


def test_generate_progress_after_a_few_seconds(capsys, monkeypatch):
    from jaxarena.models import generate_cli

    monkeypatch.setattr(generate_cli, "PROGRESS_AFTER_SECONDS", 0.01)
    monkeypatch.setattr(generate_cli, "PROGRESS_SECONDS", 0.01)
    with generate_cli._Progress("1 x 5 new tokens"):
        time.sleep(0.2)
    err = capsys.readouterr().err
    assert "jaxarena: generate:" in err and "(1 x 5 new tokens)" in err
    with generate_cli._Progress("quick"):
        pass
    assert capsys.readouterr().err == ""  # a short run stays silent


# -- item 7: the CUDA plugin -----------------------------------------------------------------------


def test_the_plugins_start_up_traceback_is_dropped_without_a_gpu(caplog, monkeypatch):
    monkeypatch.setattr(_cli_checks, "_no_gpu", lambda: True)
    logger = logging.getLogger("jax._src.xla_bridge")
    message = "Jax plugin configuration error: Exception when calling xla_cuda13.initialize()"
    with caplog.at_level(logging.WARNING, logger="jax._src.xla_bridge"):
        with _cli_checks.cli_output():
            logger.warning(message)
            logger.warning("another message")
        logger.warning(message)  # outside a command: jax's own logging, untouched
    assert [r.getMessage() for r in caplog.records] == ["another message", message]


def test_a_command_that_starts_jax_prints_no_plugin_traceback():
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-m", "jaxarena.cli", "plan", "tiny-hybrid", "--target",
                        "auto", "--max-seq-len", "4096"], capture_output=True, text=True,
                       env=env, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    if not _cli_checks._no_gpu():
        pytest.skip("a GPU machine: the plugin starts, nothing to drop")
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "--target auto found no GPU" in r.stderr


def test_one_documented_extra_for_deviceless_reports(monkeypatch):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("jax[cuda13-local]") for d in extras["gpu-aot"])
    assert 'pip install -e ".[gpu-aot]"' in (ROOT / "README.md").read_text()
    from jaxarena import gpu_aot
    from jaxarena.gpu_dump import GpuUnavailable

    monkeypatch.setattr(gpu_aot, "_cuda_plugin_module", lambda: None)
    # `gpu_device` is cached: earlier tests of the suite may have made the device already, so
    # call the function beneath the cache.
    with pytest.raises(GpuUnavailable, match=r'pip install "jaxarena\[gpu-aot\]"'):
        gpu_aot.gpu_device.__wrapped__("h200")


# -- item 8 ------------------------------------------------------------------------------------------


class _ClosedPipe:
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["plan", "qwen3-8b"]) == 0  # `jaxarena plan qwen3-8b | head -3`
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("memory", "needle"),
    [("80", "--memory 80 has no unit, so it reads as 80 bytes; did you mean --memory 80GB"),
     ("-80GB", "--memory '-80GB' must be positive")],
)  # fmt: skip
def test_memory_without_a_unit_or_negative(capsys, memory, needle):
    line = _one_error(*run(capsys, "budget", "qwen3-8b", "--memory", memory)[::2])
    assert needle in line


def test_budget_counts_mxfp4_experts_by_default(capsys):
    code, out, _ = run(capsys, "budget", "gpt-oss-20b", "--memory", "80GB", "--json")
    got = json.loads(out)
    cfg = ModelConfig.preset("gpt-oss-20b")
    # Independently: the routed experts' gate, up and down matrices at 4.25 bits per value
    # (one e8m0 byte per 32 values) instead of 16; everything else bf16.
    h, w, n, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_hidden_layers, cfg.num_experts
    expert_values = n * e * 3 * w * h
    mxfp4 = n * e * (2 * w * math.ceil(h / 32) + h * math.ceil(w / 32)) * 17
    assert got["weights"] == "mxfp4"
    assert got["weight_bytes"] == weight_bytes(cfg, "bf16") - 2 * expert_values + mxfp4
    assert 12.5e9 < got["weight_bytes"] < 14e9  # the hub's safetensors: 13.8 GB
    code, out, _ = run(capsys, "budget", "gpt-oss-20b", "--memory", "80GB", "--weights", "bf16")
    assert "bf16, not the 'mxfp4' the checkpoint stores" in out


def test_budget_counts_an_fp8_checkpoint_as_fp8_by_default(capsys):
    code, out, _ = run(capsys, "budget", "deepseek-v3", "--memory", "1TB", "--json")
    got = json.loads(out)
    assert got["weights"] == "fp8"
    assert got["weight_bytes"] == weight_bytes(ModelConfig.preset("deepseek-v3"), "fp8")


def test_step_report_names_the_file_it_was_given(capsys, tmp_path):
    raw = json.loads((ROOT / "jaxarena" / "presets" / "gpt-oss-20b.json").read_text())
    path = tmp_path / "gpt-oss-120b.json"
    path.write_text(json.dumps(raw))
    line = _one_error(*run(capsys, "step-report", path, "--target", "cpu", "--max-seq-len",
                           "256", "--max-batch-tokens", "64", "--max-batch-size", "2")[::2])  # fmt: skip
    assert line.startswith(f"jaxarena: error: {path}: quantization_config quant_method='mxfp4'")


def test_help_states_the_reserve_default(capsys):
    for command in ("budget", "fit"):
        assert main([command, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "1 GiB + the XLA temp of the steps" in text and "5%" not in text


@pytest.mark.parametrize("name", ["h100", "h200", "hopper", "H100"])
def test_every_command_takes_the_gpu_names(capsys, name):
    assert Target.preset(name).name == "hopper"
    code, out, _ = run(capsys, "plan", "qwen3-8b", "--target", name)
    assert code == 0 and "target hopper" in out
    args = build_parser().parse_args(["step-report", "qwen3-8b", "--target", name])
    assert args.target == name.lower()


def test_plan_packed_prints_the_packed_offsets(capsys):
    code, out, _ = run(capsys, "plan", "qwen3-30b-a3b", "--packed", "--target", "gb10")
    config = ModelConfig.preset("qwen3-30b-a3b")
    sizes = BufferSizes.from_config(config, 8192, 32768, 16, 64, levers=Levers.from_env(),
                                    target=Target.preset("gb10"))  # fmt: skip
    packed = ArenaPlan.packed(sizes, Lifetimes.standard(config))
    assert packed.total_bytes < ArenaPlan.sequential(sizes).total_bytes
    for line in packed.describe().splitlines():
        assert line in out
    code, out, _ = run(capsys, "plan", "qwen3-30b-a3b", "--packed", "--json", "--target", "gb10")
    data = json.loads(out)
    assert data["total_bytes"] == data["packed_bytes"] == packed.total_bytes


def test_budget_header_counts_the_devices_and_fit_json_names_the_model(capsys):
    code, out, _ = run(capsys, "budget", "qwen3-30b-a3b", "--memory", "80GB", "--tp", "4",
                       "--ep", "4")  # fmt: skip
    assert "per device (tp=4, ep=4: 4 devices)" in out.splitlines()[0]
    code, out, _ = run(capsys, "fit", "qwen3-8b", "--memory", "80GB", "--json")
    assert json.loads(out)["model"] == "qwen3-8b"


def test_auto_target_without_a_gpu_says_so(capsys, monkeypatch):
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("jax has an accelerator here")
    code, out, err = run(capsys, "plan", "qwen3-8b", "--target", "auto")
    assert code == 0 and "target gb10" in out
    assert err.startswith("jaxarena: note: --target auto found no GPU (jax's default device is "
                          "cpu); sizing for gb10")  # fmt: skip


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("jaxarena ")
    assert main(["--version"]) == 0
