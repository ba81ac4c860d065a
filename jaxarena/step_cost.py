"""What a compiled step moves and how long it would take: bytes and flops per kernel, CUDA-graph
segments, a modeled time and the bound it is held against (issue 39; the model and what it
leaves out: README.md, "The step-time model").

Inputs are those of a deviceless compile (`jaxarena.gpu_aot.GpuCompiled` with a dump): the
optimized HLO text, the thunk sequence after XLA's thunk passes (command buffers in place) and
each thunk's HLO instruction (`thunk_metadata`'s profile annotation).

- Bytes of an XLA fusion: what it reads of each operand plus what it writes. An operand the
  fused computation only slices (`slice`, `dynamic-slice`, `gather`) is read for the slices'
  sizes; an operand it updates in place (operand 0 of `dynamic-update-slice` or `scatter`) is
  not read; such a root writes the update, not the buffer. Everything else is read whole.
- Bytes of a library GEMM (cuBLAS custom call): operands plus result, the workspace left out.
- Bytes of a copy: its result twice (read + write). A memset: its result once.
- A Pallas-Triton kernel: the cost it declares (`pallas_kernels._cost`) for the `Workload`;
  an undeclared one falls back to its operands and results less the buffers it aliases, and
  is named in `undeclared`.
- Flops: `2 * M * N * K` of every `dot` (nested fusions included) and the Pallas kernels'
  declared flops; elementwise work is not counted.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pallas_kernels._cost import KernelCost, Workload, declared_cost, hlo_signature

__all__ = ["GpuSpec", "Instr", "KernelRow", "StepCost", "gpu_spec", "parse_hlo", "step_cost",
           "segments"]  # fmt: skip

# Bits per element of XLA's primitive types.
_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16,
         "bf16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64,
         "c64": 64, "c128": 128}  # fmt: skip
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
# XLA's PrimitiveType numbers (xla_data.proto), the keys of a spec's matrix unit rates.
_PRIMITIVE = {"s8": 2, "f16": 10, "f32": 11, "f64": 12, "bf16": 16, "f8e5m2": 19,
              "f8e4m3fn": 20}  # fmt: skip
# Graph launch (a CUDA graph, or a kernel outside one) cost: an assumed figure, uncalibrated.
LAUNCH_SECONDS = 4e-6
# Thunk kinds XLA can capture in a command buffer (the fallback rule, used when the dump has
# no `thunk_sequence_after_thunk_passes.txt`), and its default minimum run length.
CAPTURABLE = frozenset({"kKernel", "kCustomKernel", "kGemm", "kCublasLtMatmul", "kCustomCall",
                        "kCopy", "kDeviceToDeviceCopy", "kDynamicSliceFusion"})  # fmt: skip
MIN_GRAPH_SIZE = 5
_CONTAINERS = frozenset({"kWhile", "kConditional", "kSequential", "kCommandBuffer"})
_SKIP = frozenset({"kWaitForStreams", "kRecordEvent", "kWaitForEvent"})


def _elem_bits(dtype: str) -> int:
    if dtype.startswith("f8") or dtype.startswith("f4") or dtype.startswith("f6"):
        return 8 if dtype.startswith("f8") else 4
    return _BITS.get(dtype, 0)  # token[], opaque: no bytes


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string (a tuple's elements summed)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += n * _elem_bits(dtype) // 8
    return total


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


# -- the HLO text --------------------------------------------------------------------------------


@dataclasses.dataclass
class Instr:
    """One HLO instruction: name, result shape, opcode, operand names, the rest of the line,
    and the computation it is in."""

    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str
    computation: str
    args: str = ""


_COMP = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_NAME = re.compile(r"%([\w.\-]+)")


def _matching(s: str, i: int) -> int:
    """Index of the bracket closing the one at `s[i]`."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] in "([{":
            depth += 1
        elif s[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j
    return len(s) - 1


def parse_hlo(text: str) -> tuple[dict[str, Instr], dict[str, list[Instr]], dict[str, str]]:
    """`(instructions by name, computations' instructions by name, root name by computation)`
    of optimized HLO text (`Instr.args`: the text inside the operand parentheses, e.g. a
    parameter's number)."""
    instrs: dict[str, Instr] = {}
    comps: dict[str, list[Instr]] = {}
    roots: dict[str, str] = {}
    comp = ""
    for line in text.splitlines():
        m = _COMP.match(line)
        if m is not None:
            comp = m.group(1)
            comps[comp] = []
            continue
        m = _INSTR.match(line)
        if m is None or not comp:
            continue
        rest = m.group(3)
        if rest.startswith("("):
            end = _matching(rest, 0)
            shape, rest = rest[: end + 1], rest[end + 1 :].lstrip()
        else:
            shape, _, rest = rest.partition(" ")
        opcode, _, rest = rest.partition("(")
        close = _matching("(" + rest, 0) - 1
        operands = _NAME.findall(rest[:close])
        ins = Instr(m.group(2), shape, opcode.strip(), operands, rest[close + 1 :], comp,
                    rest[:close])
        instrs[ins.name] = ins
        comps[comp].append(ins)
        if m.group(1):
            roots[comp] = ins.name
    return instrs, comps, roots


# -- one kernel's cost ---------------------------------------------------------------------------

_CALLS = re.compile(r"calls=%([\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_CONTRACT = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_CUBLAS_CONTRACT = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_KERNEL_NAME = re.compile(r'\bname\s*=\s*"([^"\\]+)"')
_GRID = re.compile(r"grid_([xyz])\s*=\s*(\d+)")
_ALIAS = re.compile(r"output_to_operand_aliasing=\{(.*?)\}\s*,\s*[a-z_]+=")


class _Module:
    def __init__(self, hlo_text: str) -> None:
        self.instrs, self.comps, self.roots = parse_hlo(hlo_text)
        self.by_comp = {c: {i.name: i for i in ins} for c, ins in self.comps.items()}

    def _users(self, comp: str, name: str) -> list[tuple[Instr, int]]:
        return [(i, k) for i in self.comps[comp] for k, o in enumerate(i.operands) if o == name]

    def _read_bytes(self, comp: str, name: str, full: int) -> int:
        """Bytes a fused computation reads of its value `name` (`full` bytes in all)."""
        users = self._users(comp, name)
        if not users:
            return 0
        total = 0
        for user, k in users:
            if user.opcode == "bitcast":
                total += self._read_bytes(comp, user.name, full)
            elif user.opcode in ("slice", "dynamic-slice", "gather") and k == 0:
                total += shape_bytes(user.shape)
            elif user.opcode in ("dynamic-update-slice", "scatter") and k == 0:
                continue  # updated in place: not read
            else:
                return full
        return min(total, full)

    def _write_bytes(self, comp: str, name: str) -> int:
        ins = self.by_comp[comp][name]
        if ins.opcode == "tuple":
            return sum(self._write_bytes(comp, o) for o in ins.operands)
        if ins.opcode == "bitcast":
            return self._write_bytes(comp, ins.operands[0])
        if ins.opcode == "dynamic-update-slice":
            return shape_bytes(self.by_comp[comp][ins.operands[1]].shape)
        if ins.opcode == "scatter":
            n = (len(ins.operands) - 1) // 2  # scatter(operands..., indices, updates...)
            return sum(shape_bytes(self.by_comp[comp][o].shape) for o in ins.operands[n + 1 :])
        return shape_bytes(ins.shape)

    def dot_flops(self, comp: str, seen: frozenset = frozenset()) -> tuple[int, str]:
        """Flops of every dot in `comp` and the computations it calls; the first dot's lhs
        dtype (for the peak rate), "" without a dot."""
        flops, dtype = 0, ""
        for ins in self.comps.get(comp, []):
            if ins.opcode == "dot":
                lhs = self.by_comp[comp][ins.operands[0]].shape
                dims = _dims(lhs)
                c = _CONTRACT.search(ins.attrs)
                k = math.prod(dims[int(d)] for d in c.group(1).split(",") if d) if c else 1
                flops += 2 * math.prod(_dims(ins.shape)) * k
                dtype = dtype or _ARRAY.search(lhs).group(1)
            for callee in _CALLS.findall(ins.attrs):
                if callee not in seen:
                    f, d = self.dot_flops(callee, seen | {comp})
                    flops, dtype = flops + f, dtype or d
        return flops, dtype

    def cost(self, ins: Instr, kind: str, workload: Workload) -> tuple[KernelCost, str, str]:
        """`(cost, dtype of its GEMM or "", how it was counted)` of the kernel `ins`."""
        if kind in ("kCopy", "kDeviceToDeviceCopy"):
            return KernelCost(2 * shape_bytes(ins.shape), 0), "", "hlo"
        if kind in ("kMemset32BitValue", "kMemzero"):
            return KernelCost(shape_bytes(ins.shape), 0), "", "hlo"
        operand_shapes = [self.instrs[o].shape if o in self.instrs else "" for o in ins.operands]
        if ins.opcode == "fusion" and (m := _CALLS.search(ins.attrs)):
            comp = m.group(1)
            read = 0
            for p in (i for i in self.comps[comp] if i.opcode == "parameter"):
                idx = int(p.args)
                full = shape_bytes(operand_shapes[idx]) if idx < len(operand_shapes) else 0
                read += self._read_bytes(comp, p.name, full)
            flops, dtype = self.dot_flops(comp)
            return KernelCost(read + self._write_bytes(comp, self.roots[comp]), flops), dtype, \
                "hlo"  # fmt: skip
        target = (m.group(1) if (m := _TARGET.search(ins.attrs)) else "")
        if ins.opcode == "custom-call" and "triton" in target:
            return self._declared(ins, operand_shapes, workload)
        if ins.opcode == "custom-call" and "cublas" in target:
            elems = _ARRAY.findall(ins.shape)
            out = sum(shape_bytes(f"{d}[{s}]") for d, s in elems[:1])
            dims = _dims(operand_shapes[0])
            c = _CUBLAS_CONTRACT.search(ins.attrs)
            k = math.prod(dims[int(d.strip('" '))] for d in c.group(1).split(",") if d.strip()) \
                if c else 1  # fmt: skip
            flops = 2 * math.prod(int(v) for v in elems[0][1].split(",") if v) * k
            dtype = _ARRAY.search(operand_shapes[0]).group(1)
            return KernelCost(sum(map(shape_bytes, operand_shapes)) + out, flops), dtype, "hlo"
        return KernelCost(sum(map(shape_bytes, operand_shapes)) + shape_bytes(ins.shape), 0), \
            "", "hlo"  # fmt: skip

    def _declared(self, ins: Instr, operand_shapes: list[str], workload: Workload) -> tuple:
        name = (m.group(1) if (m := _KERNEL_NAME.search(ins.attrs)) else ins.name)
        grid = dict(_GRID.findall(ins.attrs))
        programs = math.prod(int(grid.get(a, 1)) for a in "xyz")
        shapes = [(d, tuple(int(v) for v in s.split(",") if v))
                  for shape in operand_shapes for d, s in _ARRAY.findall(shape)[:1]]  # fmt: skip
        fn, ambiguous = declared_cost(hlo_signature(name, programs, shapes))
        if fn is not None:
            return fn(workload), "bf16", "ambiguous" if ambiguous else "declared"
        aliased = _aliased_operands(ins.attrs)
        read = sum(shape_bytes(s) for k, s in enumerate(operand_shapes) if k not in aliased)
        out = 0 if aliased else shape_bytes(ins.shape)
        return KernelCost(read + out, 0), "", "undeclared"


def _aliased_operands(attrs: str) -> set[int]:
    m = _ALIAS.search(attrs + ", x=")
    return {int(k) for k in re.findall(r"\(\s*(\d+)\s*,", m.group(1))} if m else set()


# -- the thunk sequence: kernels and graph segments -------------------------------------------


@dataclasses.dataclass
class KernelRow:
    """One kernel of a step (launches of the same thunk name and cost merged).

    Attributes:
      name: the thunk's kernel name (a fusion's, a Pallas kernel's `name=`) or its kind.
      launches: per call of the step.
      bytes, flops: per launch; seconds: the model's time of all its launches.
      how: "hlo" (from the operands and results), "declared" (the Pallas kernel's declared
        cost), "ambiguous" (two kernels of the compile declared different costs under one
        key: the larger), "undeclared" (a Pallas kernel without a declaration: operands and
        results less its aliased buffers), "unknown" (no HLO instruction found).
    """

    name: str
    launches: int
    bytes: int
    flops: int
    seconds: float
    how: str


@dataclasses.dataclass
class Segment:
    """One CUDA-graph launch (a command buffer) or a launch outside every graph.

    Attributes:
      thunks: launches inside it (1 outside a graph); times: per call of the step (a while
      body's trip count); where: "top level" or "body of while NAME"; ended_by: the thunk
      after it that XLA could not capture ("end" at the end of its sequence), or for a launch
      outside a graph, why it is alone."""

    thunks: int
    times: int
    where: str
    ended_by: str


def _label(t: Any, names: dict[int, str]) -> str:
    return f"{t.kind} {t.name or names.get(t.thunk_id, '')}".strip()


def _sections(t: Any, times: int) -> list[tuple[str, list, int]]:
    """`(section, thunks, times)` of a container run `times` per call."""
    if t.kind == "kWhile":
        n = t.trip_count if t.trip_count is not None else 1
        return [(s, ch, times * (n if s == "body" else n + 1 if s == "condition" else 1))
                for s, ch in t.sections.items()]  # fmt: skip
    if t.kind == "kConditional":  # one branch runs: the first stands for all
        first = next(iter(t.sections.items()), None)
        return [] if first is None else [(first[0], first[1], times)]
    return [(s, ch, times) for s, ch in t.sections.items()]


def _launch_count(ts: Sequence[Any]) -> int:
    return sum(1 if t.kind not in _CONTAINERS else
               sum(_launch_count(ch) for ch in t.sections.values())
               for t in ts if t.kind not in _SKIP)  # fmt: skip


def segments(thunks: Sequence[Any], names: dict[int, str], *, graphs: bool, times: int = 1,
             where: str = "top level") -> list[Segment]:  # fmt: skip
    """The graph segments of a thunk tree. `graphs`: the tree is XLA's sequence after its
    thunk passes (its `kCommandBuffer`s are the graphs); else XLA's rule is applied to the
    sequence before them: a run of at least `MIN_GRAPH_SIZE` consecutive `CAPTURABLE` thunks
    is one graph, a shorter run launches thunk by thunk."""
    out: list[Segment] = []
    ts = [t for t in thunks if t.kind not in _SKIP]
    run: list[Any] = []

    def flush(nxt: str) -> None:
        if len(run) >= MIN_GRAPH_SIZE:
            out.append(Segment(len(run), times, where, nxt))
        else:
            out.extend(Segment(1, times, where, f"a run of {len(run)} < {MIN_GRAPH_SIZE}")
                       for _ in run)  # fmt: skip
        run.clear()

    for i, t in enumerate(ts):
        nxt = _label(ts[i + 1], names) if i + 1 < len(ts) else "end"
        if graphs and t.kind == "kCommandBuffer":
            out.append(Segment(_launch_count([t]), times, where, nxt))
        elif t.kind in _CONTAINERS:
            if run:
                flush(_label(t, names))
            for sec, ch, n in _sections(t, times):
                inner = f"{sec} of {_label(t, names)}" if t.kind == "kWhile" else where
                out += segments(ch, names, graphs=graphs, times=n, where=inner)
        elif graphs:
            out.append(Segment(1, times, where, f"{t.kind} not captured"))
        elif t.kind in CAPTURABLE:
            run.append(t)
        else:
            if run:
                flush(_label(t, names))
            out.append(Segment(1, times, where, f"{t.kind} not capturable"))
    if run:
        flush("end")
    return out


# -- the target ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """A target's HBM bandwidth (bytes/s) and dense matrix-unit peaks (flops/s by HLO dtype),
    read from its device spec (`jaxarena/gpu_specs/*.txtpb`): `2 * core_count *
    units_per_core * ops_per_clock * clock_rate_ghz * 1e9` per dtype (a matrix-unit op is a
    multiply-add)."""

    name: str
    bandwidth: float
    peaks: dict[str, float]

    def peak(self, dtype: str) -> float:
        """The matrix peak for `dtype` (bf16's for a dtype the spec has no rate for)."""
        return self.peaks.get(dtype) or self.peaks["bf16"]


_RATE = re.compile(r"key:\s*(\d+)\s*value\s*\{\s*clock_rate_ghz:\s*([\d.]+)\s*"
                   r"units_per_core:\s*(\d+)\s*ops_per_clock:\s*(\d+)")  # fmt: skip


def gpu_spec(target: str) -> GpuSpec:
    """The `GpuSpec` of "h200" or "b200"."""
    from importlib import resources

    text = resources.files("jaxarena").joinpath("gpu_specs", f"{target}.txtpb").read_text()
    bw = float(re.search(r"memory_bandwidth:\s*(\d+)", text).group(1))
    cores = int(re.search(r"core_count:\s*(\d+)", text).group(1))
    matrix = text[text.index("matrix_unit_description"):]
    by_key = {int(k): 2 * cores * int(u) * int(o) * float(c) * 1e9
              for k, c, u, o in _RATE.findall(matrix)}  # fmt: skip
    peaks = {d: by_key[k] for d, k in _PRIMITIVE.items() if k in by_key}
    return GpuSpec(target, bw, peaks)


# -- a step -------------------------------------------------------------------------------------


@dataclasses.dataclass
class StepCost:
    """What `step_cost` finds for one compiled step (see the module docstring).

    Attributes:
      kernels: one row per kernel, dearest first.
      segments: the graph segments (`Segment`); per call: `sum(s.times for s in segments)`.
      bytes_moved, flops: per call, all kernels.
      kernel_seconds: sum over kernels of `max(bytes / bandwidth, flops / peak)`.
      launch_seconds: `LAUNCH_SECONDS` per segment per call.
      graphs_from: "xla" (the command buffers XLA formed) or "rule" (XLA's rule applied to
        the thunk sequence: the dump had no sequence after the thunk passes).
    """

    kernels: list[KernelRow]
    segments: list[Segment]
    bytes_moved: int
    flops: int
    kernel_seconds: float
    launch_seconds: float
    graphs_from: str

    @property
    def graph_segments(self) -> int:
        """Graph launches plus launches outside every graph, per call."""
        return sum(s.times for s in self.segments)

    @property
    def modeled_seconds(self) -> float:
        """Kernel time plus launch time."""
        return self.kernel_seconds + self.launch_seconds

    def splits(self) -> dict[str, int]:
        """What ended the segments, per call: label -> count."""
        c: Counter[str] = Counter()
        for s in self.segments:
            c[s.ended_by] += s.times
        return dict(c.most_common())

    def undeclared(self) -> list[str]:
        """Pallas kernels counted without a usable declared cost."""
        return sorted({k.name for k in self.kernels if k.how in ("undeclared", "ambiguous")})


def _kernel_walk(thunks: Sequence[Any], times: int, out: list[tuple[Any, int]]) -> None:
    for t in thunks:
        if t.kind in _SKIP or t.kind in ("kInfeed", "kOutfeed"):
            continue
        if t.kind in _CONTAINERS:
            for _, ch, n in _sections(t, times):
                _kernel_walk(ch, n, out)
        else:
            out.append((t, times))


def step_cost(hlo_text: str, thunks: Sequence[Any], names: dict[int, str], spec: GpuSpec,
              workload: Workload, *, graphs: bool) -> StepCost:  # fmt: skip
    """Bytes, flops, segments and modeled time of a compiled step.

    Args:
      hlo_text: the optimized HLO module.
      thunks: its thunk tree (`jaxarena.gpu_dump.parse_thunk_sequence`, trip counts attached).
      names: thunk id -> HLO instruction name (the thunk metadata's profile annotations).
      spec: the target (`gpu_spec`); workload: the assumed runtime lengths.
      graphs: `thunks` is the sequence after XLA's thunk passes (see `segments`).
    """
    module = _Module(hlo_text)
    launched: list[tuple[Any, int]] = []
    _kernel_walk(thunks, 1, launched)
    rows: dict[tuple, KernelRow] = {}
    for t, times in launched:
        ins = module.instrs.get(names.get(t.thunk_id, ""))
        if ins is None:
            cost, dtype, how = KernelCost(0, 0), "", "unknown"
        else:
            cost, dtype, how = module.cost(ins, t.kind, workload)
        seconds = max(cost.bytes / spec.bandwidth, cost.flops / spec.peak(dtype or "bf16"))
        name = t.name if t.kind not in ("kCopy", "kDeviceToDeviceCopy") else "copy"
        key = (name, cost.bytes, cost.flops, how)
        if key in rows:
            rows[key].launches += times
            rows[key].seconds += times * seconds
        else:
            rows[key] = KernelRow(name or t.kind, times, cost.bytes, cost.flops,
                                  times * seconds, how)  # fmt: skip
    kernels = sorted(rows.values(), key=lambda r: -r.seconds)
    segs = segments(thunks, names, graphs=graphs)
    return StepCost(
        kernels=kernels, segments=segs,
        bytes_moved=sum(r.bytes * r.launches for r in kernels),
        flops=sum(r.flops * r.launches for r in kernels),
        kernel_seconds=sum(r.seconds for r in kernels),
        launch_seconds=LAUNCH_SECONDS * sum(s.times for s in segs),
        graphs_from="xla" if graphs else "rule",
    )  # fmt: skip
