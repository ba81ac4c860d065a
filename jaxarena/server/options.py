"""`jaxarena serve`'s command-line options and its entry (`add_serve_parser`, `cmd_serve`).

Imports only argparse: the web framework, the tokenizer and jax load when the command runs,
so `jaxarena plan` and `budget` stay free of them.
"""

from __future__ import annotations

import argparse

__all__ = ["add_serve_parser", "cmd_serve", "parse_loras"]


def add_serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the `serve` subcommand to `sub` (the `jaxarena` parser's subparsers)."""
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server on a checkpoint "
                       "(needs the serve extra: pip install 'jaxarena[serve]')")  # fmt: skip
    s.add_argument("path", help="checkpoint directory (config.json, *.safetensors, "
                   "tokenizer.json, tokenizer_config.json)")  # fmt: skip
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    s.add_argument("--port", type=int, default=8000, help="default %(default)s; 0: a free port")
    s.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model name in the API (default: PATH as given)")  # fmt: skip
    s.add_argument("--max-batch-size", type=int, default=8,
                   help="requests decoded together (default %(default)s)")  # fmt: skip
    s.add_argument("--max-seq-len", type=int, default=2048,
                   help="longest prompt + output in tokens (default %(default)s)")  # fmt: skip
    s.add_argument("--max-batch-tokens", type=int, default=512,
                   help="token rows of one engine step (default %(default)s)")  # fmt: skip
    s.add_argument("--kv-block-size", type=int, default=16,
                   help="tokens per KV-cache page (default %(default)s)")  # fmt: skip
    pool = s.add_mutually_exclusive_group()
    pool.add_argument("--memory", default=None, metavar="SIZE",
                      help="device memory the budget sizes the page pool from, e.g. 80GB "
                      "(default: on a GPU its limit x 0.9)")  # fmt: skip
    pool.add_argument("--kv-pages", type=int, default=None, metavar="N",
                      help="the page pool's size in pages, instead of --memory")  # fmt: skip
    s.add_argument("--target", default=None, metavar="NAME",
                   help="hardware target of the budget (default: the device's)")  # fmt: skip
    s.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="a PEFT LoRA adapter served as model NAME (repeatable); requests "
                   "name it in their `model` field")  # fmt: skip
    s.add_argument("--max-lora-rank", type=int, default=None, metavar="R",
                   help="the adapter slots' rank (default: the largest --lora rank)")  # fmt: skip
    s.add_argument("--max-loras", type=int, default=None, metavar="N",
                   help="adapters on the device at once; more are loaded on demand, the least "
                   "recently used evicted (default: min(#--lora, --max-batch-size))")  # fmt: skip
    s.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor-parallel devices: the model split over the first N devices "
                   "(default %(default)s)")  # fmt: skip
    s.add_argument("--ep", type=int, default=1, metavar="M",
                   help="expert parallelism: 1 (experts split like an MLP) or --tp (each "
                   "device holds num_experts / M whole experts; default %(default)s)")  # fmt: skip
    s.set_defaults(func=cmd_serve)
    return s


def cmd_serve(args: argparse.Namespace, error: type[Exception] = RuntimeError) -> int:
    """Runs `jaxarena serve` (see `jaxarena.server.run.serve`); `error` is the CLI's one-line
    error class."""
    if not 0 <= args.port <= 65535:
        raise error(f"--port {args.port} is outside 0..65535")
    for flag in ("max_batch_size", "max_seq_len", "max_batch_tokens", "kv_block_size",
                 "kv_pages", "max_lora_rank", "max_loras", "tp", "ep"):  # fmt: skip
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise error(f"--{flag.replace('_', '-')} {value} must be >= 1")
    tp, ep = getattr(args, "tp", 1), getattr(args, "ep", 1)
    if ep not in (1, tp):
        raise error(f"--ep {ep} must be 1 or equal to --tp {tp} (experts are split over the "
                    "tensor-parallel devices)")  # fmt: skip
    args.loras = parse_loras(getattr(args, "lora", []), error)
    try:
        from jaxarena.server.run import serve
    except ImportError as e:
        raise error(f"jaxarena serve needs the serve extra (pip install 'jaxarena[serve]'): "
                    f"{e}") from None  # fmt: skip
    return serve(args, error)


def parse_loras(items: list[str], error: type[Exception] = ValueError) -> dict[str, str]:
    """`--lora NAME=PATH` options as `{NAME: PATH}`; a malformed or repeated NAME raises
    `error` naming it."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise error(f"--lora {item!r} must be NAME=PATH (a PEFT adapter directory)")
        if name in out:
            raise error(f"--lora {name!r} is given twice")
        out[name] = path
    return out
