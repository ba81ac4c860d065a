"""The fused decode write (q/k RMSNorm + RoPE + K/V page write, issue 39) against its
independent reference and against the XLA operations of `Attention` it replaces, in interpret
mode at tiny widths: 4 tokens, 4 query heads and 2 KV heads of 32, 4 pages of 4.

Token 0 and 2 are real (rows 5 and 10); tokens 1 and 3 are the engine's padding (a block-table
row of zeros: both write row 0 of the null page 0, as XLA's scatter does, one of them winning).
Every other cache row keeps its bytes. Tolerance: `_helpers/tolerances.py` ("qk_rope": one
bf16 ulp of the f32 value, one e4m3 ulp with an FP8 cache; measured: bit-equal).
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol

from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.base import StepContext
from jaxarena.models.core.rope import rope, rope_table
from pallas_kernels import _cost
from pallas_kernels.qk_rope_kv_write import (
    fused_write_unsupported,
    qk_rope_kv_write,
    qk_rope_kv_write_reference,
)

HQ, HKV, D, NB, BS = 4, 2, 32, 4, 4
POS = np.array([5, 0, 10, 0], np.int32)
TABLES = np.array([[2, 1, 3], [0, 0, 0], [1, 3, 2], [0, 0, 0]], np.int32)
REAL_ROWS, NULL_ROW = [5, 10], 0  # page 1 row 1, page 2 row 2; the padding's
T = len(POS)
FP8 = jnp.float8_e4m3fn


def _inputs(seed: int, dtype=jnp.bfloat16, splits: int = 0):
    rng = np.random.default_rng(seed)
    n = (HQ + 2 * HKV) * D
    if splits:
        qkv = jnp.asarray(rng.standard_normal((splits, T, n)) / 2, jnp.float32)
    else:
        qkv = jnp.asarray(rng.standard_normal((T, n)), jnp.bfloat16)
    caches = [rng.standard_normal((NB, BS, HKV, D)) for _ in range(2)]
    if dtype == FP8:
        caches = [c * 4 for c in caches]
    k, v = (jnp.asarray(c, jnp.float32).astype(dtype) for c in caches)
    w = [jnp.asarray(rng.uniform(0.5, 1.5, D), jnp.bfloat16) for _ in range(2)]
    return qkv, k, v, w


CASES = {
    # Qwen3: q/k norms (bf16 weights), RoPE over the whole head from theta.
    "qwen3": dict(norm=True, inv=1e6 ** (-np.arange(0, D // 2, dtype=np.float32) * 2 / D)),
    # Llama 3.1 form: no norm, a frequency table; here partial rotary (16 of 32: segments
    # 8 + 8 rotated, 16 passed) and a YaRN-like cos/sin scale.
    "llama_partial": dict(norm=False, inv=np.geomspace(1.0, 1e-3, 8).astype(np.float32),
                          scaling=0.875),
    # FP8 cache with per-KV-head scales, the (1 + w) norms, no RoPE (Nemotron-H's form).
    "fp8": dict(norm=True, offset=1.0, dtype=FP8, inv=None),
    # The projection as 4 float32 split-K partials (the decode step's form).
    "split": dict(norm=True, splits=4,
                  inv=1e6 ** (-np.arange(0, D // 2, dtype=np.float32) * 2 / D)),
}  # fmt: skip


def _kwargs(case, w):
    inv = None if case["inv"] is None else jnp.asarray(case["inv"])
    kw = dict(num_q_heads=HQ, eps=1e-6, inv_freq=inv, rope_scaling=case.get("scaling", 1.0))
    if case["norm"]:
        kw |= dict(q_norm=w[0], k_norm=w[1], norm_offset=case.get("offset", 0.0))
    if case.get("dtype") == FP8:
        kw |= dict(k_scale=jnp.asarray([0.5, 2.0], jnp.float32),
                   v_scale=jnp.asarray([1.0, 0.25], jnp.float32))  # fmt: skip
    return kw


def _rows(a):
    return np.asarray(a.astype(jnp.float32)).reshape(NB * BS, HKV, D)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_reference_and_keeps_other_rows(name):
    """q and the written rows equal the reference (to the table's bound; measured bit-equal);
    every row but the three written keeps its bytes; the null row holds one padding token's
    k/v, as an XLA scatter with a repeated index does."""
    case = CASES[name]
    dtype = case.get("dtype", jnp.bfloat16)
    qkv, kc, vc, w = _inputs(hash(name) % 1000, dtype, case.get("splits", 0))
    kw = _kwargs(case, w)
    pos, tab = jnp.asarray(POS), jnp.asarray(TABLES)
    rq, rk, rv = qk_rope_kv_write_reference(qkv, kc, vc, pos, tab, **kw)
    q, k, v = qk_rope_kv_write(qkv, kc, vc, pos, tab, **kw)
    assert q.dtype == jnp.bfloat16 and q.shape == (T, HQ, D)
    assert k.dtype == v.dtype == dtype and k.shape == kc.shape
    np.testing.assert_allclose(np.asarray(q, np.float32), np.asarray(rq, np.float32),
                               **tol("qk_rope", "bfloat16"))  # fmt: skip
    other = np.setdiff1d(np.arange(NB * BS), [*REAL_ROWS, NULL_ROW])
    for got, ref, before in ((k, rk, kc), (v, rv, vc)):
        got, ref, before = _rows(got), _rows(ref), _rows(before)
        np.testing.assert_array_equal(got[other], before[other])
        np.testing.assert_allclose(got[REAL_ROWS], ref[REAL_ROWS], **tol("qk_rope", dtype))
    # The null row: token 1's or token 3's (each the reference of that token alone).
    alone = [qk_rope_kv_write_reference(qkv[..., i : i + 1, :], kc, vc, pos[i : i + 1],
                                        tab[i : i + 1], **kw) for i in (1, 3)]  # fmt: skip
    for got, j in ((k, 1), (v, 2)):
        cands = [_rows(a[j])[NULL_ROW] for a in alone]
        g = _rows(got)[NULL_ROW]
        assert any(np.allclose(g, c, **tol("qk_rope", dtype)) for c in cands)


def test_equals_the_attention_blocks_xla_operations():
    """Against what `Attention` does without the kernel (`_qk_norm`, `rope`, `_append_kv`'s
    bf16 cast and scatter) on a Qwen3-like layer: the same numbers (table bound; measured
    bit-equal), v bit for bit (a bf16 copy), other rows untouched."""
    blk = Attention(qk_norm=True, rms_eps=1e-6, rope_theta=1e6)
    qkv, kc, vc, w = _inputs(7)
    p = {"q_norm": w[0], "k_norm": w[1]}
    pos, tab = jnp.asarray(POS), jnp.asarray(TABLES)
    x = qkv.astype(jnp.float32)
    q = x[:, : HQ * D].reshape(T, HQ, D)
    kk = x[:, HQ * D : (HQ + HKV) * D].reshape(T, HKV, D)
    vv = x[:, (HQ + HKV) * D :].reshape(T, HKV, D)
    q, kk = blk._qk_norm(p, x, q, kk, HQ)
    q, kk = rope(q, pos, blk.rope_theta), rope(kk, pos, blk.rope_theta)
    ctx = StepContext(positions=pos, seq_ids=jnp.arange(T, dtype=jnp.int32), block_tables=tab)
    env = types.SimpleNamespace(kv_block_size=BS)
    want = blk._append_kv(env, {"k": kc, "v": vc}, kk, vv, ctx, p)
    inv, scaling = blk.rope_frequencies(D)
    got_q, got_k, got_v = qk_rope_kv_write(qkv, kc, vc, pos, tab, num_q_heads=HQ, q_norm=w[0],
                                           k_norm=w[1], eps=1e-6, inv_freq=inv,
                                           rope_scaling=scaling)  # fmt: skip
    np.testing.assert_allclose(np.asarray(got_q, np.float32),
                               np.asarray(q.astype(jnp.bfloat16), np.float32),
                               **tol("qk_rope", "bfloat16"))  # fmt: skip
    rows = [*REAL_ROWS]
    np.testing.assert_allclose(_rows(got_k)[rows], _rows(want["k"])[rows],
                               **tol("qk_rope", "bfloat16"))  # fmt: skip
    np.testing.assert_array_equal(_rows(got_v)[rows], _rows(want["v"])[rows])
    other = np.setdiff1d(np.arange(NB * BS), [*REAL_ROWS, NULL_ROW])
    np.testing.assert_array_equal(_rows(got_k)[other], _rows(kc)[other])


def test_the_blocks_table_is_rope_tables():
    """`Attention.rope_frequencies` gives the tables `rope` / `rope_table` rotate with: the
    kernel's reference fed them rotates as they do (no norm, no cache involved)."""
    x = jnp.asarray(np.random.default_rng(1).standard_normal((T, HQ, D)), jnp.float32)
    pos = jnp.asarray(POS)
    for blk, want in (
        (Attention(rope_theta=5e5, rotary_dim=16), rope(x, pos, 5e5, 16)),
        (Attention(rope_inv_freq=(1.0, 0.1, 0.01, 1e-3), rope_scaling=1.25),
         rope_table(x, pos, (1.0, 0.1, 0.01, 1e-3), 1.25)),
    ):  # fmt: skip
        inv, scaling = blk.rope_frequencies(D)
        qkv = jnp.concatenate([x.reshape(T, -1), jnp.zeros((T, 2 * HKV * D))], -1)
        z = jnp.zeros((NB, BS, HKV, D), jnp.bfloat16)
        q, _, _ = qk_rope_kv_write_reference(qkv, z, z, pos, jnp.asarray(TABLES),
                                             num_q_heads=HQ, inv_freq=inv,
                                             rope_scaling=scaling)  # fmt: skip
        np.testing.assert_array_equal(np.asarray(q), np.asarray(want.astype(jnp.bfloat16)))


def test_declared_cost_is_the_hand_count():
    """3 tokens, Qwen3-like: reads positions and one table entry per token (24 B), the
    projection row (3 x 8 heads x 32 bf16 = 1536 B), the bf16 norm weights (128 B) and the
    16 f32 frequencies (64 B); writes q (768 B) and one K and one V row per token (768 B):
    3288 B. Flops: 18 heads x (4 x 32 norm + 3 x 32 rope) = 4032. With 4 f32 split-K partials
    the projection read is 4 x 3 x 256 x 4 = 12288 B and the sum adds 3 x 3 x 256 flops."""
    sds = jax.ShapeDtypeStruct
    t, bf = 3, jnp.bfloat16
    cache = sds((NB, BS, HKV, D), bf)
    for qkv, want in (
        (sds((t, 8 * D), bf), _cost.KernelCost(3288, 4032)),
        (sds((4, t, 8 * D), jnp.float32),
         _cost.KernelCost(3288 - 1536 + 12288, 4032 + 3 * t * 8 * D)),
    ):  # fmt: skip
        _cost.new_session()
        jax.eval_shape(
            lambda a, k, v, p, b: qk_rope_kv_write(
                a, k, v, p, b, num_q_heads=HQ, q_norm=jnp.ones(D, bf), k_norm=jnp.ones(D, bf),
                inv_freq=jnp.ones(D // 2, jnp.float32), interpret=False),
            qkv, cache, cache, sds((t,), jnp.int32), sds((t, 3), jnp.int32),
        )  # fmt: skip
        got = [fn(_cost.Workload(1)) for key, fn in _cost._SESSION.items()
               if key[0] == "qk_rope_kv_write"]  # fmt: skip
        assert got == [want]
        assert [key[1] for key in _cost._SESSION if key[0] == "qk_rope_kv_write"] == [
            t * (HQ + HKV)
        ]


def test_unsupported_widths_and_bad_input():
    """Widths the Triton tiles cannot take are named; bad arguments are refused before
    tracing, naming the argument."""
    assert fused_write_unsupported(128, 128, jnp.bfloat16) is None
    assert fused_write_unsupported(128, 64, FP8) is None
    assert "head_dim=80" in fused_write_unsupported(80, 80, jnp.bfloat16)
    assert "rotary_dim=48" in fused_write_unsupported(128, 48, jnp.bfloat16)
    assert "float16" in fused_write_unsupported(128, 128, jnp.float16)
    qkv, kc, vc, w = _inputs(0)
    pos, tab = jnp.asarray(POS), jnp.asarray(TABLES)
    bad = [
        (dict(num_q_heads=3), "qkv must be float"),
        (dict(num_q_heads=HQ, q_norm=w[0]), "q_norm and k_norm"),
        (dict(num_q_heads=HQ, q_norm=w[0][:8], k_norm=w[1]), "q_norm must be"),
        (dict(num_q_heads=HQ, inv_freq=jnp.ones(12, jnp.float32)), "rotary_dim=24"),
    ]
    for kw, match in bad:
        err = NotImplementedError if "rotary" in match else ValueError
        with pytest.raises(err, match=match):
            qk_rope_kv_write(qkv, kc, vc, pos, tab, **kw)
    with pytest.raises(ValueError, match="positions must be int32"):
        qk_rope_kv_write(qkv, kc, vc, pos[:2], tab, num_q_heads=HQ)
    with pytest.raises(ValueError, match="k_scale is required"):
        k8 = kc.astype(FP8)
        qk_rope_kv_write(qkv, k8, k8, pos, tab, num_q_heads=HQ)


def test_the_block_falls_back_where_the_kernel_cannot_serve():
    """`Attention.fused_write_unsupported`: None for Qwen3 / Llama layers with Pallas
    kernels; a reason for the XLA backend, gated attention and a head dim of 80."""
    env = lambda hd, kernels="pallas": types.SimpleNamespace(  # noqa: E731
        kernels=kernels, config=types.SimpleNamespace(head_dim=hd)
    )
    assert Attention(qk_norm=True).fused_write_unsupported(env(128)) is None
    assert Attention(rope_inv_freq=(1.0,) * 64).fused_write_unsupported(env(128)) is None
    assert Attention(kv_dtype="fp8").fused_write_unsupported(env(128)) is None
    assert "kernels='xla'" in Attention().fused_write_unsupported(env(128, "xla"))
    assert "gated" in Attention(gated=True).fused_write_unsupported(env(128))
    assert "head_dim=80" in Attention().fused_write_unsupported(env(80))
