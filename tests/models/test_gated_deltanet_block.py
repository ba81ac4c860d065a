"""The Gated DeltaNet block on its own against a float64 NumPy reference: two sequences of 70
and 30 tokens packed into one prefill (the first spans two 64-token chunks, the second starts
mid-chunk), then one decode step each from the carried conv window and state.

The reference stores what the arena stores in bf16 (the in_proj outputs `ssm_qkvz` /
`ssm_ba`, the gated norm's `attn_output`), so what remains is the delta rule's kernels.
Tolerance: FLA's acceptance rule for its chunk kernel, RMS(diff) / RMS(ref) < 0.005 (derived
in tests/kernels/test_gdn_chunked.py from its bf16 intermediates); the gated norm rescales
each head by the norm of the same o (its relative error carries over), silu(z) is exact on
both sides, and the bf16 store of `attn_output` adds at most 2^-9 relative, carried through
out_proj (a linear map): block outputs are held to 0.005 + 2^-9 (measured at the time of
writing: 2.6e-3 prefill, 2.3e-3 .. 2.8e-3 decode, 1.1e-3 .. 1.4e-3 states). The decode step's state is
the prefill's final state (within 0.005 of the exact one) updated in f32: the same bound. The
conv window in the cache is a copy of the stored bf16 projection: equal to the reference's
up to a neighbouring bf16 value where the f32 and f64 products round differently.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target
from jaxarena.models.blocks.base import Env, StepContext
from jaxarena.models.blocks.gated_deltanet import GatedDeltaNet

CU = [0, 70, 100]
BOUND = 0.005 + 2.0**-9
# The block's f32 and the reference's f64 product may round to neighbouring bf16 values: one
# bf16 spacing, at most 2^-7 of the value.
ULP = 2.0**-7
CFG = ModelConfig(
    hidden_size=64, num_hidden_layers=1, vocab_size=256, intermediate_size=128,
    num_attention_heads=2, num_key_value_heads=1, head_dim=128, linear_num_key_heads=1,
    linear_key_head_dim=128, linear_num_value_heads=2, linear_value_head_dim=128,
    layer_types=("linear_attention",),
)  # fmt: skip
NK, DK, NV, DV = 1, 128, 2, 128
CONV_DIM = 2 * NK * DK + NV * DV


def _bf16(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _ratio(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2)))


def _reference(p, x, windows, states):
    """float64 block output of tokens `x` `[n, hidden]` of one sequence from its conv window
    `[3, conv_dim]` and state `[Hv, Dk, Dv]`; returns (out, window, state)."""
    qkvz = _bf16(x @ p["w_qkvz"])
    ba = _bf16(x @ p["w_ba"])
    xin = np.concatenate([windows, qkvz[:, :CONV_DIM]])
    n = x.shape[0]
    conv = sum(xin[j : j + n] * p["conv_w"][j] for j in range(4))
    conv = conv / (1 + np.exp(-conv))
    q, k = conv[:, :DK], conv[:, DK : 2 * DK]
    v = conv[:, 2 * DK :].reshape(n, NV, DV)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    beta = 1 / (1 + np.exp(-ba[:, :NV]))
    g = -np.exp(p["A_log"]) * np.log1p(np.exp(ba[:, NV:] + p["dt_bias"]))
    h, o = states.copy(), np.zeros((n, NV, DV))
    for t in range(n):
        for i in range(NV):
            h[i] *= np.exp(g[t, i])
            h[i] += np.outer(k[t], beta[t, i] * (v[t, i] - h[i].T @ k[t]))
            o[t, i] = h[i].T @ q[t] * DK**-0.5
    y = o / np.sqrt((o * o).mean(-1, keepdims=True) + 1e-6) * p["gate_norm"]
    z = qkvz[:, CONV_DIM:].reshape(n, NV, DV)
    y = _bf16((y * z / (1 + np.exp(-z))).reshape(n, -1))
    return y @ p["out_proj"], xin[-3:], h


def test_block_prefill_then_decode_against_float64():
    block = GatedDeltaNet()
    keys = iter(jax.random.split(jax.random.key(0), 16))
    params = block.init_params(CFG, keys)
    p64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
    sizes = BufferSizes.from_config(CFG, 128, 128, 16, 2, levers=Levers(),
                                    target=Target.preset("gb10"))  # fmt: skip
    plan = ArenaPlan.sequential(sizes)
    env = Env(config=CFG, plan=plan, kv_block_size=16, target=Target.preset("gb10"),
              levers=Levers())  # fmt: skip
    rng = np.random.default_rng(0)
    t = CU[-1]
    x = _bf16(rng.standard_normal((t, CFG.hidden_size)))
    cu = jnp.asarray(CU, jnp.int32)
    idx = jnp.arange(t, dtype=jnp.int32)
    seq = jnp.sum(cu[None, 1:] <= idx[:, None], axis=1, dtype=jnp.int32)
    tables = jnp.zeros((2, 8), jnp.int32)
    ctx = StepContext(positions=idx - cu[seq], seq_ids=seq, block_tables=tables, cu_seqlens=cu)
    cache = block.init_cache(CFG, num_blocks=16, kv_block_size=16, rows=3)

    def prefill(arena, cache, x):  # the block reads its (bf16-valued) input from ctx.x
        return block.prefill(env, params, arena, cache, ctx._replace(x=x))

    arena, cache, out = jax.jit(prefill)(plan.allocate(), cache, jnp.asarray(x, jnp.float32))
    # Decode: one more token per sequence.
    xd = _bf16(rng.standard_normal((2, CFG.hidden_size)))
    lens = jnp.asarray([CU[1] + 1, CU[2] - CU[1] + 1], jnp.int32)
    dctx = StepContext(positions=lens - 1, seq_ids=jnp.arange(2, dtype=jnp.int32),
                       block_tables=tables, seq_lens=lens)  # fmt: skip

    def decode(arena, cache, x):
        return block.decode(env, params, arena, cache, dctx._replace(x=x))

    arena, cache2, out_d = jax.jit(decode)(arena, cache, jnp.asarray(xd, jnp.float32))
    for s, (a, b) in enumerate(itertools.pairwise(CU)):
        want, win, state = _reference(p64, x[a:b], np.zeros((3, CONV_DIM)), np.zeros((NV, DK, DV)))
        assert _ratio(out[a:b], want) < BOUND, s
        np.testing.assert_allclose(np.asarray(cache["conv"][s]), win, rtol=ULP, atol=0)
        assert _ratio(cache["state"][s], state) < 0.005, s
        want_d, win_d, state_d = _reference(p64, xd[s : s + 1], win, state)
        assert _ratio(out_d[s : s + 1], want_d) < BOUND, s
        np.testing.assert_allclose(np.asarray(cache2["conv"][s]), win_d, rtol=ULP, atol=0)
        assert _ratio(cache2["state"][s], state_d) < 0.005, s
        ratios = (_ratio(out[a:b], want), _ratio(out_d[s : s + 1], want_d),
                  _ratio(cache2["state"][s], state_d))  # fmt: skip
        print(f"sequence {s}: prefill, decode, state error ratios {ratios}")
    # A one-token shift of the second sequence's boundary would mix the two: the first
    # sequence's tokens must not reach the second's outputs.
    leak, _, _ = _reference(p64, x[CU[1] - 1 : CU[2]], np.zeros((3, CONV_DIM)),
                            np.zeros((NV, DK, DV)))  # fmt: skip
    assert _ratio(out[CU[1] : CU[2]], leak[1:]) > 10 * BOUND
