"""`ArenaPlan`: where every buffer lives in the one arena array, and the pure functions that
allocate it, view a region as a typed array, write a region in place and check guard bands.

The arena is ONE `uint8` `jax.Array` of shape `(rows, ROW_BYTES)`. It is 2-D on purpose: on
CPU, a jitted `lax.dynamic_update_slice` into a 1-D `uint8` array of more than 2^31 elements
crashes the process, and a 2-D array of the same bytes works; with 256-byte rows every row
index stays below 2^31 for arenas up to 512 GiB, so no offset needs `jax_enable_x64`.
Views and writes use static offsets only: the layout is static metadata, the buffer is the
only array.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxarena._arena import packing
from jaxarena._arena.lifetimes import Lifetimes
from jaxarena._arena.record import emit
from jaxarena._errors import ArenaError
from jaxarena._units import ROW_BYTES, as_index, format_bytes, plural
from jaxarena._units import is_pow2 as _is_pow2
from jaxarena._units import round_up as _round_up
from jaxarena._units import size_items as _size_items

__all__ = ["ArenaPlan", "Region"]


@dataclasses.dataclass(frozen=True)
class Region:
    """One buffer's place in the arena: bytes `[offset_bytes, offset_bytes + nbytes)`.

    When the plan has guard bands, `[end_bytes, end_bytes + guard_bytes)` follows the region.
    """

    name: str
    offset_bytes: int
    nbytes: int

    def __post_init__(self) -> None:
        for field in ("offset_bytes", "nbytes"):  # np.int64 and friends become ints
            object.__setattr__(self, field, as_index(getattr(self, field)))

    @property
    def end_bytes(self) -> int:
        return self.offset_bytes + self.nbytes


if TYPE_CHECKING:
    import jax


def _device() -> types.ModuleType:
    """`jaxarena._arena.device`, the plan's array operations. Imported here, on first use, so
    that layouts, packing, sizing and pictures run without importing jax (~0.6 s)."""
    from jaxarena._arena import device

    return device


def _is_count(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _field_problems(plan: Any) -> list[str]:
    """Type and sign problems of an `ArenaPlan`'s fields and regions (every one listed)."""
    problems = []
    if not _is_count(plan.total_bytes) or plan.total_bytes < ROW_BYTES:
        problems.append(
            f"total_bytes={plan.total_bytes!r} must be an int >= {ROW_BYTES} (one arena row)"
        )
    if not _is_count(plan.align_bytes):
        problems.append(f"align_bytes={plan.align_bytes!r} must be an int (a power of two)")
    if not _is_count(plan.guard_bytes) or plan.guard_bytes < 0:
        problems.append(f"guard_bytes={plan.guard_bytes!r} must be an int >= 0")
    if not isinstance(plan.region_list, tuple):
        problems.append(f"region_list must be a tuple of Region, got {type(plan.region_list)}")
        return problems
    for r in plan.region_list:
        if not isinstance(r, Region):
            problems.append(f"region_list entry {r!r} is not a Region")
            continue
        if not isinstance(r.name, str) or not r.name:
            problems.append(f"region name {r.name!r} must be a non-empty str")
        for field in ("offset_bytes", "nbytes"):
            v = getattr(r, field)
            if not _is_count(v) or v < 0:
                problems.append(f"region {r.name!r} {field}={v!r} must be an int >= 0")
    return problems


