"""How long `jaxarena plan MODEL --packed --plot map.png` takes, for every bundled preset.

    python benchmarks/bench_plot.py              # the table
    python benchmarks/bench_plot.py --check      # exit 1 when a preset takes 2 s or more

Per preset, the command exactly as a user types it, in a fresh process (`python -m
jaxarena.cli`, the console script's code), target hopper, default limits: its wall time and
the CPU time it used (user + system, from `getrusage` of the child), then, in this process
with everything imported, the CPU time of the plot alone (`draw_plan` + `savefig`). The
2 s goal (issue 19) is on the command's time; on a machine shared with other jobs the wall
time includes waiting for a core, so the CPU time is the figure to read there, and `--check`
uses the smaller of the two.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jaxarena import presets
from jaxarena.cli import main as cli_main

GOAL_S = 2.0


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(preset: str, out: Path) -> tuple[float, float]:
    """`(wall s, cpu s)` of one `jaxarena plan PRESET --packed --plot OUT` in a new process."""
    cmd = [sys.executable, "-m", "jaxarena.cli", "plan", preset, "--packed", "--target",
           "hopper", "--plot", str(out)]  # fmt: skip
    cpu0, t0 = _child_cpu(), time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - t0, _child_cpu() - cpu0
    if done.returncode != 0 or f"memory map written to {out}" not in done.stderr:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return wall, cpu


def plot_cpu(preset: str, out: Path) -> float:
    """CPU seconds of the plot alone, in this process (imports done, the plan built)."""
    argv = ["plan", preset, "--packed", "--target", "hopper"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        c0 = time.process_time()
        cli_main(argv)
        c1 = time.process_time()
        cli_main([*argv, "--plot", str(out)])
        c2 = time.process_time()
    return (c2 - c1) - (c1 - c0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a preset takes >= 2 s")
    parser.add_argument("--presets", nargs="*", default=None, help="only these presets")
    args = parser.parse_args(argv)

    names = args.presets or list(presets())
    rows = [("preset", "wall s", "cpu s", "plot cpu s", "PNG KiB")]
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        plot_cpu(names[0], Path(tmp) / "warm.png")  # first use loads matplotlib's fonts
        for name in names:
            out = Path(tmp) / f"{name}.png"
            wall, cpu = run_once(name, out)
            plot = plot_cpu(name, out)
            worst = max(worst, min(wall, cpu))
            rows.append((name, f"{wall:.2f}", f"{cpu:.2f}", f"{plot:.2f}",
                         f"{os.path.getsize(out) / 1024:.0f}"))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))))  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; worst "
          f"min(wall, cpu) {worst:.2f} s (goal < {GOAL_S} s)")  # fmt: skip
    if args.check and worst >= GOAL_S:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
