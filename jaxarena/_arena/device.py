"""The arena as a `jax.Array`: allocating a plan's arena, typed views and in-place writes of its
regions, the arena-side check of a kernel's arena form, and the guard bands.

`ArenaPlan`'s array methods import this module on first use, so that layouts, packing, sizing
and the pictures (`jaxarena plan`, `budget`, `fit`) never import jax, which costs about 0.6 s
of such a command. The functions take the plan duck-typed (`region_list`, `region`,
`regions`, `arena_shape`, `total_bytes`, `guard_bytes`) so that this module does not import
`plan.py`.

Guard bands: `allocate` writes a position-dependent pattern after every region. A sharded arena
is checked by ONE program over its mesh: every device checks its own arena and flags its
broken guards in its own row of a `[mesh devices, regions]` table, and a `psum` over the mesh
gives every device the whole table. Each process then reads a replicated value, so no process
fetches another's arena, and when the mesh spans processes (`jax.distributed`) the check is a
collective: every process runs it and every process gets the same report. The table has a row
per DEVICE, not per shard: where an arena is replicated over some mesh axes, each copy is
checked and only the copies that broke are named.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxarena._arena.bytes import (
    ROW_BYTES,
    from_bytes,
    load_bytes,
    static_shape,
    store_bytes,
    to_bytes,
    view_dtype,
)
from jaxarena._arena.record import emit
from jaxarena._errors import ArenaError, GuardError
from jaxarena._units import format_bytes

# The largest arena: 2^31 rows of ROW_BYTES (row indices are int32), 512 GiB. Far
# below 2^63, the size at which XLA aborts the process instead of raising.
MAX_ARENA_BYTES = (1 << 31) * ROW_BYTES


# -- allocation ---------------------------------------------------------------------------------


def allocate(plan: Any, device: Any = None, sharding: Any = None) -> jax.Array:
    """`ArenaPlan.allocate`: the zero-filled arena with its guard bands written."""
    if device is not None and sharding is not None:
        raise ArenaError("pass device= or sharding=, not both")
    if device is not None and not isinstance(device, jax.Device):
        raise ArenaError(
            f"device={device!r} must be a jax.Device (e.g. jax.devices()[0]), got "
            f"{type(device).__name__}"
        )
    if sharding is not None:
        shards = num_shards(sharding)  # validates the sharding before anything is allocated
        targets = list(sharding.addressable_devices)
    else:
        targets = [device if device is not None else jax.devices()[0]]
    check_allocatable(plan, targets)
    init = functools.partial(_init_local, plan)
    if sharding is None:
        out = jax.sharding.SingleDeviceSharding(device) if device is not None else None
        return jax.jit(init, out_shardings=out)()
    rows, row_bytes = plan.arena_shape
    fill = jax.jit(
        jax.shard_map(init, mesh=sharding.mesh, in_specs=(), out_specs=sharding.spec),
        out_shardings=sharding,
    )
    arena = fill()
    assert arena.shape == (shards * rows, row_bytes)
    return arena


def sharding_for(mesh: jax.sharding.Mesh, axis_names: Any = None) -> jax.sharding.NamedSharding:
    """`ArenaPlan.sharding`: every device of `mesh` (or of `axis_names`) gets its own arena."""
    axes = tuple(mesh.axis_names) if axis_names is None else axis_names
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(axes))


def check_allocatable(plan: Any, devices: list[Any]) -> None:
    """`ArenaError` before allocating an arena no device could hold or index.

    Three bounds, all checked before anything is allocated (XLA aborts the whole process, with
    no exception, for a buffer of 2^63 bytes or more): the bytes must fit a signed 64-bit size;
    the rows must fit int32 (views and writes index rows with int32, so an arena holds at most
    2^31 rows of `ROW_BYTES`, 512 GiB); and the arena must fit each device's memory where JAX
    reports it (`memory_stats()["bytes_limit"]`).
    """
    total = plan.total_bytes
    if total > MAX_ARENA_BYTES:
        raise ArenaError(
            f"allocate: the arena is {total:,} bytes ({format_bytes(total)}), more than an "
            f"arena can be ({format_bytes(MAX_ARENA_BYTES)}: rows are int32-indexed, "
            f"{ROW_BYTES} bytes each); lower the serve limits (max_batch_tokens, ...)"
        )
    for d in devices:
        try:
            stats = d.memory_stats()
        except Exception:  # backends without memory statistics
            stats = None
        limit = (stats or {}).get("bytes_limit")
        if isinstance(limit, int) and 0 < limit < total:
            raise ArenaError(
                f"allocate: the arena is {total:,} bytes ({format_bytes(total)}) but {d} "
                f"reports {limit:,} bytes ({format_bytes(limit)}) of memory; lower the serve "
                "limits"
            )


def num_shards(sharding: Any) -> int:
    """How many whole arenas a sharding of the arena holds (its dimension-0 partitions)."""
    if not isinstance(sharding, jax.sharding.NamedSharding):
        raise ArenaError(
            f"sharding must be a jax.sharding.NamedSharding, got {type(sharding).__name__}"
        )
    spec = tuple(sharding.spec) + (None, None)
    if spec[1] is not None:
        raise ArenaError(f"sharding spec {sharding.spec} must not partition dimension 1")
    axes = spec[0]
    if axes is None:
        raise ArenaError(
            f"sharding spec {sharding.spec} must partition dimension 0 (one arena per "
            "device); use plan.sharding(mesh)"
        )
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(sharding.mesh.shape[a] for a in axes)


def _init_local(plan: Any) -> jax.Array:
    arena = jnp.zeros(plan.arena_shape, jnp.uint8)
    if plan.guard_bytes:
        pattern = jnp.asarray(guard_pattern(plan.guard_bytes))
        for r in plan.region_list:
            arena = store_bytes(arena, r.end_bytes, pattern)
    return arena


# -- views and writes ---------------------------------------------------------------------------


def _shape_dtype(arena: Any) -> tuple[tuple[int, ...], Any]:
    return tuple(getattr(arena, "shape", ())), getattr(arena, "dtype", None)


def _is_plans_arena(plan: Any, arena: Any) -> bool:
    """Whether `arena` has the plan's arena shape and dtype (`uint8[arena_shape]`)."""
    shape, dtype = _shape_dtype(arena)
    return shape == plan.arena_shape and dtype == jnp.uint8


