"""A small but real hybrid language model that runs every step on one fixed arena.

Layers follow the config's `layer_types` (a Nemotron-H-shaped preset, `tiny-hybrid`, by
default):
- `"mamba"`: Mamba-2 mixer. in_proj -> causal depthwise conv1d (kernel 4) -> SSD scan
  (prefill: the `ssd_chunked_scan` Pallas kernel with its scratch in `ssd_scratch`; decode:
  the one-step state update) -> gate with silu(z) -> grouped RMSNorm -> out_proj.
- attention (`"full_attention"`, ...): GQA with RoPE and a paged KV cache (vLLM layout).
  Prefill attends densely within each packed sequence; decode runs the split-K Pallas kernel
  with its partials in `splitk_workspace` and its output in `attn_output`.
- `"mlp"`: relu^2 MLP whose two projections quantize their input activations with the FP8
  block kernel (1 x 128 blocks) into `fp8_act*` (K = hidden) and `ffn_act_*`
  (K = intermediate) and multiply the dequantized values.
RMSNorm before every block, residual adds, a final norm and an LM head.

Every intermediate the seed gives a buffer for is written to and read back from the arena at
the plan's offsets (`hidden_states`, `residual`, `norm_output`, `qkv_output`, `attn_output`,
`ssm_qkvz`, `ssm_deinterleaved`, `expert_up_out`, `moe_output`, `logits`, the FP8 buffers,
`splitk_workspace`, `ssd_scratch`). Stored activations are bfloat16, as the seed sizes them;
arithmetic is float32.

`prefill` and `decode_step` are pure; jit them with the arena and the caches donated
(`jax.jit(model.prefill, donate_argnums=(1, 2))`), so every step runs in the same device buffers.

The blocks are those of `jaxarena.models.blocks` on the decoder `jaxarena.models.stack.ArenaLM`,
the one implementation the HuggingFace checkpoints (`load_pretrained`) run on as well:
`HybridModel` only chooses its blocks (`hybrid_arch`: relu^2 MLPs on FP8 activations, RoPE
attention, Mamba-2) and draws their random weights (`init_params`, each block's own
`init_params`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, ServeLimits, Target
from jaxarena.models.blocks import LAYER_TYPES, MLP, Attention, Block, Mamba2
from jaxarena.models.stack import Arch, ArenaLM

__all__ = ["HybridModel", "hybrid_arch", "init_params", "init_caches", "default_block_tables"]

F32 = jnp.float32
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
# The block kinds of the layer types this reference runs: the shared vocabulary
# (`blocks.LAYER_TYPES`), and sliding-window layers run as full attention.
_KINDS = {**LAYER_TYPES, "sliding_attention": "attention"}
_BLOCKS: dict[str, Block] = {
    "attention": Attention(rope=True, rope_theta=ROPE_THETA, qk_norm=False, rms_eps=RMS_EPS),
    "mamba": Mamba2(rms_eps=RMS_EPS),
    "mlp": MLP(act="relu2", fp8_acts=True),
}


def _blocks(config: ModelConfig) -> tuple[Block, ...]:
    bad = [lt for lt in config.layer_types if lt not in _KINDS]
    if bad:
        raise NotImplementedError(f"the reference hybrid model has no {bad[0]!r} layers "
                                  "(attention, mamba, mlp only)")  # fmt: skip
    return tuple(_BLOCKS[_KINDS[lt]] for lt in config.layer_types)


def hybrid_arch(config: ModelConfig) -> Arch:
    """The reference hybrid's architecture for `config`: one block per layer type (`Mamba2`,
    `Attention` with RoPE, relu^2 `MLP` whose projections multiply FP8-quantized activations),
    RMSNorm eps 1e-5, an untied LM head.

    Raises:
      NotImplementedError: a layer type other than attention, mamba and mlp, or experts.
    """
    blocks = _blocks(config)
    if config.num_experts:
        raise NotImplementedError("the reference hybrid model has no MoE layers")
    return Arch(blocks=blocks, rms_eps=RMS_EPS, tie_embeddings=False)


def init_params(config: ModelConfig, seed: int = 0) -> dict[str, Any]:
    """Random weights for `config` from `seed` (float32; scaled to keep activations O(1)):
    per block a pre-norm weight near 1 and the block's own `init_params`."""
    h, v = config.hidden_size, config.vocab_size
    keys = iter(jax.random.split(jax.random.key(seed), 8 * len(config.layer_types) + 4))
    layers = []
    for block in _blocks(config):
        p: dict[str, jax.Array] = {"norm": 1.0 + 0.1 * jax.random.normal(next(keys), (h,), F32)}
        p.update(block.init_params(config, keys))
        layers.append(p)
    return {
        "embed": jax.random.normal(next(keys), (v, h), F32),
        "layers": layers,
        "final_norm": jnp.ones((h,), F32),
        "lm_head": jax.random.normal(next(keys), (h, v), F32) / math.sqrt(h),
    }


