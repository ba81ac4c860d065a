"""The MoE models' decode step compiled for an H200 without a GPU (jaxarena.gpu_aot): the
grouped GEMMs (bf16, and FP8 through `moe_fp8_scratch`) lower inside the whole step with no
register spills.

Measured before the MoE block followed the step rule (qwen3_moe fixture, batch 4, H200): the
whole decode step 247 launches, temp 7,184 B; one MoE layer on the arena 52 launches against
20 for the same kernels without the arena (router, sort, two grouped GEMMs, combine), the
extra ones the arena stores and re-reads of the router input, logits and expert
intermediates. Under the step rule the arena step launches what the plain one does (within
1.15x: tests/gpu/test_step_rule_gpu.py; figures at real widths in jaxarena/models/README.md).
gpt_oss fixture (2 attention + 2 gpt-oss MoE layers, batch 4): 130 launches, temp 11,032 B,
against 129 for the mixtral fixture of the same layout: its biases, clamps and sinks fuse.
deepseek_v3 fixture (MLA layer + dense MLP, MLA layer + routed MoE with a shared expert), batch
4: 168 launches, temp 11,544 B, no spills (deepseek_v2, not compiled here: 151, 10,512 B).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

gpu_aot = pytest.importorskip("jaxarena.gpu_aot")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
from lm_runs import CHECKPOINTS, LIMITS  # noqa: E402

from jaxarena.models import load_pretrained  # noqa: E402


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


@pytest.mark.parametrize(
    ("name", "kernels"),
    [
        ("qwen3_moe", {"grouped_gemm"}),
        ("qwen3_moe_fp8", {"grouped_gemm_fp8_arena", "fp8_block_quant_inplace"}),
        ("gpt_oss", {"grouped_gemm"}),  # sinks and a sliding window in split-K too
        ("deepseek_v3", {"grouped_gemm", "splitk_decode_attention"}),  # MLA, a routed layer
    ],
)
def test_moe_decode_step_compiles_for_h200_without_spills(name, kernels):
    try:
        gpu_aot.gpu_device("h200")
    except gpu_aot.GpuUnavailable as e:
        pytest.skip(f"no compile-only h200 can be made here: {e.reason}")
    lm = load_pretrained(CHECKPOINTS / name, **LIMITS)
    model = dataclasses.replace(lm.model, interpret=False)
    b = 4
    i32 = jax.ShapeDtypeStruct((b,), jnp.int32)
    tables = jax.ShapeDtypeStruct((b, lm.block_tables.shape[1]), jnp.int32)
    r = gpu_aot.compile_for_gpu(
        model.decode_step, _abstract(lm.params), _abstract(lm.arena), _abstract(lm.caches),
        i32, i32, tables, i32, target="h200", no_spills=True, dump_dir=True,
    )  # fmt: skip
    names = {k.name for k in r.pallas_kernels}
    assert kernels <= names, names
    assert r.max_spill_bytes == 0
    assert r.temp_bytes < lm.arena_bytes, r.temp_bytes  # no copy of the arena
