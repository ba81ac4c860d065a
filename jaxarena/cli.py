"""The `jaxarena` command line: `plan`, `budget`, `fit`, `step-report`, `demo`, `generate`, `serve`.

jaxarena plan qwen3-8b --max-batch-tokens 8192 --max-seq-len 32768
jaxarena plan ./config.json --json
jaxarena budget qwen3-30b-a3b --memory 141GB --tp 8 --ep 8 --weights fp8
jaxarena fit qwen3-32b --memory 80GB --sequences 16
jaxarena fit qwen3-32b --memory 24GiB --arena-only
jaxarena step-report qwen3-8b --target h200 --json
jaxarena demo
jaxarena generate ./checkpoint-dir --prompt-ids 1,2,3 --max-new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from jaxarena import (
    ArenaError,
    ArenaPlan,
    BufferSizes,
    ConfigError,
    Levers,
    Lifetimes,
    MemoryBudget,
    ModelConfig,
    Target,
    packing_report,
    parse_memory,  # noqa: F401 - re-exported: `from jaxarena.cli import parse_memory`
    presets,
)
from jaxarena._arena.report import plot_plan
from jaxarena._cli_budget import budget_table
from jaxarena._cli_checks import (
    auto_fallback_note,
    check_kv_block_size,
    cli_output,
    join_negative_values,
    memory_option,
    stdout_closed,
    version,
)
from jaxarena._cli_options import (
    DEFAULT_LIMITS,
    STEP_REPORT_TARGETS,
    add_budget_options,
    add_generate_options,
    add_limits,
    add_step_report_options,
    stored_weights,
)
from jaxarena._units import format_bytes, plural

DEFAULT_MODEL = "qwen3-8b"


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


# Errors that mean "the input was wrong", not "jaxarena has a bug": `main` prints each as one
# line and exits with status 2 (ConfigError and ArenaError name the bad value; OSErrors of a
# path the user gave; NotImplementedError is a valid request jaxarena does not support;
# MemoryError a serve past the machine). `CheckpointError` (jaxarena.models) is one too, looked
# up without importing the models (`_is_user_error`). Anything else is a bug: its traceback is
# shown. With JAXARENA_TRACEBACK=1 every error shows its traceback.
USER_ERRORS = (
    CliError, ConfigError, ArenaError, NotImplementedError, FileNotFoundError, PermissionError,
    IsADirectoryError, NotADirectoryError, MemoryError,
)  # fmt: skip
TRACEBACK_ENV = "JAXARENA_TRACEBACK"
EPILOG = (
    "Input errors are one line on stderr, exit status 2; set JAXARENA_TRACEBACK=1 to see the "
    "traceback of any error. Other errors are bugs: their traceback is always shown."
)

# No count the CLI takes (tokens, sequences, degrees, bytes of alignment) is meaningful past
# 2^62; a larger one is a typo, refused up front instead of overflowing a float downstream.
MAX_CLI_INT = 1 << 62

# `jaxarena demo` limits, stated in --help and checked before anything is built.
DEMO_MAX_STEPS = 1 << 16
DEMO_MAX_BATCH = 4096
DEMO_MAX_SEED = (1 << 32) - 1


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors are one line plus a hint, exit status 2."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())
        if len(message) > 300:
            message = message[:297] + "..."
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _load_model(spec: str | None):
    name = spec or DEFAULT_MODEL
    if name in presets():
        return ModelConfig.preset(name)
    if _exists(name):
        return ModelConfig.from_hf(name)
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name) and not name.endswith(".json"):
        return ModelConfig.from_hf(name)  # a hub repo id (needs huggingface_hub)
    raise CliError(f"no preset or file named {name!r}; presets: {', '.join(presets())}")


def _model(args: argparse.Namespace):
    """The model of a `plan` / `budget` / `fit` command, its context checked against
    `--max-seq-len` (refused past it; a warning for the default or a RoPE-scaled model)."""
    config = _load_model(args.model)
    if args.max_seq_len is None:  # the default, within the model's context
        args.max_seq_len = _default_seq_len(config)
    else:
        config.check_context(args.max_seq_len, f"--max-seq-len {args.max_seq_len:,}", CliError)
    return config


def _default_seq_len(config) -> int:
    """`--max-seq-len`'s default: 32,768, or the model's context when that is shorter."""
    return min(DEFAULT_LIMITS["max_seq_len"], config.max_position_embeddings or 1 << 62)


def _exists(path: str) -> bool:
    try:  # a name past the file system's limits is no file (ENAMETOOLONG), not a crash
        return Path(path).exists()
    except OSError:
        return False


def _resolve_target(name: str) -> Target:
    """The `Target` of `--target`, resolved once per command (before: at every sizing, so
    `fit --arena-only` asked jax for its device at every bisection step). `auto` is jax's
    default device and the one spelling that imports jax."""
    if name == "auto":
        target = Target.detect()
        if target.name == "gb10":  # the fallback: say why, the numbers are a baseline's
            print(f"jaxarena: note: {auto_fallback_note()}", file=sys.stderr)
        return target
    try:
        return Target.preset(name)
    except ValueError as e:
        raise CliError(f"--target {name!r}: {e}") from None


def _sizes(args: argparse.Namespace, config, max_batch_tokens: int | None = None):
    return BufferSizes.from_config(
        config,
        max_batch_tokens if max_batch_tokens is not None else args.max_batch_tokens,
        args.max_seq_len,
        args.kv_block_size,
        args.max_batch_size,
        levers=Levers.from_env(),
        target=args.target,
    )


def _config_for(args: argparse.Namespace):
    config = _model(args)
    if args.tp != 1 or args.ep != 1:
        config = config.shard(tp=args.tp, ep=args.ep)
    return config


def _packed_report(sizes, config, align: int, packed: ArenaPlan | None = None) -> dict[str, Any]:
    return packing_report(sizes, Lifetimes.standard(config), align_bytes=align, packed=packed)


def cmd_plan(args: argparse.Namespace) -> int:
    config = _config_for(args)
    sizes = _sizes(args, config)
    plan = ArenaPlan.sequential(sizes, align_bytes=args.align)
    limits = {k: getattr(args, k) for k in DEFAULT_LIMITS}
    packed_plan = None
    if args.packed:
        packed_plan = ArenaPlan.packed(sizes, Lifetimes.standard(config), align_bytes=args.align)
    report = None
    if packed_plan is not None:
        report = _packed_report(sizes, config, args.align, packed_plan)
    if args.json:
        out: dict[str, Any] = {
            "model": args.model or DEFAULT_MODEL,
            "model_type": config.model_type,
            "limits": limits,
            "target": args.target.name,
            "tp": args.tp,
            "ep": args.ep,
            "align_bytes": args.align,
            "total_bytes": (packed_plan or plan).total_bytes,
            "buffer_bytes": sizes.total_bytes(),
            "seed_total_bytes": sizes.seed_total_bytes(),
            "buffers": sizes.as_dict(),
        }
        if report is None:
            out["regions"] = [
                {"name": r.name, "offset_bytes": r.offset_bytes, "nbytes": r.nbytes}
                for r in plan.region_list
            ]
        else:
            out.update(report)
        print(json.dumps(out, indent=2))
    else:
        where = f" (tp={args.tp}, ep={args.ep}, per device)" if args.tp * args.ep > 1 else ""
        print(
            f"model {args.model or DEFAULT_MODEL} [{config.model_type or 'custom'}]{where}, "
            f"target {args.target.name}, " + ", ".join(f"{k}={v}" for k, v in limits.items())
        )
        print((packed_plan or plan).describe())  # --packed: the packed offsets
        print(
            f"seed total (without o_latent, norm_unit_w): {sizes.seed_total_bytes():,} bytes "
            f"({format_bytes(sizes.seed_total_bytes())})"
        )
        if report is not None:
            seq, packed, lb = (
                report["sequential_bytes"], report["packed_bytes"], report["lower_bound_bytes"]
            )  # fmt: skip
            print(f"sequential {format_bytes(seq)}  packed {format_bytes(packed)}  "
                  f"lower bound {format_bytes(lb)}  packed/lower bound {packed / lb:.3f}  "
                  f"packed/sequential {packed / seq:.3f}")  # fmt: skip
    if args.plot:
        # A packed plan is drawn as its offset-by-time map, with the sequential strip beside it
        # on the same y scale; without --packed, the sequential strip alone.
        mesh = f", tp={args.tp} ep={args.ep} (per device)" if args.tp * args.ep > 1 else ""
        written = plot_plan(
            packed_plan if packed_plan is not None else plan,
            args.plot,
            title=f"{args.model or DEFAULT_MODEL} [{config.model_type or 'custom'}]: "
            + ("packed arena" if packed_plan is not None else "sequential arena"),
            context=[
                f"target {args.target.name}{mesh}, align {args.align} B, "
                + ", ".join(f"{k}={v}" for k, v in limits.items())
            ],
            sequential=plan if packed_plan is not None else None,
        )
        print(f"memory map written to {written}", file=sys.stderr)
    return 0


def _budget_for(args: argparse.Namespace, config, **changes) -> MemoryBudget:
    """The `MemoryBudget` the `budget` and `fit` subcommands describe."""
    kw = dict(
        config=config,
        memory_bytes=memory_option(args.memory, "--memory", CliError),
        max_batch_tokens=getattr(args, "max_batch_tokens", DEFAULT_LIMITS["max_batch_tokens"]),
        max_seq_len=args.max_seq_len,
        kv_block_size=args.kv_block_size,
        max_batch_size=args.max_batch_size,
        tp=args.tp,
        ep=args.ep,
        weights=args.weights or stored_weights(config),
        kv_dtype=args.kv_dtype,
        state_dtype=args.state_dtype,
        arena="packed" if args.packed else "sequential",
        reserve=None if args.reserve is None else memory_option(args.reserve, "--reserve",
                                                                CliError, zero=True),
        levers=Levers.from_env(),
        target=args.target,
        align_bytes=args.align,
    )
    kw.update(changes)
    return MemoryBudget(**kw)


def cmd_budget(args: argparse.Namespace) -> int:
    config = _model(args)
    args.weights = args.weights or stored_weights(config)  # --compiled compiles the same
    if args.compiled and args.weights == "mxfp4":
        raise NotImplementedError("--compiled runs the models, which do not load MXFP4 experts; "
                                  "add --weights bf16 to compile the dequantized model")  # fmt: skip
    if args.compiled:  # compiles the steps (imports jax; seconds to minutes)
        from jaxarena._cli_step_report import budget_step_temp

        b = _budget_for(args, config, step_temp=budget_step_temp(args, CliError))
    else:
        b = _budget_for(args, config)
    name = args.model or DEFAULT_MODEL
    if args.json:  # `model` as given, as `plan --json` names it (the file is in the table)
        print(json.dumps({**b.as_dict(), "model": name}, indent=2))
    else:
        print(budget_table(b, name))
    if args.plot:
        written = b.plot(args.plot, title=name)
        print(f"budget plot written to {written}", file=sys.stderr)
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    if args.arena_only:
        if args.max_batch_size is None:
            args.max_batch_size = DEFAULT_LIMITS["max_batch_size"]
        return _fit_arena_only(args)
    config = _model(args)
    n = args.sequences
    if n < 1:
        raise CliError(f"--sequences {n} must be >= 1")
    if args.max_batch_size is None:
        args.max_batch_size = max(DEFAULT_LIMITS["max_batch_size"], n)
    elif args.max_batch_size < n:
        raise CliError(
            f"--sequences {n} exceeds --max-batch-size {args.max_batch_size}: the serve needs a "
            f"slot per sequence (raise --max-batch-size or drop it)"
        )
    b = _budget_for(args, config, max_batch_tokens=1)
    m = b.fit_max_batch_tokens(n)
    if m is None:
        advice = ", or ".join(b.alternatives()) if n == 1 else ""
        raise CliError(
            f"even max_batch_tokens=1 needs {format_bytes(b.required_bytes(n))} for "
            f"{plural(n, 'sequence')} of {plural(args.max_seq_len, 'token')}, more than "
            f"--memory {args.memory} "
            f"({format_bytes(b.memory_bytes)})" + (f"; would fit with: {advice}" if advice else "")
        )
    best = b.replace(max_batch_tokens=m)
    if args.json:
        out = {**best.as_dict(), "model": args.model, "sequences": n,
               "required_bytes": best.required_bytes(n)}
        print(json.dumps(out, indent=2))
    else:
        print(
            f"largest max_batch_tokens with {plural(n, 'sequence')} of "
            f"{plural(args.max_seq_len, 'token')} "
            f"within {format_bytes(best.memory_bytes)} per device: {m:,} (weights "
            f"{format_bytes(best.weight_bytes)} + arena {format_bytes(best.arena_bytes)} + "
            f"reserve {format_bytes(best.reserve_bytes)} + KV/state "
            f"{format_bytes(n * best.sequence_bytes)} = {format_bytes(best.required_bytes(n))})"
        )
    return 0


def _fit_arena_only(args: argparse.Namespace) -> int:
    """Today's `fit` before issue 14: the largest max_batch_tokens whose ARENA alone fits."""
    budget = memory_option(args.memory, "--memory", CliError)
    config = _config_for(args)

    def arena_bytes(m: int) -> int:
        sizes = _sizes(args, config, m)
        if args.packed:
            return _packed_report(sizes, config, args.align)["packed_bytes"]
        return ArenaPlan.sequential(sizes, align_bytes=args.align).total_bytes

    if arena_bytes(1) > budget:
        raise CliError(
            f"even max_batch_tokens=1 needs {format_bytes(arena_bytes(1))}, more than "
            f"--memory {args.memory}"
        )
    lo, hi = 1, 2
    # Every size is monotone in max_batch_tokens (a tested property), so double without an
    # upper bound (the arena grows with max_batch_tokens, so this ends), then bisect.
    while arena_bytes(hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if arena_bytes(mid) <= budget else (lo, mid)
    total = arena_bytes(lo)
    if args.json:
        print(json.dumps({"max_batch_tokens": lo, "arena_bytes": total, "budget_bytes": budget}))
    else:
        print(
            f"largest max_batch_tokens within {format_bytes(budget)}: {lo:,} "
            f"(arena {total:,} bytes = {format_bytes(total)})"
        )
    return 0


def _available_memory() -> int | None:
    """Bytes of host memory available now (Linux `MemAvailable`), else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def demo_memory_estimate(steps: int, batch: int) -> int:
    """Bytes `jaxarena demo` needs at most: f32 weights, the arena, every sequence's KV cache and
    states at full length (prompts of up to 16 tokens + `steps`), and the host-side tokens."""
    from jaxarena.models.reference.demo import DEMO_PRESET

    config = ModelConfig.preset(DEMO_PRESET)
    budget = MemoryBudget(
        config=config, memory_bytes=1 << 59, max_batch_tokens=16 * batch,
        max_seq_len=16 + steps, kv_block_size=16, max_batch_size=batch, reserve=0,
        levers=Levers(), target=Target.preset("gb10"),
    )  # fmt: skip
    host = steps * (batch * 4 + 128)  # one small numpy array of tokens per step
    return 2 * budget.weight_bytes + budget.arena_bytes + batch * budget.sequence_bytes + host


def _check_demo(args: argparse.Namespace) -> None:
    for flag, value, lo, hi in (
        ("--steps", args.steps, 1, DEMO_MAX_STEPS),
        ("--batch", args.batch, 1, DEMO_MAX_BATCH),
        ("--seed", args.seed, 0, DEMO_MAX_SEED),
    ):
        if not lo <= value <= hi:
            raise CliError(f"{flag} {value} is outside the demo's range {lo}..{hi:,}")
    need, have = demo_memory_estimate(args.steps, args.batch), _available_memory()
    if have is not None and need > have // 2:
        raise CliError(
            f"demo --steps {args.steps} --batch {args.batch} needs about {format_bytes(need)}, "
            f"more than half of the {format_bytes(have)} of memory available; lower them"
        )


def cmd_demo(args: argparse.Namespace) -> int:
    _check_demo(args)
    # Imported here: the model and its kernels cost ~0.4 s of import that plan/budget/fit skip.
    from jaxarena.models.reference.demo import run_demo

    return run_demo(steps=args.steps, batch=args.batch, seed=args.seed)


def cmd_step_report(args: argparse.Namespace) -> int:
    # Imported here: jax and the models are what plan/budget/fit never import.
    from jaxarena._cli_step_report import run_step_report

    args.target = STEP_REPORT_TARGETS[args.target.lower()]  # hopper / h100 -> h200's sm_90a
    if args.model in presets() or _exists(args.model):  # else step_report names what is missing
        _model(args)  # the default within, or a check against, the model's context
    elif args.max_seq_len is None:
        args.max_seq_len = DEFAULT_LIMITS["max_seq_len"]
    return run_step_report(args, CliError)


def cmd_generate(args: argparse.Namespace) -> int:
    # Imported here: the model and its kernels cost ~0.4 s of import that plan/budget/fit skip.
    from jaxarena.models.generate_cli import run_generate

    try:
        Target.preset(args.target)
    except ValueError as e:
        raise CliError(f"--target {args.target!r}: {e}") from None
    from jaxarena.models.runtime import RequestError

    try:
        return run_generate(args, CliError)
    except RequestError as e:  # token ids or lengths the model's limits refuse: input errors
        raise CliError(str(e)) from e


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="jaxarena",
        description="Size, plan and try out a static LLM inference workspace arena.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"jaxarena {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="every buffer of a model's arena, with offsets")
    p.add_argument("model", nargs="?", default=None,
                   help=f"preset name, config.json path or directory (default {DEFAULT_MODEL})")  # fmt: skip
    add_limits(p)
    p.add_argument("--plot", metavar="PNG", help="draw the arena as a memory map (matplotlib)")
    p.set_defaults(func=cmd_plan)
    b = sub.add_parser(
        "budget", help="weights + arena + reserve + KV cache and states on each device"
    )
    b.add_argument("model", help="preset name, config.json path or directory")
    add_budget_options(b)
    add_limits(b)
    b.add_argument("--plot", metavar="PNG", help="draw one stacked bar per device (matplotlib)")
    b.add_argument("--compiled", action="store_true", help="reserve the XLA temp of the steps "
                   "compiled for --target h200 (any Hopper) or b200, not an estimate")  # fmt: skip
    b.set_defaults(func=cmd_budget)
    f = sub.add_parser(
        "fit",
        help="the largest max_batch_tokens leaving room for --sequences full-length sequences",
    )
    f.add_argument("model", help="preset name, config.json path or directory")
    add_budget_options(f)
    f.add_argument(
        "--sequences",
        type=int,
        default=1,
        help="concurrent sequences of --max-seq-len to keep room for (default 1)",
    )
    f.add_argument(
        "--arena-only",
        action="store_true",
        help="the old meaning: the largest max_batch_tokens whose arena alone fits",
    )
    add_limits(f, with_tokens=False, batch_default=None)
    f.set_defaults(func=cmd_fit)
    r = sub.add_parser("step-report", help="compile the prefill and decode steps for a GPU "
                       "(no GPU, no weights needed): temp bytes, launches, spills, collectives")  # fmt: skip
    add_step_report_options(r)
    r.set_defaults(func=cmd_step_report)
    d = sub.add_parser("demo", help="run the reference hybrid model's decode loop on the arena")
    d.add_argument("--steps", type=int, default=32,
                   help=f"decode steps, 1..{DEMO_MAX_STEPS} (default %(default)s)")  # fmt: skip
    d.add_argument("--batch", type=int, default=4,
                   help=f"sequences, 1..{DEMO_MAX_BATCH} (default %(default)s)")  # fmt: skip
    d.add_argument("--seed", type=int, default=0,
                   help=f"random seed, 0..{DEMO_MAX_SEED} (default %(default)s)")  # fmt: skip
    d.set_defaults(func=cmd_demo)
    g = sub.add_parser("generate", help="greedy decoding of a HuggingFace checkpoint on the arena")
    add_generate_options(g)
    g.set_defaults(func=cmd_generate)
    from jaxarena.server.options import add_serve_parser, cmd_serve  # argparse only, no server

    add_serve_parser(sub).set_defaults(func=lambda a: cmd_serve(a, CliError))
    for command in sub.choices.values():
        command.epilog = EPILOG
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `jaxarena` console script; returns the exit status.

    Exit status 2 with ONE line on stderr for every input error: argparse usage errors (with a
    `--help` hint), a count past `MAX_CLI_INT`, and every `USER_ERRORS` a command raises. Any
    other exception propagates with its traceback (a bug); with the environment variable
    `JAXARENA_TRACEBACK=1` input errors propagate too.
    """
    parser = build_parser()
    argv = join_negative_values(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, already printed as one line)
        return e.code if isinstance(e.code, int) else 2
    try:
        with cli_output():
            _check_args(args)
            if args.command in ("plan", "budget", "fit"):
                args.target = _resolve_target(args.target)
            return args.func(args)
    except BrokenPipeError:  # `jaxarena plan | head -3`: the reader has what it wanted
        stdout_closed()
        return 0
    except Exception as e:
        if not _is_user_error(e) or os.environ.get(TRACEBACK_ENV, "0") not in ("", "0"):
            raise
        print(f"jaxarena: error: {_one_line(e)}", file=sys.stderr)
        return 2


def _is_user_error(e: BaseException) -> bool:
    if isinstance(e, USER_ERRORS):
        return True
    # Only a loaded checkpoint module can have raised its error: no import (and no jax) here.
    checkpoint = sys.modules.get("jaxarena.models.checkpoint")
    return checkpoint is not None and isinstance(e, checkpoint.CheckpointError)


def _one_line(e: BaseException) -> str:
    message = " ".join(str(e).split()) or type(e).__name__
    return message if len(message) <= 1000 else message[:997] + "..."


def _check_args(args: argparse.Namespace) -> None:
    """Checks every subcommand shares, before any work: int options within `MAX_CLI_INT`, and
    matplotlib present when `--plot` asks for a picture."""
    for dest, value in sorted(vars(args).items()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_CLI_INT:
            shown = (
                str(value)
                if len(str(value)) <= 24
                else f"{str(value)[:20]}... ({len(str(value))} digits)"
            )
            raise CliError(
                f"--{dest.replace('_', '-')} {shown} is beyond 2^62; no count is that large"
            )
    check_kv_block_size(args, CliError)
    for flag in ("memory", "reserve"):  # before the model is read (and warned about)
        if getattr(args, flag, None) is not None:
            memory_option(getattr(args, flag), f"--{flag}", CliError, zero=flag == "reserve")
    if getattr(args, "plot", None):
        from jaxarena._figure import pyplot

        try:
            pyplot()  # before anything is computed
        except ImportError as e:  # the message names the extra to install
            raise CliError(str(e)) from None


if __name__ == "__main__":
    sys.exit(main())
