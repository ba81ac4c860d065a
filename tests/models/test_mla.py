"""The MLA block's absorbed decode against the expanded form, in plain NumPy (float64).

The reference expands `kv_b_proj` into per-head keys `[c W_uk | k_rope]` and values `c W_uv`
over the cache rows the step returned (so the cache's own bf16 rounding is common to both
sides) and computes the query, the softmax and `o_proj` itself. Its RoPE is written out here
(pairs rotated by `pos * inv_freq`); the YaRN frequencies are the module's (they are held to
transformers by the deepseek_v3 fixture, tests/models/test_pretrained_mla.py).

Tolerance. The step stores in bf16 (unit roundoff u = 2^-9): the query rows (`qkv_output`),
with a q LoRA the normed q latent (`ssm_ba`), the absorbed query (`ssm_deinterleaved`), the
latent output and the `[B, H v]` rows (`attn_output`): n = 4 (5 with q LoRA) roundings. A
rounding of a value feeding `o_proj` moves an output by at most u * max|out| (gain <= 1 for
a relative perturbation of the rows); a rounding of the query moves each logit s by at most
u |s|, which moves the softmax weights relatively by at most 2 u max|s| and the output by as
much again times max|out|. Modelled as independent uniform errors (as tests/models/
test_pretrained.py does), four standard deviations:
    atol = 4 u sqrt(n / 3) (1 + 2 max|s|) max|out_ref|.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target
from jaxarena.models.blocks.base import Env, StepContext
from jaxarena.models.blocks.mla import MLA
from jaxarena.models.core.mla_rope import Yarn

U = 2.0**-9
KV_BLOCK, PAGES_PER_SEQ = 4, 4
POSITIONS = np.array([5, 13], np.int32)  # the new token of each sequence (lengths 6 and 14)
YARN = Yarn(factor=4.0, original_max_position_embeddings=8, mscale=0.8, mscale_all_dim=1.0)

CASES = {
    # V2-Lite-style: a plain q projection, interleaved RoPE pairs, no YaRN.
    "v2": (dict(q_lora_rank=0), MLA(rope_theta=10000.0, rope_interleave=True)),
    # V3-style: q LoRA, rotate-half pairs, YaRN with mscale_all_dim (the softmax scale moves).
    "v3": (dict(q_lora_rank=48), MLA(rope_theta=500.0, rope_interleave=False, yarn=YARN)),
}


def _config(**kw) -> ModelConfig:
    base = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=24,
                qk_rope_head_dim=8, v_head_dim=16, kv_lora_rank=32, intermediate_size=64,
                vocab_size=64, num_hidden_layers=1)  # fmt: skip
    return ModelConfig(**{**base, **kw})


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def _rotate(x, pos, inv, interleave, scale):
    """Rotates `x [..., D]` (one position per leading row) pair by pair."""
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang) * scale, np.sin(ang) * scale
    while c.ndim < x.ndim:
        c, s = c[:, None], s[:, None]
    d = x.shape[-1]
    idx = [(2 * i, 2 * i + 1) if interleave else (i, i + d // 2) for i in range(d // 2)]
    a, b = x[..., [i for i, _ in idx]], x[..., [j for _, j in idx]]
    return np.concatenate([a * c - b * s, b * c + a * s], -1)


def _expanded(p, x, cache, tables, cfg, block, scale, positions=POSITIONS, seq_ids=None,
              first=None):  # fmt: skip
    """float64 expanded MLA of the rows `x` (token `i` at `positions[i]` of sequence
    `seq_ids[i]`, default one new token per sequence), each attending to its sequence's cache
    rows from `first[i]` (default 0) up to its position; `(out, new latent rows, max|s|)`."""
    seq_ids = np.arange(len(positions)) if seq_ids is None else seq_ids
    first = np.zeros(len(positions), int) if first is None else first
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    H, rope, kv_lora = cfg.num_attention_heads, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    nope, v = cfg.head_dim - rope, cfg.v_head_dim
    eps = block.rms_eps
    if cfg.q_lora_rank:
        q = _rms(x @ f(p["wq_a"]), f(p["q_a_norm"]), eps) @ f(p["wq_b"])
    else:
        q = x @ f(p["wq"])
    q = q.reshape(-1, H, nope + rope)
    yarn = block.yarn
    inv = yarn.inverse_frequencies(rope, block.rope_theta).astype(np.float64) if yarn else (
        1.0 / block.rope_theta ** (np.arange(0, rope, 2) / rope))  # fmt: skip
    cs = yarn.cos_sin_factor() if yarn else 1.0
    pos = np.asarray(positions, np.float64)
    q_rope = _rotate(q[..., nope:], pos, inv, block.rope_interleave, cs)
    kv = x @ f(p["wkv_a"])
    new = np.concatenate([_rms(kv[:, :kv_lora], f(p["kv_a_norm"]), eps),
                          _rotate(kv[:, kv_lora:], pos, inv, block.rope_interleave, cs)], -1)  # fmt: skip
    w = f(p["wkv_b"]).reshape(kv_lora, H, nope + v)
    outs, smax = [], 0.0
    for b, (seq, n) in enumerate(zip(seq_ids, np.asarray(positions) + 1, strict=True)):
        rows = f(cache[tables[seq]].reshape(-1, kv_lora + rope)[first[b] : n])
        k_nope = np.einsum("tc,chn->thn", rows[:, :kv_lora], w[..., :nope])
        vals = np.einsum("tc,chv->thv", rows[:, :kv_lora], w[..., nope:])
        s = (np.einsum("hn,thn->ht", q[b, :, :nope], k_nope)
             + np.einsum("hr,tr->ht", q_rope[b], rows[:, kv_lora:])) * scale  # fmt: skip
        smax = max(smax, np.abs(s).max())
        e = np.exp(s - s.max(-1, keepdims=True))
        outs.append(np.einsum("ht,thv->hv", e / e.sum(-1, keepdims=True), vals).reshape(-1))
    return np.stack(outs) @ f(p["wo"]), new, smax


@pytest.fixture(scope="module")
def levers_target():
    return Levers(), Target.preset("gb10")


def _setup(name, levers, target):
    """The case's config and block, an env, random parameters, a random bf16 latent cache of
    two sequences with scrambled page tables (so a wrong page walk reads other rows), the
    scale and an rng."""
    kw, block = CASES[name]
    cfg = _config(**kw)
    sizes = BufferSizes.from_config(cfg, 16, KV_BLOCK * PAGES_PER_SEQ, KV_BLOCK, 2,
                                    levers=levers, target=target)  # fmt: skip
    plan = ArenaPlan.sequential(sizes)
    env = Env(config=cfg, plan=plan, kv_block_size=KV_BLOCK, target=target, levers=levers)
    params = block.init_params(cfg, iter(jax.random.split(jax.random.key(7), 16)))
    rng = np.random.default_rng(3)
    width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    cache = {"latent": jnp.asarray(rng.standard_normal((2 * PAGES_PER_SEQ, KV_BLOCK, 1, width)),
                                   jnp.bfloat16)}  # fmt: skip
    tables = rng.permutation(2 * PAGES_PER_SEQ).reshape(2, PAGES_PER_SEQ).astype(np.int32)
    scale = 1.0 / math.sqrt(cfg.head_dim)
    if block.yarn is not None:  # transformers' yarn_apply_mscale
        scale *= (0.1 * YARN.mscale_all_dim * math.log(YARN.factor) + 1.0) ** 2
    return cfg, block, env, params, cache, tables, scale, rng


def _bf16_rows(rng, n, width):
    x = rng.standard_normal((n, width)).astype(np.float32)
    return np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))


def _check_rows(lat, tables, positions, seq_ids, new_rows):
    """The appended rows: the raw `kv_a` rows are rounded (`qkv_output`), normed (the RMS
    moves by at most u relative) or rotated (a rotation keeps a pair's norm, <= sqrt(2)
    max|row|), then rounded into the cache: every element within 3 sqrt(2) u max|row| of the
    exact one."""
    got_rows = np.stack([lat[tables[s, p // KV_BLOCK], p % KV_BLOCK]
                         for s, p in zip(seq_ids, positions, strict=True)])  # fmt: skip
    row_tol = 3 * math.sqrt(2) * U * np.abs(new_rows).max(-1, keepdims=True)
    assert (np.abs(got_rows - new_rows) <= row_tol).all(), np.abs(got_rows - new_rows).max()


@pytest.mark.parametrize("name", CASES)
def test_absorbed_decode_equals_expanded_attention(name, levers_target):
    cfg, block, env, params, cache, tables, scale, rng = _setup(name, *levers_target)
    bsz = len(POSITIONS)
    x = _bf16_rows(rng, bsz, cfg.hidden_size)
    ctx = StepContext(positions=jnp.asarray(POSITIONS), seq_ids=jnp.arange(bsz, dtype=jnp.int32),
                      block_tables=jnp.asarray(tables), seq_lens=jnp.asarray(POSITIONS + 1))  # fmt: skip

    @jax.jit
    def step(params, arena, cache, x, ctx):  # the block reads its (bf16-valued) input from ctx.x
        return block.decode(env, params, arena, cache, ctx._replace(x=x))

    _, new_cache, out = step(params, env.plan.allocate(), cache, jnp.asarray(x), ctx)
    lat = np.asarray(new_cache["latent"].astype(jnp.float32))[:, :, 0]
    want, new_rows, smax = _expanded(params, x.astype(np.float64), lat, tables, cfg, block, scale)
    _check_rows(lat, tables, POSITIONS, range(bsz), new_rows)

    n = 5 if cfg.q_lora_rank else 4
    atol = 4 * U * math.sqrt(n / 3) * (1 + 2 * smax) * np.abs(want).max()
    assert atol < 0.1 * np.abs(want).max()  # the bound is far below the outputs' size
    np.testing.assert_allclose(np.asarray(out), want, atol=atol, rtol=0)
    # The comparison can fail: the same reference over the pages walked in order (a wrong
    # block-table walk) lies outside the bound. (Measured: the step is within 0.006 (v2) and
    # 0.004 (v3) of the reference against bounds of 0.069 and 0.18.)
    ordered = np.arange(bsz * PAGES_PER_SEQ, dtype=np.int32).reshape(bsz, PAGES_PER_SEQ)
    wrong, _, _ = _expanded(params, x.astype(np.float64), lat, ordered, cfg, block, scale)
    assert np.abs(wrong - want).max() > 3 * atol


# A chunk continuing sequence 0 after 5 cached tokens (positions 5-7, across a page boundary)
# and starting sequence 1 (positions 0-3).
CHUNK_CACHED, CHUNK_LENS = np.array([5, 0], np.int32), np.array([3, 4], np.int32)


@pytest.mark.parametrize("name", CASES)
def test_absorbed_chunked_prefill_equals_expanded_attention(name, levers_target):
    """The absorbed prefill (the paged prefill kernel over the latent cache) of a chunk
    against the float64 expanded attention over the same cache rows. Roundings (the module
    docstring's model): the query rows, the absorbed query, the kernel's bf16 probabilities,
    the latent output in `attn_output` and the `[T, H v]` rows (5; 6 with the q LoRA's normed
    latent): the decode count plus the probabilities, which split-K keeps exact."""
    cfg, block, env, params, cache, tables, scale, rng = _setup(name, *levers_target)
    seq_ids = np.repeat(np.arange(2, dtype=np.int32), CHUNK_LENS)
    positions = np.concatenate([np.arange(c, c + n) for c, n in zip(CHUNK_CACHED, CHUNK_LENS,
                                                                    strict=True)]).astype(np.int32)  # fmt: skip
    x = _bf16_rows(rng, len(positions), cfg.hidden_size)
    ctx = StepContext(
        positions=jnp.asarray(positions), seq_ids=jnp.asarray(seq_ids),
        block_tables=jnp.asarray(tables),
        cu_seqlens=jnp.asarray(np.concatenate([[0], np.cumsum(CHUNK_LENS)]), jnp.int32),
        seq_lens=jnp.asarray(CHUNK_CACHED + CHUNK_LENS), cached_lens=jnp.asarray(CHUNK_CACHED),
    )  # fmt: skip

    @jax.jit
    def step(params, arena, cache, x, ctx):
        return block.prefill(env, params, arena, cache, ctx._replace(x=x))

    _, new_cache, out = step(params, env.plan.allocate(), cache, jnp.asarray(x), ctx)
    lat = np.asarray(new_cache["latent"].astype(jnp.float32))[:, :, 0]
    x64 = x.astype(np.float64)
    want, new_rows, smax = _expanded(params, x64, lat, tables, cfg, block, scale, positions,
                                     seq_ids)  # fmt: skip
    _check_rows(lat, tables, positions, seq_ids, new_rows)
    n = 6 if cfg.q_lora_rank else 5
    atol = 4 * U * math.sqrt(n / 3) * (1 + 2 * smax) * np.abs(want).max()
    assert atol < 0.1 * np.abs(want).max()
    np.testing.assert_allclose(np.asarray(out), want, atol=atol, rtol=0)
    # The comparison can fail: a wrong page walk (the pages in order) lies outside the bound,
    # and so does attending to the chunk alone (sequence 0's cached rows left out).
    ordered = np.arange(2 * PAGES_PER_SEQ, dtype=np.int32).reshape(2, PAGES_PER_SEQ)
    wrong, _, _ = _expanded(params, x64, lat, ordered, cfg, block, scale, positions, seq_ids)
    assert np.abs(wrong - want).max() > 3 * atol
    alone, _, _ = _expanded(params, x64, lat, tables, cfg, block, scale, positions, seq_ids,
                            CHUNK_CACHED[seq_ids])  # fmt: skip
    assert np.abs(alone - want).max() > 3 * atol
    # (Measured: the step within 0.006 (v2) and 0.008 (v3) of the reference against bounds of
    # 0.19 and 0.28; the wrong walk 3.9 and 3.4 away, the chunk alone 2.5 and 3.0.)


def test_latent_partials_fit_the_workspace():
    """The workspace is sized by `head_dim + 2` f32 per slot; the latent partials take
    `kv_lora + 2`, wider for DeepSeek (512 against 192): the split count is lowered until
    they fit, and kept where they already do. (Hopper, 64 sequences: V2-Lite's 16 heads get
    6 splits instead of the policy's 16, V3's 128 heads 1 instead of 3.)"""
    from pallas_kernels.splitk_decode_attention import splitk_num_splits

    levers, target = Levers(), Target.preset("hopper")
    lowered = 0
    for heads in (16, 128):
        cfg = ModelConfig(num_attention_heads=heads, num_key_value_heads=heads, head_dim=192,
                          kv_lora_rank=512, qk_rope_head_dim=64, hidden_size=1024,
                          intermediate_size=64, vocab_size=64, num_hidden_layers=1)  # fmt: skip
        sizes = BufferSizes.from_config(cfg, 16, 4096, 16, 64, levers=levers, target=target)
        plan = ArenaPlan.sequential(sizes)
        env = Env(config=cfg, plan=plan, kv_block_size=16, target=target, levers=levers)
        cap = plan.regions["splitk_workspace"].nbytes
        for b in (1, 8, 64):
            n = MLA()._num_splits(env, b)
            policy = splitk_num_splits(b, heads, levers=levers, target=target)
            assert 1 <= n <= policy
            assert n == 1 or b * heads * n * (512 + 2) * 4 <= cap
            if b * heads * policy * (512 + 2) * 4 <= cap:
                assert n == policy
            lowered += n < policy
    assert lowered >= 2  # the lowering is exercised
