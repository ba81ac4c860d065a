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
    mlp = fp8["layers"][1]["w_gate_up"]  # gate then up: 2 x 128 outputs
    assert mlp["w"].dtype == np.dtype("float8_e4m3fn") and mlp["w"].shape == (256, 64)
    assert mlp["scale_inv"].shape == (2, 1) and fp8["embed"].dtype == params["embed"].dtype
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
    assert list(r) == ["target", "tp", "ep", "arena_bytes", "weight_bytes", "steps"]
    assert (r["tp"], r["ep"]) == (1, 1)
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
        # issue 42: the mesh splits the experts over the tensor-parallel devices themselves
        (["qwen3-30b-a3b", "--target", "cpu", "--tp", "2", "--ep", "4"],
         "--tp 2 --ep 4: ep=4 must be 1 or equal to tp=2"),
        (["qwen3-30b-a3b", "--target", "cpu", "--tp", "0"], "tp=0 must be a positive int"),
        (["mamba2-2.7b", "--target", "cpu", "--tp", "3"], "mamba_num_heads=80 is not divisible"),
        (["qwen3-8b", "--target", "cpu", "--tp", "4096"], "tp=4096 on the cpu target needs 4096"),
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


# -- the step-time model (issue 39): costs from HLO text and thunks, no compile ---------------

_HLO = """HloModule m

%gemm_a_computation (p0: bf16[8,256], p1: bf16[256,512]) -> bf16[8,512] {
  %p0 = bf16[8,256]{1,0} parameter(0)
  %p1 = bf16[256,512]{1,0} parameter(1)
  ROOT %dot.1 = bf16[8,512]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%upd_computation (q0: bf16[100,512], q1: s32[], q2: bf16[1,512]) -> bf16[100,512] {
  %q0 = bf16[100,512]{1,0} parameter(0)
  %q2 = bf16[1,512]{1,0} parameter(2)
  %q1 = s32[] parameter(1)
  %c0 = s32[] constant(0)
  ROOT %dus = bf16[100,512]{1,0} dynamic-update-slice(%q0, %q2, %q1, %c0)
}

%row_computation (r0: bf16[100,512], r1: s32[]) -> bf16[1,512] {
  %r0 = bf16[100,512]{1,0} parameter(0)
  %r1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = bf16[1,512]{1,0} dynamic-slice(%r0, %r1, %z), dynamic_slice_sizes={1,512}
}

ENTRY %main (x: bf16[8,256], w: bf16[256,512], w2: bf16[512,128], cache: bf16[100,512], i: s32[]) -> bf16[8,128] {
  %x = bf16[8,256]{1,0} parameter(0)
  %w = bf16[256,512]{1,0} parameter(1)
  %w2 = bf16[512,128]{1,0} parameter(2)
  %cache = bf16[100,512]{1,0} parameter(3)
  %i = s32[] parameter(4)
  %gemm_a = bf16[8,512]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm_a_computation
  %cublas = (bf16[8,128]{1,0}, s8[4194304]{0}) custom-call(%gemm_a, %w2), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %row = bf16[1,512]{1,0} fusion(%cache, %i), kind=kLoop, calls=%row_computation
  %upd = bf16[100,512]{1,0} fusion(%cache, %i, %row), kind=kLoop, calls=%upd_computation
  ROOT %gte = bf16[8,128]{1,0} get-tuple-element(%cublas), index=0
}
"""  # fmt: skip


def _thunk(tid, kind, name="", **sections):
    from jaxarena.gpu_dump import Thunk

    return Thunk(tid, kind, name, sections=sections)


def test_known_gemms_move_their_operands_and_results():
    """A step of two GEMMs (a Triton GEMM fusion, a cuBLAS call) and a cache row read and
    written in place: bytes are the GEMMs' operands + results (the cuBLAS workspace left
    out), a slice's bytes for the sliced cache, the update's for the in-place write; flops
    2 * M * N * K; modeled time max(bytes / 4.8 TB/s, flops / bf16 peak) per kernel."""
    from jaxarena.step_cost import LAUNCH_SECONDS, gpu_spec, step_cost
    from pallas_kernels._cost import Workload

    thunks = [_thunk(1, "kCustomKernel", "gemm_a"), _thunk(2, "kGemm"),
              _thunk(3, "kCustomKernel", "row"), _thunk(4, "kCustomKernel", "upd")]  # fmt: skip
    names = {1: "gemm_a", 2: "cublas", 3: "row", 4: "upd"}
    spec = gpu_spec("h200")
    c = step_cost(_HLO, thunks, names, spec, Workload(1), graphs=False)
    by = {k.name: k for k in c.kernels}
    assert (by["gemm_a"].bytes, by["gemm_a"].flops) == (2 * (8 * 256 + 256 * 512 + 8 * 512),
                                                        2 * 8 * 512 * 256)  # fmt: skip
    assert (by["kGemm"].bytes, by["kGemm"].flops) == (2 * (8 * 512 + 512 * 128 + 8 * 128),
                                                      2 * 8 * 128 * 512)  # fmt: skip
    assert by["row"].bytes == 4 + 2 * 512 + 2 * 512  # index, the row read, the row written
    assert by["upd"].bytes == 4 + 2 * 512 + 2 * 512  # index, the update read and written
    assert c.bytes_moved == sum(k.bytes for k in by.values())
    want = sum(max(k.bytes / 4.8e12, k.flops / spec.peaks["bf16"]) for k in by.values())
    assert c.kernel_seconds == pytest.approx(want, rel=1e-12)
    # Four capturable thunks: a run shorter than 5, so four launches outside a graph.
    assert c.graph_segments == 4 and c.launch_seconds == pytest.approx(4 * LAUNCH_SECONDS)