def check_arena(plan: Any, arena: Any, what: str) -> None:
    """`ArenaError` unless `arena` has this plan's arena shape and dtype."""
    if not _is_plans_arena(plan, arena):
        shape, dtype = _shape_dtype(arena)
        raise ArenaError(
            f"{what}: arena is {dtype}{list(shape)}, expected uint8{list(plan.arena_shape)}"
            " (a different plan's arena, or a sharded global array outside shard_map?)"
        )


def fit_problems(plan: Any, uses: tuple[tuple[Any, ...], ...], arena: Any, what: str) -> list[str]:
    """The problems `ArenaPlan.check_fits` reports, one line each (empty when it all fits)."""
    problems = []
    for use in uses:
        name, shape, dtype, *note = use
        region = plan.regions.get(name) if isinstance(name, str) else None
        dims = static_shape(shape, f"{what}: region {name!r}")
        dt = view_dtype(dtype, f"{what}: region {name!r}")
        nbytes = math.prod(dims) * dt.itemsize
        extra = f" ({note[0]})" if note else ""
        if region is None:
            problems.append(f"region {name!r} is not in the plan (needs {nbytes} bytes{extra})")
        elif nbytes > region.nbytes:
            problems.append(
                f"region {name!r} holds {region.nbytes} bytes but {dt.name}{list(dims)} "
                f"needs {nbytes}{extra}"
            )
    if arena is not None and not _is_plans_arena(plan, arena):
        shape, dtype = _shape_dtype(arena)
        problems.append(
            f"arena must be the plan's uint8{list(plan.arena_shape)} array, got "
            f"{dtype}{list(shape)}"
        )
    return problems


def view(plan: Any, arena: jax.Array, name: str, shape: Any, dtype: Any) -> jax.Array:
    """`ArenaPlan.view`: the start of region `name` as a `dtype` array of `shape`."""
    check_arena(plan, arena, f"view({name!r})")
    region = plan.region(name)
    shape = static_shape(shape, f"view({name!r})")
    dtype = view_dtype(dtype, f"view({name!r})")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > region.nbytes:
        raise ArenaError(
            f"view({name!r}, shape={shape}, dtype={dtype.name}) needs {nbytes} bytes but the "
            f"region holds {region.nbytes}"
        )
    emit("view", name)
    if nbytes == 0:
        return jnp.zeros(shape, dtype)
    return from_bytes(load_bytes(arena, region.offset_bytes, nbytes), shape, dtype)


