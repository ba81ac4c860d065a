"""The tensor-parallel attention block over a sharded arena (one arena per device, in place)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol
from jax import lax

from jaxarena import ArenaError, ArenaPlan, BufferSizes, ConfigError, Levers, ModelConfig, Target
from jaxarena.models.reference import tp_attention
from jaxarena.models.reference.tp_attention import (
    attention_arena_plan,
    init_attention_weights,
    make_tp_attention_step,
    shard_attention_weights,
)
from jaxarena.testing import memory_footprint

SEQ, KV_BLOCK, BATCH = 4096, 16, 8
LEVERS, TARGET = Levers(), Target.preset("gb10")


def _sizes(cfg: ModelConfig, m: int) -> BufferSizes:
    return BufferSizes.from_config(cfg, m, SEQ, KV_BLOCK, BATCH, levers=LEVERS, target=TARGET)


def _ceil16(x: int) -> int:
    return -(-x // 16) * 16


def _small(**kw) -> ModelConfig:
    base = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                intermediate_size=128, vocab_size=96)  # fmt: skip
    return ModelConfig(**{**base, **kw})


# -- the tensor-parallel attention block over a sharded arena ----------------------------------------

_HI = lax.Precision.HIGHEST
MAX_M = 17  # max_batch_tokens of the block's arenas: one past a multiple of 16


@functools.partial(jax.jit, static_argnums=2)
def _reference(w, x, cfg):
    """The unsharded block in plain jnp, f32, from the full weights (independent of the step)."""
    m, hq, hkv, hd = x.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q_mul = 2 if cfg.attn_gated else 1
    x = x.astype(jnp.float32)
    normed = x / jnp.sqrt(jnp.mean(x**2, axis=-1, keepdims=True) + 1e-6) * w.norm_w
    qg = jnp.matmul(normed, w.wq, precision=_HI).reshape(m, hq, q_mul, hd)
    k = jnp.matmul(normed, w.wk, precision=_HI).reshape(m, hkv, hd)
    v = jnp.matmul(normed, w.wv, precision=_HI).reshape(m, hkv, hd)
    kr, vr = (jnp.repeat(a, hq // hkv, axis=1) for a in (k, v))  # query head i reads i // G
    s = jnp.einsum("qhd,khd->hqk", qg[:, :, 0], kr, precision=_HI) / np.sqrt(hd)
    s = jnp.where(np.tril(np.ones((m, m), bool)), s, -np.inf)
    o = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(s, axis=-1), vr, precision=_HI)
    if cfg.attn_gated:
        o = o * jax.nn.sigmoid(qg[:, :, 1])
    y = x + jnp.matmul(o.reshape(m, hq * hd), w.wo, precision=_HI)
    return dict(normed=normed, qg=qg, k=k, v=v, o=o, y=y)


def _device_qkv(ref, cfg, tp, d):
    """Device d's `[Q (| gate) | K | V]` rows: its query heads, and the KV heads they read."""
    hq = cfg.num_attention_heads // tp
    heads = range(d * hq, (d + 1) * hq)
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    kv = sorted({i // group for i in heads})
    m = ref["y"].shape[0]
    return jnp.concatenate(
        [ref["qg"][:, heads.start : heads.stop].reshape(m, -1),
         ref["k"][:, kv].reshape(m, -1), ref["v"][:, kv].reshape(m, -1)], axis=1,
    )  # fmt: skip


def _setup(cfg, tp, *, dtype=jnp.float32, guard_bytes=64):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:tp]), ("tp",))
    sizes = _sizes(cfg.shard(tp=tp), MAX_M)
    plan = attention_arena_plan(sizes, dtype=dtype, guard_bytes=guard_bytes)
    step = make_tp_attention_step(cfg, plan, mesh, dtype=dtype)
    return mesh, plan, step


