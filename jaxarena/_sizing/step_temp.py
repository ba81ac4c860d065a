"""XLA's temporaries of the prefill and decode steps, without compiling them.

`MemoryBudget` reserves, beside the arena, what the static plan cannot see: the runtime's own
memory (`RUNTIME_RESERVE`) and the temporaries XLA allocates for a step (its `temp` bytes).
The temp bytes are measured by compiling the steps (`jaxarena step-report`, `jaxarena budget
--compiled`); where nothing is compiled (a family the models do not run, a target with no
compile-only device, or no `--compiled`), `estimate_step_temp` estimates them with the formula
below, fitted to measured compiles. No jax here: `jaxarena budget` imports none.

Measured (deviceless H200 compiles, jax 0.10.2, the step code of this commit, default limits
but `max_batch_tokens` T; `jaxarena step-report PRESET --target h200 --max-batch-tokens T`):

    preset          T     prefill temp      decode temp (batch 64)
    qwen3-8b        8192  17,368,696,856    19,448,336
    qwen3-8b        2048   1,108,371,480    19,448,336
    nemotron-h-8b   8192  17,179,992,864    16,933,400
    nemotron-h-8b   2048   1,073,806,616    16,933,400
    mamba2-2.7b     8192     425,050,656     6,502,680
    mamba2-2.7b     2048     106,299,416     6,502,680
    qwen3-32b       8192  34,615,689,240    19,448,336

Prefill. The attention blocks compute the dense causal scores of all T tokens, `f32[Hq, T, T]`,
and their softmax: 2 x 4 Hq T^2 bytes, the whole T^2 part of the qwen3-8b figures (8192: 2 x
8,589,934,592 = 17,179,869,184 of 17,368,696,856). The rest grows linearly with T: 188,827,672 B at
8192 and 34,629,656 B at 2048, a slope of 25,097 B per token = 2.04 B per unit of the widest
activation row (qwen3-8b: the intermediate size, 12,288; one bf16 `[T, intermediate]` buffer).
Mamba-2 blocks hold more per token: mamba2-2.7b (no attention) needs 51,886 B per token at
8192, 4.91 B per unit of its in_proj width (10,576: the f32 projection and the scan's inputs).
On nemotron-h-8b (attention and Mamba) the measured temp is the scores alone (17,179,869,184
of 17,179,992,864; 1,073,741,824 of 1,073,806,616 at 2048): the Mamba blocks run at other times
and XLA gives their bytes to the scores. So the estimate is the larger of the two kinds:

    prefill temp ~= max(8 Hq T^2 [when the model has attention layers]
                          + T x PREFILL_BYTES_PER_WIDTH x max(hidden, intermediate, MoE width),
                        T x MAMBA_BYTES_PER_WIDTH x Mamba in_proj width)

(nemotron-h-8b: 2% high at 8192, 9% at 2048; qwen3-32b, measured after the fit: 0.5% high).
Families the models do not run yet (MoE, MLA, gated delta net) take the same terms, unmeasured.

Decode. The temp is the bf16 logits of the batch, `B x vocab x 2` bytes (qwen3-8b: 64 x
151,936 x 2 = 19,447,808 of 19,448,336), plus a few small buffers (`DECODE_FIXED` covers them).

The estimate is the larger of the two (both steps run in the same reserve), rounded up by
`ESTIMATE_MARGIN` against what the fit leaves out. When the step code changes (the dense scores
give way to a flash-attention kernel, issue 23 item 1), re-measure with `jaxarena step-report`
and refit: the T^2 term then vanishes.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DECODE_FIXED",
    "ESTIMATE_MARGIN",
    "MAMBA_BYTES_PER_WIDTH",
    "PREFILL_BYTES_PER_WIDTH",
    "RUNTIME_RESERVE",
    "decode_temp_estimate",
    "estimate_step_temp",
    "prefill_temp_estimate",
]

GIB = 1 << 30
# The runtime's own share outside the plan and XLA's temp: the CUDA context, cuBLAS / cuDNN
# workspaces, NCCL channel buffers. Not measurable without a GPU; kept from the old default.
RUNTIME_RESERVE = GIB
# Bytes per token of the linear part of prefill's temp, per unit of the widest activation row.
PREFILL_BYTES_PER_WIDTH = 2.1  # 2.04 measured, rounded up
MAMBA_BYTES_PER_WIDTH = 5.0  # 4.91 measured, rounded up
# Fixed decode temp beside the logits (small buffers: the argmax, indices); measured at most
# 156,184 B (nemotron-h-8b), 65,816 B (mamba2-2.7b), 528 B (qwen3-8b).
DECODE_FIXED = 256 << 10
ESTIMATE_MARGIN = 1.10


def _attention_heads(config: Any) -> int:
    """Query heads of the attention layers (0 when the model has none)."""
    kinds = set(getattr(config, "layer_types", ()) or ())
    attention = {k for k in kinds if "attention" in k or k in ("attn", "mla")}
    if kinds and not attention:
        return 0
    return int(config.num_attention_heads or 0)


def _dense_width(config: Any) -> int:
    return max(config.hidden_size, config.intermediate_size or 0,
               int(getattr(config, "moe_intermediate_size", 0) or 0))  # fmt: skip


def prefill_temp_estimate(config: Any, max_batch_tokens: int) -> int:
    """Estimated XLA temp bytes of the prefill step at `max_batch_tokens` tokens (per device:
    pass the sharded config); see the module docstring for the formula and its fit."""
    t = max_batch_tokens
    scores = 8 * _attention_heads(config) * t * t
    attention = scores + t * PREFILL_BYTES_PER_WIDTH * _dense_width(config)
    mamba = t * MAMBA_BYTES_PER_WIDTH * int(getattr(config, "mamba2_in_proj_size", 0) or 0)
    return int(max(attention, mamba))


def decode_temp_estimate(config: Any, max_batch_size: int) -> int:
    """Estimated XLA temp bytes of the decode step at `max_batch_size` sequences: the bf16
    logits of the batch plus `DECODE_FIXED`."""
    return max_batch_size * config.vocab_size * 2 + DECODE_FIXED


def estimate_step_temp(config: Any, max_batch_tokens: int, max_batch_size: int) -> int:
    """`ESTIMATE_MARGIN` x the larger of the prefill and decode estimates (bytes)."""
    worst = max(prefill_temp_estimate(config, max_batch_tokens),
                decode_temp_estimate(config, max_batch_size))  # fmt: skip
    return int(worst * ESTIMATE_MARGIN)