def write(plan: Any, arena: jax.Array, name: str, value: Any) -> jax.Array:
    """`ArenaPlan.write`: the arena with `value`'s bytes at the start of region `name`."""
    check_arena(plan, arena, f"write({name!r})")
    region = plan.region(name)
    if hasattr(value, "dtype"):  # before jnp.asarray silently narrows a 64-bit array
        view_dtype(value.dtype, f"write({name!r})")
    value = jnp.asarray(value)
    dtype = view_dtype(value.dtype, f"write({name!r})")
    nbytes = value.size * dtype.itemsize
    if nbytes > region.nbytes:
        raise ArenaError(
            f"write({name!r}) of {dtype.name}{list(value.shape)} needs {nbytes} bytes but "
            f"the region holds {region.nbytes}"
        )
    emit("write", name)
    if nbytes == 0:
        return arena
    return store_bytes(arena, region.offset_bytes, to_bytes(value))


# -- guard bands --------------------------------------------------------------------------------


def guard_pattern(n: int) -> np.ndarray:
    """The `n` guard bytes: position-dependent, so a stray fill of any one byte value shows."""
    return ((np.arange(n, dtype=np.uint32) * 151 + 0x5A) & 0xFF).astype(np.uint8)


@functools.partial(jax.jit, static_argnums=0)
def _guards_ok(plan: Any, arena: jax.Array) -> jax.Array:
    """`bool[regions]`: whether each region's guard band in ONE arena holds the pattern."""
    check_arena(plan, arena, "check_guards")
    pattern = jnp.asarray(guard_pattern(plan.guard_bytes))
    return jnp.stack(
        [jnp.all(load_bytes(arena, r.end_bytes, plan.guard_bytes) == pattern)
         for r in plan.region_list]
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def _sharded_broken(plan: Any, sharding: jax.sharding.NamedSharding):
    """A jitted `arena -> int32[mesh devices, regions]` table of broken guards, replicated.

    Cached per (plan, sharding), so checking the same arena again does not compile again.
    """
    num_shards(sharding)
    mesh = sharding.mesh
    names = tuple(mesh.axis_names)

    def local(a: jax.Array) -> jax.Array:
        mine = (~_guards_ok(plan, a)).astype(jnp.int32)
        table = jnp.zeros((mesh.size, mine.shape[0]), jnp.int32)
        return lax.psum(table.at[lax.axis_index(names)].set(mine), names)

    # check_vma=False: an arena replicated over some mesh axes is typed invariant there, yet
    # each device's own copy is checked; the psum adds up the per-device rows.
    return jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(sharding.spec,),
                      out_specs=jax.sharding.PartitionSpec(), check_vma=False)
    )  # fmt: skip


def guard_report(plan: Any, arena: Any) -> dict[str, tuple[jax.Device, ...]]:
    """`ArenaPlan.guard_report`: `{region name: devices whose guard after it broke}`."""
    if not plan.guard_bytes:
        raise ArenaError("check_guards: this plan has no guard bands (guard_bytes=0)")
    shape, dtype = _shape_dtype(arena)
    rows = plan.arena_shape[0]
    sharded = (
        isinstance(arena, jax.Array)
        and isinstance(getattr(arena, "sharding", None), jax.sharding.NamedSharding)
        and len(shape) == 2
        and shape[1] == ROW_BYTES
        and shape[0] > rows
        and shape[0] % rows == 0
    )
    if dtype != jnp.uint8 or (shape != plan.arena_shape and not sharded):
        raise ArenaError(
            f"check_guards: arena is {dtype}{list(shape)} ({type(arena).__name__}), "
            f"expected this plan's uint8{list(plan.arena_shape)} array, or a sharded "
            f"jax.Array of uint8[k * {rows}, {ROW_BYTES}] (plan.allocate(sharding=...))"
        )
    if sharded:
        broken = np.asarray(_sharded_broken(plan, arena.sharding)(arena)) > 0
        devices = list(arena.sharding.mesh.devices.flat)
    else:
        arena = jnp.asarray(arena)
        broken = ~np.asarray(_guards_ok(plan, arena))[None]
        devices = sorted(arena.sharding.device_set, key=lambda d: d.id)[:1]
    return {
        r.name: tuple(devices[k] for k in np.flatnonzero(broken[:, i]))
        for i, r in enumerate(plan.region_list)
        if broken[:, i].any()
    }


def check_guards(plan: Any, arena: Any, strict: bool) -> list[str]:
    """`ArenaPlan.check_guards`: the regions whose guard broke; `GuardError` when `strict`."""
    report = guard_report(plan, arena)
    if strict and report:
        raise GuardError("guard bands overwritten after regions: " + "; ".join(
            f"{name} on {device_names(devs)}" for name, devs in report.items()
        ))  # fmt: skip
    return list(report)


def device_names(devices: Iterable[jax.Device]) -> str:
    """`'device 2049 (process 1), device 3 (process 0)'`."""
    return ", ".join(f"device {d.id} (process {d.process_index})" for d in devices)
