"""Test helpers for people asserting memory under XLA: compiled footprints, aliasing, and how
often a function is traced.

    from jaxarena.testing import assert_footprint
    assert_footprint(step, arena, x, min_alias_bytes=plan.total_bytes, max_temp_bytes=1 << 20)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

__all__ = [
    "Footprint",
    "memory_footprint",
    "assert_footprint",
    "TraceCounter",
    "count_traces",
    "assert_traced_at_most",
    "FootprintUnavailable",
]


class FootprintUnavailable(RuntimeError):
    """XLA returned no memory analysis for this backend, so no footprint can be asserted."""


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What XLA's compiled module needs, in bytes (`Compiled.memory_analysis()`).

    Attributes:
      argument_bytes: all inputs, donated ones included.
      output_bytes: all outputs.
      alias_bytes: outputs that reuse an input buffer (donation that XLA honoured).
      temp_bytes: scratch XLA allocates for the computation itself.
      generated_code_bytes: size of the compiled code.
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int

    @property
    def peak_bytes(self) -> int:
        """Arguments + outputs not aliased to arguments + temps: the module's device footprint."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


def _lowerable(fn: Callable) -> Any:
    # A jitted function keeps its own donation and static arguments; anything else is jitted
    # plainly.
    return fn if hasattr(fn, "lower") else jax.jit(fn)


def memory_footprint(fn: Callable, *args: Any, **kwargs: Any) -> Footprint:
    """Lowers and compiles `fn(*args, **kwargs)` and returns its XLA memory footprint.

    `fn` may be a `jax.jit`-wrapped function (its `donate_argnums` and static arguments are
    honoured) or a plain function (jitted without donation). Arguments may be arrays or
    `jax.ShapeDtypeStruct`s; nothing is executed.

    Raises:
      FootprintUnavailable: the backend returned no memory analysis.
    """
    compiled = _lowerable(fn).lower(*args, **kwargs).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        raise FootprintUnavailable(
            f"XLA returned no memory analysis on backend {jax.default_backend()!r}; "
            "the footprint cannot be measured here"
        )
    if isinstance(analysis, list | tuple):  # one per device program on some backends
        analysis = analysis[0]
    return Footprint(
        argument_bytes=int(analysis.argument_size_in_bytes),
        output_bytes=int(analysis.output_size_in_bytes),
        alias_bytes=int(analysis.alias_size_in_bytes),
        temp_bytes=int(analysis.temp_size_in_bytes),
        generated_code_bytes=int(analysis.generated_code_size_in_bytes),
    )


def assert_footprint(
    fn: Callable,
    *args: Any,
    max_temp_bytes: int | None = None,
    min_alias_bytes: int | None = None,
    max_argument_bytes: int | None = None,
    max_output_bytes: int | None = None,
    max_peak_bytes: int | None = None,
    max_generated_code_bytes: int | None = None,
    fn_kwargs: dict[str, Any] | None = None,
) -> Footprint:
    """Compiles `fn(*args, **fn_kwargs)` and asserts its footprint against the given bounds.

    Every bound is optional; at least one must be given. The error message is a table of
    every measured quantity against what was allowed, with the failing rows marked.

    Returns:
      The measured `Footprint` (so a test can assert more).

    Raises:
      AssertionError: a bound is violated, or XLA gives no memory analysis (never passes
        silently).
      ValueError: no bound was given.
    """
    bounds = {
        "argument_bytes": ("<=", max_argument_bytes),
        "output_bytes": ("<=", max_output_bytes),
        "alias_bytes": (">=", min_alias_bytes),
        "temp_bytes": ("<=", max_temp_bytes),
        "generated_code_bytes": ("<=", max_generated_code_bytes),
        "peak_bytes": ("<=", max_peak_bytes),
    }
    if all(limit is None for _, limit in bounds.values()):
        raise ValueError("assert_footprint needs at least one bound (max_temp_bytes=, ...)")
    try:
        fp = memory_footprint(fn, *args, **(fn_kwargs or {}))
    except FootprintUnavailable as e:
        raise AssertionError(f"cannot assert a footprint: {e}") from e
    lines = [f"{'quantity':<22}{'measured':>16}  {'rule':<4}{'allowed':>16}  verdict"]
    failed = False
    for name, (op, limit) in bounds.items():
        measured = getattr(fp, name)
        if limit is None:
            lines.append(f"{name:<22}{measured:>16,}  {'':<4}{'-':>16}")
            continue
        ok = measured <= limit if op == "<=" else measured >= limit
        failed |= not ok
        lines.append(f"{name:<22}{measured:>16,}  {op:<4}{limit:>16,}  {'ok' if ok else 'FAILED'}")
    if failed:
        name = getattr(fn, "__name__", repr(fn))
        raise AssertionError(f"memory footprint of {name} out of bounds:\n" + "\n".join(lines))
    return fp


class TraceCounter:
    """Wraps a Python function and counts how many times it runs, i.e. is traced under jit.

    counter = count_traces(step)
    jitted = jax.jit(counter, donate_argnums=0)
    ...  # run many steps
    assert_traced_at_most(counter, 1)
    """

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.count = 0
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return self.fn(*args, **kwargs)


def count_traces(fn: Callable) -> TraceCounter:
    """Returns a `TraceCounter` around `fn`; jit the counter, not `fn`."""
    return TraceCounter(fn)


def assert_traced_at_most(counter: TraceCounter, n: int) -> None:
    """Asserts that the counted function was traced at most `n` times (so: no recompiles)."""
    if counter.count > n:
        raise AssertionError(
            f"{getattr(counter.fn, '__name__', counter.fn)!r} was traced {counter.count} times, "
            f"at most {n} allowed: something (a shape, dtype, static argument or weak type) "
            "changed between calls"
        )
