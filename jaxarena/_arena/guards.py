"""Guard bands: the pattern `allocate` writes after every region, and the check that it is
still there, on one arena, on every device of a sharded arena, and across processes.

A sharded arena is checked by ONE program over its mesh: every device checks its own arena
and flags its broken guards in its own row of a `[mesh devices, regions]` table, and a `psum`
over the mesh gives every device the whole table. Each process then reads a replicated value,
so no process fetches another's arena, and when the mesh spans processes (`jax.distributed`)
the check is a collective: every process runs it and every process gets the same report.
The table has a row per DEVICE, not per shard: where an arena is replicated over some mesh
axes, each copy is checked and only the copies that broke are named.

The functions take the plan (an `ArenaPlan`, duck-typed: `region_list`, `guard_bytes`,
`arena_shape`, `_check_arena`, `_num_shards`) so that this module does not import it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxarena._arena.bytes import load_bytes

__all__ = ["device_names", "guard_pattern", "guard_report"]


def guard_pattern(n: int) -> np.ndarray:
    """The `n` guard bytes: position-dependent, so a stray fill of any one byte value shows."""
    return ((np.arange(n, dtype=np.uint32) * 151 + 0x5A) & 0xFF).astype(np.uint8)


@functools.partial(jax.jit, static_argnums=0)
def _guards_ok(plan: Any, arena: jax.Array) -> jax.Array:
    """`bool[regions]`: whether each region's guard band in ONE arena holds the pattern."""
    plan._check_arena(arena, "check_guards")
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
    plan._num_shards(sharding)
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


def guard_report(plan: Any, arena: Any, *, sharded: bool) -> dict[str, tuple[jax.Device, ...]]:
    """`{region name: devices whose guard after it broke}` (see `ArenaPlan.guard_report`).

    `arena` has been validated by the caller: one arena (`sharded=False`; any array-like,
    placed on a device if it is not on one) or a sharded `jax.Array` of whole arenas.
    """
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


def device_names(devices: Iterable[jax.Device]) -> str:
    """`'device 2049 (process 1), device 3 (process 0)'`."""
    return ", ".join(f"device {d.id} (process {d.process_index})" for d in devices)
