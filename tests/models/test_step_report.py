"""`jaxarena step-report` and `jaxarena.step_report` on the CPU target (issue 23 item 3): the
abstract model is the loaded one without its bytes, the CPU figures are those of the steps
`load_pretrained` compiles, the JSON schema, and the one-line errors. The GPU targets are in
tests/gpu/test_step_report_gpu.py."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from lm_runs import CHECKPOINTS, LIMITS

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target, gpu_aot
from jaxarena.cli import main
from jaxarena.step_report import STEP_KEYS, abstract_model, compile_step, format_report

LLAMA = CHECKPOINTS / "llama"


def _types(tree):
    return jax.tree.structure(tree), [(tuple(a.shape), np.dtype(a.dtype))
                                      for a in jax.tree.leaves(tree)]  # fmt: skip


def test_abstract_weights_are_the_loaded_ones_without_bytes(runs, tmp_path):
    loaded = runs.lm("llama")
    lm, params, caches = abstract_model(LLAMA, target="cpu", **LIMITS)
    # Same tree, shapes and dtypes as the weights load_pretrained placed (read from the
    # safetensors headers only: every leaf is a ShapeDtypeStruct).
    assert _types(params) == _types(loaded.params)
    assert all(isinstance(a, jax.ShapeDtypeStruct) for a in jax.tree.leaves(params))
    assert lm.plan.total_bytes == loaded.arena_bytes
    # The caches: the same per-block entries; only the KV page pool is smaller.
    (k_abs, k_real) = (caches["attention.000"]["k"], loaded.caches["attention.000"]["k"])
    assert k_abs.shape[1:] == k_real.shape[1:] and k_abs.shape[0] < k_real.shape[0]
    # config.json alone (no safetensors): the dtypes come from the config's torch_dtype.
    shutil.copy(LLAMA / "config.json", tmp_path / "config.json")
    _, from_config, _ = abstract_model(tmp_path / "config.json", target="cpu", **LIMITS)
    assert _types(from_config) == _types(params)
    # --weights fp8: every linear weight becomes float8 [out, in] with f32 128x128 block scales.
    _, fp8, _ = abstract_model(tmp_path, target="cpu", weights="fp8", **LIMITS)
    mlp = fp8["layers"][1]["w_up"]
    assert mlp["w"].dtype == np.dtype("float8_e4m3fn") and mlp["w"].shape == (128, 64)
    assert mlp["scale_inv"].shape == (1, 1) and fp8["embed"].dtype == params["embed"].dtype
    # Asked of a bf16 checkpoint, another format takes the config's shapes, not the headers.
    assert _types(abstract_model(LLAMA, target="cpu", weights="fp8", **LIMITS)[1]) == _types(fp8)


def test_cpu_figures_are_those_of_the_loaded_model(runs):
    loaded = runs.lm("llama")
    loaded.generate([[1, 2, 3]], 2)  # compiles (or reuses) prefill and decode
    lm, params, _ = abstract_model(str(LLAMA), target="cpu", **LIMITS)
    # With the loaded model's KV page pool (step_report's own pool is one sequence's pages:
    # on the CPU, prefill's KV scatter copies the pool, so its temp follows the pool's size).
    caches = jax.eval_shape(lambda: loaded.caches)
    for kind in ("prefill", "decode"):
        step = compile_step(lm, params, caches, kind, "cpu")
        # The same step on the same shapes: XLA's figures are the loaded model's.
        memory = loaded.step_memory(kind)
        assert (step["temp_bytes"], step["alias_bytes"], step["argument_bytes"]) == (
            memory["temp"], memory["alias"], memory["argument"]), kind  # fmt: skip
        assert step["launches"] is None and step["copies"] is None and step["spills"] is None
        assert step["compile_seconds"] > 0


@pytest.mark.parametrize(
    ("name", "kind"),
    [("qwen3_moe", "moe"), ("qwen3_moe_fp8", "moe"), ("nemotron_h_moe", "moe"),
     ("gpt_oss", "moe_gpt_oss"), ("qwen2", "attention")],
)  # fmt: skip
def test_moe_abstract_weights_are_the_loaded_ones(runs, name, kind):
    """MoE blocks build from shapes (stacked experts, fused gate/up, FP8 expert dicts, shared
    experts, latent projections, the sigmoid router's bias, gpt-oss's de-interleaved experts
    and biases), as do attention biases (qwen2): the tree, shapes and dtypes load_pretrained
    places, from the safetensors headers."""
    loaded = runs.lm(name)
    lm, params, _ = abstract_model(CHECKPOINTS / name, target="cpu", **LIMITS)
    assert kind in lm.arch.kinds
    assert _types(params) == _types(loaded.params)
    assert lm.plan.total_bytes == loaded.arena_bytes


def test_moe_step_report_on_cpu():
    """`step_report` runs a MoE model (the decode step of the qwen3_moe fixture)."""
    from jaxarena.step_report import step_report_details

    details = step_report_details(CHECKPOINTS / "qwen3_moe", target="cpu", steps=("decode",),
                                  max_batch_tokens=16, max_seq_len=32, kv_block_size=16,
                                  max_batch_size=2)  # fmt: skip
    r = details["report"]
    step = r["steps"]["decode"]
    assert step["batch"] == 2 and step["temp_bytes"] > 0 and step["launches"] is None
    # The arena and the caches are donated and written in place: both are aliased.
    assert step["alias_bytes"] >= r["arena_bytes"] + details["cache_bytes"]
    assert r["weight_bytes"] == sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(
        abstract_model(CHECKPOINTS / "qwen3_moe", target="cpu", max_batch_tokens=16,
                       max_seq_len=32, max_batch_size=2)[1]))  # fmt: skip


def test_json_schema_and_text(capsys, tmp_path):
    shutil.copy(LLAMA / "config.json", tmp_path / "config.json")
    limits = ["--max-batch-tokens", "32", "--max-seq-len", "32", "--kv-block-size", "16",
              "--max-batch-size", "2"]  # fmt: skip
    assert main(["step-report", str(tmp_path), "--target", "cpu", "--json", *limits]) == 0
    out, err = capsys.readouterr()
    r = json.loads(out)
    assert list(r) == ["target", "arena_bytes", "weight_bytes", "steps"]
    assert list(r["steps"]) == ["prefill", "decode"]
    assert list(r["steps"]["prefill"]) == ["tokens", *STEP_KEYS]
    assert list(r["steps"]["decode"]) == ["batch", *STEP_KEYS]
    assert (r["target"], r["steps"]["prefill"]["tokens"], r["steps"]["decode"]["batch"]) == (
        "cpu", 32, 2)  # fmt: skip
    cfg = ModelConfig.from_hf(tmp_path)
    sizes = BufferSizes.from_config(cfg, 32, 32, 16, 2, levers=Levers(),
                                    target=Target.preset("gb10"))  # fmt: skip
    assert r["arena_bytes"] == ArenaPlan.sequential(sizes, guard_bytes=64).total_bytes
    # Progress on stderr, one line per step; stdout is the JSON alone.
    assert err.splitlines() == ["compiling prefill for cpu ...", "compiling decode for cpu ..."]
    for step in r["steps"].values():
        # The arena and the caches are donated and written in place: both are aliased.
        assert step["alias_bytes"] > r["arena_bytes"] and step["temp_bytes"] > 0
        assert step["launches"] is None and step["spills"] is None
    params = abstract_model(tmp_path, target="cpu", max_batch_tokens=32, max_seq_len=32,
                            max_batch_size=2)[1]  # fmt: skip
    assert r["weight_bytes"] == sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
    # The text form of the same figures (format_report is what the command prints).
    details = {"report": r, "argument_bytes": {"prefill": 1, "decode": 1}, "cache_bytes": 0,
               "layers": 2, "model_type": "llama"}  # fmt: skip
    text = format_report(details, "tiny", {"max_batch_tokens": 32}).splitlines()
    assert text[0] == "tiny [llama] on cpu (this CPU, memory analysis only), max_batch_tokens=32"
    assert text[3].split()[:3] == ["prefill", "32", "tokens"] and text[4].split()[:3] == [
        "decode", "2", "seqs"]  # fmt: skip
    assert text[4].split()[-6:-2] == ["n/a"] * 4  # launches, copies, per layer, spills


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["tiny-hybrid", "--target", "v100"], "invalid choice: 'v100'"),
        (["gpt-oss-20b", "--target", "cpu"], "MXFP4 expert weights"),
        (["tiny-hybrid", "--target", "cpu", "--max-batch-tokens", "0"], "max_batch_tokens=0"),
        (["tiny-hybrid", "--target", "cpu", "--kv-block-size", "0"], "--kv-block-size 0 must be a power of two"),
        (["no-such-model", "--target", "cpu"], "no preset, config.json or checkpoint"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, needle):
    assert main(["step-report", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err and err.count("\n") == 1, err


def test_no_cuda_plugin_is_one_line(capsys, monkeypatch):
    def unavailable(target="h200"):
        raise gpu_aot.GpuUnavailable("the CUDA PJRT plugin is not installed (test)")

    monkeypatch.setattr(gpu_aot, "gpu_device", unavailable)
    argv = ["step-report", "tiny-hybrid", "--target", "b200", "--max-batch-tokens", "16",
            "--max-seq-len", "32", "--max-batch-size", "2"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["jaxarena: error: --target b200 needs a compile-only GPU: the CUDA PJRT "
                       "plugin is not installed (test)"]  # fmt: skip
