"""`ArenaLM(scan_layers=True)` (issue 23 item 5): runs of identical layers under one
`lax.scan`. The runs found (`layer_runs`), and scanned steps against the unrolled ones on the
fixture checkpoints (mixtral: MoE experts read in place, `Block.scan_in_place`): bit-identical
prefill logits, greedy tokens and decode logits, the arena and caches still aliased, decode
traced once; the FP8 experts' in-place read on one block. Compile time against the layer count
is a report, not a test: benchmarks/compile_layers.py."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, NEW_TOKENS

from jaxarena.models import load_pretrained
from jaxarena.models.scan_layers import layer_runs, sliced_after


def _check_cover(blocks, runs):
    """The runs cover `blocks` in order, and every repetition equals the run's first period."""
    i = 0
    for start, period, repeats in runs:
        assert start == i and period >= 1 and repeats >= 1
        first = blocks[start : start + period]
        for k in range(repeats):
            assert blocks[start + k * period : start + (k + 1) * period] == first
        i += period * repeats
    assert i == len(blocks)


@pytest.mark.parametrize(
    "blocks, expected",
    [
        (("a", "m") * 3, ((0, 2, 3),)),  # Qwen3 / Llama: [attention, mlp] x N
        (("M", "a", "m", "M"), ((0, 1, 1), (1, 1, 1), (2, 1, 1), (3, 1, 1))),  # no repeat
        (("a",) * 4 + ("b",), ((0, 1, 4), (4, 1, 1))),
        # Gemma 3's period (5 sliding + 1 global attention, each with its MLP) twice: the
        # 12-block period covers 24 blocks, the 2-block one only the first 10.
        (((("s", "m") * 5 + ("g", "m")) * 2), ((0, 12, 2),)),
        (("x", "a", "m", "a", "m", "y"), ((0, 1, 1), (1, 2, 2), (5, 1, 1))),
    ],
)
def test_layer_runs(blocks, expected):
    runs = layer_runs(blocks)
    _check_cover(blocks, runs)
    assert runs == expected


