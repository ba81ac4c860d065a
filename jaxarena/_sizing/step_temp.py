"""XLA's temporaries of the prefill and decode steps, without compiling them.

`MemoryBudget` reserves, beside the arena, what the static plan cannot see: the runtime's own
memory (`RUNTIME_RESERVE`) and the temporaries XLA allocates for a step (its `temp` bytes).
The temp bytes are measured by compiling the steps (`jaxarena step-report`, `jaxarena budget
--compiled`); where nothing is compiled (a family the models do not run, a target with no
compile-only device, or no `--compiled`), `estimate_step_temp` estimates them with the formula
below, fitted to measured compiles. No jax here: `jaxarena budget` imports none.

Measured (deviceless H200 compiles, jax 0.10.2, the step code of this commit: the paged
flash-attention prefill kernel, the step rule of jaxarena/models/README.md; default limits but
`max_batch_tokens` T; `python tools/fit_step_temp.py`, which prints these rows and the fit):

    preset          T     prefill temp    B per token   decode temp (batch 64)
    qwen3-8b        2048    185,619,472      90,634     10,528,272
    qwen3-8b        8192    807,457,296      98,567
    llama3.1-8b     2048    218,112,016     106,500     11,837,968
    llama3.1-8b     8192    872,423,440     106,497
    qwen3-32b       2048    336,624,144     164,367      6,603,280
    qwen3-32b       8192  1,344,345,616     164,105
    nemotron-h-8b   2048    331,387,928     161,810      6,362,392
    nemotron-h-8b   8192  1,392,552,992     169,989
    mamba2-2.7b     2048    190,218,264      92,880      5,755,160
    mamba2-2.7b     8192    855,657,760     104,450

Prefill. No T^2 term any more: the attention runs in the paged prefill kernel, whose output
is in the arena, so the temp is linear in T (the bytes per token above barely move from 2048
to 8192 tokens). What lives at the peak is a layer's token-parallel values: the MLP's
`[T, intermediate]` GEMM outputs (gate and up: two bf16 buffers, 4 B per unit) and a few
`[T, hidden]` rows (the f32 residual stream, its pre-norm and the block output). A relative
least-squares fit of the six dense compiles to `T x (a x intermediate + b x hidden)` gives
a = 4.48, b = 9.84 (residuals -3.2% .. +5.3%); rounded to a = `PREFILL_BYTES_PER_INTERMEDIATE`
= 4.0 and b = `PREFILL_BYTES_PER_HIDDEN` = 12.5 the formula is at or above every dense compile:

    preset        T=2048    T=8192      (estimate / measured - 1)
    qwen3-8b      +10.7%    +1.8%
    llama3.1-8b    +1.9%    +1.9%
    qwen3-32b      +1.2%    +1.4%

Mamba-2 blocks hold more per token, and a little more at 8192 tokens than at 2048 (the SSD
scan's per-chunk values): per unit of the in_proj width, mamba2-2.7b (no attention, no MLP;
10,576) 8.78 and 9.88 B, nemotron-h-8b (Mamba, attention and MLP blocks; 18,560) 8.72 and
9.16 B, above its dense term (137,216 B per token): its peak is in a Mamba block, where the
f32 in_proj output and the scan's inputs live. `MAMBA_BYTES_PER_WIDTH` = 10.0 covers all four
(+13.9% and +1.3%, +14.7% and +9.2%). So the estimate is the larger of the two kinds:

    prefill temp ~= T x max(PREFILL_BYTES_PER_INTERMEDIATE x max(intermediate, MoE width)
                              + PREFILL_BYTES_PER_HIDDEN x hidden,
                            MAMBA_BYTES_PER_WIDTH x Mamba in_proj width)

Families measured only through these (MoE, MLA, gated delta net) take the same terms,
unmeasured: their blocks run other kernels and may hold more.

Decode. The temp is at most the bf16 logits of the batch, `B x vocab x 2` bytes, plus a few
small buffers (`DECODE_FIXED`): the logits are now the step's output, and what the compiles
show (5.8 to 11.8 MB at batch 64) sits below that bound (qwen3-8b: 19.4 MB), which is kept as
the estimate. It matters little: prefill dominates at any `max_batch_tokens` above ~100.

The estimate is the larger of the two (both steps run in the same reserve), rounded up by
`ESTIMATE_MARGIN` against what the fit leaves out. When the step code changes, re-run
`tools/fit_step_temp.py` (and `--presets mamba2-2.7b nemotron-h-8b`) and refit.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DECODE_FIXED",
    "DEFAULT_PREFILL_CHUNK",
    "ESTIMATE_MARGIN",
    "MAMBA_BYTES_PER_WIDTH",
    "MLA_BYTES_PER_LATENT",
    "PREFILL_BYTES_PER_HIDDEN",
    "PREFILL_BYTES_PER_INTERMEDIATE",
    "RUNTIME_RESERVE",
    "decode_temp_estimate",
    "estimate_step_temp",
    "prefill_temp_estimate",
]

GIB = 1 << 30
# Tokens per chunk of a long prefill (`ArenaLM.prefill_chunk="auto"`): a prefill of more tokens
# runs as chunks of this many through every layer, so its XLA temp is one chunk's
# (benchmarks/step_costs.py --prefill-chunk; the README's "fixed workspace" figures).
DEFAULT_PREFILL_CHUNK = 2048
# The runtime's own share outside the plan and XLA's temp: the CUDA context, cuBLAS / cuDNN
# workspaces, NCCL channel buffers. Not measurable without a GPU; kept from the old default.
RUNTIME_RESERVE = GIB
# Prefill temp per token: per unit of the MLP width and of the hidden size (the dense fit,
# 4.48 and 9.84, rounded to cover every dense compile), per unit of a Mamba in_proj width
# (9.88 the most measured, rounded up). See the module docstring.
PREFILL_BYTES_PER_INTERMEDIATE = 4.0
PREFILL_BYTES_PER_HIDDEN = 12.5
MAMBA_BYTES_PER_WIDTH = 10.0
# MLA prefill temp per token and per unit of `heads x (kv_lora + rope)`: the absorbed query's
# float32 latent product and its bf16 `[q_lat | q_rope]` rows (6 B per unit; DeepSeek-V3
# widths measured 414 KB per token, this gives 442 KB). See the module docstring.
MLA_BYTES_PER_LATENT = 6.0
# Fixed decode temp beside the logits bound (small buffers: the argmax, indices).
DECODE_FIXED = 256 << 10
ESTIMATE_MARGIN = 1.10


def _mlp_width(config: Any) -> int:
    """The widest MLP row: `max(intermediate, moe_intermediate)` (0 without MLPs)."""
    return max(config.intermediate_size or 0,
               int(getattr(config, "moe_intermediate_size", 0) or 0))  # fmt: skip


def prefill_temp_estimate(config: Any, max_batch_tokens: int) -> int:
    """Estimated XLA temp bytes of the prefill step at `max_batch_tokens` tokens (per device:
    pass the sharded config): one chunk's, `min(max_batch_tokens, DEFAULT_PREFILL_CHUNK)`
    tokens (the steps run longer prefills in chunks); see the module docstring for the
    formula and its fit."""
    max_batch_tokens = min(max_batch_tokens, DEFAULT_PREFILL_CHUNK)
    dense = (PREFILL_BYTES_PER_INTERMEDIATE * _mlp_width(config)
             + PREFILL_BYTES_PER_HIDDEN * config.hidden_size)  # fmt: skip
    mamba = MAMBA_BYTES_PER_WIDTH * int(getattr(config, "mamba2_in_proj_size", 0) or 0)
    lora = int(getattr(config, "kv_lora_rank", 0) or 0)
    mla = 0.0
    if lora:
        rope = int(getattr(config, "qk_rope_head_dim", 0) or 0)
        mla = MLA_BYTES_PER_LATENT * config.num_attention_heads * (lora + rope)
    return int(max_batch_tokens * max(dense, mamba, mla))


def decode_temp_estimate(config: Any, max_batch_size: int) -> int:
    """Estimated XLA temp bytes of the decode step at `max_batch_size` sequences: the bf16
    logits of the batch plus `DECODE_FIXED`."""
    return max_batch_size * config.vocab_size * 2 + DECODE_FIXED


def estimate_step_temp(config: Any, max_batch_tokens: int, max_batch_size: int) -> int:
    """`ESTIMATE_MARGIN` x the larger of the prefill and decode estimates (bytes)."""
    worst = max(prefill_temp_estimate(config, max_batch_tokens),
                decode_temp_estimate(config, max_batch_size))  # fmt: skip
    return int(worst * ESTIMATE_MARGIN)
