"""What `jaxarena step-report` and `jaxarena budget --compiled` run (the parsers are in
`jaxarena.cli`): the report of `jaxarena.step_report` for the command line's arguments, with
input problems raised as the CLI's one-line error."""

from __future__ import annotations

import json
import sys
from typing import Any

from jaxarena import step_report as sr
from jaxarena.step_report import check_parallelism, format_report, step_report_details

__all__ = ["BUDGET_COMPILE_TARGETS", "budget_step_temp", "print_progress", "run_step_report"]


def print_progress(line: str) -> None:
    """Progress lines go to stderr (the report itself to stdout)."""
    print(line, file=sys.stderr, flush=True)


def run_step_report(args: Any, error: type[Exception] = ValueError) -> int:
    """What `jaxarena step-report` runs (the parser is in `jaxarena.cli`); input problems
    raise `error` (the CLI's one-line error) or the library's ConfigError /
    NotImplementedError / CheckpointError. Returns the exit status 0."""
    from jaxarena.gpu_dump import GpuUnavailable

    limits = {k: getattr(args, k) for k in ("max_batch_tokens", "max_seq_len", "kv_block_size",
                                            "max_batch_size")}  # fmt: skip
    tp, ep = _parallelism(args, error, target=args.target)
    try:
        details = step_report_details(args.model, target=args.target, weights=args.weights,
                                      progress=print_progress,
                                      context=getattr(args, "context", None), tp=tp, ep=ep,
                                      **limits)  # fmt: skip
    except GpuUnavailable as e:
        raise error(f"--target {args.target} needs a compile-only GPU: {e.reason}") from None
    if args.json:
        print(json.dumps(details["report"], indent=2))
    else:
        print(format_report(details, args.model, limits))
    return 0


# The compile target of `jaxarena budget --target NAME --compiled`.
BUDGET_COMPILE_TARGETS = {"hopper": "h200", "b200": "b200"}


def budget_step_temp(args: Any, error: type[Exception] = ValueError) -> int:
    """What `jaxarena budget --compiled` reserves for XLA: the larger temp of the prefill and
    decode steps compiled for the budget's target at its limits (`step_report`).

    With `--tp N` (and `--ep 1` or `N`) the steps are one device's over N compile-only
    devices (`step_report(tp=, ep=)`): the reserve is one device's temp, as the budget is.

    Raises:
      error: a target with no compile-only device here (`--target` other than hopper / b200,
        or no CUDA plugin), `--ep` other than 1 or `--tp`. NotImplementedError: an FP8 KV
        cache or bf16 states (the models run bf16 KV, f32 states), or a family or block the
        models do not run (or split).
    """
    from jaxarena.gpu_dump import GpuUnavailable

    name = getattr(args.target, "name", args.target)
    if name not in BUDGET_COMPILE_TARGETS:
        raise error(f"--compiled compiles for --target hopper (an H200) or b200, not {name!r}")
    tp, ep = _parallelism(args, error, "--compiled: ")
    if args.kv_dtype != "bf16" or args.state_dtype != "f32":
        raise NotImplementedError("--compiled runs the models' bf16 KV cache and f32 states "
                                  "(--kv-dtype bf16 --state-dtype f32)")  # fmt: skip
    target = BUDGET_COMPILE_TARGETS[name]
    limits = {k: getattr(args, k) for k in ("max_batch_tokens", "max_seq_len", "kv_block_size",
                                            "max_batch_size")}  # fmt: skip
    try:
        r = sr.step_report(args.model, target=target, weights=args.weights,
                        progress=print_progress, tp=tp, ep=ep, **limits)  # fmt: skip
    except GpuUnavailable as e:
        raise error(f"--compiled needs a compile-only {target}: {e.reason}") from None
    return max(s["temp_bytes"] for s in r["steps"].values())


def _parallelism(args: Any, error: type[Exception], what: str = "",
                 target: str | None = None) -> tuple[int, int]:  # fmt: skip
    """`(--tp, --ep)`, refused with `error` unless the models' mesh runs them (`ep` 1 or `tp`;
    on the "cpu" target, as many CPU devices as `tp`)."""
    tp, ep = getattr(args, "tp", 1), getattr(args, "ep", 1)
    try:
        check_parallelism(tp, ep, target)
    except ValueError as e:
        raise error(f"{what}--tp {tp} --ep {ep}: {e}") from None
    return tp, ep
