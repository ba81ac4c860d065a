"""Compiled cost of the LoRA path (`jaxarena.models.core.lora`) on a GPU target without a GPU:

    JAX_PLATFORMS=cpu python benchmarks/lora_costs.py [--target h200] [--layers 4]
        [--rank 16] [--slots 8] [--batch 8] [--tokens 2048]

Qwen3-0.6B widths (random weights: shapes only). For the decode step (`--batch` rows) and a
one-pass prefill (`--tokens`), compiles the step without LoRA tables and with them (every
attention q/k/v/o and MLP gate/up/down module, `--slots` slots of rank `--rank`; the slots are
data; the plan sized with `adapter_max_rank = --rank`, so the shrink stores into `lora_xa`)
and prints the launches (`launches_static`: both branches of every `lax.cond` once), the XLA
temp and the spills. Third, `plain`: the tables without
the slots argument, the form the engine runs for a batch that names no adapter
(`jaxarena.engine.runner`: `decode` beside `decode+lora`), which should cost what `base` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_step import QWEN3_0_6B, abstract_caches, abstract_params, build_model  # noqa: E402

from jaxarena import ArenaPlan, BufferSizes  # noqa: E402
from jaxarena.gpu_aot import compile_for_gpu  # noqa: E402
from jaxarena.gpu_dump import count_launches  # noqa: E402
from jaxarena.models.lora import lora_layout  # noqa: E402

S, I32, U8, BF16 = jax.ShapeDtypeStruct, jnp.int32, jnp.uint8, jnp.bfloat16


def _with_tables(m, params, rank: int, slots: int):
    prefixes = [f"layers.{i}" for i in range(len(m.arch.blocks))]
    layout = lora_layout(m.arch, m.config, prefixes, max_loras=slots, max_rank=rank)
    layers = list(params["layers"])
    for i, _, mods in layout.modules:
        layers[i] = {**layers[i], "lora": {
            mod: {"a": S((slots, rank, k), BF16), "b": S((slots, o, rank), BF16),
                  "scale": S((slots,), jnp.float32)} for mod, (k, o) in mods}}  # fmt: skip
    return {**params, "layers": layers}


def no_adapter_launches(thunks) -> tuple[int, list[str]]:
    """Launches of a step whose batch uses no adapter (every conditional's cheapest branch:
    the pass-through) and the kinds that branch runs."""
    total, seen = 0, []
    for t in thunks:
        if t.kind == "kConditional":
            counts = {k: count_launches(v) or 0 for k, v in t.sections.items()}
            low = min(counts, key=counts.get)
            total += counts[low] + 1  # + the predicate's readback, counted as one
            seen += [c.kind + ":" + c.name for c in t.sections[low]]
        else:
            total += count_launches([t]) or 0
    return total, sorted(set(seen))


def compile_step(*, mode: str, name: str, layers: int, rank: int, slots: int, batch: int,
                 tokens: int, target: str, dump_dir: str | bool = True):  # fmt: skip
    """One step (`mode`: "decode" or "prefill") compiled for `target`: `name` "base" (no LoRA
    tables, the plan without `lora_*`), "lora" (tables and slots, the plan sized with
    `adapter_max_rank = rank`, as `load_pretrained(max_lora_rank=)` does) or "plain" (tables
    without slots, on the LoRA plan: the engine's form for a batch that names no adapter).
    `dump_dir`: where XLA dumps (True: a temporary folder)."""
    raw = dict(QWEN3_0_6B, num_hidden_layers=layers)
    m = build_model(raw, max_batch_tokens=tokens, max_seq_len=tokens, max_batch_size=batch)
    m = dataclasses.replace(m, prefill_chunk=None)
    params = abstract_params(m)
    if name != "base":
        cfg = dataclasses.replace(m.config, adapter_max_rank=rank)
        sizes = BufferSizes.from_config(cfg, tokens, tokens, m.kv_block_size, batch,
                                        levers=m.levers, target=m.target)  # fmt: skip
        params = _with_tables(m, params, rank, slots)
        m = dataclasses.replace(m, config=cfg, plan=ArenaPlan.sequential(sizes))
    per = tokens // m.kv_block_size
    rows = batch if mode == "decode" else batch + 1
    caches = abstract_caches(m, num_blocks=rows * per, rows=rows)
    tables = S((rows, per), I32)
    v = S((batch,), I32)
    extra = (S((rows if mode == "prefill" else batch,), I32),) if name == "lora" else ()
    if mode == "decode":
        fn, args = m.decode_step, (v, v, tables, v, *extra)
    else:
        fn = m.prefill
        args = (S((tokens,), I32), S((rows + 1,), I32), tables)
        args = (*args, None, *extra) if extra else args
    return compile_for_gpu(fn, params, S(m.plan.arena_shape, U8), caches, *args, target=target,
                           donate_argnums=(1, 2), dump_dir=dump_dir, no_spills=False)  # fmt: skip


def costs(*, layers: int, rank: int, slots: int, batch: int, tokens: int, target: str):
    out = {}
    for mode in ("decode", "prefill"):
        for name in ("base", "lora", "plain"):
            c = compile_step(mode=mode, name=name, layers=layers, rank=rank, slots=slots,
                             batch=batch, tokens=tokens, target=target)  # fmt: skip
            out[(mode, name)] = c
            print(f"{mode:8s} {name:5s} launches {c.launches} (static {c.launches_static}) "
                  f"temp {c.temp_bytes / 2**20:8.2f} MiB  max spill {c.max_spill_bytes} B",
                  flush=True)  # fmt: skip
            conds = sum(t.kind == "kConditional" for t in c.thunks)
            if name == "lora" and conds:  # a LoRA path inside conditionals (none today)
                n, kinds = no_adapter_launches(c.thunks)
                print(f"         without adapters: ~{n} launches ({conds} conditionals, "
                      f"pass-through branches run {kinds})", flush=True)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h200")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2048)
    a = ap.parse_args()
    costs(layers=a.layers, rank=a.rank, slots=a.slots, batch=a.batch, tokens=a.tokens,
          target=a.target)  # fmt: skip


if __name__ == "__main__":
    main()