def test_graph_segments_and_what_split_them():
    from jaxarena.step_cost import segments

    k = [_thunk(i, "kCustomKernel", f"k{i}") for i in range(1, 10)]
    loop = _thunk(20, "kWhile", condition=[_thunk(21, "kCustomKernel", "cond")],
                  body=[_thunk(30 + i, "kCustomKernel", f"b{i}") for i in range(6)])  # fmt: skip
    loop.trip_count = 3
    seq = [*k[:5], _thunk(10, "kMemset32BitValue"), k[5], k[6], loop]
    segs = segments(seq, {}, graphs=False)
    # 5 kernels: one graph, ended by the memset; the memset alone; 2 kernels: a run < 5,
    # launched one by one; the loop's condition 4 times, its 6-kernel body one graph x 3.
    assert sum(s.times for s in segs) == 1 + 1 + 2 + 4 + 3
    assert segs[0].thunks == 5 and segs[0].ended_by == "kMemset32BitValue"
    assert segs[-1].times == 3 and segs[-1].where == "body of kWhile" and segs[-1].thunks == 6
    # After XLA's thunk passes: each command buffer is one graph, whatever it holds.
    seq = [_thunk(0, "kCommandBuffer", **{"": k[:3]}), _thunk(10, "kMemset32BitValue"),
           _thunk(0, "kCommandBuffer", **{"": k[3:]})]  # fmt: skip
    segs = segments(seq, {}, graphs=True)
    assert [(s.thunks, s.ended_by) for s in segs] == [
        (3, "kMemset32BitValue"), (1, "kMemset32BitValue not captured"), (6, "end")]


def test_target_peaks_are_the_datasheets():
    """The peaks read from the device specs against NVIDIA's datasheets (dense): H200 989.4
    TFLOP/s BF16, 1,979 FP8; B200 2.25 PFLOP/s BF16, 4.5 FP8 (the spec's clock gives 1.1%
    less); bandwidths 4.8 and 7.67 TB/s as the specs say."""
    from jaxarena.step_cost import gpu_spec

    h, b = gpu_spec("h200"), gpu_spec("b200")
    assert (h.bandwidth, b.bandwidth) == (4.8e12, 7.67232e12)
    assert h.peaks["bf16"] == pytest.approx(989.4e12, rel=0.002)
    assert h.peaks["f8e4m3fn"] == pytest.approx(1979e12, rel=0.002)
    assert b.peaks["bf16"] == pytest.approx(2.25e15, rel=0.012)
    assert b.peaks["f8e4m3fn"] == pytest.approx(4.5e15, rel=0.012)


def test_splitk_declares_the_pages_it_reads():
    """The split-K kernel's declared cost, against a hand count: 2 sequences attending 40
    tokens read 3 of their 4 pages of 16, for K and V of each of 2 KV heads (one head block:
    the group of 2 fits one), the bf16 queries, the block table rows and lengths, and write
    2 splits' f32 partials `[o(64), m, l]` per query head; the combine reads those and writes
    the bf16 output. A cost off by 2x fails here."""
    import jax.numpy as jnp

    from pallas_kernels import _cost, splitk_decode_attention

    B, Hq, Hkv, D, bs, pages = 2, 4, 2, 64, 16, 4
    S = jax.ShapeDtypeStruct
    args = (S((B, Hq, D), jnp.bfloat16), S((B * pages, bs, Hkv, D), jnp.bfloat16),
            S((B * pages, bs, Hkv, D), jnp.bfloat16), S((B, pages), jnp.int32),
            S((B,), jnp.int32))  # fmt: skip
    jax.eval_shape(lambda *a: splitk_decode_attention(*a, num_splits=2, interpret=True), *args)
    got = {k[0]: fn(_cost.Workload(40)) for k, fn in _cost._REGISTRY.items()
           if k[1] in (B * Hkv * 2, B * Hkv) and fn is not None and k[2][:1] in (
               (("bf16", (B, Hq, D)),), (("u32", (B * Hq * 2, D + 2)),))}  # fmt: skip
    kv = B * Hkv * 3 * (bs * D * 2) * 2
    partials = B * Hq * 2 * (D + 2) * 4
    assert got["splitk_decode_attention"] == _cost.KernelCost(
        kv + B * Hq * D * 2 + B * (3 + 1) * 4 + partials, 2 * B * Hq * 40 * (D + D))
    assert got["splitk_combine"].bytes == partials + B * Hq * D * 2


def test_a_key_declared_twice_in_one_compile_is_ambiguous():
    """Two kernels of one compile with the same name, grid and operands but different costs
    are ambiguous (counted at the larger); in a later compile the latest declaration wins
    (the same shapes may stand for other runtime sizes, e.g. a grouped GEMM's rows)."""
    from pallas_kernels import _cost

    x = jax.ShapeDtypeStruct((3, 5), np.float32)
    key = _cost.hlo_signature("k_test", 6, [("f32", (3, 5))])
    small, big = _cost.KernelCost(10, 1), _cost.KernelCost(20, 2)
    _cost.new_session()
    _cost.declare_fixed("k_test", (2, 3), [x], bytes=10, flops=1)
    fn, ambiguous = _cost.declared_cost(key)
    assert (fn(_cost.Workload(1)), ambiguous) == (small, False)
    _cost.declare_fixed("k_test", (2, 3), [x], bytes=20, flops=2)
    fn, ambiguous = _cost.declared_cost(key)
    assert (fn(_cost.Workload(1)), ambiguous) == (big, True)
    _cost.new_session()
    _cost.declare_fixed("k_test", (6,), [x], bytes=10, flops=1)
    fn, ambiguous = _cost.declared_cost(key)
    assert (fn(_cost.Workload(1)), ambiguous) == (small, False)
