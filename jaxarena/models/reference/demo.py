"""`jaxarena demo`: prefill and a greedy decode loop of the reference hybrid model on one
fixed arena, with a progress bar and the figures that matter."""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ModelConfig
from jaxarena._units import format_bytes
from jaxarena.models.reference.hybrid import (
    HybridModel,
    default_block_tables,
    init_caches,
    init_params,
)
from jaxarena.testing import count_traces, memory_footprint

__all__ = ["run_demo"]

DEMO_PRESET = "tiny-hybrid"


def _bar(done: int, total: int, width: int = 32) -> str:
    filled = round(width * done / total)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def run_demo(*, steps: int = 32, batch: int = 4, seed: int = 0, out=None) -> int:
    """Runs the demo; prints to `out` (default: the current `sys.stdout`); returns 0."""
    out = sys.stdout if out is None else out
    if steps < 1 or batch < 1:
        raise ValueError(f"steps={steps} and batch={batch} must be >= 1")
    cfg = ModelConfig.preset(DEMO_PRESET)
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 17, batch)
    block = 16
    max_seq = int(-(-(lens.max() + steps) // block) * block)
    blocks_per_seq = max_seq // block
    model = HybridModel.create(cfg, max_batch_tokens=max(int(lens.sum()), 16),
                               max_seq_len=max_seq, kv_block_size=block,
                               max_batch_size=batch, guard_bytes=64)  # fmt: skip
    params = init_params(cfg, seed)
    prompts = [rng.integers(0, cfg.vocab_size, n).astype(np.int32) for n in lens]
    tables = jnp.asarray(default_block_tables(batch, blocks_per_seq, seed))
    caches = init_caches(cfg, num_blocks=batch * blocks_per_seq, block_size=block,
                         max_batch_size=batch)  # fmt: skip
    print(f"model {DEMO_PRESET}: layers {', '.join(cfg.layer_types)}; backend "
          f"{jax.default_backend()}; arena {format_bytes(model.plan.total_bytes)} in "
          f"{len(model.plan.regions)} regions", file=out)  # fmt: skip
    prefill = jax.jit(model.prefill, donate_argnums=(1, 2))
    counter = count_traces(model.decode_step)
    decode = jax.jit(counter, donate_argnums=(1, 2))

    arena = model.plan.allocate()
    pointer = arena.unsafe_buffer_pointer()
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    t0 = time.perf_counter()
    arena, caches, logits = prefill(params, arena, caches, jnp.asarray(np.concatenate(prompts)),
                                    cu, tables)  # fmt: skip
    tokens = jnp.argmax(logits, -1).astype(jnp.int32)
    jax.block_until_ready(tokens)
    t_prefill = time.perf_counter() - t0
    positions = jnp.asarray(lens, jnp.int32)
    generated = [np.asarray(tokens)]
    moved = 0
    t_first = t_rest = 0.0
    isatty = getattr(sys.stderr, "isatty", None)
    bar = bool(isatty and isatty())
    for step in range(steps):
        t0 = time.perf_counter()
        arena, caches, logits, tokens = decode(params, arena, caches, tokens, positions, tables,
                                               positions + 1)  # fmt: skip
        jax.block_until_ready(tokens)
        dt = time.perf_counter() - t0
        if step == 0:
            t_first = dt
        else:
            t_rest += dt
        positions = positions + 1
        moved += arena.unsafe_buffer_pointer() != pointer
        generated.append(np.asarray(tokens))
        if bar:  # a terminal only: a log file would get every redraw
            print(f"\rdecode {_bar(step + 1, steps)}", end="", file=sys.stderr, flush=True)
    if bar:
        print(file=sys.stderr)
    fp = memory_footprint(decode, params, arena, caches, tokens, positions, tables, positions + 1)
    rate = batch * (steps - 1) / t_rest if steps > 1 else float("nan")
    print(f"prefill: {int(lens.sum())} tokens in {t_prefill:.2f} s (compile included)", file=out)
    print(f"decode: {steps} steps x {batch} sequences; first step {t_first:.2f} s (compile); "
          f"then {rate:.1f} tokens/s", file=out)  # fmt: skip
    print(f"decode_step compiled: arguments {format_bytes(fp.argument_bytes)}, aliased "
          f"{format_bytes(fp.alias_bytes)}, temp {format_bytes(fp.temp_bytes)}; traced "
          f"{counter.count}x", file=out)  # fmt: skip
    print(f"arena buffer moved in {moved} of {steps} steps; guards broken: "
          f"{model.plan.check_guards(arena) or 'none'}", file=out)  # fmt: skip
    for b in range(batch):
        seq = " ".join(str(int(g[b])) for g in generated[:12])
        print(f"  seq {b} (prompt {lens[b]:2d} tokens): {seq} ...", file=out)
    return 0
