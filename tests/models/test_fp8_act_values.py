"""Decode's FP8 activations as values (issue 39): `linear(..., act_values=True)` quantizes the
input with the standalone `fp8_block_quant` kernel instead of into the arena's FP8 regions
(which the GEMM would read through a copy). Same kernel arithmetic, so the products must be
the same bit for bit; the arena must be left as it was. Tiny shapes, Pallas interpreted."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from _helpers.arena import random_arena
from lm_runs import CHECKPOINTS

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target, workspaces
from jaxarena.models.core.arena import linear, stored
from jaxarena.step_report import abstract_model, step_args

T, K = 4, 256  # decode-like rows; K: two 128-column scale blocks (the tiny preset's widest)


def _plan() -> ArenaPlan:
    cfg = ModelConfig.preset("tiny-hybrid")
    sizes = BufferSizes.from_config(cfg, 16, 64, 16, T, levers=Levers(),
                                    target=Target.preset("gb10"))  # fmt: skip
    return ArenaPlan.sequential(sizes)


def _fp8_weight(rng: np.random.Generator, n: int, k: int) -> dict[str, jax.Array]:
    w = rng.normal(0.0, 64.0, (n, k)).astype(np.float32)
    return {"w": jnp.asarray(w).astype(jnp.float8_e4m3fn),
            "scale_inv": jnp.asarray(rng.uniform(1e-3, 1e-2, (-(-n // 128), -(-k // 128))),
                                     jnp.float32)}  # fmt: skip


def _x(rng: np.random.Generator) -> jax.Array:
    # Rows of very different magnitudes, and one all-zero block (the floor scale).
    x = rng.normal(0.0, 1.0, (T, K)) * np.array([1e-3, 1.0, 30.0, 500.0])[:, None]
    x[1, 128:] = 0.0
    return stored(jnp.asarray(x, jnp.float32))


def test_act_values_match_the_in_place_quantization_bit_for_bit():
    plan, rng = _plan(), np.random.default_rng(0)
    x = _x(rng)
    # An FP8 part (N not a multiple of 128) and a bf16 part beside it (multiplied by the
    # dequantized input): one quantization feeds both.
    w = (_fp8_weight(rng, 192, K), jnp.asarray(rng.normal(0, 0.05, (K, 64)), jnp.bfloat16))
    host = random_arena(plan, seed=1)
    run = jax.jit(lambda arena, x, values: linear(plan, arena, x, (T, K), w,
                                                  workspaces.FP8_ACT_REGIONS, interpret=True,
                                                  act_values=values),
                  static_argnums=2)  # fmt: skip
    arena_in, out_in = run(jnp.asarray(host), x, False)
    arena_val, out_val = run(jnp.asarray(host), x, True)
    out_in, out_val = np.asarray(out_in), np.asarray(out_val)
    assert out_in.shape == (T, 192 + 64) and np.isfinite(out_in).all()
    assert np.abs(out_in).max() > 0
    np.testing.assert_array_equal(out_val.view(np.uint32), out_in.view(np.uint32))
    # The value form wrote nothing; the in-place form wrote its FP8 regions (so the two runs
    # took different routes to the same numbers).
    np.testing.assert_array_equal(np.asarray(arena_val), host)
    q = plan.regions[workspaces.FP8_ACT_REGIONS[0]]
    span = slice(q.offset_bytes, q.offset_bytes + T * K)
    assert not np.array_equal(np.asarray(arena_in).reshape(-1)[span], host.reshape(-1)[span])


def test_only_the_decode_step_quantizes_as_values():
    """`ArenaLM._block` gives the blocks `Env.fp8_act_values` in decode only: the traced decode
    step of the qwen3_fp8 fixture runs the standalone quantizer and no in-place one, its
    prefill the in-place one (a trace, no compile)."""
    lm, params, caches = abstract_model(str(CHECKPOINTS / "qwen3_fp8"), target="cpu",
                                        max_batch_tokens=32, max_seq_len=64, kv_block_size=16,
                                        max_batch_size=2)  # fmt: skip
    names = {}
    for kind in ("prefill", "decode"):
        fn, extra = step_args(lm, kind)
        arena = jax.ShapeDtypeStruct(lm.plan.arena_shape, jnp.uint8)
        text = str(jax.make_jaxpr(fn)(params, arena, caches, *extra))
        names[kind] = set(re.findall(r"\bname=(fp8_block_quant\w*)", text))
    assert names == {"prefill": {"fp8_block_quant_inplace"}, "decode": {"fp8_block_quant"}}