@pytest.mark.parametrize("name", ["qwen3", "mamba2", "mixtral"])
def test_scanned_steps_equal_unrolled(runs, name):
    """Bit-identical to the unrolled model. Each repetition runs the same block code on the
    same values in the same order (the scan changes only where the layer's weights and cache
    come from), every block output is rounded to bf16 as before, and XLA's CPU backend fuses
    within a layer, not across the loop boundary into arithmetic that reassociates: so no
    tolerance is needed, and any difference is a bug (a wrong layer's weights or pages)."""
    r = runs.run(name)
    base = runs.lm(name)
    lm = load_pretrained(
        CHECKPOINTS / name, **LIMITS, scan_layers=True, compiler_options=FAST_CPU_COMPILE
    )  # as the unrolled runs
    repeated = [run for run in lm.model.layer_runs if run[2] > 1]
    assert repeated, "the fixture must have a repeated run to test the scan"
    # The scanned layout: one cache entry per block of each run's first repetition.
    assert len(lm.caches) < len(base.caches)
    for p, want in zip(r["ref"]["prompts"], r["prefill"], strict=True):
        np.testing.assert_array_equal(lm.prefill_logits(p), want)
    tokens, logits = lm.generate(r["ref"]["prompts"], NEW_TOKENS, return_logits=True)
    np.testing.assert_array_equal(np.asarray(tokens), r["tokens"])
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(r["logits"]))
    # The scanned caches unstack to the per-block shapes.
    for key, c in lm.model.unstack_caches(lm.caches).items():
        for a, b in zip(jax.tree.leaves(c), jax.tree.leaves(base.caches[key]), strict=True):
            assert a.shape == b.shape
    # In place: the arena and every cache byte aliased; one decode trace for all steps.
    mem, base_mem = lm.step_memory("decode"), base.step_memory("decode")
    assert mem["alias"] >= lm.arena_bytes + lm.cache_bytes
    assert lm.cache_bytes == base.cache_bytes
    assert lm.decode_counter.count == 1
    assert lm.arena.unsafe_buffer_pointer() == lm.arena_pointer
    assert mem["alias"] == base_mem["alias"]
    # The temp the scan adds: inside the loop a repetition's weights are sliced out of the
    # stacked parameters, a copy (XLA slices no loop operand in place), and on CPU widened to
    # f32 for the dot: at most one period's weights at 2 + 4 bytes per element. Nothing of the
    # arena's size (the carry copied instead of updated in place would be). A block's
    # `scan_in_place` weights (the MoE experts) are read in place, never sliced, so they do not
    # count (mixtral: the experts are 79% of a period's elements).
    period = max(lm.model.layer_runs, key=lambda run: run[2])
    start, n, repeats = period
    group = lm.params["layers"][lm.model.layer_runs.index(period)]
    blocks = lm.model.arch.blocks[start : start + n]
    sliced = [{key: v for key, v in p.items() if key not in b.scan_in_place}
              for b, p in zip(blocks, group, strict=True)]  # fmt: skip
    period_elements = sum(x.size // repeats for x in jax.tree.leaves(sliced))
    extra = 6 * period_elements
    assert extra < lm.arena_bytes
    # The Pallas interpreter (these CPU runs) copies the operands a kernel writes in place:
    # the fused decode write (`pallas_kernels.qk_rope_kv_write`) aliases the run's stacked K/V
    # caches, one layer's pages unrolled but every repetition's scanned, so the scanned step
    # holds copies of them (mixtral: 186,192 B more than the unrolled step, its caches
    # 81,920 B). Compiled for a GPU the kernel writes them in place and the scanned temp stays
    # within one block's weights (tests/gpu/test_scan_layers_gpu.py); here at most two copies
    # of the caches are allowed beside the sliced weights.
    extra += 2 * lm.cache_bytes
    assert mem["temp"] <= base_mem["temp"] + extra


def test_fp8_moe_reads_its_layers_experts_in_place(runs):
    """The block-FP8 experts under the scan (the FP8 grouped GEMM in `moe_fp8_scratch`, with
    `group_offset`). No FP8 fixture repeats a layer, so the qwen3_moe_fp8 MoE block runs on its
    parameters stacked after another layer's (its experts with every scale doubled), as
    `sliced_after` hands them to repetition `k`: repetition 1 must equal the block on its own
    parameters bit for bit (the same kernel, tiles and sums; only where the weights come from
    changed), repetition 0 must not (it reads the other layer's scales)."""
    lm = runs.lm("qwen3_moe_fp8")
    env = lm.model.env
    j = next(i for i, b in enumerate(lm.model.arch.blocks) if b.kind == "moe")
    block, p = lm.model.arch.blocks[j], lm.params["layers"][j]
    assert "scale_inv" in p["w_down"], "the fixture's experts must be block-FP8"
    other = {**p, **{key: {**p[key], "scale_inv": p[key]["scale_inv"] * 2}
                     for key in block.scan_in_place if key in p}}  # fmt: skip
    stacked = jax.tree.map(lambda a, b: jax.numpy.stack([a, b]), other, p)
    t = 4
    rng = np.random.default_rng(0)
    x = jax.numpy.asarray(rng.standard_normal((t, env.config.hidden_size)), jax.numpy.bfloat16)
    x = x.astype(jax.numpy.float32)

    @jax.jit
    def scanned(arena, k):
        q, _ = sliced_after(stacked, k, x, first=True, in_place=block.scan_in_place)
        return block._forward(env, q, arena, x, t)[1]

    direct = jax.jit(lambda arena: block._forward(env, p, arena, x, t)[1])(lm.arena)
    np.testing.assert_array_equal(np.asarray(scanned(lm.arena, 1)), np.asarray(direct))
    assert not np.array_equal(np.asarray(scanned(lm.arena, 0)), np.asarray(direct))