@dataclasses.dataclass(frozen=True, eq=False)
class ArenaPlan:
    """A static layout of named regions in one byte arena.

    Build one with `ArenaPlan.sequential(sizes)` (every buffer its own region) or
    `ArenaPlan.packed(sizes, lifetimes)` (buffers never live together share bytes). The plan
    is frozen and hashable, so it can be closed over or passed as a static argument of
    `jax.jit`; `allocate`, `view`, `write` and `check_guards` are its operations.

    Attributes:
      regions: read-only mapping name -> `Region`, in layout order.
      total_bytes: the arena's size in bytes (a multiple of `ROW_BYTES`).
      align_bytes: every region offset is a multiple of this (a power of two).
      guard_bytes: size of the guard band after every region (0: none).
      arena_shape: `(total_bytes // ROW_BYTES, ROW_BYTES)`, the array's shape.
      may_alias: names of region pairs that a packed plan lets share bytes.
    """

    region_list: tuple[Region, ...]
    total_bytes: int
    align_bytes: int = 256
    guard_bytes: int = 0
    may_alias: frozenset[frozenset[str]] = frozenset()
    regions: Mapping[str, Region] = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        for field in ("total_bytes", "align_bytes", "guard_bytes"):  # one int type from here on
            object.__setattr__(self, field, as_index(getattr(self, field)))
        problems = _field_problems(self)
        if problems:  # wrong types: the layout checks below would only fail less clearly
            raise ArenaError("invalid ArenaPlan:\n  - " + "\n  - ".join(problems))
        if not _is_pow2(self.align_bytes):
            problems.append(f"align_bytes={self.align_bytes} must be a power of two")
        if not isinstance(self.guard_bytes, int) or self.guard_bytes < 0:
            problems.append(f"guard_bytes={self.guard_bytes!r} must be an int >= 0")
        if self.total_bytes % ROW_BYTES:
            problems.append(f"total_bytes={self.total_bytes} must be a multiple of {ROW_BYTES}")
        seen: dict[str, Region] = {}
        for r in self.region_list:
            if r.name in seen:
                problems.append(f"region {r.name!r} appears twice")
            seen[r.name] = r
            if r.nbytes <= 0:
                problems.append(f"region {r.name!r} has nbytes={r.nbytes}; empty buffers get none")
            if problems or not _is_pow2(self.align_bytes):
                continue
            if r.offset_bytes < 0 or r.offset_bytes % self.align_bytes:
                problems.append(
                    f"region {r.name!r} offset_bytes={r.offset_bytes} is not a multiple of "
                    f"align_bytes={self.align_bytes}"
                )
            if r.end_bytes + self.guard_bytes > self.total_bytes:
                problems.append(
                    f"region {r.name!r} [{r.offset_bytes}, {r.end_bytes}) plus guard "
                    f"{self.guard_bytes} ends past total_bytes={self.total_bytes}"
                )
        # Every pair of regions whose bytes (guards included) intersect must be allowed to.
        spans = sorted(self.region_list, key=lambda r: r.offset_bytes)
        for i, a in enumerate(spans):
            for b in spans[i + 1 :]:
                if b.offset_bytes >= a.end_bytes + self.guard_bytes:
                    break
                if frozenset((a.name, b.name)) not in self.may_alias:
                    problems.append(
                        f"regions {a.name!r} [{a.offset_bytes}, {a.end_bytes}) and {b.name!r} "
                        f"[{b.offset_bytes}, {b.end_bytes}) overlap (guard {self.guard_bytes})"
                    )
        if problems:
            raise ArenaError("invalid ArenaPlan:\n  - " + "\n  - ".join(problems))
        object.__setattr__(self, "regions", types.MappingProxyType(seen))

    def _key(self) -> tuple:
        return (self.region_list, self.total_bytes, self.align_bytes, self.guard_bytes,
                self.may_alias)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ArenaPlan) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def sequential(cls, sizes: Any, *, align_bytes: int = 256, guard_bytes: int = 0) -> ArenaPlan:
        """Gives every non-empty buffer its own region, in the given order.

        Args:
          sizes: a `BufferSizes` (regions in the seed's order) or any `{name: nbytes}` mapping
            (so users can add buffers of their own). Zero-size buffers get no region, as the
            seed leaves them unallocated.
          align_bytes: alignment of every region offset (a power of two; 256 by default, which
            also keeps every region on an arena row).
          guard_bytes: bytes of guard band after every region, filled with a known pattern by
            `allocate` and checked by `check_guards`.
        """
        items = _size_items(sizes)
        align_bytes, guard_bytes = as_index(align_bytes), as_index(guard_bytes)
        if not _is_pow2(align_bytes):
            raise ArenaError(f"align_bytes={align_bytes!r} must be a power of two")
        if isinstance(guard_bytes, bool) or not isinstance(guard_bytes, int) or guard_bytes < 0:
            raise ArenaError(f"guard_bytes={guard_bytes!r} must be an int >= 0")
        regions, offset = [], 0
        for name, nbytes in items:
            if nbytes == 0:
                continue
            regions.append(Region(name, offset, nbytes))
            offset = _round_up(offset + nbytes + guard_bytes, align_bytes)
        total = _round_up(max(offset, 1), ROW_BYTES)
        return cls(tuple(regions), total, align_bytes, guard_bytes)

    # -- metadata -------------------------------------------------------------------------------

    @property
    def arena_shape(self) -> tuple[int, int]:
        """Shape of the arena array, `(rows, ROW_BYTES)` of `uint8`."""
        return (self.total_bytes // ROW_BYTES, ROW_BYTES)

    def region(self, name: str) -> Region:
        """The region of buffer `name`; a clear error for unknown or empty buffers."""
        try:
            return self.regions[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name (a list, a dict)
            known = ", ".join(self.regions) or "(none)"
            raise ArenaError(
                f"no region named {name!r} in this plan (zero-size buffers get no region); "
                f"regions: {known}"
            ) from None

    def describe(self) -> str:
        """A readable table: name, offset, size and share of the arena for every region."""
        rows = [("region", "offset", "bytes", "size", "share")]
        for r in self.region_list:
            rows.append(
                (r.name, f"{r.offset_bytes:,}", f"{r.nbytes:,}", format_bytes(r.nbytes),
                 f"{100 * r.nbytes / self.total_bytes:5.1f}%")
            )  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines = [
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
            for row in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(
            f"total: {self.total_bytes:,} bytes ({format_bytes(self.total_bytes)}) in "
            f"{plural(len(self.region_list), 'region')}, align {self.align_bytes}, guard "
            f"{self.guard_bytes}"
        )
        return "\n".join(lines)

    # -- the array (jaxarena._arena.device, imported on first use: it imports jax) ---------------

    def allocate(self, *, device: Any = None, sharding: Any = None) -> jax.Array:
        """Allocates the arena: one zero-filled `uint8` array, guard bands filled.

        Args:
          device: place the arena on this device (default: JAX's default device).
          sharding: a `jax.sharding.NamedSharding` whose spec partitions dimension 0 (for
            example `plan.sharding(mesh)`): every shard is one full arena of `arena_shape`,
            so each device gets its own arena; views and writes then work on the local shard
            inside `jax.shard_map`. Dimension 1 must not be partitioned.

        Returns:
          `uint8[rows, ROW_BYTES]`, or `uint8[num_shards * rows, ROW_BYTES]` when sharded.
          Pass it donated to your step functions and keep only the returned arena.

        Raises:
          ArenaError: both `device` and `sharding`, a wrong sharding, or an arena larger than
            512 GiB (rows are int32-indexed) or than a device's reported memory, before
            anything is allocated.
        """
        return _device().allocate(self, device, sharding)

    def sharding(self, mesh: jax.sharding.Mesh, axis_names: Any = None):
        """A `NamedSharding` giving every device of `mesh` (or of `axis_names`) its own arena."""
        return _device().sharding_for(mesh, axis_names)

    def check_fits(
        self, *uses: tuple[Any, ...], arena: Any = None, what: str = "this call"
    ) -> None:
        """The one arena-side check of a kernel's arena form, made before anything is traced.

        Args:
          *uses: `(name, shape, dtype)` or `(name, shape, dtype, note)` per region the caller
            views or writes: the array of `shape` and `dtype` must fit region `name`. `note`
            (e.g. `"192 slots of [o[64], m, l]"`) is added to that region's message.
          arena: when given, it must be this plan's arena (`uint8[arena_shape]`).
          what: the caller, named at the head of the message.

        When it all fits, every region of `uses` is reported to `record_lifetimes` as viewed
        and then written, here: a kernel that reads or writes its regions in place (the whole
        arena aliased) makes no `view` or `write` of its own, and without these events a
        recording would leave its regions out (or end a region's life before the kernel
        reads it). Conservative, never too short: a region nothing wrote before counts as an
        input (live from the start of the pass), and one a kernel only uses as scratch stays
        live to the end of the pass.

        Raises:
          ArenaError: listing every problem at once: a region not in the plan, an array larger
            than its region (what the region holds and what is needed), an arena that is not
            this plan's.
        """
        problems = _device().fit_problems(self, uses, arena, what)
        if problems:
            raise ArenaError(
                f"{what}: the arena cannot hold it:\n  - "
                + "\n  - ".join(problems)
                + "\nsize the plan (BufferSizes.from_config) for these shapes"
            )
        for use in uses:
            emit("view", use[0])
            emit("write", use[0])

    def view(self, arena: jax.Array, name: str, shape: Any, dtype: Any) -> jax.Array:
        """Reads the start of region `name` as a `dtype` array of `shape`.

        Pure and traceable: the offset is static, the bytes are sliced out of the arena and
        bitcast (`lax.bitcast_convert_type`). The result is a value, not an alias: write it
        back with `write` to change the arena.

        Read from the newest arena, right where the value is needed. XLA orders in-place
        updates by data dependencies only: a view of an older arena version that is still
        consumed after a later `write` (a residual held across a block, say) makes XLA copy
        the WHOLE arena to keep that version alive. Views consumed before the next write, or
        taken again from the newest arena where they are used, keep every write in place
        (`jaxarena.testing.assert_footprint(..., max_temp_bytes=...)` catches the copy).

        Raises:
          ArenaError: unknown or empty region, a non-static shape, or a view larger than the
            region (`prod(shape) * itemsize > nbytes`), at trace time.
        """
        return _device().view(self, arena, name, shape, dtype)

    def write(self, arena: jax.Array, name: str, value: Any) -> jax.Array:
        """Returns the arena with `value`'s bytes stored at the start of region `name`.

        Uses `lax.dynamic_update_slice` at a static offset: when the arena is donated to the
        enclosing `jax.jit`, XLA updates it in place. Bytes of the region past `value` are kept.

        Raises:
          ArenaError: unknown or empty region, or `value` larger than the region.
        """
        return _device().write(self, arena, name, value)

    # -- guards ---------------------------------------------------------------------------------

    def check_guards(self, arena: jax.Array, *, strict: bool = False) -> list[str]:
        """Names of the regions whose guard band no longer holds the pattern.

        For a sharded arena every device's arena is checked and a region is reported when its
        guard broke on any device (`guard_report` says on which). With `strict=True` a broken
        guard raises `GuardError` naming the regions and the devices. Call it outside `jit`
        (it reads the result back to the host). When the arena spans several processes
        (`jax.distributed`, a mesh over every process's devices) this is a collective: EVERY
        process must call it, and every process gets the same answer, for all devices.
        """
        return _device().check_guards(self, arena, strict)

    def guard_report(self, arena: jax.Array) -> dict[str, tuple[jax.Device, ...]]:
        """`{region name: the devices whose guard after it broke}`, for every broken guard.

        Regions in layout order, devices in mesh order (`jax.Device`: `.id`,
        `.process_index`); empty when every guard holds. Each device checks its own copy, so
        in an arena replicated over some mesh axes only the copies that broke are named. A
        collective across processes, like `check_guards` (see `jaxarena._arena.device`).
        """
        return _device().guard_report(self, arena)

    # -- packing (issue 8) ------------------------------------------------------------------------
    # The lifetimes a packed plan was built for (None for other plans). Not part of equality or
    # hashing: the layout alone decides what a traced step does with the arena.
    lifetimes: Lifetimes | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def packed(
        cls, sizes: Any, lifetimes: Lifetimes, *, align_bytes: int = 256, guard_bytes: int = 0,
        drop_unnamed: bool = False,
    ) -> ArenaPlan:  # fmt: skip
        """Lets buffers that are never live at the same step share bytes.

        Two buffers get disjoint bytes iff their `lifetimes` intersect in some mode; buffers
        the lifetimes do not name are live always and share nothing. The layout is the best of
        several greedy best-fit placements (see `jaxarena._arena.packing`); it is never larger
        than `ArenaPlan.sequential(sizes)` and never smaller than `lower_bound_bytes`. Every
        non-conflicting pair is listed in `may_alias`.

        Args:
          sizes: a `BufferSizes` or a `{name: nbytes}` mapping; regions keep its order, zero
            sizes get none.
          lifetimes: a `Lifetimes` (`Lifetimes.standard(config)`, `record_lifetimes(step, ...)`).
          align_bytes: alignment of every region offset (a power of two).
          guard_bytes: guard band after every region; no region ever covers another's guard,
            so `check_guards` stays meaningful on a packed arena.
          drop_unnamed: buffers `lifetimes` does not name get no region at all, instead of
            bytes of their own. For a plan built for one model from the recorded lifetimes of
            all its steps: a buffer no step views or writes is one its blocks never use (the
            seed sizes every buffer of every architecture). A step that does touch a dropped
            buffer then fails at trace time with the ArenaError "no region named ...".
            `sizes` itself (`jaxarena.sizing`) is unchanged.

        Returns:
          The plan; `plan.lifetimes` keeps `lifetimes` (used by `lower_bound_bytes` and
          `validate`). Steps run on it exactly as on a sequential plan (views, writes,
          donation), as long as they respect the lifetimes.
        """
        if not isinstance(drop_unnamed, bool):
            raise ArenaError(f"drop_unnamed={drop_unnamed!r} must be a bool")
        if drop_unnamed:
            if not isinstance(lifetimes, Lifetimes):
                raise ArenaError(f"lifetimes must be a Lifetimes, got {type(lifetimes).__name__}")
            sizes = {n: b for n, b in _size_items(sizes) if n in lifetimes}
        layout, total, may_alias = packing.packed_layout(
            sizes, lifetimes, align_bytes=align_bytes, guard_bytes=guard_bytes
        )
        regions = tuple(Region(n, o, b) for n, o, b in layout)
        return cls(regions, total, align_bytes, guard_bytes, may_alias, lifetimes=lifetimes)

    @property
    def lower_bound_bytes(self) -> int:
        """Peak bytes live at one step under `self.lifetimes`: no layout can be smaller.

        Each region counts `round_up(nbytes + guard_bytes, align_bytes)`; the peak is the
        maximum over modes and steps. A plan without lifetimes (e.g. sequential) treats every
        region as live always, so its bound is the sum of its regions. For a sequential plan's
        bound under some lifetimes use `lifetimes.lower_bound_bytes(sizes, align_bytes=...)`.
        """
        lt = self.lifetimes if self.lifetimes is not None else Lifetimes({}, num_steps={"all": 1})
        sizes = {r.name: r.nbytes for r in self.region_list}
        return lt.lower_bound_bytes(
            sizes, align_bytes=self.align_bytes, guard_bytes=self.guard_bytes
        )

    def validate(self, lifetimes: Any = None) -> None:
        """Checks that no two regions live at the same step share a byte.

        Args:
          lifetimes: the `Lifetimes` to check against (default: `self.lifetimes`; with none,
            every region is live always and no two may overlap).

        Raises:
          ArenaError: listing EVERY violation at once: each pair of conflicting regions that
            shares bytes (with the shared bytes and the first common live steps), and with
            guard bands, each region covering another region's guard band.
        """
        lt = lifetimes if lifetimes is not None else self.lifetimes
        if lt is None:
            lt = Lifetimes({}, num_steps={"all": 1})
        if not isinstance(lt, Lifetimes):
            raise ArenaError(f"lifetimes must be a Lifetimes, got {type(lt).__name__}")
        problems = packing.plan_violations(self.region_list, self.guard_bytes, lt)
        if problems:
            raise ArenaError(
                f"plan violates its lifetimes ({plural(len(problems), 'problem')}):\n  - "
                + "\n  - ".join(problems)
            )