@pytest.mark.parametrize(
    "tp, kv, gated, m",
    [
        (8, 2, False, 5),  # fewer KV heads than devices: replicated KV
        (4, 4, True, 16),  # KV split, gated queries, M on a 16-row boundary
        (2, 8, False, 1),  # one token, MHA
        (1, 2, True, MAX_M),  # single device, M = max_batch_tokens (one past 16)
    ],
)
def test_tp_attention_matches_unsharded_and_stays_in_place(tp, kv, gated, m):
    cfg = _small(num_key_value_heads=kv, attn_gated=gated)
    mesh, plan, step = _setup(cfg, tp)
    w = init_attention_weights(0, cfg)
    ws = shard_attention_weights(w, cfg, mesh)
    arena = plan.allocate(sharding=plan.sharding(mesh, "tp"))
    assert [s.data.shape for s in arena.addressable_shards] == [plan.arena_shape] * tp
    ptrs = [s.data.unsafe_buffer_pointer() for s in arena.addressable_shards]
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = jnp.asarray(rng.standard_normal((m, cfg.hidden_size)), jnp.float32)
        arena, y = step(arena, ws, x)
        ref = _reference(w, x, cfg)
        np.testing.assert_allclose(y, ref["y"], **tol("model", "float32"))
    # Each device's arena is the same buffer after every step (donation honoured in place).
    assert [s.data.unsafe_buffer_pointer() for s in arena.addressable_shards] == ptrs
    # Each device's arena holds its own intermediates of the last step (decoded on the host
    # from the plan's offsets, not through `plan.view`), and no other byte changed: guard
    # bands and untouched regions still read as in a freshly allocated arena.
    h, hq = cfg.hidden_size, cfg.num_attention_heads // tp
    fresh = np.asarray(plan.allocate()).reshape(-1)
    for d, shard in enumerate(arena.addressable_shards):
        local = np.asarray(shard.data).reshape(-1)
        untouched = np.ones(local.shape, bool)

        def region(name, shape, local=local, untouched=untouched):
            start = plan.regions[name].offset_bytes
            stop = start + 4 * math.prod(shape)
            untouched[start:stop] = False
            return local[start:stop].view(np.float32).reshape(shape)

        np.testing.assert_array_equal(region("residual", (m, h)), x)
        np.testing.assert_allclose(region("norm_output", (m, h)), ref["normed"],
                                   **tol("model", "float32"))  # fmt: skip
        qkv = _device_qkv(ref, cfg, tp, d)
        np.testing.assert_allclose(region("qkv_output", qkv.shape), qkv, **tol("model", "float32"))
        o = ref["o"][:, d * hq : (d + 1) * hq].reshape(m, -1)
        np.testing.assert_allclose(region("attn_output", o.shape), o, **tol("model", "float32"))
        np.testing.assert_array_equal(region("hidden_states", (m, h)), y)
        np.testing.assert_array_equal(local[untouched], fresh[untouched])


def test_compiled_tp_step_aliases_the_arena():
    cfg = _small(num_key_value_heads=2)
    mesh, plan, step = _setup(cfg, 8, guard_bytes=0)
    ws = shard_attention_weights(init_attention_weights(0, cfg), cfg, mesh)
    arena = plan.allocate(sharding=plan.sharding(mesh, "tp"))
    x = jnp.ones((MAX_M, cfg.hidden_size), jnp.float32)
    assert "input_output_alias" in step.lower(arena, ws, x).compile().as_text()
    fp = memory_footprint(step, arena, ws, x)
    assert fp.alias_bytes >= plan.total_bytes  # the whole per-device arena is reused


def test_bf16_block_fits_the_seed_sized_regions_exactly():
    # bf16 activations: the plan is the per-device BufferSizes, unscaled, and the block's
    # views fit it (a region too small would be an ArenaError while tracing).
    cfg = _small(num_key_value_heads=2, attn_gated=True)
    mesh, plan, step = _setup(cfg, 8, dtype=jnp.bfloat16, guard_bytes=0)
    sizes = _sizes(cfg.shard(tp=8), MAX_M)
    assert plan == ArenaPlan.sequential(sizes)
    w = init_attention_weights(0, cfg, dtype=jnp.bfloat16)
    ws = shard_attention_weights(w, cfg, mesh)
    arena = jax.ShapeDtypeStruct((8 * plan.arena_shape[0], plan.arena_shape[1]), jnp.uint8,
                                 sharding=plan.sharding(mesh, "tp"))  # fmt: skip
    x = jax.ShapeDtypeStruct((MAX_M, cfg.hidden_size), jnp.bfloat16)
    out_arena, y = jax.eval_shape(step, arena, ws, x)
    assert out_arena.shape == arena.shape and y.shape == x.shape
    # The per-device qkv_output region is exactly the block's [ceil16(M), width] bf16 rows.
    width = (1 * 2 + 2 * 1) * cfg.head_dim  # 1 gated query head + 1 replicated KV head
    assert sizes.qkv_output == _ceil16(MAX_M) * width * 2
    # One token more than the sizes allow does not fit.
    too_many = jax.ShapeDtypeStruct((MAX_M + 16, cfg.hidden_size), jnp.bfloat16)
    with pytest.raises(ArenaError, match="needs"):
        jax.eval_shape(step, arena, ws, too_many)


def test_tp_step_validation():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("tp",))
    plan = ArenaPlan.sequential({"x": 256})
    with pytest.raises(NotImplementedError, match="kv_lora_rank"):
        make_tp_attention_step(ModelConfig.preset("deepseek-v2-lite"), plan, mesh)
    with pytest.raises(ValueError, match="num_attention_heads=0"):
        make_tp_attention_step(ModelConfig.preset("mamba2-2.7b"), plan, mesh)
    with pytest.raises(ValueError, match="axis='model'"):
        make_tp_attention_step(_small(), plan, mesh, axis="model")
    with pytest.raises(ValueError, match="dtype=int32"):
        make_tp_attention_step(_small(), plan, mesh, dtype=jnp.int32)
    mesh3 = jax.sharding.Mesh(np.array(jax.devices()[:3]), ("tp",))
    with pytest.raises(ConfigError, match="tp=3"):
        make_tp_attention_step(_small(), plan, mesh3)


def test_public_names_have_docstrings():
    for name in tp_attention.__all__:
        assert (getattr(tp_attention, name).__doc__ or "").strip(), name
