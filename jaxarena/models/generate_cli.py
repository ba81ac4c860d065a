"""What `jaxarena generate` runs: load a checkpoint with `load_pretrained`, decode greedily,
print the tokens and the figures (prefill and decode tokens/s, compile seconds, arena and
weight bytes). The argument parser is in `jaxarena.cli`."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from jaxarena import ModelConfig, Target
from jaxarena._units import format_bytes
from jaxarena.models.runtime import load_pretrained

# A run longer than this prints what it is doing on stderr, every PROGRESS_SECONDS after.
PROGRESS_AFTER_SECONDS = 3.0
PROGRESS_SECONDS = 5.0

__all__ = ["run_generate"]


def _prompt_ids(text: str, error: type[Exception]) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        raise error(
            f"--prompt-ids {text!r} must be comma-separated token ids, e.g. 1,2,3"
        ) from None
    if not ids or min(ids) < 0:
        raise error(f"--prompt-ids {text!r} must be non-negative token ids")
    return ids


def run_generate(args: argparse.Namespace, error: type[Exception] = ValueError) -> int:
    """Greedy decoding of a local HuggingFace checkpoint on the arena (`load_pretrained`);
    bad arguments raise `error` (the CLI's one-line error); returns the exit status 0."""
    prompts = [_prompt_ids(t, error) for t in args.prompt_ids or ["0"]]
    if args.max_new_tokens < 1:
        raise error(f"--max-new-tokens {args.max_new_tokens} must be >= 1")
    tp, ep = getattr(args, "tp", 1), getattr(args, "ep", 1)
    if tp < 1 or ep not in (1, tp):
        raise error(f"--tp {tp} --ep {ep}: --tp must be >= 1 and --ep 1 or equal to --tp")
    mesh = {"mesh": tp, "ep": ep} if tp > 1 else {}
    batch = args.max_batch_size or len(prompts)
    block = args.kv_block_size
    longest = max(len(p) for p in prompts) + args.max_new_tokens
    # Defaults: just enough for this request (prefill pads to max_batch_tokens with one token
    # per free sequence slot, plus one, so one compiled prefill serves every request).
    tokens = args.max_batch_tokens or sum(len(p) for p in prompts) + batch + 1 - len(prompts)
    seq = args.max_seq_len or -(-longest // block) * block
    # Before the load (seconds): the model's context bounds every sequence it runs.
    config_file = Path(args.path) / "config.json"
    if config_file.is_file():  # else load_pretrained says what is missing
        config = ModelConfig.from_hf(config_file)
        if args.max_seq_len:
            config.check_context(seq, f"--max-seq-len {seq:,}", error)
        config.check_context(longest, f"the longest prompt + --max-new-tokens = {longest:,} "
                             "tokens", error)  # fmt: skip
    with _Progress(f"{len(prompts)} x {args.max_new_tokens} new tokens"):
        lm = load_pretrained(args.path, max_batch_tokens=tokens, max_seq_len=seq,
                             kv_block_size=block, max_batch_size=batch,
                             target=Target.preset(args.target), packed=args.packed,
                             **mesh)  # fmt: skip
        out = lm.generate(prompts, args.max_new_tokens)
    st = lm.last_stats
    rate = lambda n, t: n / t if t > 0 else float("inf")  # noqa: E731
    result = {
        "model_type": lm.model_type,
        "path": lm.path,
        "fp8": lm.fp8,
        "tokens": out,
        "prefill_tokens": st["prefill_tokens"],
        "prefill_tokens_per_s": rate(st["prefill_tokens"], st["prefill_seconds"]),
        "decode_tokens": st["decode_tokens"],
        "decode_tokens_per_s": rate(st["decode_tokens"], st["decode_seconds"]),
        "compile_seconds": {k: round(v, 3) for k, v in lm.compile_seconds.items()},
        "arena_bytes": lm.arena_bytes,
        "weight_bytes": lm.weight_bytes,
        "limits": {
            "max_batch_tokens": tokens,
            "max_seq_len": seq,
            "kv_block_size": block,
            "max_batch_size": batch,
        },  # fmt: skip
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{lm.model_type} from {lm.path}: {'fp8' if lm.fp8 else 'bf16'} weights "
          f"{format_bytes(lm.weight_bytes)}; arena {format_bytes(lm.arena_bytes)} in "
          f"{len(lm.model.plan.regions)} regions")  # fmt: skip
    for i, (p, new) in enumerate(zip(prompts, out, strict=True)):
        print(f"prompt {i} ({len(p)} tokens): {' '.join(map(str, new))}")
    print(f"prefill: {st['prefill_tokens']} tokens, {result['prefill_tokens_per_s']:.1f} tokens/s")
    print(f"decode: {st['decode_tokens']} tokens, {result['decode_tokens_per_s']:.1f} tokens/s")
    print("compile: " + ", ".join(f"{k} {v:.2f} s" for k, v in lm.compile_seconds.items()))
    return 0


class _Progress:
    """While a `generate` runs: silent for its first `PROGRESS_AFTER_SECONDS`, then one line
    on stderr every `PROGRESS_SECONDS` saying how long it has run (a long decode is no
    longer silent for minutes). A daemon thread; stopped when the block exits."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._tick, daemon=True)

    def _tick(self) -> None:
        t0 = time.perf_counter()
        wait = PROGRESS_AFTER_SECONDS
        while not self.done.wait(wait):
            elapsed = time.perf_counter() - t0
            print(f"jaxarena: generate: {elapsed:.0f} s, still loading, compiling or decoding "
                  f"({self.what})", file=sys.stderr, flush=True)  # fmt: skip
            wait = PROGRESS_SECONDS

    def __enter__(self) -> _Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