def init_caches(
    config: ModelConfig, *, num_blocks: int, block_size: int, max_batch_size: int
) -> dict[str, Any]:
    """Zeroed decode caches, one entry per layer (`Arch.init_caches`, keyed by
    `Arch.cache_keys`): a paged bf16 KV cache per attention layer
    (`[num_blocks, block_size, Hkv, D]`), per Mamba layer the f32 SSM state
    (`[max_batch_size, H, P, N]`) and the conv window (`[max_batch_size, 3, d_xbc]`), None
    per MLP layer."""
    arch = Arch(blocks=_blocks(config), rms_eps=RMS_EPS)
    return arch.init_caches(config, num_blocks=num_blocks, kv_block_size=block_size,
                            rows=max_batch_size)  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class HybridModel(ArenaLM):
    """The reference hybrid model bound to one arena plan: an `ArenaLM` with `hybrid_arch`.

    Attributes (those of `ArenaLM`):
      config: the model (attention / mamba / mlp layers).
      arch: `hybrid_arch(config)`.
      plan: the arena layout, from `BufferSizes.from_config` at the serve limits (or packed).
      max_batch_tokens, max_seq_len, kv_block_size, max_batch_size: the serve limits the plan
        was sized for.
      target, levers: what sized the split-K workspace; the decode kernel uses the same policy.
      interpret: Pallas interpret mode (None: on CPU).

    `prefill(params, arena, caches, tokens, cu_seqlens, block_tables)` and
    `decode_step(params, arena, caches, tokens, positions, block_tables, seq_lens)` take
    `init_params(config)` and `init_caches(config, ...)`; see `ArenaLM`.
    """

    @classmethod
    def create(
        cls,
        config: ModelConfig,
        *,
        max_batch_tokens: int,
        max_seq_len: int,
        kv_block_size: int = 16,
        max_batch_size: int = 8,
        target: Target | None = None,
        levers: Levers | None = None,
        guard_bytes: int = 0,
        plan: ArenaPlan | None = None,
        interpret: bool | None = None,
    ) -> HybridModel:
        """Sizes the arena for `config` at these limits and returns the model bound to it.

        `target` defaults to `gb10` and `levers` to none set, so the plan does not depend on
        the machine or the environment; pass `plan=` to run on a plan of your own (e.g. a
        packed one built from the same sizes).
        """
        arch = hybrid_arch(config)
        target = target or Target.preset("gb10")
        levers = levers or Levers()
        if plan is None:
            limits = ServeLimits(
                max_batch_tokens=max_batch_tokens,
                max_seq_len=max_seq_len,
                kv_block_size=kv_block_size,
                max_batch_size=max_batch_size,
            )
            sizes = BufferSizes.from_config(config, limits, levers=levers, target=target)
            plan = ArenaPlan.sequential(sizes, guard_bytes=guard_bytes)
        return cls(config=config, arch=arch, plan=plan, max_batch_tokens=max_batch_tokens,
                   max_seq_len=max_seq_len, kv_block_size=kv_block_size,
                   max_batch_size=max_batch_size, target=target, levers=levers,
                   interpret=interpret)  # fmt: skip


@functools.cache
def default_block_tables(batch: int, blocks_per_seq: int, seed: int = 0) -> np.ndarray:
    """A block table that gives each sequence `blocks_per_seq` pages in a shuffled order."""
    perm = np.random.default_rng(seed).permutation(batch * blocks_per_seq).astype(np.int32)
    return perm.reshape(batch, blocks_per_seq)
