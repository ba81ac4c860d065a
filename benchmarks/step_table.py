"""Issue 39's closing table: each model's decode step compiled for a GPU without one and modeled
(`jaxarena.step_model`): launches per layer, CUDA-graph segments, bytes moved against the
minimum, the modeled time and the bound, at batch 1, 8 and 64.

    JAX_PLATFORMS=cpu python benchmarks/step_table.py [--target h200] [--batch 1 8 64]
        [--models qwen3-8b deepseek-v3@tp8 ...] [--layers N] [--context 1024] [--json]

`NAME@tpK` is the preset's per-device config at tensor parallelism K (`ModelConfig.shard`'s
field changes applied to the preset's config.json). `--layers N` compiles N layers and the
table extrapolates (launches, segments, bytes and times scale per layer from a second compile
at 2N layers): a model's first dense layers or hybrid period must fit in N.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from importlib import resources
from pathlib import Path

from jaxarena import ModelConfig
from jaxarena.step_report import step_report_details

MODELS = ("qwen3-8b", "llama3.1-8b", "qwen3-30b-a3b", "deepseek-v3@tp8", "nemotron-h-8b",
          "qwen3-next-80b-a3b")  # fmt: skip
KEYS = ("launches", "graph_segments", "bytes_moved", "min_bytes", "modeled_seconds",
        "bound_seconds")  # fmt: skip


def config_path(name: str, folder: Path, layers: int | None) -> Path:
    """A config.json for `name` (`preset` or `preset@tpK`), cut to `layers` when given."""
    preset, _, tp = name.partition("@tp")
    raw = json.loads((resources.files("jaxarena") / "presets" / f"{preset}.json").read_text())
    if tp:
        changes = ModelConfig.preset(preset).shard(tp=int(tp))
        for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size",
                    "moe_intermediate_size", "shared_expert_intermediate_size", "vocab_size",
                    "mamba_num_heads", "n_groups", "linear_num_key_heads",
                    "linear_num_value_heads"):  # fmt: skip
            if key in raw and hasattr(changes, key):
                raw[key] = getattr(changes, key)
    if layers is not None:
        raw["num_hidden_layers"] = layers
        for key in ("layer_types", "hybrid_override_pattern"):
            if isinstance(raw.get(key), list | str):
                raw[key] = raw[key][:layers]
    path = folder / name.replace("@", "_") / f"L{layers}" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw))
    return path


def decode_figures(path: Path, args: argparse.Namespace, batch: int) -> dict:
    d = step_report_details(str(path), target=args.target, steps=("decode",),
                            context=args.context, max_batch_size=batch,
                            max_seq_len=args.max_seq_len, max_batch_tokens=args.tokens)  # fmt: skip
    s = d["report"]["steps"]["decode"]
    return {**{k: s[k] for k in KEYS}, "layers": d["layers"], "top": s["top_kernels"][:3]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="h200")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--batch", nargs="+", type=int, default=[1, 8, 64])
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--max-seq-len", type=int, default=8192)
    p.add_argument("--tokens", type=int, default=2048, help="max_batch_tokens (arena sizing)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="step_table_"))
    print("model                 batch  launches/layer  segments  bytes/min   modeled ms  "
          "bound ms  modeled/bound")  # fmt: skip
    for name in args.models:
        full = ModelConfig.preset(name.partition("@")[0]).num_hidden_layers
        for b in args.batch:
            if args.layers is None:
                f = decode_figures(config_path(name, folder, None), args, b)
            else:  # two cuts, extrapolated linearly in the layers
                lo = decode_figures(config_path(name, folder, args.layers), args, b)
                hi = decode_figures(config_path(name, folder, 2 * args.layers), args, b)
                f = {k: lo[k] + (hi[k] - lo[k]) * (full - args.layers) / args.layers
                     for k in KEYS}  # fmt: skip
                f["layers"], f["top"] = full, hi["top"]
            row = (f"{name:20s}  {b:5d}  {f['launches'] / f['layers']:14.1f}  "
                   f"{f['graph_segments']:8.0f}  {f['bytes_moved'] / f['min_bytes']:9.2f}  "
                   f"{f['modeled_seconds'] * 1e3:11.3f}  {f['bound_seconds'] * 1e3:8.3f}  "
                   f"{f['modeled_seconds'] / f['bound_seconds']:13.2f}")  # fmt: skip
            print(row, flush=True)
            if args.json:
                print(json.dumps({"model": name, "batch": b, **f}), file=sys.stderr)


if __name__ == "__main__":
    main()
