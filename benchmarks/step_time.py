"""The modeled decode step beside the measured one (issue 39: calibrate the step-time model).

    python benchmarks/step_time.py [--model qwen3-8b] [--layers 4] [--batch 1 8 64]
        [--context 1024] [--target h200]

On a GPU, for each batch: the model's decode step (random weights, every sequence at
`--context` tokens) is compiled on the device with an XLA dump, modeled from that dump
(`jaxarena.step_model.compiled_cost`: per kernel max(bytes / bandwidth, flops / peak) + 4 us
per graph segment) with the `--target` spec's peaks, at the spec's bandwidth and at this
device's measured copy bandwidth, and timed (median of the donated step run in a loop). The
spec is an H200's or a B200's: on another GPU (an H100) compare the column at the measured
bandwidth. Without a GPU (JAX_PLATFORMS=cpu) only the deviceless model is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_seconds  # noqa: E402

from jaxarena import gpu_aot  # noqa: E402
from jaxarena.step_cost import gpu_spec  # noqa: E402
from jaxarena.step_model import compiled_cost  # noqa: E402
from jaxarena.step_report import abstract_model, step_args  # noqa: E402


def _config(model: str, layers: int | None, folder: Path) -> str:
    if layers is None:
        return model
    raw = json.loads((resources.files("jaxarena") / "presets" / f"{model}.json").read_text())
    raw["num_hidden_layers"] = layers
    for key in ("layer_types", "hybrid_override_pattern"):
        if isinstance(raw.get(key), list | str):
            raw[key] = raw[key][:layers]
    (folder / "config.json").write_text(json.dumps(raw))
    return str(folder)


def _concrete(tree, key):
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    out = [(0.02 * jax.random.normal(k, s.shape, jnp.float32)).astype(s.dtype)
           if jnp.issubdtype(s.dtype, jnp.floating) else jnp.zeros(s.shape, s.dtype)
           for k, s in zip(keys, leaves, strict=True)]  # fmt: skip
    return jax.tree.unflatten(treedef, out)


def _real_compile(step, args):
    where = tempfile.mkdtemp(prefix="jaxarena_step_time_")
    try:
        options = {"xla_dump_to": where, "xla_dump_emitter_re": "ptx"}
        compiled = step.lower(*args).compile(compiler_options=options)
        res = gpu_aot.GpuCompiled(compiled=compiled, target="", temp_bytes=0, argument_bytes=0,
                                  output_bytes=0, alias_bytes=0, hlo_text=compiled.as_text(),
                                  compile_seconds=0.0)  # fmt: skip
        try:
            gpu_aot.analyze_dump(res, where)
        except Exception as e:  # noqa: BLE001 - no ptxas: the thunks are read all the same
            print(f"  (dump analysis: {type(e).__name__}: {str(e)[:200]})")
        return compiled, res
    finally:
        shutil.rmtree(where, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--layers", type=int, default=4, help="cut the model (0: all its layers)")
    p.add_argument("--batch", nargs="+", type=int, default=[1, 8, 64])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--target", default="h200", help="the spec the model reads (h200, b200)")
    p.add_argument("--min-seconds", type=float, default=0.5)
    args = p.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    spec = gpu_spec(args.target)
    copy_bw = None
    if on_gpu:
        from gpu_bandwidth import copy_bandwidth

        copy_bw = copy_bandwidth(1 << 30, 0.3)
        print(f"{jax.devices()[0].device_kind}: copy bandwidth {copy_bw / 1e12:.2f} TB/s "
              f"(spec {args.target}: {spec.bandwidth / 1e12:.2f} TB/s)")  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="jaxarena_step_time_cfg_"))
    model = _config(args.model, args.layers or None, folder)
    print("batch  launches  segments  bytes moved  modeled(spec) ms  modeled(copy bw) ms  "
          "measured ms")  # fmt: skip
    for b in args.batch:
        lm, params, caches = abstract_model(model, target=args.target, max_batch_size=b,
                                            max_seq_len=max(2048, 2 * args.context),
                                            max_batch_tokens=512)  # fmt: skip
        fn, extra = step_args(lm, "decode")
        step = jax.jit(fn, donate_argnums=(1, 2))
        per_seq = extra[2].shape[1]
        if not on_gpu:
            arena = jax.ShapeDtypeStruct(lm.plan.arena_shape, jnp.uint8)
            res = gpu_aot.compile_for_gpu(step, params, arena, caches, *extra,
                                          target=args.target, no_spills=False, dump_dir=True)  # fmt: skip
            cost = compiled_cost(res, args.context)
            print(f"{b:5d}  {res.launches:8d}  {cost.graph_segments:8d}  "
                  f"{cost.bytes_moved / 2**20:9.1f} MiB  {cost.modeled_seconds * 1e3:16.3f}  "
                  f"{'n/a':>19s}  {'n/a':>11s}")  # fmt: skip
            continue
        pages = -(-args.context // lm.kv_block_size) + 1
        caches = lm.init_caches(num_blocks=b * pages, rows=b + 1)
        params = _concrete(params, jax.random.key(0))
        arena = jnp.zeros(lm.plan.arena_shape, jnp.uint8)
        tables = np.zeros((b, per_seq), np.int32)
        tables[:, :pages] = np.arange(b * pages, dtype=np.int32).reshape(b, pages)
        pos = jnp.full((b,), args.context - 1, jnp.int32)
        call = (jnp.zeros((b,), jnp.int32), pos, jnp.asarray(tables), pos + 1)
        compiled, res = _real_compile(step, (params, arena, caches, *call))
        res = dataclasses.replace(res, target=args.target)
        cost = compiled_cost(res, args.context)
        at_copy = compiled_cost(res, args.context,
                                dataclasses.replace(spec, bandwidth=copy_bw)).modeled_seconds
        state = {"arena": arena, "caches": caches}

        def run(state=state, compiled=compiled, params=params, call=call):
            state["arena"], state["caches"], _, tok = compiled(params, state["arena"],
                                                               state["caches"], *call)  # fmt: skip
            return tok

        measured = median_seconds(run, min_seconds=args.min_seconds, max_iters=200)
        print(f"{b:5d}  {res.launches or 0:8d}  {cost.graph_segments:8d}  "
              f"{cost.bytes_moved / 2**20:9.1f} MiB  {cost.modeled_seconds * 1e3:16.3f}  "
              f"{at_copy * 1e3:19.3f}  {measured * 1e3:11.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
