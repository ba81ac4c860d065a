"""Readers of XLA's GPU dumps: the thunk sequence (kernel launches per call) and `ptxas -v`
(registers and spills per kernel). `jaxarena.gpu_aot` uses them after a deviceless compile;
they work as well on the dump of a real GPU compile (`benchmarks/gpu_bandwidth.py`).

What counts as a launch: see `jaxarena.gpu_aot`'s module docstring.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "GpuUnavailable",
    "KernelResources",
    "Thunk",
    "analyze_dump",
    "dump_kernels",
    "count_launches",
    "parse_ptxas_output",
    "parse_thunk_sequence",
    "ptxas_resources",
    "thunk_names",
    "walk",
]

_CONTAINER_KINDS = frozenset({"kWhile", "kConditional", "kSequential", "kCommandBuffer"})
_LAUNCH_KINDS = frozenset(
    {
        # kernels
        "kKernel", "kCustomKernel", "kCustomCall", "kGemm", "kCublasLtMatmul", "kConvolution",
        "kConvolutionReorder", "kCuDnn", "kCudnn", "kFft", "kTriangularSolve", "kCholesky",
        "kNorm", "kFusedMHA", "kTopK", "kDynamicSliceFusion", "kTriton",
        # copies and memsets
        "kCopy", "kDeviceToDeviceCopy", "kCopyDone", "kMemset32BitValue", "kMemzero",
        # collectives (one kernel each on one device)
        "kAllReduce", "kAllGather", "kReduceScatter", "kAllToAll", "kCollectivePermute",
        "kRaggedAllToAll",
    }
)  # fmt: skip
_NON_LAUNCH_KINDS = frozenset(
    {"kWaitForStreams", "kRecordEvent", "kWaitForEvent", "kInfeed", "kOutfeed",
     "kSend", "kSendDone", "kRecv", "kRecvDone", "kHostSend", "kHostRecv"}
)  # fmt: skip


class GpuUnavailable(RuntimeError):
    """No compile-only GPU device can be made here; `reason` says why and how to fix it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- the thunk sequence --------------------------------------------------------------------------


@dataclasses.dataclass
class Thunk:
    """One entry of XLA's thunk sequence (`*.thunk_sequence.txt`).

    Attributes:
      thunk_id: XLA's thunk id (the number before the colon).
      kind: e.g. `kCustomKernel`, `kCopy`, `kWhile`.
      name: the kernel name for kernels (`fp8_block_quant`, `loop_add_fusion`), else "".
      grid, threads: launch dimensions of kernels, else None.
      shared_memory_bytes: dynamic shared memory of kernels, else None.
      sections: for containers, section name (`condition`, `body`, ...) -> child thunks.
      trip_count: for `kWhile`, XLA's known trip count (None when unknown).
    """

    thunk_id: int
    kind: str
    name: str = ""
    grid: tuple[int, ...] | None = None
    threads: tuple[int, ...] | None = None
    shared_memory_bytes: int | None = None
    sections: dict[str, list[Thunk]] = dataclasses.field(default_factory=dict)
    trip_count: int | None = None


_THUNK_LINE = re.compile(r"^(\s*)(\d+):\s+(k\w+)\s*(?:\[[^\]]*\])?\s*(.*?)\s*$")
_HEADER_LINE = re.compile(r"^\s*([A-Za-z][\w ]*?)\s*:\s*$")
# jax 0.12.1's XLA writes the name as `kernel=NAME,`; earlier ones as `NAME`.
_KERNEL_REST = re.compile(
    r"^(?:kernel=)?([^\s,]+),?\s+grid:\s*\[([\d, ]+)\]\s+threads:\s*\[([\d, ]+)\]\s+shared_memory:\s*(\d+)"
)


