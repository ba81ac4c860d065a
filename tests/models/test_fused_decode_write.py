"""`Attention`'s fused decode write (`_fused_decode_qkv`: the projection, then
`pallas_kernels.qk_rope_kv_write`), both projection forms: the plain GEMM through `linear`
(hidden 64) and the 4 float32 split-K partials the kernel sums (hidden 2048, 512 per part).

Inputs are small integers (x, w in {-2..2}), so every product and partial sum is exact in
float32 whatever the order: the projection is exactly `bf16(x @ w)` (int64 NumPy), and the
step's q and cache rows must equal the kernel's reference fed that projection, to the
"qk_rope" bound (measured: bit-equal). Token 1 is padding (null page)."""

from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol

from jaxarena.models.blocks.attention import QKV_SPLITS, Attention
from jaxarena.models.blocks.base import StepContext
from pallas_kernels.qk_rope_kv_write import qk_rope_kv_write_reference

HQ, HKV, D, NB, BS = 4, 2, 32, 4, 4
POS = np.array([5, 0, 10], np.int32)
TABLES = np.array([[2, 1, 3], [0, 0, 0], [1, 3, 2]], np.int32)


@pytest.mark.parametrize(("hidden", "splits"), [(64, 1), (2048, QKV_SPLITS)])
def test_fused_decode_qkv_is_the_reference_of_the_exact_projection(hidden, splits):
    rng = np.random.default_rng(hidden)
    t, n = len(POS), (HQ + 2 * HKV) * D
    x = rng.integers(-2, 3, (t, hidden))
    w = rng.integers(-2, 3, (hidden, n))
    params = {"wqkv": jnp.asarray(w, jnp.bfloat16),
              "q_norm": jnp.asarray(rng.uniform(0.5, 1.5, D), jnp.bfloat16),
              "k_norm": jnp.asarray(rng.uniform(0.5, 1.5, D), jnp.bfloat16)}  # fmt: skip
    cache = {k: jnp.asarray(rng.standard_normal((NB, BS, HKV, D)), jnp.bfloat16) for k in "kv"}
    blk = Attention(qk_norm=True, rms_eps=1e-6, rope_theta=1e6)
    config = types.SimpleNamespace(num_attention_heads=HQ, num_key_value_heads=HKV,
                                   head_dim=D, hidden_size=hidden)  # fmt: skip
    env = types.SimpleNamespace(config=config, kernels="pallas", interpret=True, plan=None,
                                linear_kw={"interpret": True, "kernels": "pallas"})  # fmt: skip
    ctx = StepContext(positions=jnp.asarray(POS), seq_ids=jnp.arange(t, dtype=jnp.int32),
                      block_tables=jnp.asarray(TABLES), x=jnp.asarray(x, jnp.float32))  # fmt: skip
    assert blk.fused_write_unsupported(env) is None
    assert blk._qkv_splits(params, ctx) == splits
    _, q, got = blk._fused_decode_qkv(env, params, None, dict(cache), ctx)
    exact = jnp.asarray((x @ w).astype(np.float32), jnp.bfloat16)
    inv, scaling = blk.rope_frequencies(D)
    rq, rk, rv = qk_rope_kv_write_reference(
        exact, cache["k"], cache["v"], ctx.positions, ctx.block_tables, num_q_heads=HQ,
        q_norm=params["q_norm"], k_norm=params["k_norm"], eps=1e-6, inv_freq=inv,
        rope_scaling=scaling,
    )  # fmt: skip
    bound = tol("qk_rope", "bfloat16")
    np.testing.assert_allclose(np.asarray(q, np.float32), np.asarray(rq, np.float32), **bound)
    for a, b in ((got["k"], rk), (got["v"], rv)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **bound)
