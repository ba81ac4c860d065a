"""XLA's temporaries of the prefill and decode steps, without compiling them.

`MemoryBudget` reserves, beside the arena, what the static plan cannot see: the runtime's own
memory (`RUNTIME_RESERVE`) and the temporaries XLA allocates for a step (its `temp` bytes).
The temp bytes are measured by compiling the steps (`jaxarena step-report`, `jaxarena budget
--compiled`); where nothing is compiled (a family the models do not run, a target with no
compile-only device, or no `--compiled`), `estimate_step_temp` estimates them with the formula
below, fitted to measured compiles. No jax here: `jaxarena budget` imports none.

Measured (deviceless H200 compiles, jax 0.10.2, the step code of this commit: the paged
flash-attention prefill kernel, the step rule of jaxarena/models/README.md, prefills longer
than `DEFAULT_PREFILL_CHUNK` = 2048 tokens in chunks; default limits but `max_batch_tokens` T;
`python tools/fit_step_temp.py`, which prints these rows and the fit):

    preset          T     prefill temp    decode temp (batch 64)
    qwen3-8b        2048    219,165,224      2,640,152
    qwen3-8b        8192    153,126,792
    llama3.1-8b     2048    277,361,192      2,900,248
    llama3.1-8b     8192    194,004,040
    qwen3-32b       2048    441,465,896      4,620,568
    qwen3-32b       8192    336,616,008
    nemotron-h-8b   2048    331,375,144     13,261,336
    nemotron-h-8b   8192    441,696,112
    mamba2-2.7b     2048    190,185,496      7,741,712
    mamba2-2.7b     8192    269,131,848
    deepseek-v3     2048    831,386,840     20,416,472   (block-FP8 weights, as released)
    deepseek-v3     8192    820,622,208

Prefill. No T^2 term: the attention runs in the paged prefill kernel. And no growth past one
chunk: a prefill of more than 2048 tokens runs as 2048-token passes through every layer
(`ArenaLM.prefill_chunk`), so its temp is one chunk's (below the one-pass 2048-token temp,
since a chunk keeps the residual stream materialised after each block), plus, for SSM layers,
the masked copy of one layer's states of every sequence a chunk's scan starts from
(`(max_batch_size + 1) x` a layer's f32 state per sequence: 170 MB for mamba2-2.7b, 272 MB
for nemotron-h-8b at 65 rows). What lives at a chunk's peak is a layer's token-parallel
values: the MLP's joined gate|up GEMM output (`[T, 2 intermediate]` bf16, 4 B per unit) and
its activation (`[T, intermediate]` bf16, 2 B per unit: with gate and up one weight, one GEMM
in decode, the activation can no longer take the gate's buffer, as it did when they were two
outputs), and a few `[T, hidden]` rows. The 2048-token rows of qwen3-8b and llama3.1-8b differ
by 13.9 B per unit of intermediate (XLA reuses buffers differently at the two widths), so no
line fits them closely; a = `PREFILL_BYTES_PER_INTERMEDIATE` = 6.25 (the 6 B above and some)
and b = `PREFILL_BYTES_PER_HIDDEN` = 11.25 put the formula at or above every dense compile
(llama3.1-8b +0.2%, qwen3-32b +0.9%, qwen3-8b +14.8% at 2048 tokens; 1.32x-1.64x at 8192,
where the chunks measure lower). Before the joined weight: a = 4.0, b = 12.5 (qwen3-8b
185.6 MB, llama3.1-8b 218.6 MB, qwen3-32b 336.6 MB at 2048 tokens).

Mamba-2 blocks hold more per token: per unit of the in_proj width, mamba2-2.7b (no
attention, no MLP; 10,576) 8.78 B at 2048 tokens, nemotron-h-8b (Mamba, attention and MLP
blocks; 18,560) 8.72 B. `MAMBA_BYTES_PER_WIDTH` = 10.0 covers both (+13.9%, +14.7%). MLA
(DeepSeek-V3, absorbed prefill): 405,950 B per token, the absorbed query's float32 latent
product and its bf16 rows, `heads x (kv_lora + rope)` = 73,728 units at 5.5 B;
`MLA_BYTES_PER_LATENT` = 6.0 (+9.0%). So the estimate is the largest of the kinds:

    prefill temp ~= min(T, 2048) x max(PREFILL_BYTES_PER_INTERMEDIATE x max(intermediate,
                                          MoE width) + PREFILL_BYTES_PER_HIDDEN x hidden,
                                       MAMBA_BYTES_PER_WIDTH x Mamba in_proj width,
                                       MLA_BYTES_PER_LATENT x heads x (kv_lora + rope))
                    + [T > 2048] x (max_batch_size + 1) x one SSM layer's state per sequence

Families measured only through these (MoE, gated delta net) take the same terms, unmeasured:
their blocks run other kernels and may hold more.

Decode. The temp is at most the bf16 logits of the batch, `B x vocab x 2` bytes, plus a few
small buffers (`DECODE_FIXED`, 4 MiB: the argmax and indices, FP8 activations, Mamba conv
windows): the logits are the step's output; what the compiles show (2.6 to 20.4 MB at batch
64) sits at or below that bound (deepseek-v3: 20.7 MB bound, 20.4 measured; qwen3-8b 23.6
bound, 2.6 measured since issue 39's decode fusions, 10.5 before), which is kept as the
estimate. It matters little: prefill dominates at
any `max_batch_tokens` above ~100.

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
# Prefill temp per token: per unit of the MLP width and of the hidden size (chosen to cover
# every dense compile, the joined gate|up output and its activation 6 B per unit), per unit of
# a Mamba in_proj width (8.78 the most measured, rounded up). See the module docstring.
PREFILL_BYTES_PER_INTERMEDIATE = 6.25
PREFILL_BYTES_PER_HIDDEN = 11.25
MAMBA_BYTES_PER_WIDTH = 10.0
# MLA prefill temp per token and per unit of `heads x (kv_lora + rope)`: the absorbed query's
# float32 latent product and its bf16 `[q_lat | q_rope]` rows (6 B per unit; DeepSeek-V3
# widths measured 414 KB per token, this gives 442 KB). See the module docstring.
MLA_BYTES_PER_LATENT = 6.0
# Fixed decode temp beside the logits bound (the argmax, indices, FP8 activations and the
# Mamba-2 conv windows: deepseek-v3 measures 3.9 MB above its logits, mamba2-2.7b 1.3 MB).
DECODE_FIXED = 4 << 20
ESTIMATE_MARGIN = 1.10


def _mlp_width(config: Any) -> int:
    """The widest MLP row: `max(intermediate, moe_intermediate)` (0 without MLPs)."""
    return max(config.intermediate_size or 0,
               int(getattr(config, "moe_intermediate_size", 0) or 0))  # fmt: skip


def _state_row_bytes(config: Any) -> int:
    """The float32 recurrent state one sequence holds in one SSM layer (the largest kind:
    Mamba-2 `heads x head_dim x d_state`, Gated DeltaNet `v_heads x k_dim x v_dim`); 0
    without SSM layers."""
    mamba = (int(getattr(config, "mamba_num_heads", 0) or 0)
             * int(getattr(config, "mamba_head_dim", 0) or 0)
             * int(getattr(config, "ssm_state_size", 0) or 0))  # fmt: skip
    gdn = (int(getattr(config, "linear_num_value_heads", 0) or 0)
           * int(getattr(config, "linear_key_head_dim", 0) or 0)
           * int(getattr(config, "linear_value_head_dim", 0) or 0))  # fmt: skip
    return 4 * max(mamba, gdn)


def prefill_temp_estimate(config: Any, max_batch_tokens: int,
                          max_batch_size: int | None = None) -> int:  # fmt: skip
    """Estimated XLA temp bytes of the prefill step at `max_batch_tokens` tokens (per device:
    pass the sharded config): one chunk's, `min(max_batch_tokens, DEFAULT_PREFILL_CHUNK)`
    tokens (the steps run longer prefills in chunks), plus, in chunks of a model with SSM
    layers and given `max_batch_size`, one layer's states of every sequence (the masked copy
    a chunk's scan starts from); see the module docstring for the formula and its fit."""
    tokens = min(max_batch_tokens, DEFAULT_PREFILL_CHUNK)
    dense = (PREFILL_BYTES_PER_INTERMEDIATE * _mlp_width(config)
             + PREFILL_BYTES_PER_HIDDEN * config.hidden_size)  # fmt: skip
    mamba = MAMBA_BYTES_PER_WIDTH * int(getattr(config, "mamba2_in_proj_size", 0) or 0)
    lora = int(getattr(config, "kv_lora_rank", 0) or 0)
    mla = 0.0
    if lora:
        rope = int(getattr(config, "qk_rope_head_dim", 0) or 0)
        mla = MLA_BYTES_PER_LATENT * config.num_attention_heads * (lora + rope)
    temp = int(tokens * max(dense, mamba, mla))
    if max_batch_tokens > DEFAULT_PREFILL_CHUNK and max_batch_size:
        temp += (max_batch_size + 1) * _state_row_bytes(config)
    return temp


def decode_temp_estimate(config: Any, max_batch_size: int) -> int:
    """Estimated XLA temp bytes of the decode step at `max_batch_size` sequences: the bf16
    logits of the batch plus `DECODE_FIXED`."""
    return max_batch_size * config.vocab_size * 2 + DECODE_FIXED


def estimate_step_temp(config: Any, max_batch_tokens: int, max_batch_size: int) -> int:
    """`ESTIMATE_MARGIN` x the larger of the prefill and decode estimates (bytes)."""
    worst = max(prefill_temp_estimate(config, max_batch_tokens, max_batch_size),
                decode_temp_estimate(config, max_batch_size))  # fmt: skip
    return int(worst * ESTIMATE_MARGIN)
