"""Measures the steps' XLA temp on a deviceless H200 and fits `jaxarena._sizing.step_temp`:

    JAX_PLATFORMS=cpu python tools/fit_step_temp.py [--presets qwen3-8b ...] [--tokens 2048 8192]

For each dense preset (attention + MLP blocks) and prefill token count, compiles the prefill
step (`jaxarena.step_report`, default limits but `max_batch_tokens`) and, once per preset, the
decode step at batch 64; prints each temp, the prefill temp per token per unit of the widest
activation row (`max(hidden, intermediate)`), the least-squares slope through the origin over
all prefill compiles, and each compile's residual against it. The figures and the fit are
written down in jaxarena/_sizing/step_temp.py's docstring and tests/sizing/test_step_temp.py.
"""

from __future__ import annotations

import argparse
import json

from jaxarena import ModelConfig
from jaxarena._sizing.step_temp import _dense_width
from jaxarena.step_report import step_report

DENSE = ("qwen3-8b", "llama3.1-8b", "qwen3-32b")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=list(DENSE))
    ap.add_argument("--tokens", nargs="+", type=int, default=[2048, 8192])
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = ap.parse_args()
    rows = []
    for name in args.presets:
        width = _dense_width(ModelConfig.preset(name))
        for i, t in enumerate(args.tokens):
            steps = ("prefill", "decode") if i == 0 else ("prefill",)
            r = step_report(name, target="h200", max_batch_tokens=t, steps=steps)["steps"]
            row = {"preset": name, "tokens": t, "width": width,
                   "prefill_temp": r["prefill"]["temp_bytes"],
                   "decode_temp": r["decode"]["temp_bytes"] if "decode" in r else None}  # fmt: skip
            rows.append(row)
            print(f"{name:12} T={t:5d} width {width:6d}  prefill temp {row['prefill_temp']:>14,}"
                  f"  ({row['prefill_temp'] / (t * width):.3f} B per token per width)  decode "
                  f"temp (B=64) {row['decode_temp'] or '-'}", flush=True)  # fmt: skip
    # Least squares through the origin: temp ~= k * T * width.
    xs = [r["tokens"] * r["width"] for r in rows]
    k = sum(x * r["prefill_temp"] for x, r in zip(xs, rows, strict=True)) / sum(x * x for x in xs)
    print(f"fit: prefill temp ~= {k:.4f} x T x max(hidden, intermediate)")
    for x, r in zip(xs, rows, strict=True):
        print(f"  {r['preset']:12} T={r['tokens']:5d}  residual "
              f"{(k * x - r['prefill_temp']) / r['prefill_temp']:+.2%}")  # fmt: skip
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
