"""Compile for an NVIDIA GPU without one: deviceless ahead-of-time compilation, footprints,
kernel launches and per-kernel registers.

With the CUDA PJRT plugin installed (`pip install "jax[cuda13-local]"` at jaxlib's version) and
`JAX_PLATFORMS=cpu`, JAX can build a compile-only device from a target description. XLA's whole
GPU pipeline then runs on the CPU machine: fusion, buffer assignment, Triton to PTX, and
`ptxas`. What comes out is what an H200 (or B200) would run:

    from jaxarena.gpu_aot import compile_for_gpu
    res = compile_for_gpu(step, arena_sds, x_sds, donate_argnums=0, dump_dir=True)
    res.temp_bytes, res.alias_bytes      # the GPU footprint beside the arguments
    res.launches                         # kernels + copies + memsets per call
    res.kernels                          # registers / spills per kernel (ptxas -v)

Pallas kernels must be traced with `interpret=False` (the backend JAX sees is the CPU).

Target descriptions are openxla/xla's device specs (`jaxarena/gpu_specs/*.txtpb`, see the
source commit in each file), with fields jaxlib 0.10.2 does not know removed.

What counts as a launch (`GpuCompiled.launches`): every operation the host puts on a GPU
stream per call of the executable, taken from XLA's thunk sequence: a kernel (an XLA fusion, a
Triton/Pallas kernel, a library call such as a cuBLAS GEMM or another custom call), a device
copy (`kCopy`, a memcpy) and a memset. Control flow (`kWhile`, `kConditional`, `kSequential`,
`kCommandBuffer`) is not a launch itself; its contents are, a while loop's body counted
`trip_count` times and its condition `trip_count + 1` times (XLA's `known_trip_count`), a
conditional's largest branch once. Kinds not known to this module are counted as launches and
listed in `GpuCompiled.unknown_thunk_kinds`, so a count is never low by omission.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from typing import Any

import jax
import numpy as np

from jaxarena.gpu_dump import (
    GpuUnavailable,
    KernelResources,
    Thunk,
    analyze_dump,
    count_launches,
    dump_kernels,
    parse_ptxas_output,
    parse_thunk_sequence,
    ptxas_resources,
    walk,
)

__all__ = [
    "TARGETS",
    "GpuCompiled",
    "GpuUnavailable",
    "KernelResources",
    "RegisterSpillError",
    "Thunk",
    "abstract_gpu",
    "compile_for_gpu",
    "count_launches",
    "gpu_device",
    "gpu_devices",
    "gpu_mesh",
    "on_gpu",
    "parse_ptxas_output",
    "parse_thunk_sequence",
    "ptxas_resources",
    "target_config",
    "walk",
]

TARGETS: dict[str, tuple[str, str]] = {
    "h200": ("h200.txtpb", "NVIDIA H200"),
    "b200": ("b200.txtpb", "NVIDIA B200"),
}
"""target name -> (spec file under `jaxarena/gpu_specs`, device kind for the abstract mesh)."""

# XLA flag that turns a register spill reported by ptxas into a compile error.
_NO_SPILLS_OPTION = "xla_gpu_fail_ptx_compilation_on_register_spilling"
# XLA option value that dumps each module's PTX and no other emitter output.
_DUMP_PTX_ONLY = "ptx"


class RegisterSpillError(RuntimeError):
    """Compilation failed because a kernel spills registers (the no-spill switch was on).

    Attributes:
      kernels: per-kernel resources from `ptxas -v` when a dump was requested (else empty), so
        the failing kernel and its spill bytes can be named.
    """

    def __init__(self, message: str, kernels: Sequence[KernelResources] = ()) -> None:
        super().__init__(message)
        self.kernels = list(kernels)


# -- the device -----------------------------------------------------------------------------


def _check_target(target: str) -> str:
    if not isinstance(target, str) or target.lower() not in TARGETS:
        raise ValueError(f"target={target!r} is not one of {sorted(TARGETS)}")
    return target.lower()


def target_config(target: str = "h200") -> str:
    """The `GpuTargetConfigProto` text of `target` ("h200" or "b200"), from the package data."""
    filename, _ = TARGETS[_check_target(target)]
    return resources.files("jaxarena").joinpath("gpu_specs", filename).read_text()


def _cuda_plugin_module() -> str | None:
    for name in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except (ImportError, ValueError):
            continue
    return None


def _register_cuda_plugin_for_topology(module_name: str) -> None:
    """Registers the CUDA plugin's topology factory after its CUDA check failed.

    Without a GPU the plugin's import-time check of the CUDA libraries fails unless
    `JAX_PLATFORMS` excludes CUDA, and then no CUDA topology exists. The backends are
    initialized first (so the late registration cannot add a CUDA backend that would fail
    later), then the plugin registers with its library check skipped: this only makes the
    compile-only topology available.
    """
    import importlib

    jax.devices()  # initialize (and freeze) the backends first
    plugin = importlib.import_module(module_name)
    old = os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK")
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
    try:
        plugin.initialize()
    finally:
        if old is None:
            os.environ.pop("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", None)
        else:
            os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = old


@functools.cache
def gpu_device(target: str = "h200") -> Any:
    """A compile-only device of the given GPU: arrays cannot live there, programs compile for it.

    Made with `jax.experimental.topologies.get_topology_desc(platform="cuda",
    target_config=..., topology="1x1x1")`. Works on a CPU-only machine with the CUDA PJRT
    plugin installed; run with `JAX_PLATFORMS=cpu` there (otherwise the plugin's CUDA check
    fails at import; this function then retries the registration with the check skipped).

    Raises:
      GpuUnavailable: the CUDA plugin is missing or cannot make a topology; the reason says
        which and how to fix it.
      ValueError: unknown `target`.
    """
    return _make_devices(_check_target(target), 1)[0]


def gpu_devices(target: str = "h200", n: int = 1) -> tuple[Any, ...]:
    """`n` compile-only devices of the given GPU in one host (topology `1x1xn`), for programs
    sharded over them (`gpu_mesh`, `compile_for_gpu(mesh=...)`); as `gpu_device` otherwise.
    The same `(target, n)` gives the same device objects (meshes over them compare equal).

    Raises:
      GpuUnavailable: as `gpu_device`. ValueError: unknown `target`, `n` not a positive int.
    """
    target = _check_target(target)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be a positive int (compile-only devices)")
    return _cached_devices(target, n)


@functools.cache
def _cached_devices(target: str, n: int) -> tuple[Any, ...]:
    return _make_devices(target, n)


def _make_devices(target: str, n: int) -> tuple[Any, ...]:
    from jax.experimental import topologies

    text = target_config(target)

    def make() -> tuple[Any, ...]:
        topo = topologies.get_topology_desc(platform="cuda", target_config=text,
                                            topology=f"1x1x{n}")  # fmt: skip
        return tuple(topo.devices)

    module_name = _cuda_plugin_module()
    if module_name is None:
        raise GpuUnavailable(
            "the CUDA PJRT plugin is not installed (no jax_plugins.xla_cuda13 or xla_cuda12); "
            'install the deviceless-report extra: pip install "jaxarena[gpu-aot]" (that is '
            f'jax[cuda13-local], which must match jaxlib {jax.__version__})'
        )
    try:
        return make()
    except NotImplementedError as first:
        # "topology not implemented for cuda": the plugin did not register.
        try:
            _register_cuda_plugin_for_topology(module_name)
            return make()
        except Exception as e:  # noqa: BLE001 - any failure here means: no GPU compiles
            raise GpuUnavailable(
                f"{module_name} is installed but registered no CUDA topology ({first}); "
                f"registering it again failed with {type(e).__name__}: {e}. Without a GPU run "
                "with JAX_PLATFORMS=cpu, and install jax-cuda13-plugin and jax-cuda13-pjrt at "
                f"exactly jaxlib's version ({jax.__version__})"
            ) from e
    except Exception as e:  # noqa: BLE001
        raise GpuUnavailable(
            f"{module_name} could not make a {target} topology: {type(e).__name__}: {e}. "
            "Check that jax-cuda13-plugin and jax-cuda13-pjrt match jaxlib "
            f"({jax.__version__}) and that ptxas (CUDA 12.8+/13) is on PATH or CUDA_ROOT"
        ) from e


def gpu_mesh(n: int, target: str = "h200", axis: str = "tp") -> jax.sharding.Mesh:
    """A one-axis mesh (`axis`) of `n` compile-only `target` devices (`gpu_devices`)."""
    return jax.sharding.Mesh(np.asarray(gpu_devices(target, n), dtype=object), (axis,))


@contextlib.contextmanager
def abstract_gpu(target: str = "h200", mesh: jax.sharding.Mesh | None = None) -> Iterator[None]:
    """Context in which Pallas lowers for `target` though the process has no GPU.

    jax >= 0.11 refuses to lower a Pallas-Triton call with no GPU unless an abstract GPU device
    is set; it reads only the abstract mesh's device. A one-device `AxisType.Auto` mesh is
    used (with `Explicit` axes the arena writes fail with a sharding mismatch). jax 0.10.2 has
    the same names (`jax.sharding.AbstractMesh`, `AbstractDevice`, `AxisType`,
    `use_abstract_mesh`) and is unaffected by it; on jax 0.8.x (whose `AbstractDevice` takes no
    platform) this context does nothing. With `mesh` (compile-only devices, `gpu_mesh`) the
    context is that mesh's abstract mesh: a `shard_map` over `mesh` must match it.
    """
    _, kind = TARGETS[_check_target(target)]
    from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

    if mesh is not None:
        with use_abstract_mesh(mesh.abstract_mesh):
            yield
        return

    try:
        device = AbstractDevice(kind, 1, "cuda")
    except TypeError:
        # jax 0.8.x: AbstractDevice has no platform, and Pallas-Triton does not ask for a GPU.
        yield
        return
    mesh = AbstractMesh((1,), ("x",), (AxisType.Auto,), abstract_device=device)
    with use_abstract_mesh(mesh):
        yield


def on_gpu(tree: Any, target: str = "h200", mesh: jax.sharding.Mesh | None = None) -> Any:
    """Replaces every array-like leaf (array, `ShapeDtypeStruct`, numpy array) of `tree` by a
    `ShapeDtypeStruct` placed on `gpu_device(target)`; other leaves are kept as they are.

    With `mesh` (of compile-only devices, `gpu_mesh`): a `ShapeDtypeStruct` that already
    carries a `NamedSharding` over `mesh` keeps it; every other array-like leaf is replicated
    over `mesh` (`PartitionSpec()`).
    """
    if mesh is None:
        sharding = jax.sharding.SingleDeviceSharding(gpu_device(target))
    else:
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def place(leaf: Any) -> Any:
        if mesh is not None and isinstance(leaf, jax.ShapeDtypeStruct):
            own = getattr(leaf, "sharding", None)
            if isinstance(own, jax.sharding.NamedSharding) and own.mesh == mesh:
                return leaf
        if isinstance(leaf, jax.ShapeDtypeStruct | jax.Array | np.ndarray):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        return leaf

    return jax.tree.map(place, tree)


# -- compiling ----------------------------------------------------------------------------------


@dataclasses.dataclass
class GpuCompiled:
    """The result of `compile_for_gpu`.

    Attributes:
      compiled: the `jax.stages.Compiled` (compile-only: it cannot run here).
      target: "h200" or "b200".
      temp_bytes, argument_bytes, output_bytes, alias_bytes: `memory_analysis()` on the GPU.
      hlo_text: the optimized HLO module.
      compile_seconds: trace + lower + compile (ptxas included; the `ptxas -v` analysis not).
      dump_dir: where XLA dumped (None when no dump was asked for or it was temporary).
      thunks: the thunk tree (empty without a dump).
      launches: launches per call (None without a dump or with a while loop of unknown trip
        count); `launches_static`: every thunk once.
      unknown_thunk_kinds: thunk kinds counted as launches though this module does not know
        them.
      kernels: `ptxas -v` resources per kernel (empty without a dump).
      thunk_names: thunk id -> the HLO instruction it runs (empty without a dump).
      graph_thunks: the thunk tree after XLA's thunk passes, its command buffers (CUDA
        graphs) in place; None when the dump has no such sequence.
      dump_hlo_text: the optimized module as dumped ("" without a dump): unlike `hlo_text`
        on jax >= 0.12, it holds the async computations of collectives emitted as kernels.
    """

    compiled: Any
    target: str
    temp_bytes: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    hlo_text: str
    compile_seconds: float
    dump_dir: str | None = None
    thunks: list[Thunk] = dataclasses.field(default_factory=list)
    launches: int | None = None
    launches_static: int | None = None
    unknown_thunk_kinds: tuple[str, ...] = ()
    kernels: list[KernelResources] = dataclasses.field(default_factory=list)
    thunk_names: dict[int, str] = dataclasses.field(default_factory=dict)
    graph_thunks: list[Thunk] | None = None
    dump_hlo_text: str = ""

    def memory_analysis(self) -> dict[str, int]:
        """`{"temp_bytes", "argument_bytes", "output_bytes", "alias_bytes"}` on the GPU."""
        return {
            "temp_bytes": self.temp_bytes,
            "argument_bytes": self.argument_bytes,
            "output_bytes": self.output_bytes,
            "alias_bytes": self.alias_bytes,
        }

    @property
    def pallas_kernels(self) -> list[KernelResources]:
        """The `kernels` that come from `pallas_call`s."""
        return [k for k in self.kernels if k.pallas]

    @property
    def max_spill_bytes(self) -> int:
        """Largest spill store of any kernel (0 when nothing spills or nothing was dumped)."""
        return max((k.spill_store_bytes for k in self.kernels), default=0)


def compile_for_gpu(
    fn: Callable,
    *args: Any,
    target: str = "h200",
    donate_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
    no_spills: bool = True,
    dump_dir: str | os.PathLike | bool | None = None,
    compiler_options: dict[str, Any] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    **kwargs: Any,
) -> GpuCompiled:
    """Compiles `fn(*args, **kwargs)` for `target` on this (CPU-only) machine.

    Array-like leaves of `args`/`kwargs` (arrays, `ShapeDtypeStruct`s) become
    `ShapeDtypeStruct`s on `gpu_device(target)`; nothing is allocated or run. Tracing and
    lowering happen inside `abstract_gpu(target)`. Pallas kernels must be called with
    `interpret=False`.

    Args:
      fn: a plain function (jitted here with `donate_argnums`/`static_argnames`) or a
        `jax.jit`-wrapped one (its own donation and static arguments apply; then leave
        `donate_argnums`/`static_argnames` empty).
      target: "h200" (sm_90a) or "b200" (sm_100a).
      no_spills: compile with `xla_gpu_fail_ptx_compilation_on_register_spilling`: a kernel that
        spills registers fails the compile (`RegisterSpillError`).
      dump_dir: None: no dump, no launch/register analysis. A path: XLA dumps there (give each
        compile its own empty folder) and the dump is analyzed and kept. True: a temporary
        folder, analyzed and removed. The dump is set per compile
        (`compiler_options={"xla_dump_to": ...}`): no XLA_FLAGS, no subprocess needed.
      compiler_options: more XLA options for this compile.
      mesh: None: one device. A mesh of compile-only devices (`gpu_mesh(n, target)`): the
        program is compiled for all of them (SPMD); leaves carrying a `NamedSharding` over
        `mesh` keep it, the others are replicated (`on_gpu`). The memory analysis, launches
        and kernels are then one device's.

    Returns:
      A `GpuCompiled` with the footprint, optimized HLO, and (with a dump) the thunk tree,
      launches per call and `ptxas -v` figures per kernel.

    Raises:
      GpuUnavailable: no compile-only device can be made (see `gpu_device`).
      RegisterSpillError: `no_spills` and a kernel spills; with a dump it carries the
        per-kernel ptxas figures.
    """
    device_target = _check_target(target)
    gpu_device(device_target)  # raise GpuUnavailable before anything else
    if hasattr(fn, "trace"):
        if donate_argnums not in ((), None) or static_argnames not in ((), None):
            raise ValueError(
                "fn is already jitted: give donate_argnums/static_argnames to its jax.jit"
            )
        jitted = fn
    else:
        jitted = jax.jit(fn, donate_argnums=donate_argnums, static_argnames=static_argnames)
    options = dict(compiler_options or {})
    if no_spills:
        options[_NO_SPILLS_OPTION] = True
    temp_dir = None
    if dump_dir is True:
        temp_dir = tempfile.mkdtemp(prefix="jaxarena_gpu_aot_")
        where: str | None = temp_dir
    elif dump_dir in (None, False):
        where = None
    else:
        where = os.fspath(dump_dir)
        os.makedirs(where, exist_ok=True)
    if where is not None:
        options["xla_dump_to"] = where
        # jax >= 0.11 writes a module's PTX into the dump only for emitters matching this
        # regex (jax 0.10.2 always did); "ptx" selects the PTX files alone (".*" would add
        # every Triton pass' IR, several times slower to write).
        options.setdefault("xla_dump_emitter_re", _DUMP_PTX_ONLY)
    try:
        placed_args = on_gpu(args, device_target, mesh)
        placed_kwargs = on_gpu(kwargs, device_target, mesh)
        start = time.perf_counter()
        with abstract_gpu(device_target, mesh):
            lowered = jitted.trace(*placed_args, **placed_kwargs).lower()
        try:
            compiled = lowered.compile(compiler_options=options)
        except Exception as e:  # noqa: BLE001 - XlaRuntimeError and friends
            if no_spills and "spill" in str(e).lower():
                kernels = (
                    dump_kernels(where, sorted(os.listdir(where)), lowered.as_text())
                    if where
                    else []
                )
                spilling = [k for k in kernels if k.spill_store_bytes]
                detail = "".join(
                    f"\n  {k.name}: {k.registers} registers, {k.spill_store_bytes} B spill "
                    f"stores, {k.spill_load_bytes} B spill loads, {k.stack_bytes} B stack"
                    for k in spilling
                )
                raise RegisterSpillError(
                    f"compiling for {device_target} failed: a kernel spills registers "
                    f"({_NO_SPILLS_OPTION}){detail or ' (dump for the per-kernel figures)'}\n"
                    f"XLA said: {str(e)[:2000]}",
                    kernels,
                ) from e
            raise
        seconds = time.perf_counter() - start
        analysis = compiled.memory_analysis()
        if isinstance(analysis, list | tuple):
            analysis = analysis[0]
        result = GpuCompiled(
            compiled=compiled,
            target=device_target,
            temp_bytes=int(analysis.temp_size_in_bytes),
            argument_bytes=int(analysis.argument_size_in_bytes),
            output_bytes=int(analysis.output_size_in_bytes),
            alias_bytes=int(analysis.alias_size_in_bytes),
            hlo_text=compiled.as_text(),
            compile_seconds=seconds,
            dump_dir=where if temp_dir is None else None,
        )
        if where is not None:
            analyze_dump(result, where)
        return result
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
