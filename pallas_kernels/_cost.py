"""The cost each Pallas kernel declares for its shapes: the HBM bytes it reads and writes and
the flops it does, for a workload (how many tokens each sequence attends).

XLA sees a Pallas-Triton kernel as an opaque custom call (its cost analysis counts -1 bytes
and flops), and an arena-form kernel takes the WHOLE arena as an operand though it touches a
few rows of it; its operands say nothing about what it moves. So each wrapper calls
`declare_cost` while it is traced, with the kernel's name, its grid and its operands: that
triple is what the compiled HLO's custom call shows (`name`, `grid_x/y/z` whose product is
the grid's, `operand_layout_constraints`), and `jaxarena.step_cost` finds the declaration by
it.

The registry is global and never cleared: a wrapper inside an inner `jax.jit` is traced once
per shape signature and the trace is cached, so a second compile of the same step would
declare nothing. A cost is a pure function of the static shapes and the `Workload`, so one
declaration per key serves later compiles until the key is declared again (`new_session`
says when two declarations of a key are one compile's: then it is ambiguous).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["KernelCost", "Workload", "declare_cost", "declare_fixed", "declared_cost",
           "hlo_signature", "nbytes", "new_session", "touched_groups"]


@dataclasses.dataclass(frozen=True)
class Workload:
    """What the runtime values of a step are assumed to be (shapes alone do not say).

    Attributes:
      context: decode: the tokens each sequence attends (its cache including the new token);
        prefill: the length of each prompt the step's tokens are cut into (each starting from
        an empty cache). The KV bytes and attention flops follow from it.
    """

    context: int


@dataclasses.dataclass(frozen=True)
class KernelCost:
    """HBM bytes read + written and flops (multiply-add = 2) of one launch."""

    bytes: int
    flops: int


CostFn = Callable[[Workload], KernelCost]
_REGISTRY: dict[tuple, CostFn] = {}
_SESSION: dict[tuple, CostFn] = {}
_AMBIGUOUS: set[tuple] = set()

# numpy dtype name -> XLA's primitive type name, as the HLO text prints shapes.
_HLO_DTYPES = {
    "bool": "pred", "int8": "s8", "uint8": "u8", "int16": "s16", "uint16": "u16",
    "int32": "s32", "uint32": "u32", "int64": "s64", "uint64": "u64", "float16": "f16",
    "bfloat16": "bf16", "float32": "f32", "float64": "f64", "float8_e4m3fn": "f8e4m3fn",
    "float8_e5m2": "f8e5m2", "float8_e4m3fnuz": "f8e4m3fnuz", "float8_e5m2fnuz": "f8e5m2fnuz",
}  # fmt: skip


def hlo_signature(name: str, programs: int, shapes: Sequence[tuple[str, tuple[int, ...]]]) -> tuple:
    """The registry key: `(name, programs, ((hlo dtype, dims), ...))`. `programs` is the
    grid's product: Pallas-Triton folds a grid of any rank into a 3-d launch grid in a way
    that depends on the sizes, but the product stays."""
    return (name, int(programs), tuple((d, tuple(int(v) for v in s)) for d, s in shapes))


def new_session() -> None:
    """Starts a compile: declarations from now on are this compile's. A key declared twice
    with different costs within one session is ambiguous (two kernels of the compile that the
    key cannot tell apart); across sessions the latest declaration wins (the same key in an
    earlier compile may have had other runtime sizes behind the same shapes)."""
    _SESSION.clear()


def declare_cost(name: str, grid: Sequence[int], operands: Sequence[Any], cost: CostFn) -> None:
    """Records `cost` (a function of the `Workload`) for the kernel `name` launched on `grid`
    with `operands` (arrays or tracers: only their shapes and dtypes are read)."""
    shapes = [(_HLO_DTYPES[np.dtype(x.dtype).name], tuple(x.shape)) for x in operands]
    key = hlo_signature(name, int(np.prod([int(g) for g in grid])), shapes)
    probe = Workload(context=1000)
    if key in _SESSION:
        if _SESSION[key](probe) != cost(probe):
            first, second = _SESSION[key], cost
            _AMBIGUOUS.add(key)
            _REGISTRY[key] = lambda w: max(first(w), second(w), key=lambda c: c.bytes)
        return
    _SESSION[key] = _REGISTRY[key] = cost
    _AMBIGUOUS.discard(key)


def declared_cost(key: tuple) -> tuple[CostFn | None, bool]:
    """`(the cost function declared for key (hlo_signature) or None, ambiguous)`; an
    ambiguous key's function gives the larger of the costs declared under it."""
    return _REGISTRY.get(key), key in _AMBIGUOUS


def nbytes(*arrays: Any) -> int:
    """Bytes of arrays / shape-dtype structs together (None entries count 0)."""
    return sum(int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize
               for a in arrays if a is not None)  # fmt: skip


def declare_fixed(name: str, grid: Sequence[int], operands: Sequence[Any], *, bytes: int,
                  flops: int = 0) -> None:  # fmt: skip
    """`declare_cost` of a cost the workload does not change."""
    cost = KernelCost(int(bytes), int(flops))
    declare_cost(name, grid, operands, lambda w: cost)


def touched_groups(groups: int, rows: int) -> float:
    """Expected groups (experts) `rows` rows routed uniformly at random touch."""
    return groups * (1.0 - (1.0 - 1.0 / groups) ** rows) if groups else 0.0
