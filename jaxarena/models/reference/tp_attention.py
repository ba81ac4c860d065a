"""A tensor-parallel GQA attention block whose intermediates live in a sharded arena.

One arena per device, all laid out by the same plan (the plan of the PER-DEVICE sizes,
`BufferSizes.from_config(config.shard(tp=tp), ...)`), allocated as one global array
with one shard per device (`plan.allocate(sharding=plan.sharding(mesh, "tp"))`). The step is a
`jax.shard_map` over the mesh; on every device it

  1. stores the input rows in `residual` and reads them back,
  2. RMS-normalises them into `norm_output`,
  3. runs the column-parallel QKV projection (this device's query heads and its KV heads;
     with fewer KV heads than devices each device holds a replicated copy of the KV head its
     query heads use) into `qkv_output`, laid out `[Q (| gate per head) | K | V]` per row,
  4. runs causal GQA attention over its heads (times `sigmoid(gate)` when `attn_gated`) into
     `attn_output`,
  5. runs the row-parallel output projection and its `lax.psum` all-reduce over the mesh
     axis, adds the residual and stores the result in `hidden_states`.

Every intermediate is written with `plan.write` and read back with `plan.view`, so a region
too small for the TP block's data is an `ArenaError` at trace time. The arena is donated and
updated in place.

The rows are one sequence of `M` tokens (causal mask, no RoPE: positions do not change how the
block shards). Weights are `AttentionWeights`; `shard_attention_weights` cuts them per device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxarena import ArenaPlan, BufferSizes, ModelConfig

__all__ = [
    "AttentionWeights",
    "attention_arena_plan",
    "init_attention_weights",
    "make_tp_attention_step",
    "shard_attention_weights",
]

_P = jax.sharding.PartitionSpec
_HI = lax.Precision.HIGHEST
_EPS = 1e-6
# Activation dtypes the block runs in. The seed sizes activations as bf16 (2 bytes).
_ACT_DTYPES = ("bfloat16", "float16", "float32")


class AttentionWeights(NamedTuple):
    """Weights of one attention block.

    Unsharded (`init_attention_weights`), with `Hq` query heads, `Hkv` KV heads, head
    dimension `hd`, hidden size `H` and `q_mul = 2` when `attn_gated` (else 1):

      norm_w: `[H]` RMSNorm weight.
      wq: `[H, Hq * q_mul * hd]`; per head `[query (hd) | gate (hd)]` when gated.
      wk, wv: `[H, Hkv * hd]`.
      wo: `[Hq * hd, H]`.

    Sharded (`shard_attention_weights`) every leaf gets a leading `tp` axis holding one
    device's slice: `norm_w [tp, H]` (copies), `wq [tp, H, Hq/tp * q_mul * hd]`,
    `wk, wv [tp, H, kv * hd]` with `kv = max(Hkv/tp, 1)`, `wo [tp, Hq/tp * hd, H]`.
    """

    norm_w: jax.Array
    wq: jax.Array
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array


def _validate(config: ModelConfig, mesh: Any, axis: str, dtype: Any) -> tuple[ModelConfig, int]:
    """Checks the arguments shared by every entry point; returns (per-device config, tp)."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if axis not in mesh.axis_names:
        raise ValueError(f"axis={axis!r} is not an axis of the mesh; mesh axes: {mesh.axis_names}")
    if config.num_attention_heads == 0 or config.num_key_value_heads == 0 or config.head_dim == 0:
        raise ValueError(
            f"the attention block needs num_attention_heads={config.num_attention_heads}, "
            f"num_key_value_heads={config.num_key_value_heads} and "
            f"head_dim={config.head_dim} all > 0"
        )
    if config.kv_lora_rank > 0:
        raise NotImplementedError(
            f"kv_lora_rank={config.kv_lora_rank}: MLA attention is not implemented here (GQA only)"
        )
    name = jnp.dtype(dtype).name
    if name not in _ACT_DTYPES:
        raise ValueError(f"dtype={name} must be one of {_ACT_DTYPES}")
    tp = mesh.shape[axis]
    return config.shard(tp=tp), tp


def attention_arena_plan(
    sizes: BufferSizes, *, dtype: Any = jnp.bfloat16, guard_bytes: int = 0
) -> ArenaPlan:
    """The per-device arena plan for running the block with `dtype` activations.

    The seed sizes every activation buffer for bf16. For bf16/f16 this is exactly
    `ArenaPlan.sequential(sizes)`; for f32 (the reference runs) every region is twice its
    `sizes` entry, the width ratio of the element types, so the same views fit.

    Args:
      sizes: the per-device sizes, `BufferSizes.from_config(config.shard(tp=tp), ...)`.
      dtype: the activation dtype of the step.
      guard_bytes: guard band after each region (see `ArenaPlan.sequential`).
    """
    name = jnp.dtype(dtype).name
    if name not in _ACT_DTYPES:
        raise ValueError(f"dtype={name} must be one of {_ACT_DTYPES}")
    factor = jnp.dtype(dtype).itemsize // 2
    scaled = {k: v * factor for k, v in sizes.as_dict().items()}
    return ArenaPlan.sequential(scaled, guard_bytes=guard_bytes)


