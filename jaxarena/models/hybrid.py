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

The blocks are those of `jaxarena.models.arena_lm.ArenaLM`, the one implementation the
HuggingFace checkpoints (`load_pretrained`) run on as well: `HybridModel` only chooses its
architecture (`hybrid_arch`: relu^2 MLPs on FP8 activations, RoPE attention) and its random
weights (`init_params`).
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
from jaxarena.models.arena_lm import FFN_QUANT_REGIONS, Arch, ArenaLM

__all__ = [
    "HybridModel",
    "hybrid_arch",
    "init_params",
    "init_caches",
    "ATTENTION",
    "MAMBA",
    "MLP",
    "FFN_QUANT_REGIONS",
]

ATTENTION = frozenset({"full_attention", "sliding_attention", "attention"})
MAMBA = frozenset({"mamba"})
MLP = frozenset({"mlp"})
BF16 = jnp.bfloat16
F32 = jnp.float32
CONV_KERNEL = 4
RMS_EPS = 1e-5
ROPE_THETA = 10000.0


def _kind(layer_type: str) -> str:
    if layer_type in ATTENTION:
        return "attention"
    if layer_type in MAMBA:
        return "mamba"
    if layer_type in MLP:
        return "mlp"
    raise NotImplementedError(
        f"the reference hybrid model has no {layer_type!r} layers (attention, mamba, mlp only)"
    )


def init_params(config: ModelConfig, seed: int = 0) -> dict[str, Any]:
    """Random weights for `config` from `seed` (float32; scaled to keep activations O(1))."""
    h, v = config.hidden_size, config.vocab_size
    keys = iter(jax.random.split(jax.random.key(seed), 8 * len(config.layer_types) + 4))

    def dense(fan_in: int, fan_out: int) -> jax.Array:
        return jax.random.normal(next(keys), (fan_in, fan_out), F32) / math.sqrt(fan_in)

    layers = []
    for lt in config.layer_types:
        kind = _kind(lt)
        p: dict[str, jax.Array] = {"norm": 1.0 + 0.1 * jax.random.normal(next(keys), (h,), F32)}
        if kind == "attention":
            hq, hkv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
            p["wqkv"] = dense(h, (hq + 2 * hkv) * hd)
            p["wo"] = dense(hq * hd, h)
        elif kind == "mamba":
            nh, d_in, d_xbc = config.mamba_num_heads, config.mamba2_d_inner, config.mamba2_d_xbc
            p["in_proj"] = dense(h, config.mamba2_in_proj_size)
            p["conv_w"] = jax.random.normal(next(keys), (CONV_KERNEL, d_xbc), F32) * 0.5
            p["conv_b"] = jax.random.normal(next(keys), (d_xbc,), F32) * 0.1
            p["dt_bias"] = jax.random.uniform(next(keys), (nh,), F32, -3.0, -1.0)
            p["A_log"] = jnp.log(jax.random.uniform(next(keys), (nh,), F32, 1.0, 8.0))
            p["D"] = jnp.ones((nh,), F32)
            p["gate_norm"] = jnp.ones((d_in,), F32)
            p["out_proj"] = dense(d_in, h)
        else:
            p["w_up"] = dense(h, config.intermediate_size)
            p["w_down"] = dense(config.intermediate_size, h) * 0.5
        layers.append(p)
    return {
        "embed": jax.random.normal(next(keys), (v, h), F32),
        "layers": layers,
        "final_norm": jnp.ones((h,), F32),
        "lm_head": dense(h, v),
    }


def init_caches(
    config: ModelConfig, *, num_blocks: int, block_size: int, max_batch_size: int
) -> dict[str, Any]:
    """Zeroed decode caches: a paged bf16 KV cache per attention layer
    (`[num_blocks, block_size, Hkv, D]`), and per Mamba layer the f32 SSM state
    (`[max_batch_size, H, P, N]`) and the conv window (`[max_batch_size, 3, d_xbc]`)."""
    kv, ssm = [], []
    for lt in config.layer_types:
        kind = _kind(lt)
        if kind == "attention":
            shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
            kv.append({"k": jnp.zeros(shape, BF16), "v": jnp.zeros(shape, BF16)})
        elif kind == "mamba":
            ssm.append({
                "state": jnp.zeros((max_batch_size, config.mamba_num_heads,
                                    config.mamba_head_dim, config.ssm_state_size), F32),
                "conv": jnp.zeros((max_batch_size, CONV_KERNEL - 1, config.mamba2_d_xbc), F32),
            })  # fmt: skip
    return {"kv": kv, "ssm": ssm}


def hybrid_arch(config: ModelConfig) -> Arch:
    """The reference hybrid's architecture for `config`: one block per layer type (mamba,
    attention with RoPE, relu^2 MLP whose projections multiply FP8-quantized activations),
    RMSNorm eps 1e-5, an untied LM head.

    Raises:
      NotImplementedError: a layer type other than attention, mamba and mlp, or experts.
    """
    blocks = tuple(_kind(lt) for lt in config.layer_types)
    if config.num_experts:
        raise NotImplementedError("the reference hybrid model has no MoE layers")
    return Arch(blocks=blocks, mlp="relu2", rope=True, rope_theta=ROPE_THETA, qk_norm=False,
                rms_eps=RMS_EPS, tie_embeddings=False, fp8_mlp_acts=True)  # fmt: skip


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
            limits = ServeLimits(max_batch_tokens=max_batch_tokens, max_seq_len=max_seq_len,
                                 kv_block_size=kv_block_size, max_batch_size=max_batch_size)
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
