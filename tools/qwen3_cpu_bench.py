"""The CPU speed checkpoint of issue #37 and transformers' figure on it.

Run in the torch virtual environment (tools/README.md), from the repository root::

    python tools/qwen3_cpu_bench.py make DIR     # random bf16 Qwen3-0.6B widths, 28 layers
    python tools/qwen3_cpu_bench.py bench DIR    # transformers bf16 prefill / decode tokens/s

`make` writes a Qwen3ForCausalLM with Qwen3-0.6B's dimensions (hidden 1024, 28 layers, 16
query / 8 KV heads of 128, intermediate 3072, vocab 151936, tied embeddings) and random
weights (transformers' initialisation, seed 0) as bf16 safetensors (1.2 GB; not committed).
`bench` runs what `benchmarks/bench_generate.py --checkpoint DIR` runs on the arena: the
`qwen3_fp8` fixture's four prompts (1, 5, 11 and 16 tokens) as one left-padded batch, greedy,
`--new-tokens` each, median of `--repeats` after a warm-up. Prefill tokens/s: the real prompt
tokens over one forward of the padded batch; decode tokens/s: the 4 sequences' new tokens
after the first over `generate(new_tokens) - generate(1)`; CPU-seconds of one
`generate(new_tokens)` call (all threads), as bench_generate.py reports them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "checkpoints" / "qwen3_fp8"


def make(out: Path) -> None:
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                      num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                      rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    print(f"wrote {out}")


def bench(path: Path, new_tokens: int, repeats: int) -> None:
    torch.set_num_threads(2)
    model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    with np.load(FIXTURE / "reference.npz") as r:
        prompts = [r["prompt_ids"][i, :n].tolist() for i, n in enumerate(r["prompt_lengths"])]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0)

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    with torch.inference_mode():
        model.generate(ids, max_new_tokens=new_tokens, **kw)  # warm-up
        pre, dec, cpu = [], [], []
        for _ in range(repeats):
            t_fwd = timed(lambda: model(ids, attention_mask=mask))
            t_one = timed(lambda: model.generate(ids, max_new_tokens=1, **kw))
            c0 = time.process_time()
            t_all = timed(lambda: model.generate(ids, max_new_tokens=new_tokens, **kw))
            cpu.append(time.process_time() - c0)
            pre.append(sum(len(p) for p in prompts) / t_fwd)
            dec.append(len(prompts) * (new_tokens - 1) / (t_all - t_one))
    print(f"transformers {torch.__version__} bf16 on {torch.get_num_threads()} threads, prompts "
          f"{[len(p) for p in prompts]}, {new_tokens} new tokens, median of {repeats}")  # fmt: skip
    print(f"prefill: {statistics.median(pre):10.1f} tokens/s")
    print(f"decode:  {statistics.median(dec):10.1f} tokens/s (batch {len(prompts)})")
    print(f"cpu:     {statistics.median(cpu):10.2f} CPU-seconds per generate call (all threads)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=("make", "bench"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.cmd == "make":
        make(args.dir)
    else:
        bench(args.dir, args.new_tokens, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
