"""The modeled time of a compiled step, as `step-report` prints it (issue 39; the model and its
assumptions: README.md, "The step-time model").

`model_step` joins `jaxarena.step_cost` (what the compiled kernels move and compute, the CUDA
graph segments) and `jaxarena.step_bound` (the least the step must move and compute) for one
step compiled by `jaxarena.step_report.compile_step`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxarena._units import format_bytes
from jaxarena.step_bound import minimum
from jaxarena.step_cost import gpu_spec, step_cost
from pallas_kernels._cost import Workload

__all__ = ["COST_KEYS", "TOP_KERNELS", "compiled_cost", "default_context", "format_model",
           "model_step"]

COST_KEYS = ("context", "bytes_moved", "min_bytes", "flops", "min_flops", "kernel_seconds",
             "launch_seconds", "modeled_seconds", "bound_seconds", "bound",
             "modeled_over_bound", "graph_segments", "graphs_from", "segment_splits",
             "undeclared", "top_kernels")  # fmt: skip
"""The keys `model_step` adds to a step's entry of `step_report` (None on the CPU target)."""
TOP_KERNELS = 8
"""How many of the dearest kernels a step's entry lists."""


def default_context(lm: Any) -> int:
    """The tokens each sequence attends unless told: 1024 (vLLM's benchmark length), at most
    the longest sequence."""
    return min(1024, lm.max_seq_len)


def model_step(res: Any, lm: Any, params: Any, caches: Any, kind: str, *,
               context: int | None = None) -> dict[str, Any]:  # fmt: skip
    """`{key: value for key in COST_KEYS}` of a step compiled for a GPU (`res`: the
    `GpuCompiled`, dumped) at a workload of `context` tokens per sequence."""
    context = default_context(lm) if context is None else int(context)
    if context < 1:
        raise ValueError(f"context={context} must be >= 1 (tokens each sequence attends)")
    spec = gpu_spec(res.target)
    cost = compiled_cost(res, context)
    pool = lm.pages_per_seq
    low = minimum(lm, params, caches, kind, rows=lm.max_batch_size + 1, context=context,
                  pool=pool)  # fmt: skip
    fp8 = any("float8" in np.dtype(a.dtype).name for a in _leaves(params))
    bw_s = low["min_bytes"] / spec.bandwidth
    flop_s = low["min_flops"] / spec.peak("f8e4m3fn" if fp8 else "bf16")
    bound = max(bw_s, flop_s)
    return {
        "context": context,
        "bytes_moved": cost.bytes_moved,
        "min_bytes": low["min_bytes"],
        "flops": cost.flops,
        "min_flops": low["min_flops"],
        "kernel_seconds": cost.kernel_seconds,
        "launch_seconds": cost.launch_seconds,
        "modeled_seconds": cost.modeled_seconds,
        "bound_seconds": bound,
        "bound": "bandwidth" if bw_s >= flop_s else "compute",
        "modeled_over_bound": cost.modeled_seconds / bound if bound else None,
        "graph_segments": cost.graph_segments,
        "graphs_from": cost.graphs_from,
        "segment_splits": cost.splits(),
        "undeclared": cost.undeclared(),
        "top_kernels": [{"name": k.name, "launches": k.launches, "bytes": k.bytes,
                         "flops": k.flops, "seconds": k.seconds, "how": k.how}
                        for k in cost.kernels[:TOP_KERNELS]],  # fmt: skip
    }


def compiled_cost(res: Any, context: int, spec: Any = None) -> Any:
    """`jaxarena.step_cost.step_cost` of a dumped `GpuCompiled` at `Workload(context)` for
    `spec` (default: `gpu_spec(res.target)`): the graphs XLA formed when the dump has the
    thunk sequence after its passes, else XLA's rule applied to the sequence before them."""
    graphs = res.graph_thunks is not None
    return step_cost(res.hlo_text, res.graph_thunks if graphs else res.thunks, res.thunk_names,
                     spec or gpu_spec(res.target), Workload(context), graphs=graphs)  # fmt: skip


def _leaves(tree: Any) -> list[Any]:
    import jax

    return jax.tree.leaves(tree)


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f} ms"


def format_model(steps: dict[str, dict[str, Any]]) -> list[str]:
    """The text lines of the model's table (none when no step has a model: the CPU target)."""
    steps = {k: s for k, s in steps.items() if s.get("modeled_seconds") is not None}
    if not steps:
        return []
    head = ["step", "context", "bytes moved", "minimum", "ratio", "graphs", "launch",
            "modeled", "bound", "modeled/bound"]  # fmt: skip
    table = [head]
    for kind, s in steps.items():
        table.append([kind, f"{s['context']:,}", format_bytes(s["bytes_moved"]),
                      format_bytes(s["min_bytes"]), f"{s['bytes_moved'] / s['min_bytes']:.2f}x",
                      str(s["graph_segments"]), _ms(s["launch_seconds"]),
                      _ms(s["modeled_seconds"]), f"{_ms(s['bound_seconds'])} ({s['bound']})",
                      f"{s['modeled_over_bound']:.2f}"])  # fmt: skip
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                              enumerate(zip(r, widths, strict=True))) for r in table]  # fmt: skip
    for kind, s in steps.items():
        splits = ", ".join(f"{v}x {k}" for k, v in s["segment_splits"].items())
        lines.append(f"  {kind} graph segments ended by ({s['graphs_from']}): {splits}")
        if s["undeclared"]:
            lines.append(f"  {kind}: Pallas kernels without a declared cost (operands and "
                         f"results counted) or with an ambiguous one (the larger): "
                         f"{', '.join(s['undeclared'])}")  # fmt: skip
    lines.append("modeled: per kernel max(bytes / bandwidth, flops / peak) from the target's "
                 "spec, plus 4 us per graph segment; bound: the least the step must move "
                 "and compute; uncalibrated (README, the step-time model)")  # fmt: skip
    return lines
