"""Packed arenas versus sequential ones and the lower bound, for every bundled preset.

    python benchmarks/bench_packing.py            # the table
    python benchmarks/bench_packing.py --check    # exit 1 if a preset packs > 5% above the bound

For each preset at the serve limits `(max_batch_tokens, max_seq_len, kv_block_size,
max_batch_size)` = (8192, 262144, 64, 128) and (2048, 131072, 16, 64), target gb10, no levers,
with the standard lifetimes table (`Lifetimes.standard`): the sequential total, the packed
total, the lower bound (peak live bytes), packed / bound, packed / sequential, and the time
`ArenaPlan.packed` takes (best of 3).
"""

from __future__ import annotations

import argparse
import sys
import time

import jaxarena
from jaxarena import ArenaPlan, BufferSizes, Levers, Lifetimes, ModelConfig, Target

LIMITS = ((8192, 262144, 64, 128), (2048, 131072, 16, 64))
GOAL = 1.05


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a preset misses 5%%")
    args = parser.parse_args(argv)

    target = Target.preset("gb10")
    header = ("preset", "limits", "buffers", "sequential MiB", "packed MiB", "bound MiB",
              "packed/bound", "packed/seq", "plan ms")  # fmt: skip
    rows = [header]
    worst_ratio, worst_ms = 0.0, 0.0
    for limits in LIMITS:
        for name in jaxarena.presets():
            cfg = ModelConfig.preset(name)
            sizes = BufferSizes.from_config(cfg, *limits, levers=Levers(), target=target)
            lifetimes = Lifetimes.standard(cfg)
            seconds = []
            for _ in range(3):
                t0 = time.perf_counter()
                plan = ArenaPlan.packed(sizes, lifetimes)
                seconds.append(time.perf_counter() - t0)
            plan.validate()
            seq = ArenaPlan.sequential(sizes)
            bound = plan.lower_bound_bytes
            ratio = plan.total_bytes / bound
            ms = 1000 * min(seconds)
            worst_ratio, worst_ms = max(worst_ratio, ratio), max(worst_ms, ms)
            rows.append((
                name, f"{limits[0]}/{limits[1]}", str(len(plan.region_list)),
                _mib(seq.total_bytes), _mib(plan.total_bytes), _mib(bound), f"{ratio:.4f}",
                f"{plan.total_bytes / seq.total_bytes:.3f}", f"{ms:.1f}",
            ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in
                        enumerate(zip(row, widths, strict=True))))  # fmt: skip
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(
        f"\nworst packed/bound {worst_ratio:.4f} (goal <= {GOAL}); slowest plan {worst_ms:.1f} ms"
    )
    return 1 if args.check and worst_ratio > GOAL else 0


if __name__ == "__main__":
    sys.exit(main())