def parse_thunk_sequence(text: str) -> list[Thunk]:
    """Parses XLA's `*.thunk_sequence.txt` dump into a tree of `Thunk`s (top level returned).

    Nested thunks are indented under their container; a container's sections are introduced by
    header lines (`condition:`, `body:`, `branch 0:`); children before any header land in
    section "".
    """
    top: list[Thunk] = []
    stack: list[tuple[int, Thunk, list[str]]] = []  # (indent, container, [current section])
    pending: str | None = None
    for line in text.splitlines():
        m = _THUNK_LINE.match(line)
        if m is None:
            h = _HEADER_LINE.match(line)
            if h is not None:
                pending = h.group(1)
            continue
        indent, tid, kind, rest = len(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
        thunk = Thunk(tid, kind)
        k = _KERNEL_REST.match(rest)
        if k is not None:
            thunk.name = k.group(1)
            thunk.grid = tuple(int(v) for v in k.group(2).split(","))
            thunk.threads = tuple(int(v) for v in k.group(3).split(","))
            thunk.shared_memory_bytes = int(k.group(4))
        elif rest and kind not in _CONTAINER_KINDS:
            thunk.name = rest.split()[0].removeprefix("kernel=").rstrip(",")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stack:
            _, parent, current = stack[-1]
            if pending is not None:
                current[0] = pending
            parent.sections.setdefault(current[0], []).append(thunk)
        else:
            top.append(thunk)
        pending = None
        if kind in _CONTAINER_KINDS:
            stack.append((indent, thunk, [""]))
    return top


def walk(thunks: Sequence[Thunk]) -> Iterator[Thunk]:
    for t in thunks:
        yield t
        for children in t.sections.values():
            yield from walk(children)


def count_launches(thunks: Sequence[Thunk], *, per_call: bool = True) -> int | None:
    """Launches of a thunk tree (see the module docstring for what counts as a launch).

    With `per_call=False` every thunk counts once (the static count); with `per_call=True`
    while loops are multiplied out by their trip counts, and None is returned when one is
    unknown.
    """
    total = 0
    for t in thunks:
        if t.kind in _NON_LAUNCH_KINDS:
            continue
        if t.kind not in _CONTAINER_KINDS:
            total += 1
            continue
        counts = {name: count_launches(ch, per_call=per_call) for name, ch in t.sections.items()}
        if any(c is None for c in counts.values()):
            return None
        if t.kind == "kWhile" and per_call:
            if t.trip_count is None:
                return None
            n = t.trip_count
            total += n * counts.get("body", 0) + (n + 1) * counts.get("condition", 0)
            total += sum(c for k, c in counts.items() if k not in ("body", "condition"))
        elif t.kind == "kConditional" and per_call:
            total += max(counts.values(), default=0)
        else:
            total += sum(counts.values())
    return total


_METADATA_BLOCK = re.compile(
    r'profile_annotation:\s*"([^"]*)"\s*thunk_id:\s*(\d+)\s*\}\s*thunk_kind:\s*"(\w+)"'
)
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_HLO_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=")


def _while_trip_counts(hlo_text: str) -> dict[str, int]:
    """Known trip counts of the while instructions in optimized HLO text, by name."""
    out = {}
    for line in hlo_text.splitlines():
        if " while(" not in line:
            continue
        name, trip = _HLO_INSTR.match(line), _TRIP_COUNT.search(line)
        if name is not None and trip is not None:
            out[name.group(1)] = int(trip.group(1))
    return out


def thunk_names(metadata_text: str) -> dict[int, str]:
    """Thunk id -> the HLO instruction it runs (`*.thunk_metadata.txt`'s profile annotation)."""
    return {int(tid): ann for ann, tid, _ in _METADATA_BLOCK.findall(metadata_text)}


def _attach_trip_counts(thunks: list[Thunk], metadata_text: str, hlo_text: str) -> None:
    names = thunk_names(metadata_text)
    trips = _while_trip_counts(hlo_text)
    for t in walk(thunks):
        if t.kind == "kWhile":
            t.trip_count = trips.get(names.get(t.thunk_id, ""))


# -- ptxas ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """What `ptxas -v` reports for one kernel (entry function).

    Attributes:
      name: the kernel's entry name (a Pallas kernel's `name=`, or an XLA fusion's name).
      registers: registers per thread.
      spill_store_bytes, spill_load_bytes: per thread (0 when nothing spills).
      stack_bytes: the stack frame per thread.
      static_smem_bytes: statically declared shared memory (Triton's is dynamic: see
        `Thunk.shared_memory_bytes`).
      pallas: whether the kernel comes from a Pallas `pallas_call` (a Triton custom call).
    """

    name: str
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    static_smem_bytes: int
    pallas: bool = False


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_PROPS = re.compile(r"Function properties for (\S+)")
_PTXAS_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas_output(text: str) -> list[KernelResources]:
    """Parses `ptxas -v` output (stderr) into one `KernelResources` per entry function."""
    out: list[KernelResources] = []
    entry: str | None = None
    props_for: str | None = None
    frame = (0, 0, 0)
    for line in text.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            entry, frame = m.group(1), (0, 0, 0)
        elif m := _PTXAS_PROPS.search(line):
            props_for = m.group(1)
        elif (m := _PTXAS_FRAME.search(line)) and props_for == entry:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _PTXAS_USED.search(line)) and entry is not None:
            out.append(
                KernelResources(
                    name=entry,
                    registers=int(m.group(1)),
                    spill_store_bytes=frame[1],
                    spill_load_bytes=frame[2],
                    stack_bytes=frame[0],
                    static_smem_bytes=int(m.group(2) or 0),
                )
            )
            entry = None
    return out


_PTX_TARGET = re.compile(r"^\s*\.target\s+(sm_\w+)", re.MULTILINE)


def ptxas_resources(
    ptx_path: str | os.PathLike, *, ptxas: str | None = None
) -> list[KernelResources]:
    """Runs `ptxas -v` on a PTX file (for the `.target` it declares) and parses the report.

    `ptxas` defaults to the one on PATH, else `$CUDA_ROOT/bin/ptxas`.

    Raises:
      GpuUnavailable: no ptxas found.
      RuntimeError: ptxas failed on the file.
    """
    exe = ptxas or shutil.which("ptxas")
    if exe is None and os.environ.get("CUDA_ROOT"):
        cand = os.path.join(os.environ["CUDA_ROOT"], "bin", "ptxas")
        exe = cand if os.path.exists(cand) else None
    if exe is None:
        raise GpuUnavailable("ptxas is not on PATH (nor in $CUDA_ROOT/bin)")
    with open(ptx_path) as f:
        text = f.read()
    m = _PTX_TARGET.search(text)
    if m is None:
        raise RuntimeError(f"{ptx_path}: no .target directive, not a PTX file?")
    proc = subprocess.run(
        [exe, "-v", f"--gpu-name={m.group(1)}", os.fspath(ptx_path), "-o", os.devnull],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed on {ptx_path}:\n{proc.stderr[-4000:]}")
    return parse_ptxas_output(proc.stderr + proc.stdout)


# -- a dump folder ------------------------------------------------------------


_PALLAS_NAME = re.compile(
    r'custom_call_target="__gpu\$xla\.gpu\.triton".*?\bname\s*=\s*"([^"\\]+)"'
)


def _pallas_kernel_names(hlo_text: str) -> set[str]:
    return {m.group(1) for m in _PALLAS_NAME.finditer(hlo_text)}


def _latest(paths: list[str]) -> str | None:
    # module_NNNN.<name>...: XLA numbers modules in compile order within a process.
    return max(paths, key=lambda p: (os.path.basename(p).split(".")[0], p)) if paths else None


def analyze_dump(result: Any, dump_dir: str) -> None:
    """Fills `result.thunks`, `thunk_names`, `graph_thunks` (the sequence after XLA's thunk
    passes, when dumped), `launches`, `launches_static`, `unknown_thunk_kinds` and `kernels`
    (a `gpu_aot.GpuCompiled`, or any object with those attributes and `hlo_text`)
    from an XLA dump folder of one compile (the newest module in it)."""
    files = sorted(os.listdir(dump_dir))
    seq = _latest([os.path.join(dump_dir, f) for f in files if f.endswith(".thunk_sequence.txt")])
    if seq is not None:
        module = os.path.basename(seq).split(".")[0]
        meta = os.path.join(dump_dir, os.path.basename(seq).replace(
            ".thunk_sequence.txt", ".thunk_metadata.txt"))  # fmt: skip
        with open(seq) as f:
            thunks = parse_thunk_sequence(f.read())
        meta_text = open(meta).read() if os.path.exists(meta) else ""
        _attach_trip_counts(thunks, meta_text, result.hlo_text)
        result.thunks = thunks
        result.thunk_names = thunk_names(meta_text)
        # After XLA's thunk passes: the command buffers (CUDA graphs) it formed, if dumped.
        after = seq.replace(".thunk_sequence.txt", ".thunk_sequence_after_thunk_passes.txt")
        if os.path.exists(after):
            with open(after) as f:
                result.graph_thunks = parse_thunk_sequence(f.read())
            _attach_trip_counts(result.graph_thunks, meta_text, result.hlo_text)
        result.launches = count_launches(thunks, per_call=True)
        result.launches_static = count_launches(thunks, per_call=False)
        result.unknown_thunk_kinds = tuple(
            sorted(
                {t.kind for t in walk(thunks)}
                - _LAUNCH_KINDS
                - _CONTAINER_KINDS
                - _NON_LAUNCH_KINDS
            )
        )
        files = [f for f in files if f.startswith(module + ".")]
        # The optimized module as dumped: jax >= 0.12 leaves the async computations of its
        # collective kernels out of `Compiled.as_text()`, and the thunks name what is inside.
        opt = [f for f in files if f.endswith("gpu_after_optimizations.txt")]
        if opt and hasattr(result, "dump_hlo_text"):
            with open(os.path.join(dump_dir, opt[0])) as f:
                result.dump_hlo_text = f.read()
    result.kernels = dump_kernels(dump_dir, files, result.hlo_text)
    missing = _pallas_kernel_names(result.hlo_text) - {k.name for k in result.kernels}
    if missing:
        raise RuntimeError(
            f"the dump in {dump_dir} has no PTX for the Pallas kernels {sorted(missing)}: "
            "XLA did not dump their PTX (jax >= 0.11 dumps PTX only with "
            f"xla_dump_emitter_re matching 'ptx'; files seen: {len(files)})"
        )


def dump_kernels(dump_dir: str, files: list[str], hlo_text: str) -> list[KernelResources]:
    """`ptxas -v` resources of the PTX `files` in `dump_dir`, Pallas kernels marked."""
    pallas = _pallas_kernel_names(hlo_text)
    kernels: list[KernelResources] = []
    for f in files:
        path = os.path.join(dump_dir, f)
        if f.endswith(".ptx") and os.path.getsize(path) > 0:
            kernels += ptxas_resources(path)
    return [dataclasses.replace(k, pallas=k.name in pallas) for k in kernels]