def init_attention_weights(
    seed: int, config: ModelConfig, *, dtype: Any = jnp.float32
) -> AttentionWeights:
    """Random unsharded weights for `config` (see `AttentionWeights` for the shapes).

    Drawn on the host with NumPy's generator seeded by `seed` (cheap for test-sized models;
    no XLA compile), returned as arrays of `dtype` on the default device.
    """
    h, hq, hkv, hd = (config.hidden_size, config.num_attention_heads,
                      config.num_key_value_heads, config.head_dim)  # fmt: skip
    q_mul = 2 if config.attn_gated else 1
    rng = np.random.default_rng(seed)

    def dense(shape):
        return jnp.asarray(rng.standard_normal(shape) / math.sqrt(shape[0]), dtype)

    return AttentionWeights(
        norm_w=jnp.asarray(1.0 + 0.1 * rng.standard_normal(h), dtype),
        wq=dense((h, hq * q_mul * hd)),
        wk=dense((h, hkv * hd)),
        wv=dense((h, hkv * hd)),
        wo=dense((hq * hd, h)),
    )


def shard_attention_weights(
    weights: AttentionWeights, config: ModelConfig, mesh: jax.sharding.Mesh, *, axis: str = "tp"
) -> AttentionWeights:
    """Cuts unsharded weights into per-device slices and places them over `mesh[axis]`.

    Device `d` gets query heads `[d*Hq/tp, (d+1)*Hq/tp)` (QKV column-parallel, output
    projection row-parallel) and the KV heads those query heads read: `Hkv/tp` heads when
    `Hkv >= tp`, else one replicated copy of KV head `d // (tp // Hkv)`.

    With a mesh spanning processes, every process passes the same unsharded weights (they
    are cut on the host) and each places only its own devices' slices.

    Returns:
      `AttentionWeights` with a leading `tp` axis on every leaf, sharded `P(axis)`.
    """
    local, tp = _validate(config, mesh, axis, weights.wq.dtype)
    h, hkv, hd = config.hidden_size, config.num_key_value_heads, config.head_dim
    hq_l, kv_l = local.num_attention_heads, local.num_key_value_heads
    q_mul = 2 if config.attn_gated else 1
    # Which global KV heads each device holds: a contiguous slice, or its group's one head.
    kv_index = np.array(
        [
            [d * kv_l + j for j in range(kv_l)] if hkv >= tp else [d // (tp // hkv)]
            for d in range(tp)
        ]
    )

    def kv_slices(w):  # [H, Hkv*hd] -> [tp, H, kv_l*hd]
        w = w.reshape(h, hkv, hd)[:, kv_index, :]
        return w.transpose(1, 0, 2, 3).reshape(tp, h, kv_l * hd)

    # The slicing runs on the host (NumPy): a reference-scale setup step, no XLA compile.
    w = AttentionWeights(*(np.asarray(a) for a in weights))
    stacked = AttentionWeights(
        norm_w=np.broadcast_to(w.norm_w, (tp, h)),
        wq=w.wq.reshape(h, tp, hq_l * q_mul * hd).transpose(1, 0, 2),
        wk=kv_slices(w.wk),
        wv=kv_slices(w.wv),
        wo=w.wo.reshape(tp, hq_l * hd, h),
    )
    sharding = jax.sharding.NamedSharding(mesh, _P(axis))
    return AttentionWeights(*(jax.device_put(np.ascontiguousarray(a), sharding) for a in stacked))


def _rms_norm(x: jax.Array, w: jax.Array) -> jax.Array:
    x = x.astype(jnp.float32)
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + _EPS) * w.astype(jnp.float32)


