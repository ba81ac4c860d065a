"""The collectives of a step compiled over a tensor-parallel mesh (issue 42 item 3): how many
run per step, the bytes each device hands them, the least the design needs, and the time the
bytes take over the GPUs' links.

Counted from a deviceless compile's dump (`jaxarena.gpu_aot.GpuCompiled`): every collective
thunk of the thunk sequence (`kAllReduce`, `kAllGather`, `kAllToAll`, `kCollectivePermute`,
`kReduceScatter`, `kRaggedAllToAll`, XLA's asynchronous `...Start` forms; the `...Done` halves
are not counted again), a while loop's body times its trip count. A collective's bytes are its
operands' bytes on one device (an all-gather's operand is the device's piece, an all-reduce's
the whole partial sum), read from the optimized HLO instruction the thunk runs.

The minimum (`collective_minimum`): a Megatron-style tensor-parallel model must all-reduce the
hidden rows once per block (`[rows, hidden]` bf16; two per dense decoder layer: attention and
MLP). The design (`jaxarena.models.tensor_parallel`) all-reduces the blocks' partial sums in
bf16 (`ArenaLM._block`: the minimum's bytes) and adds two: the vocab-parallel embedding's all-reduce of the bf16 rows and the LM
head's all-gather of the bf16 logits. Mamba-2 with fewer groups than devices adds one float32
all-reduce per mixer, its gated RMSNorm's sums of squares (`[rows, n_groups]`, `Mamba2`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from jaxarena._units import format_bytes
from jaxarena.step_cost import parse_hlo, shape_bytes

__all__ = ["COLLECTIVE_KINDS", "LINK_BYTES_PER_SECOND", "collective_minimum", "collectives",
           "format_collectives", "link_seconds", "BLOCK_OUTPUT_BYTES"]  # fmt: skip

COLLECTIVE_KINDS = {
    "kAllReduce": "all-reduce",
    "kAllGather": "all-gather",
    "kAllToAll": "all-to-all",
    "kRaggedAllToAll": "all-to-all",
    "kCollectivePermute": "collective-permute",
    "kReduceScatter": "reduce-scatter",
}
"""Thunk kind (without `kNccl` / `Start`) -> the collective it runs."""

LINK_BYTES_PER_SECOND = {"h200": 450e9, "b200": 900e9}
"""One direction of one GPU's NVLink, bytes/s (assumed, from the data sheets: H200 NVLink 4 at
900 GB/s and B200 NVLink 5 at 1.8 TB/s, both directions together)."""

BLOCK_OUTPUT_BYTES = 2
"""Bytes per element of a block's output as the design all-reduces it (bf16)."""

_CONTAINERS = frozenset({"kWhile", "kConditional", "kSequential", "kCommandBuffer"})


COLLECTIVE_KERNEL = "kCollectiveKernel"
"""The thunk of a collective XLA emits as a kernel (jax 0.12's one-shot all-reduce: a fusion
whose computation holds the collective); its HLO fusion says which collective."""

_HLO_COLLECTIVES = {"all-reduce", "all-gather", "all-to-all", "ragged-all-to-all",
                    "collective-permute", "reduce-scatter"}  # fmt: skip


def _collective(kind: str) -> str | None:
    """The collective a thunk kind runs, None for other thunks (and `...Done` halves);
    `COLLECTIVE_KERNEL` for a collective emitted as a kernel (its HLO says which)."""
    if kind == COLLECTIVE_KERNEL:
        return kind
    k = kind.replace("kNccl", "k")
    if k.endswith("Done"):
        return None
    return COLLECTIVE_KINDS.get(k.removesuffix("Start"))


def _kernel_collective(ins: Any, comps: dict[str, list[Any]]) -> str:
    """The collective a `COLLECTIVE_KERNEL` thunk's HLO fusion `ins` computes ("unknown" when
    its computation holds none)."""
    called = re.search(r"calls=%([\w.\-]+)", ins.attrs) if ins is not None else None
    for sub in comps.get(called.group(1), []) if called else []:
        op = sub.opcode.removesuffix("-start")
        if op in _HLO_COLLECTIVES:
            return "all-to-all" if op == "ragged-all-to-all" else op
    return "unknown"


def _walk(thunks: Sequence[Any], times: int, out: list[tuple[Any, int, bool]],
          known: bool = True) -> None:  # fmt: skip
    for t in thunks:
        if t.kind in _CONTAINERS:
            for name, ch in t.sections.items():
                n, k = times, known
                if t.kind == "kWhile" and t.trip_count is None:
                    k = False  # counted once: `unknown` says so
                elif t.kind == "kWhile":
                    n = times * (t.trip_count if name == "body" else t.trip_count + 1
                                 if name == "condition" else 1)  # fmt: skip
                if t.kind == "kConditional" and name != next(iter(t.sections)):
                    continue  # one branch runs: the first stands for all (as step_cost)
                _walk(ch, n, out, k)
        elif _collective(t.kind) is not None:
            out.append((t, times, known))


