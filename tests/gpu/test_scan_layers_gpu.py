"""`ArenaLM(scan_layers=True)` compiled for an H200 without a GPU, at the tiny Qwen3 widths of
test_step_rule_gpu.py (2 layers: one run of [attention, mlp] x 2 under one `lax.scan`).

XLA's GPU GEMM fusions cannot read a dynamic slice of a stacked weight in place, so each
repetition's weights are copied into temporaries before their GEMMs. `scan_layers.sliced_after`
makes a block's copies wait for the block before it, so only one block's weights are live at a
time: the scanned decode step needs at most the unrolled step's temp plus the largest block's
parameters. Without it XLA hoists all of a repetition's copies to the top of the loop body and
the temp holds the whole repetition (measured: 1,194,648 B against a bound of 943,376 B; with
it 808,856 B). The real widths are benchmarks/compile_layers.py's.

The MoE block's experts (`MoE.scan_in_place`) are not sliced at all: the grouped GEMMs read
the layer's experts of the stacked `[R * E, ...]` weights in place (`group_offset`), so the
bound counts only a block's other parameters. At TINY_MOE widths one layer's experts are
1.5 MiB, several times that bound: measured 409,752 B of scanned decode temp against a bound
of 433,176 B (unrolled 39,192 B); with the experts sliced as before, 1,601,432 B. At
Qwen3-30B-A3B widths (8 layers, benchmarks/compile_layers.py): 768.3 -> 36.1 MiB (the rest is
the attention block's sliced wqkv and wo).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxarena import gpu_aot

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_step_rule_gpu import BATCH, MAX_SEQ, TINY, TINY_MOE, S  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from plain_step import abstract_caches, abstract_params, build_model  # noqa: E402


def _nbytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _decode(config, scan: bool):
    m = build_model(config, max_batch_tokens=MAX_SEQ, max_seq_len=MAX_SEQ, max_batch_size=BATCH)
    m = dataclasses.replace(m, scan_layers=scan)
    params = abstract_params(m)
    # What a block slices per repetition: its parameters but the ones read in place.
    block_bytes = max(_nbytes({k: v for k, v in p.items() if k not in b.scan_in_place})
                      for b, p in zip(m.arch.blocks, params["layers"], strict=True))  # fmt: skip
    if scan:
        params = m.stack_params(params)
    per = MAX_SEQ // m.kv_block_size
    caches = abstract_caches(m, num_blocks=BATCH * per, rows=BATCH)
    v, tables = S((BATCH,), jnp.int32), S((BATCH, per), jnp.int32)
    arena = S(m.plan.arena_shape, jnp.uint8)
    # No dump: the memory analysis is all this test reads (the dump's ptxas pass costs seconds).
    c = gpu_aot.compile_for_gpu(m.decode_step, params, arena, caches, v, v, tables, v,
                                target="h200", donate_argnums=(1, 2))  # fmt: skip
    return m, c, block_bytes


@pytest.mark.parametrize("config", [TINY, TINY_MOE], ids=["qwen3", "qwen3_moe"])
def test_scanned_decode_holds_one_blocks_weights(config):
    try:
        gpu_aot.gpu_device("h200")
    except gpu_aot.GpuUnavailable as e:
        pytest.skip(f"no compile-only h200 here: {e.reason}")
    m, scanned, block_bytes = _decode(config, True)
    assert [run for run in m.layer_runs if run[2] > 1], m.layer_runs  # it does scan
    _, unrolled, _ = _decode(config, False)
    assert scanned.temp_bytes <= unrolled.temp_bytes + block_bytes, (
        scanned.temp_bytes, unrolled.temp_bytes, block_bytes)  # fmt: skip
    # The arena and the caches are still updated in place.
    assert scanned.alias_bytes >= m.plan.total_bytes
