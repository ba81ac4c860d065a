"""Measures the steps' XLA temp on a deviceless H200 and fits `jaxarena._sizing.step_temp`:

    JAX_PLATFORMS=cpu python tools/fit_step_temp.py [--presets qwen3-8b ...] [--tokens 2048 8192]

For each dense preset (attention + MLP blocks) and prefill token count, compiles the prefill
step (`jaxarena.step_report`, default limits but `max_batch_tokens`) and, once per preset, the
decode step at batch 64; prints each temp and the least-squares fit of the prefill temps to
`min(T, DEFAULT_PREFILL_CHUNK) x (a x intermediate + b x hidden)` (intermediate: the widest MLP row, `_dense_width`'s
`max(intermediate, moe_intermediate)`), with each compile's residual against it. The figures and the fit are
written down in jaxarena/_sizing/step_temp.py's docstring and tests/sizing/test_step_temp.py.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from jaxarena import ModelConfig
from jaxarena._sizing.step_temp import DEFAULT_PREFILL_CHUNK, _mlp_width
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
        cfg = ModelConfig.preset(name)
        width, hidden = _mlp_width(cfg), cfg.hidden_size
        for i, t in enumerate(args.tokens):
            steps = ("prefill", "decode") if i == 0 else ("prefill",)
            r = step_report(name, target="h200", max_batch_tokens=t, steps=steps)["steps"]
            row = {"preset": name, "tokens": t, "width": width, "hidden": hidden,
                   "prefill_temp": r["prefill"]["temp_bytes"],
                   "decode_temp": r["decode"]["temp_bytes"] if "decode" in r else None}  # fmt: skip
            rows.append(row)
            print(f"{name:12} T={t:5d} intermediate {width:6d} hidden {hidden:5d}  prefill temp "
                  f"{row['prefill_temp']:>14,} ({row['prefill_temp'] / t:,.0f} B per token)  "
                  f"decode temp (B=64) {row['decode_temp'] or '-'}", flush=True)  # fmt: skip
    # Least squares, relative: minimise sum(((a I + b H) T - temp) / temp)^2.
    temps = np.array([r["prefill_temp"] for r in rows], float)
    # A prefill of more tokens than DEFAULT_PREFILL_CHUNK runs in chunks of that many: its
    # temp is one chunk's.
    eff = [min(r["tokens"], DEFAULT_PREFILL_CHUNK) for r in rows]
    terms = np.array([[t * r["width"], t * r["hidden"]] for t, r in zip(eff, rows, strict=True)],
                     float)  # fmt: skip
    (a, b), *_ = np.linalg.lstsq(terms / temps[:, None], np.ones(len(rows)), rcond=None)
    print(f"fit: prefill temp ~= T x ({a:.3f} x intermediate + {b:.3f} x hidden)")
    for r, x in zip(rows, terms @ np.array([a, b]), strict=True):
        print(
            f"  {r['preset']:12} T={r['tokens']:5d}  residual {(x - r['prefill_temp']) / r['prefill_temp']:+.2%}"
        )
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