def collectives(hlo_text: str, thunks: Sequence[Any], names: dict[int, str]) -> dict[str, Any]:
    """`{"count", "bytes", "by_kind": {collective: {"count", "bytes"}}, "unknown"}` per step of
    a dumped compile: `count` collectives run, `bytes` their operands' bytes on one device;
    `unknown`: collectives whose HLO instruction was not found (counted, bytes 0) or that sit
    in a while loop of unknown trip count (counted once per entry)."""
    instrs, comps, _ = parse_hlo(hlo_text)
    found: list[tuple[Any, int, bool]] = []
    _walk(thunks, 1, found)
    by_kind: dict[str, dict[str, int]] = {}
    unknown = 0
    for t, times, known in found:
        ins = instrs.get(names.get(t.thunk_id, ""))
        unknown += 0 if known and ins is not None else times
        if ins is None:
            size = 0
        else:
            size = sum(shape_bytes(instrs[o].shape) for o in ins.operands if o in instrs)
        kind = _collective(t.kind)
        if kind == COLLECTIVE_KERNEL:
            kind = _kernel_collective(ins, comps)
            unknown += times if kind == "unknown" else 0
        k = by_kind.setdefault(kind, {"count": 0, "bytes": 0})
        k["count"] += times
        k["bytes"] += times * size
    return {"count": sum(k["count"] for k in by_kind.values()),
            "bytes": sum(k["bytes"] for k in by_kind.values()),
            "by_kind": dict(sorted(by_kind.items())), "unknown": unknown}  # fmt: skip


def collective_minimum(lm: Any, kind: str, tp: int) -> dict[str, int]:
    """`{"min_count", "min_bytes", "design_count", "design_bytes"}` per step of `lm` (one
    device's `ArenaLM`) over `tp` devices (all 0 on one device): the minimum is one bf16
    all-reduce of the `[rows, hidden]` block output per block; the design all-reduces them in
    bf16 (`BLOCK_OUTPUT_BYTES`) and adds the embedding's all-reduce of the bf16 rows and the
    all-gather of each device's bf16 logits (`rows` the step's tokens; the logits' rows: a
    decode step's sequences, a prefill's `max_batch_size + 1`), and, when Mamba-2's groups
    are fewer than the devices (`lm.tp_groups < tp`), each mixer's float32 all-reduce of its
    gated RMSNorm's `[rows, n_groups]` sums of squares."""
    if tp == 1:
        return dict.fromkeys(("min_count", "min_bytes", "design_count", "design_bytes"), 0)
    hidden, blocks = lm.config.hidden_size, len(lm.arch.blocks)
    if kind == "decode":
        rows = logit_rows = lm.max_batch_size
    else:
        rows, logit_rows = lm.max_batch_tokens, lm.max_batch_size + 1
    block_bytes = rows * hidden * 2
    groups = getattr(lm, "tp_groups", None)
    norms = sum(b.kind == "mamba" for b in lm.arch.blocks) if groups and groups < tp else 0
    return {"min_count": blocks, "min_bytes": blocks * block_bytes,
            "design_count": blocks + 2 + norms,
            "design_bytes": blocks * rows * hidden * BLOCK_OUTPUT_BYTES + block_bytes
            + logit_rows * lm.config.vocab_size * 2 + norms * rows * (groups or 0) * 4}  # fmt: skip


def link_seconds(coll: dict[str, Any], tp: int, target: str) -> float:
    """Seconds the collectives' bytes take over one direction of a device's NVLink
    (`LINK_BYTES_PER_SECOND`; bandwidth only, no latency): a ring all-reduce of `B` bytes
    sends `2 (tp - 1) / tp B`, an all-gather of `B`-byte pieces `(tp - 1) B`, an all-to-all
    `(tp - 1) / tp B`, a reduce-scatter `(tp - 1) / tp B`, a permute `B`."""
    if tp == 1 or not coll["count"]:
        return 0.0
    factor = {"all-reduce": 2 * (tp - 1) / tp, "all-gather": tp - 1,
              "all-to-all": (tp - 1) / tp, "reduce-scatter": (tp - 1) / tp,
              "collective-permute": 1.0}  # fmt: skip
    sent = sum(factor[k] * v["bytes"] for k, v in coll["by_kind"].items())
    return sent / LINK_BYTES_PER_SECOND[target]


def format_collectives(steps: dict[str, dict[str, Any]]) -> list[str]:
    """The text lines of the collectives' table (none when no step ran any)."""
    steps = {k: s["collectives"] for k, s in steps.items() if s.get("collectives")
             and s["collectives"]["count"]}  # fmt: skip
    if not steps:
        return []
    head = ["step", "collectives", "bytes", "minimum", "design", "link", "by kind"]
    table = [head]
    for kind, c in steps.items():
        table.append([kind, f"{c['count']:,}", format_bytes(c["bytes"]),
                      f"{c['min_count']:,} / {format_bytes(c['min_bytes'])}",
                      f"{c['design_count']:,} / {format_bytes(c['design_bytes'])}",
                      f"{c['link_seconds'] * 1e3:.3f} ms",
                      ", ".join(f"{v['count']}x {k} {format_bytes(v['bytes'])}"
                                for k, v in c["by_kind"].items())])  # fmt: skip
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = ["  " + "  ".join(c.ljust(w) if i in (0, len(head) - 1) else c.rjust(w)
                              for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in table]  # fmt: skip
    lines.append("collectives per step and the bytes one device hands them (operands); minimum: "
                 "one bf16 all-reduce of the hidden rows per block; design: + the embedding's "
                 "all-reduce and the logits' all-gather; link: the bytes over one direction of "
                 "NVLink, no latency (not in the modeled time, which counts a collective's "
                 "HBM traffic only)")  # fmt: skip
    return lines
