"""Issue 42 item 3's closing table: each model's decode step over a tensor-parallel mesh,
compiled for N compile-only H200s (`step_report(tp=, ep=)`): per-device temp, launches per
layer, collectives and their bytes per layer against the minimum (two bf16 all-reduces of the
hidden rows per layer), spills.

    JAX_PLATFORMS=cpu python benchmarks/tp_step_table.py [--runs qwen3-32b:8:1:1 ...]
        [--batch 64] [--json]

A run is `preset:tp:ep:N`: the decode step is compiled with the preset cut to N and to 2N
layers (`step_table.config_path`); per-layer figures are the difference over N layers (the
cut must hold the model's first dense layers or its hybrid period, so every added layer is a
repeat), the whole model's `fixed + per layer x layers`, where `fixed` is the N-layer figure
less N layers (the embedding's all-reduce and the logits' all-gather for the collectives).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_table import config_path  # noqa: E402

from jaxarena import ModelConfig  # noqa: E402
from jaxarena.step_report import step_report_details  # noqa: E402

RUNS = ("qwen3-32b:8:1:1", "qwen3-30b-a3b:4:4:1", "qwen3-next-80b-a3b:4:1:4",
        "kimi-k2-instruct:8:8:2", "deepseek-v3:8:8:4", "qwen3-30b-a3b:8:8:1",
        "mamba2-2.7b:4:1:1")  # fmt: skip


def format_bytes(n: float) -> str:
    """Bytes in KiB / MiB (the table's unit)."""
    return f"{n / 2**20:.2f} MiB" if abs(n) >= 2**20 else f"{n / 2**10:.1f} KiB"


def figures(path: Path, tp: int, ep: int, batch: int) -> dict:
    """One decode compile's per-device figures."""
    t0 = time.perf_counter()
    d = step_report_details(str(path), target="h200", steps=("decode",), tp=tp, ep=ep,
                            max_batch_size=batch)  # fmt: skip
    s = d["report"]["steps"]["decode"]
    c = s["collectives"]
    return {"temp": s["temp_bytes"], "launches": s["launches"], "spills": s["spills"],
            "count": c["count"], "bytes": c["bytes"], "min_count": c["min_count"],
            "min_bytes": c["min_bytes"], "design_count": c["design_count"],
            "design_bytes": c["design_bytes"], "by_kind": c["by_kind"],
            "link_seconds": c["link_seconds"], "weights": d["report"]["weight_bytes"],
            "seconds": time.perf_counter() - t0}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", default=list(RUNS))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--json", action="store_true", help="a JSON line per run on stderr")
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="tp_step_table_"))
    print("model               tp ep  temp/dev   launch/L  coll/L  bytes/L    min/L     "
          "fixed coll  whole coll / bytes    link ms  spills")  # fmt: skip
    for run in args.runs:
        name, tp, ep, n = run.split(":")
        tp, ep, n = int(tp), int(ep), int(n)
        full = ModelConfig.preset(name).num_hidden_layers
        try:
            lo = figures(config_path(name, folder, n), tp, ep, args.batch)
            if args.json:
                print(json.dumps({"run": run, "layers": n, **lo}), file=sys.stderr, flush=True)
            hi = figures(config_path(name, folder, 2 * n), tp, ep, args.batch)
        except Exception as e:  # noqa: BLE001 - a preset our TP refuses: say so, go on
            print(f"{name:18s} {tp:3d} {ep:2d}  FAILED: {type(e).__name__}: {e}"[:400],
                  flush=True)  # fmt: skip
            continue
        per = {k: (hi[k] - lo[k]) / n for k in ("launches", "count", "bytes", "min_count",
                                                 "min_bytes", "link_seconds")}  # fmt: skip
        fixed = {k: lo[k] - n * per[k] for k in ("count", "bytes")}
        whole = {k: fixed[k] + full * per[k] for k in ("count", "bytes")}
        whole["link_seconds"] = lo["link_seconds"] + (full - n) * per["link_seconds"]
        print(f"{name:18s} {tp:3d} {ep:2d}  {format_bytes(hi['temp']):>9s}  "
              f"{per['launches']:8.1f}  {per['count']:6.1f}  {format_bytes(per['bytes']):>9s}  "
              f"{per['min_count']:.0f}/{format_bytes(per['min_bytes']):>9s}  "
              f"{fixed['count']:3.0f}/{format_bytes(fixed['bytes']):>9s}  "
              f"{whole['count']:5.0f} / {format_bytes(whole['bytes']):>10s}  "
              f"{whole['link_seconds'] * 1e3:7.3f}  {max(lo['spills'], hi['spills']):6d}",
              flush=True)  # fmt: skip
        if args.json:
            print(json.dumps({"run": run, "layers": full, "lo": lo, "hi": hi, "per_layer": per,
                              "fixed": fixed, "whole": whole}), file=sys.stderr, flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
