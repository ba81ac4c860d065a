"""Runs of identical layers, for `ArenaLM(scan_layers=True)`: one `lax.scan` per run.

Compiling a step costs time linear in its blocks when every block is unrolled (issue 23 item
5). A model is mostly a few block patterns repeated: Qwen3 is `[attention, mlp] x N`, Gemma 3
`[5 sliding, 1 global attention + mlps]` repeated, a hybrid its period. `layer_runs` splits
`Arch.blocks` into runs `(start, period, repeats)`: blocks `start + k * period + j` for
`k < repeats` are equal (same class and options) to block `start + j`. A run of `repeats > 1`
runs as one `lax.scan` over its repetitions, so XLA compiles its period once.

The scanned layout of the parameters and caches (what the steps of a scanning `ArenaLM` take):

- `params["layers"]`: one entry per run, a list of `period` parameter dicts; in a run of
  `repeats > 1` every leaf gains a leading axis of `repeats` (repetition `k` at index `k`).
  `stack_params` builds it on the host (numpy), before the one host -> device copy, so the
  device never holds both layouts. Inside the scan a block gets repetition `k`'s slice of
  each leaf (`sliced_after`), except its `Block.scan_in_place` keys (the MoE experts): those
  come whole, `[repeats * E, ...]`, and the block reads its `E` entries at `k * E` in place.
- caches: one entry per block of a run's first repetition, under that block's
  `Arch.cache_keys` key. A block with a paged cache (`Block.paged_kv`: pages indexed through
  `StepContext.block_tables`) gets the pages of all repetitions back to back along the page
  axis (`[repeats * num_blocks, ...]`); repetition `k` sees `block_tables + k * num_blocks`,
  so the block reads and writes its own pages of the one buffer in place, unchanged. Other
  caches gain a leading axis of `repeats`, sliced and written back per repetition.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxarena.models.blocks.base import SCAN_INDEX, Block

__all__ = [
    "MAX_PERIOD",
    "layer_runs",
    "sliced_after",
    "stack_caches",
    "stack_params",
    "unstack_caches",
]

# The longest repeating pattern looked for (Gemma 3's period is 12 blocks: 6 attention layers,
# each followed by its MLP).
MAX_PERIOD = 16


def layer_runs(blocks: tuple[Block, ...],
               max_period: int = MAX_PERIOD) -> tuple[tuple[int, int, int], ...]:  # fmt: skip
    """Splits `blocks` into runs `(start, period, repeats)` covering them in order.

    Greedy from the first block: at each start, the period (up to `max_period`) whose
    repetitions cover the most blocks (the shortest on a tie); a block that starts no repeated
    pattern is a run `(start, 1, 1)`.
    """
    runs, i, n = [], 0, len(blocks)
    while i < n:
        period, repeats = 1, 1
        for p in range(1, min(max_period, (n - i) // 2) + 1):
            r = 1
            while i + (r + 1) * p <= n and blocks[i + r * p : i + (r + 1) * p] == blocks[i : i + p]:
                r += 1
            if r > 1 and p * r > period * repeats:
                period, repeats = p, r
        runs.append((i, period, repeats))
        i += period * repeats
    return tuple(runs)


def _stack(leaves: list[Any]) -> Any:
    """Stacks equal-shaped leaves on a new leading axis: on the host (numpy) for arrays,
    abstractly for `jax.ShapeDtypeStruct`s."""
    first = leaves[0]
    if isinstance(first, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((len(leaves), *first.shape), first.dtype)
    return np.stack([np.asarray(x) for x in leaves])


def _check_same(trees: list[Any], what: str) -> None:
    shapes = [jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), t) for t in trees]
    for k, s in enumerate(shapes[1:], 1):
        if s != shapes[0]:
            raise ValueError(f"{what}: repetition {k} has parameters {s}, the first {shapes[0]}; "
                             "equal blocks must have equal parameter shapes to be scanned")  # fmt: skip


def stack_params(runs: tuple[tuple[int, int, int], ...], params: dict[str, Any]) -> dict[str, Any]:
    """`params` (one dict per block in `params["layers"]`) in the scanned layout of `runs`
    (module docstring). Arrays are stacked with numpy: pass host arrays (as the checkpoint
    reader returns them) and copy the result to the device once.

    Raises:
      ValueError: the parameters of one run's repetitions differ in structure or shape.
    """
    layers = params["layers"]
    out = []
    for start, period, repeats in runs:
        group = []
        for j in range(period):
            reps = [layers[start + k * period + j] for k in range(repeats)]
            if repeats > 1:
                _check_same(reps, f"layer {start + j}")
                group.append(jax.tree.map(lambda *xs: _stack(list(xs)), *reps))
            else:
                group.append(reps[0])
        out.append(group)
    return {**params, "layers": out}


def sliced_after(stack: Any, k: Any, h: Any, *, first: bool = False,
                 in_place: tuple[str, ...] = ()) -> tuple[Any, Any]:  # fmt: skip
    """Repetition `k`'s parameters of one block (`stack`: its stacked parameter tree), sliced
    once `h` (the residual stream entering the block) exists: `(params, h)`.

    XLA's GPU GEMM fusions cannot read a dynamic slice of the stacked weight in place (its
    Triton GEMM fusion pass declines dynamic-slice operands), so every slice is a copy into a
    temporary. Left alone, XLA schedules all of a repetition's copies at the top of the loop
    body and one repetition's weights are live at once (Qwen3-0.6B widths: 30 MiB of decode
    temp). An `optimization_barrier` joining the stack to `h` makes a block's copies wait for
    the block before it, whose copies are then dead: the temp holds one block's weights (the
    MLP's 18 MiB), and XLA merges a block's slices into fewer copy kernels (decode b=8 at 8
    layers: 312 -> 216 launches as `gpu_aot` counts them, 240 -> 216 counting each
    dynamic-slice memcpy once; benchmarks/compile_layers.py). The barrier is the identity on
    values: the results are those of the plain slice. `first`: the period's first block,
    which waits for nothing (the loop body starts there).

    `in_place`: the block's `Block.scan_in_place` keys, not sliced: each of their leaves
    `[R, E, ...]` comes whole as `[R * E, ...]` (a reshape XLA makes a bitcast) and
    `params[SCAN_INDEX]` is `k`, so the block reads repetition `k`'s entries at `k * E` in
    place (the MoE block's experts through the grouped GEMM's `group_offset`: at
    Qwen3-30B-A3B widths a layer's experts are 1.1 GiB, which the slice would copy per layer
    per step).
    """
    if not first:
        stack, h = lax.optimization_barrier((stack, h))
    keep = {key: stack[key] for key in in_place if key in stack}
    rest = {key: v for key, v in stack.items() if key not in keep}
    p = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, k, 0, False), rest)
    if keep:
        merged = jax.tree.map(lambda a: a.reshape(a.shape[0] * a.shape[1], *a.shape[2:]), keep)
        p = {**p, **merged, SCAN_INDEX: k}
    return p, h


def _join_pages(leaves: list[Any]) -> Any:
    first = leaves[0]
    if isinstance(first, jax.ShapeDtypeStruct):
        shape = (len(leaves) * first.shape[0], *first.shape[1:])
        return jax.ShapeDtypeStruct(shape, first.dtype)
    return jnp.concatenate(leaves)


def _stack_cache(leaves: list[Any]) -> Any:
    first = leaves[0]
    if isinstance(first, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((len(leaves), *first.shape), first.dtype)
    return jnp.stack(leaves)


def stack_caches(runs: tuple[tuple[int, int, int], ...], blocks: tuple[Block, ...],
                 keys: tuple[str, ...], caches: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Per-block `caches` (`{cache key: cache}`) in the scanned layout of `runs` (module
    docstring); arrays or `jax.ShapeDtypeStruct`s."""
    out = {}
    for start, period, repeats in runs:
        for j in range(period):
            reps = [caches[keys[start + k * period + j]] for k in range(repeats)]
            block = blocks[start + j]
            if repeats == 1 or reps[0] is None:
                out[keys[start + j]] = reps[0]
            elif block.paged_kv:
                out[keys[start + j]] = jax.tree.map(lambda *xs: _join_pages(list(xs)), *reps)
            else:
                out[keys[start + j]] = jax.tree.map(lambda *xs: _stack_cache(list(xs)), *reps)
    return out


def _pages_of(a: Any, k: int, repeats: int) -> Any:
    """Repetition `k`'s pages of a joined paged cache leaf."""
    n = a.shape[0] // repeats
    return a[k * n : (k + 1) * n]


def unstack_caches(runs: tuple[tuple[int, int, int], ...], blocks: tuple[Block, ...],
                   keys: tuple[str, ...], caches: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The inverse of `stack_caches`: scanned caches back to one entry per block."""
    out = {}
    for start, period, repeats in runs:
        for j in range(period):
            c, block = caches[keys[start + j]], blocks[start + j]
            for k in range(repeats):
                key = keys[start + k * period + j]
                if repeats == 1 or c is None:
                    out[key] = c
                elif block.paged_kv:
                    out[key] = jax.tree.map(lambda a, k=k, r=repeats: _pages_of(a, k, r), c)
                else:
                    out[key] = jax.tree.map(lambda a, k=k: a[k], c)
    return out
