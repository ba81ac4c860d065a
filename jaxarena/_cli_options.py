"""The options `jaxarena plan`, `budget` and `fit` share (limits, target, mesh, budget)."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_LIMITS = {
    "max_batch_tokens": 8192,
    "max_seq_len": 32768,
    "kv_block_size": 16,
    "max_batch_size": 64,
}
# The target a plan is sized for unless --target says otherwise: the seed's baseline build.
# Named, not detected, so the same command gives the same numbers on every machine and never
# imports jax; `--target auto` asks jax for its default device.
DEFAULT_TARGET = "gb10"
# `step-report --target`: the compile targets (gpu_specs/*.txtpb) under every GPU name the
# sizing targets accept; any Hopper part compiles as the H200 (sm_90a, 132 SMs).
STEP_REPORT_TARGETS = {
    "h200": "h200", "hopper": "h200", "h100": "h200", "h800": "h200", "gh200": "h200",
    "b200": "b200", "cpu": "cpu",
}  # fmt: skip


def stored_weights(config: Any) -> str:
    """The `--weights` a budget defaults to: the format the checkpoint stores (its
    `quantization_config`: `fp8` block-scaled, `mxfp4` experts), else bf16."""
    stored = getattr(config, "quant_method", "")
    return stored if stored in ("fp8", "mxfp4") else "bf16"


def add_limits(
    p: argparse.ArgumentParser, *, with_tokens: bool = True, batch_default: int | None = 64
) -> None:
    if with_tokens:
        p.add_argument("--max-batch-tokens", type=int, default=DEFAULT_LIMITS["max_batch_tokens"],
                       help="token rows of one forward pass (default %(default)s)")  # fmt: skip
    p.add_argument("--max-seq-len", type=int, default=None,
                   help=f"longest sequence, at most the model's max_position_embeddings "
                   f"(default {DEFAULT_LIMITS['max_seq_len']}, or that when shorter)")  # fmt: skip
    p.add_argument("--kv-block-size", type=int, default=DEFAULT_LIMITS["kv_block_size"],
                   help="paged-KV block size in tokens, a power of two; 0 = unpaged "
                   "(default %(default)s)")  # fmt: skip
    p.add_argument("--max-batch-size", type=int, default=batch_default,
                   help="sequence slots (default %(default)s)" if batch_default else
                   "sequence slots (default: the larger of 64 and --sequences)")  # fmt: skip
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help="hardware target: gb10 (default: the seed's baseline), h100 / h200 "
                   "(hopper), b200, b300, ...; auto = jax's default device (imports jax)")  # fmt: skip
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (per-device plan)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree (per-device plan)")
    p.add_argument("--align", type=int, default=256, help="region alignment in bytes")
    p.add_argument("--packed", action="store_true",
                   help="also pack buffers that are never live together")  # fmt: skip
    p.add_argument("--json", action="store_true", help="machine-readable output")


def add_budget_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--memory",
        required=True,
        help="memory of ONE device, e.g. 141GB (10^9), 24GiB (2^30), 80e9",
    )
    p.add_argument(
        "--weights",
        choices=("bf16", "fp8", "mxfp4"),
        default=None,
        help="weight format: bf16, fp8 with 128x128 block scales, or mxfp4 experts (4-bit, "
        "one e8m0 scale per 32) (default: what the config's quantization_config stores, "
        "else bf16)",
    )
    p.add_argument(
        "--kv-dtype",
        choices=("bf16", "fp8"),
        default="bf16",
        help="KV-cache element type (default bf16)",
    )
    p.add_argument(
        "--state-dtype",
        choices=("f32", "bf16"),
        default="f32",
        help="SSM / gated-delta-net state type (default f32)",
    )
    p.add_argument(
        "--reserve",
        default=None,
        help="memory left to the runtime and XLA, e.g. 4GiB (default: 1 GiB + the XLA temp "
        "of the steps, estimated; measured with --compiled)",
    )


def add_step_report_options(p: argparse.ArgumentParser) -> None:
    """`jaxarena step-report`'s options: the model, the compile target, the serve limits."""
    p.add_argument("model", help="preset name, config.json path, or checkpoint directory "
                   "(only its config and safetensors headers are read)")  # fmt: skip
    p.add_argument("--target", choices=tuple(STEP_REPORT_TARGETS), default="h200",
                   type=str.lower, metavar="{h200,h100,hopper,b200,cpu}",
                   help="compile for an H200 (any Hopper: h100, hopper) / B200 without a GPU "
                   "(needs the gpu-aot extra: pip install 'jaxarena[gpu-aot]') or for this "
                   "CPU (default %(default)s)")  # fmt: skip
    p.add_argument("--max-batch-tokens", type=int, default=DEFAULT_LIMITS["max_batch_tokens"],
                   help="prefill tokens (default %(default)s)")  # fmt: skip
    p.add_argument("--max-seq-len", type=int, default=None,
                   help=f"longest sequence, at most the model's max_position_embeddings "
                   f"(default {DEFAULT_LIMITS['max_seq_len']}, or that when shorter)")  # fmt: skip
    p.add_argument("--kv-block-size", type=int, default=DEFAULT_LIMITS["kv_block_size"],
                   help="paged-KV block size in tokens, a power of two (default %(default)s)")  # fmt: skip
    p.add_argument("--max-batch-size", type=int, default=DEFAULT_LIMITS["max_batch_size"],
                   help="decode sequences (default %(default)s)")  # fmt: skip
    p.add_argument(
        "--weights",
        choices=("bf16", "fp8"),
        default=None,
        help="weight format (default: as the checkpoint / config stores them)",
    )
    p.add_argument("--context", type=int, default=None,
                   help="tokens each sequence attends, for the modeled time (default: 1024, "
                   "at most --max-seq-len)")  # fmt: skip
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel devices: one device's "
                   "step over N compile-only GPUs, with its collectives (default 1)")  # fmt: skip
    p.add_argument("--ep", type=int, default=1, help="expert parallelism: 1, or --tp to split "
                   "the routed experts whole over the same devices (default 1)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="machine-readable output")


def add_generate_options(g: argparse.ArgumentParser) -> None:
    """`jaxarena generate`'s arguments."""
    g.add_argument("path", help="checkpoint directory (config.json + *.safetensors)")
    g.add_argument("--prompt-ids", action="append", metavar="IDS",
                   help="comma-separated token ids; repeat for a batch (default: 0)")  # fmt: skip
    g.add_argument("--max-new-tokens", type=int, default=16, help="default %(default)s")
    g.add_argument("--max-batch-tokens", type=int, default=None,
                   help="arena limit (default: what the prompts need)")  # fmt: skip
    g.add_argument("--max-seq-len", type=int, default=None,
                   help="arena limit (default: longest prompt + new tokens)")  # fmt: skip
    g.add_argument("--kv-block-size", type=int, default=16, help="default %(default)s")
    g.add_argument("--max-batch-size", type=int, default=None,
                   help="sequence slots (default: the number of prompts)")  # fmt: skip
    g.add_argument("--target", default="gb10",
                   help="hardware target: gb10, h100, h200, b200, ... (default %(default)s)")  # fmt: skip
    g.add_argument("--packed", action="store_true", help="pack the arena by buffer lifetimes")
    g.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallelism over the first N devices (default %(default)s)")  # fmt: skip
    g.add_argument("--ep", type=int, default=1, metavar="M",
                   help="1, or --tp: routed experts split whole over the devices")  # fmt: skip
    g.add_argument("--json", action="store_true", help="machine-readable output")