def make_tp_attention_step(
    config: ModelConfig,
    plan: ArenaPlan,
    mesh: jax.sharding.Mesh,
    *,
    axis: str = "tp",
    dtype: Any = jnp.float32,
) -> Callable[[jax.Array, AttentionWeights, jax.Array], tuple[jax.Array, jax.Array]]:
    """The jitted tensor-parallel attention step over a sharded arena.

    Args:
      config: the WHOLE model's config; the per-device split is `config.shard(
        tp=mesh.shape[axis])`.
      plan: the per-device plan (`attention_arena_plan` of the per-device sizes).
      mesh: the device mesh; `axis` is its tensor-parallel axis.
      dtype: activation dtype (`x`, the weights and every arena intermediate).

    Returns:
      `step(arena, weights, x) -> (arena, y)`:
        arena: `uint8[tp * rows, ROW_BYTES]` from `plan.allocate(sharding=plan.sharding(mesh,
          axis))`; DONATED and updated in place. Keep only the returned arena.
        weights: `shard_attention_weights(...)` output.
        x: `[M, hidden_size]` of `dtype`, replicated; `M` must fit the plan's regions (at most
          the `max_batch_tokens` the sizes were built for), else `ArenaError` at trace time.
        y: `[M, hidden_size]` of `dtype`, replicated: `x + o_proj(attention(rms_norm(x)))`.

      The mesh may span `jax.distributed` processes (tests/distributed/): every process calls
      `step` with the same `x` (an uncommitted array such as `jnp.asarray(host_rows)`), the
      all-reduce crosses processes, and every process can read `y`; each reads only its own
      devices' arenas (`arena.addressable_shards`).

    Raises:
      ValueError: no attention heads, an unknown mesh axis or an unsupported dtype.
      NotImplementedError: MLA configs (`kv_lora_rank > 0`).
      ConfigError: the heads do not split over the axis (see `ModelConfig.shard`).
    """
    local, _ = _validate(config, mesh, axis, dtype)
    dtype = jnp.dtype(dtype)
    h, hd = config.hidden_size, config.head_dim
    hq_l, kv_l = local.num_attention_heads, local.num_key_value_heads
    q_mul = 2 if config.attn_gated else 1
    group = hq_l // kv_l
    q_width = hq_l * q_mul * hd
    width = q_width + 2 * kv_l * hd

    def local_step(arena: jax.Array, w: AttentionWeights, x: jax.Array):
        w = jax.tree.map(lambda a: a[0], w)  # this device's slice
        m = x.shape[0]
        arena = plan.write(arena, "residual", x)
        resid = plan.view(arena, "residual", (m, h), dtype)

        arena = plan.write(arena, "norm_output", _rms_norm(resid, w.norm_w).astype(dtype))
        normed = plan.view(arena, "norm_output", (m, h), dtype)

        # Column-parallel QKV: this device's heads only, no communication.
        wqkv = jnp.concatenate([w.wq, w.wk, w.wv], axis=1)
        qkv = jnp.dot(normed, wqkv, precision=_HI, preferred_element_type=jnp.float32)
        arena = plan.write(arena, "qkv_output", qkv.astype(dtype))
        qkv = plan.view(arena, "qkv_output", (m, width), dtype).astype(jnp.float32)

        qg = qkv[:, :q_width].reshape(m, hq_l, q_mul, hd)
        k = qkv[:, q_width : q_width + kv_l * hd].reshape(m, kv_l, hd)
        v = qkv[:, q_width + kv_l * hd :].reshape(m, kv_l, hd)
        q = qg[:, :, 0, :].reshape(m, kv_l, group, hd) / math.sqrt(hd)
        s = jnp.einsum("qkgd,nkd->kgqn", q, k, precision=_HI)
        causal = jnp.arange(m)[:, None] >= jnp.arange(m)[None, :]
        p = jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1)
        o = jnp.einsum("kgqn,nkd->qkgd", p, v, precision=_HI).reshape(m, hq_l, hd)
        if q_mul == 2:
            o = o * jax.nn.sigmoid(qg[:, :, 1, :])
        arena = plan.write(arena, "attn_output", o.reshape(m, hq_l * hd).astype(dtype))
        attn = plan.view(arena, "attn_output", (m, hq_l * hd), dtype)

        # Row-parallel output projection: partial sums, all-reduced over the axis. The residual
        # added is `x` itself (equal to `resid`): shard_map can prove `x` replicated, not a
        # value read from the per-device arena.
        part = jnp.dot(attn, w.wo, precision=_HI, preferred_element_type=jnp.float32)
        y = (x.astype(jnp.float32) + lax.psum(part, axis)).astype(dtype)
        arena = plan.write(arena, "hidden_states", y)
        return arena, y

    def step(arena: jax.Array, weights: AttentionWeights, x: jax.Array):
        if x.ndim != 2 or x.shape[1] != h or x.dtype != dtype:
            raise ValueError(f"x must be {dtype.name}[M, {h}], got {x.dtype}{list(x.shape)}")
        w_specs = AttentionWeights(*([_P(axis)] * 5))
        return jax.shard_map(
            local_step,
            mesh=mesh,
            in_specs=(_P(axis), w_specs, _P()),
            out_specs=(_P(axis), _P()),
        )(arena, weights, x)

    return jax.jit(step, donate_argnums=0)
