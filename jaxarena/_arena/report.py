"""Reports on a plan: `packing_report` (the numbers `jaxarena plan --packed` prints) and a
memory-map plot (matplotlib, an optional dependency)."""

from __future__ import annotations

from typing import Any

from jaxarena._arena.lifetimes import Lifetimes
from jaxarena._arena.plan import ArenaPlan
from jaxarena._units import format_bytes

__all__ = ["packing_report", "plot_plan"]


def packing_report(sizes: Any, lifetimes: Lifetimes, align_bytes: int = 256) -> dict[str, Any]:
    """The numbers behind `jaxarena plan --packed`, as plain JSON-ready data.

    Returns:
      `{"sequential_bytes", "packed_bytes", "lower_bound_bytes", "peak", "regions"}`: the
      totals of `ArenaPlan.sequential(sizes)` and `ArenaPlan.packed(sizes, lifetimes)`, the
      lower bound (`lifetimes.lower_bound_bytes`), the peak as `[mode, step, label]`, and one
      dict per region in the order of `sizes`: `name`, `offset_bytes`, `nbytes` and `live`,
      a list of `[mode, start, end]` half-open step intervals (every step of every mode for a
      buffer the lifetimes do not name).
    """
    seq = ArenaPlan.sequential(sizes, align_bytes=align_bytes)
    plan = ArenaPlan.packed(sizes, lifetimes, align_bytes=align_bytes)
    peak = lifetimes.peak(sizes, align_bytes=align_bytes)
    return {
        "sequential_bytes": seq.total_bytes,
        "packed_bytes": plan.total_bytes,
        "lower_bound_bytes": peak.bytes,
        "peak": [peak.mode, peak.step, lifetimes.label(peak.mode, peak.step)],
        "regions": [
            {
                "name": r.name,
                "offset_bytes": r.offset_bytes,
                "nbytes": r.nbytes,
                "live": [list(iv) for iv in lifetimes.intervals(r.name)],
            }
            for r in plan.region_list
        ],
    }



def plot_plan(plan: ArenaPlan, path: str, *, title: str = "arena", label_top: int = 12) -> None:
    """Saves a memory map of `plan` to `path` (PNG): one bar, regions to scale by offset and
    size, the `label_top` largest labelled with name and size.

    Raises:
      ImportError: matplotlib is not installed (`pip install "jaxarena[plot]"`).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError('plotting needs matplotlib: pip install "jaxarena[plot]"') from e
    total = plan.total_bytes
    regions = sorted(plan.region_list, key=lambda r: r.offset_bytes)
    largest = {r.name for r in sorted(regions, key=lambda r: -r.nbytes)[:label_top]}
    fig, ax = plt.subplots(figsize=(12, 3.2 + 0.22 * len(largest)))
    cmap = plt.get_cmap("tab20")
    for i, r in enumerate(regions):
        ax.barh(0, r.nbytes / total, left=r.offset_bytes / total, height=0.6,
                color=cmap(i % 20), edgecolor="white", linewidth=0.3)  # fmt: skip
    labelled = [r for r in regions if r.name in largest]
    for j, r in enumerate(labelled):
        mid = (r.offset_bytes + r.nbytes / 2) / total
        y = -0.55 - 0.22 * j
        ax.annotate(f"{r.name} ({format_bytes(r.nbytes)})", xy=(mid, -0.3), xytext=(mid, y),
                    fontsize=7, ha="center", va="top",
                    arrowprops=dict(arrowstyle="-", lw=0.4, color="0.4"))  # fmt: skip
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.7 - 0.22 * len(labelled), 0.5)
    ax.set_yticks([])
    ticks = [0, 0.25, 0.5, 0.75, 1.0]
    ax.set_xticks(ticks, [format_bytes(int(t * total)) for t in ticks])
    ax.set_title(f"{title}: {format_bytes(total)} in {len(regions)} regions")
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
