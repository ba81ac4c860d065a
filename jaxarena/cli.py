"""The `jaxarena` command line: `plan`, `fit` and `demo`.

jaxarena plan qwen3-8b --max-batch-tokens 8192 --max-seq-len 32768
jaxarena plan ./config.json --json
jaxarena fit qwen3-32b --memory 24GiB
jaxarena demo
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxarena import (
    ArenaError,
    ArenaPlan,
    BufferSizes,
    ConfigError,
    Levers,
    Lifetimes,
    ModelConfig,
    Target,
    packing_report,
    presets,
)
from jaxarena._arena.report import plot_plan
from jaxarena._units import format_bytes
from jaxarena.models.demo import run_demo

DEFAULT_MODEL = "qwen3-8b"
DEFAULT_LIMITS = {
    "max_batch_tokens": 8192,
    "max_seq_len": 32768,
    "kv_block_size": 16,
    "max_batch_size": 64,
}

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def parse_memory(text: str) -> int:
    """`'24GiB'`, `'24 GB'`, `'1.5TiB'` or a plain byte count, in bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise CliError(
            f"--memory {text!r} is not a size; write e.g. 24GiB, 80GB, 512MiB or a byte count"
        )
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1:
        raise CliError(f"--memory {text!r} must be at least one byte")
    return int(value)


def _load_model(spec: str | None):
    name = spec or DEFAULT_MODEL
    if name in presets():
        return ModelConfig.preset(name)
    if Path(name).exists():
        return ModelConfig.from_hf(name)
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name) and not name.endswith(".json"):
        return ModelConfig.from_hf(name)  # a hub repo id (needs huggingface_hub)
    raise CliError(f"no preset or file named {name!r}; presets: {', '.join(presets())}")


def _target(name: str):
    return Target.detect() if name == "auto" else Target.preset(name)


def _sizes(args: argparse.Namespace, config, max_batch_tokens: int | None = None):
    return BufferSizes.from_config(
        config,
        max_batch_tokens if max_batch_tokens is not None else args.max_batch_tokens,
        args.max_seq_len,
        args.kv_block_size,
        args.max_batch_size,
        levers=Levers.from_env(),
        target=_target(args.target),
    )


def _config_for(args: argparse.Namespace):
    config = _load_model(args.model)
    if args.tp != 1 or args.ep != 1:
        config = config.shard(tp=args.tp, ep=args.ep)
    return config


def _packed_report(sizes, config, align: int) -> dict[str, Any]:
    return packing_report(sizes, Lifetimes.standard(config), align_bytes=align)


def cmd_plan(args: argparse.Namespace) -> int:
    config = _config_for(args)
    sizes = _sizes(args, config)
    plan = ArenaPlan.sequential(sizes, align_bytes=args.align)
    limits = {k: getattr(args, k) for k in DEFAULT_LIMITS}
    report = _packed_report(sizes, config, args.align) if args.packed else None
    if args.json:
        out: dict[str, Any] = {
            "model": args.model or DEFAULT_MODEL,
            "model_type": config.model_type,
            "limits": limits,
            "target": _target(args.target).name,
            "tp": args.tp,
            "ep": args.ep,
            "align_bytes": args.align,
            "total_bytes": plan.total_bytes,
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
            f"target {_target(args.target).name}, "
            + ", ".join(f"{k}={v}" for k, v in limits.items())
        )
        print(plan.describe())
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
        plot_plan(plan, args.plot, title=f"{args.model or DEFAULT_MODEL} arena")
        print(f"memory map written to {args.plot}", file=sys.stderr)
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    budget = parse_memory(args.memory)
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
    # Every size is monotone in max_batch_tokens (a tested property), so bisect.
    while hi <= 1 << 24 and arena_bytes(hi) <= budget:
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


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(steps=args.steps, batch=args.batch, seed=args.seed)


def _add_limits(p: argparse.ArgumentParser, *, with_tokens: bool = True) -> None:
    if with_tokens:
        p.add_argument("--max-batch-tokens", type=int, default=DEFAULT_LIMITS["max_batch_tokens"],
                       help="token rows of one forward pass (default %(default)s)")  # fmt: skip
    p.add_argument("--max-seq-len", type=int, default=DEFAULT_LIMITS["max_seq_len"],
                   help="longest sequence (default %(default)s)")  # fmt: skip
    p.add_argument("--kv-block-size", type=int, default=DEFAULT_LIMITS["kv_block_size"],
                   help="paged-KV block size in tokens, 0 = unpaged (default %(default)s)")  # fmt: skip
    p.add_argument("--max-batch-size", type=int, default=DEFAULT_LIMITS["max_batch_size"],
                   help="sequence slots (default %(default)s)")  # fmt: skip
    p.add_argument("--target", default="auto",
                   help="hardware target: gb10, hopper, b200, b300, ... or auto (default)")  # fmt: skip
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (per-device plan)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree (per-device plan)")
    p.add_argument("--align", type=int, default=256, help="region alignment in bytes")
    p.add_argument("--packed", action="store_true",
                   help="also pack buffers that are never live together")  # fmt: skip
    p.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxarena",
        description="Size, plan and try out a static LLM inference workspace arena.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="every buffer of a model's arena, with offsets")
    p.add_argument("model", nargs="?", default=None,
                   help=f"preset name, config.json path or directory (default {DEFAULT_MODEL})")  # fmt: skip
    _add_limits(p)
    p.add_argument("--plot", metavar="PNG", help="draw the arena as a memory map (matplotlib)")
    p.set_defaults(func=cmd_plan)
    f = sub.add_parser("fit", help="the largest max_batch_tokens whose arena fits a budget")
    f.add_argument("model", help="preset name, config.json path or directory")
    f.add_argument("--memory", required=True, help="budget, e.g. 24GiB")
    _add_limits(f, with_tokens=False)
    f.set_defaults(func=cmd_fit)
    d = sub.add_parser("demo", help="run the reference hybrid model's decode loop on the arena")
    d.add_argument("--steps", type=int, default=32, help="decode steps (default %(default)s)")
    d.add_argument("--batch", type=int, default=4, help="sequences (default %(default)s)")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `jaxarena` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CliError, ConfigError, ArenaError, ValueError, OSError, NotImplementedError) as e:
        message = str(e).strip().replace("\n", " ")
        print(f"jaxarena: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
