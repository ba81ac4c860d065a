"""The arena-free reference step: the same model as `ArenaLM` (same blocks, same weights,
same Pallas attention kernels in their standalone forms), written plainly, every
intermediate an XLA value. The step rule (jaxarena/models/README.md) is measured against it:
launches and temp of `ArenaLM.prefill` / `decode_step` vs these.

Also builds an `ArenaLM` at real widths from a config dict without weights (abstract bf16
parameters and caches, `jax.ShapeDtypeStruct`), for `compile_for_gpu`.

Attention (gated and partial-RoPE included), MLA (absorbed attention over the latent cache:
the paged prefill and split-K kernels' latent paths), MLP, MoE (bf16 experts on the same
Pallas grouped GEMM), Mamba-2 and Gated DeltaNet blocks; `plain_*` raise NotImplementedError
for any other.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target
from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.gated_deltanet import GatedDeltaNet
from jaxarena.models.blocks.mamba2 import Mamba2
from jaxarena.models.blocks.mla import MLA, mla_dims
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.blocks.moe import MoE
from jaxarena.models.blocks.moe_routing import combine, sort_by_expert
from jaxarena.models.core.norms import rms_norm
from jaxarena.models.core.rope import rope, rope_table
from jaxarena.models.families.registry import family_for
from jaxarena.models.stack import ArenaLM
from pallas_kernels import (
    gdn_chunked,
    gdn_state_update,
    paged_prefill_attention,
    splitk_decode_attention,
    ssd_chunked_scan,
    ssd_state_update,
)
from pallas_kernels.grouped_gemm import grouped_gemm

BF16, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
S = jax.ShapeDtypeStruct

# Qwen3-30B-A3B's widths (the MoE figures; `num_hidden_layers` is cut by the callers).
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "num_hidden_layers": 48, "vocab_size": 151936,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "max_position_embeddings": 40960, "hidden_act": "silu", "torch_dtype": "bfloat16",
    "attention_bias": False,
}  # fmt: skip

# Qwen3-0.6B's shapes (the figures).
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 3072, "num_hidden_layers": 28, "vocab_size": 151936,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
    "max_position_embeddings": 40960, "hidden_act": "silu", "torch_dtype": "bfloat16",
    "attention_bias": False,
}  # fmt: skip


def build_model(raw: dict[str, Any], *, max_batch_tokens: int, max_seq_len: int,
                kv_block_size: int = 16, max_batch_size: int = 8, target: Target | None = None,
                interpret: bool | None = False) -> ArenaLM:  # fmt: skip
    """An `ArenaLM` for the config dict `raw` at these serve limits (no weights read)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)
        (path / "config.json").write_text(json.dumps(raw))
        cfg = ModelConfig.from_hf(path / "config.json")
        arch = family_for(raw["model_type"], path).arch(raw["model_type"], raw, cfg, path,
                                                        max_seq_len)  # fmt: skip
    target, levers = target or Target.preset("hopper"), Levers()
    sizes = BufferSizes.from_config(cfg, max_batch_tokens, max_seq_len, kv_block_size,
                                    max_batch_size, levers=levers, target=target)  # fmt: skip
    return ArenaLM(config=cfg, arch=arch, plan=ArenaPlan.sequential(sizes),
                   max_batch_tokens=max_batch_tokens, max_seq_len=max_seq_len,
                   kv_block_size=kv_block_size, max_batch_size=max_batch_size, target=target,
                   levers=levers, interpret=interpret)  # fmt: skip


def abstract_params(model: ArenaLM, dtype=BF16) -> dict[str, Any]:
    """`ShapeDtypeStruct`s of the model's parameters (as a bf16 checkpoint loads them)."""
    c = model.config

    def init():
        keys = iter(jax.random.split(jax.random.key(0), 12 * len(model.arch.blocks) + 4))
        layers = [{"norm": jnp.ones((c.hidden_size,)), **b.init_params(c, keys)}
                  for b in model.arch.blocks]  # fmt: skip
        p = {"embed": jnp.ones((c.vocab_size, c.hidden_size)), "layers": layers,
             "final_norm": jnp.ones((c.hidden_size,))}  # fmt: skip
        if not model.arch.tie_embeddings:
            p["lm_head"] = jnp.ones((c.hidden_size, c.vocab_size))
        return p

    return jax.tree.map(lambda x: S(x.shape, dtype), jax.eval_shape(init))


def abstract_caches(model: ArenaLM, *, num_blocks: int, rows: int) -> dict[str, Any]:
    """`ShapeDtypeStruct`s of the model's caches."""
    return jax.eval_shape(lambda: model.init_caches(num_blocks=num_blocks, rows=rows))


def _check_blocks(model: ArenaLM) -> None:
    for b in model.arch.blocks:
        if not isinstance(b, Attention | MLA | MLP | MoE | Mamba2 | GatedDeltaNet):
            raise NotImplementedError(
                f"the plain step runs attention, MLA, MLP, MoE, Mamba-2 and GDN blocks, not "
                f"{b.kind}"
            )


def _attention(model, b: Attention, p, x, cache, ctx, mode):
    c, t = model.config, x.shape[0]
    hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    qkv = x @ p["wqkv"]
    qw = 2 * hq if b.gated else hq  # gated: each head's q projection is [q_h | gate_h]
    qh = qkv[:, : qw * hd].reshape(t, hq, -1)
    q, gate = qh[..., :hd], qh[..., hd:].reshape(t, -1)
    k = qkv[:, qw * hd : (qw + hkv) * hd].reshape(t, hkv, hd)
    v = qkv[:, (qw + hkv) * hd :].reshape(t, hkv, hd)
    if b.qk_norm:
        eps, off = b.rms_eps, b.norm_offset
        q, k = rms_norm(q, p["q_norm"], eps, off), rms_norm(k, p["k_norm"], eps, off)
    pos = ctx["positions"]
    if b.rope and b.rope_inv_freq is not None:
        q = rope_table(q, pos, b.rope_inv_freq, b.rope_scaling)
        k = rope_table(k, pos, b.rope_inv_freq, b.rope_scaling)
    elif b.rope:
        q, k = rope(q, pos, b.rope_theta, b.rotary_dim), rope(k, pos, b.rope_theta, b.rotary_dim)
    bs = model.kv_block_size
    slots = ctx["block_tables"][ctx["seq_ids"], pos // bs] * bs + pos % bs
    nb = cache["k"].shape[0]
    flat = lambda a: a.reshape(nb * bs, hkv, hd)  # noqa: E731
    cache = {
        "k": flat(cache["k"]).at[slots].set(k.astype(BF16)).reshape(cache["k"].shape),
        "v": flat(cache["v"]).at[slots].set(v.astype(BF16)).reshape(cache["v"].shape),
    }
    if mode == "prefill":
        cu = ctx["cu_seqlens"]
        o = paged_prefill_attention(q.astype(BF16), cache["k"], cache["v"], ctx["block_tables"],
                                    cu, cu[1:] - cu[:-1], interpret=model.interpret)  # fmt: skip
    else:
        o = splitk_decode_attention(q.astype(BF16), cache["k"], cache["v"], ctx["block_tables"],
                                    ctx["seq_lens"], levers=model.levers, target=model.target,
                                    interpret=model.interpret)  # fmt: skip
    o = o.reshape(t, hq * hd)
    if b.gated:
        o = (o.astype(F32) * jax.nn.sigmoid(gate.astype(F32))).astype(BF16)
    return cache, o @ p["wo"]


def _mla(model, b: MLA, p, x, cache, ctx, mode):
    """The MLA block plainly (jaxarena/models/blocks/mla.py): bf16 projections, the latent
    `[c | k_rope]` appended to the paged cache; `kv_b_proj` absorbed into the query, the
    standalone paged prefill kernel (prefill) or split-K kernel (decode, its own split policy:
    no region caps the partials) over the latent cache, the latent output through `W_uv`.
    The block's pure helpers (`_rope`, `_kv_b`, `_mul`, `_absorb_prefill`, `sm_scale`) are
    reused."""
    c, t = model.config, x.shape[0]
    H, nope, rope, v, kv_lora, q_lora = mla_dims(c)
    if q_lora:
        qa = rms_norm((x @ p["wq_a"]).astype(F32), p["q_a_norm"], b.rms_eps)
        q = qa.astype(BF16) @ p["wq_b"]
    else:
        q = x @ p["wq"]
    kv = (x @ p["wkv_a"]).astype(F32)
    pos = ctx["positions"]
    q = q.astype(F32).reshape(t, H, nope + rope)
    q = jnp.concatenate([q[..., :nope], b._rope(q[..., nope:], pos, rope)], -1).astype(BF16)
    lat = rms_norm(kv[:, :kv_lora], p["kv_a_norm"], b.rms_eps)
    k_rope = b._rope(kv[:, None, kv_lora:], pos, rope)[:, 0]
    latent = jnp.concatenate([lat, k_rope], -1).astype(BF16)
    bs, full = model.kv_block_size, cache["latent"]
    slots = ctx["block_tables"][ctx["seq_ids"], pos // bs] * bs + pos % bs
    cache = {"latent": full.reshape(-1, full.shape[-1]).at[slots].set(latent).reshape(full.shape)}
    w, scale = b._kv_b(p, c), b.sm_scale(c)
    if mode == "prefill":
        cu = ctx["cu_seqlens"]
        o_lat = paged_prefill_attention(b._absorb_prefill(q, w, nope), cache["latent"], None,
                                        ctx["block_tables"], cu, cu[1:] - cu[:-1],
                                        sm_scale=scale, v_head_dim=kv_lora,
                                        interpret=model.interpret)  # fmt: skip
        o = b._mul("thc,chv->thv", o_lat, w[..., nope:])
    else:
        q_pad = jnp.pad(q[..., :nope], ((0, 0), (0, 0), (0, v)))  # zeros against W_uv
        qa = jnp.concatenate([b._mul("bhd,chd->bhc", q_pad, w), q[..., nope:]], -1)
        o_lat = splitk_decode_attention(qa.astype(BF16), cache["latent"], None,
                                        ctx["block_tables"], ctx["seq_lens"], sm_scale=scale,
                                        v_head_dim=kv_lora, levers=model.levers,
                                        target=model.target, interpret=model.interpret)  # fmt: skip
        o = b._mul("bhc,chd->bhd", o_lat, w)[..., nope:]
    return cache, o.reshape(t, H * v).astype(BF16) @ p["wo"]


def _mlp(b: MLP, p, x):
    if b.act == "swiglu":
        # The model's joined gate|up weight (`MLP.read_params`): one GEMM, as ArenaLM's.
        gu = x @ p["w_gate_up"]
        inter = gu.shape[-1] // 2
        h = jax.nn.silu(gu[:, :inter]) * gu[:, inter:]
    else:
        h = jnp.square(jax.nn.relu(x @ p["w_up"]))
    return h @ p["w_down"]


def _moe(model: ArenaLM, b: MoE, p, x):
    """The MoE block plainly: float32 router, routing, the two bf16 grouped GEMMs (the same
    Pallas kernel), combine; shared expert and latent projections as plain products."""
    c = model.config
    e, k = c.num_experts, c.num_experts_per_tok
    weights, ids = b._route(p, b._router_logits(p, x.astype(F32)), k)
    order, sizes, token = sort_by_expert(ids, e)
    expert = ids.reshape(-1)[order]
    src = (x @ p["w_lat_in"]).astype(BF16) if b.latent else x
    w_in = p["w_gate_up"] if b.act == "swiglu" else p["w_up"]
    gu = grouped_gemm(src[token], w_in, sizes, out_dtype=F32, interpret=model.interpret)
    a = b._act(p, gu, expert).astype(BF16)
    y = grouped_gemm(a, p["w_down"], sizes, out_dtype=F32, interpret=model.interpret)
    out = combine(b._down_bias(p, y, expert), order, weights, F32)
    if b.latent:
        out = out.astype(BF16) @ p["w_lat_out"]
    if b.shared:
        if b.act == "swiglu":
            # The model's joined shared gate|up weight (`MoE.read_params`): one GEMM.
            gu = x @ p["s_gate_up"]
            half = gu.shape[-1] // 2
            h = jax.nn.silu(gu[:, :half]) * gu[:, half:]
        else:
            h = jnp.square(jax.nn.relu(x @ p["s_up"]))
        y = h @ p["s_down"]
        if b.shared_gate:
            y = y * jax.nn.sigmoid(x @ p["s_scale"])
        out = out + y.astype(F32)
    return out


def _causal_conv(xs, w, conv_cache, ctx, mode):
    """Depthwise causal conv1d of `xs [T, D]` with `w [K, D]` (the last row the current
    token's): per packed sequence in prefill (the cache gets each sequence's last `K - 1` rows,
    zeros before its start), over the cached window in decode. Returns `(conv, new cache)`."""
    t, kk = xs.shape[0], w.shape[0]
    if mode == "prefill":
        cu, seq = ctx["cu_seqlens"], ctx["seq_ids"]
        idx = jnp.arange(t, dtype=I32)
        conv = xs * w[kk - 1]
        for j in range(1, kk):
            same = (idx >= j) & (jnp.roll(seq, j) == seq)
            conv = conv + jnp.where(same[:, None], jnp.roll(xs, j, 0), 0.0) * w[kk - 1 - j]
        win = jnp.stack([jnp.where((cu[1:] - j >= cu[:-1])[:, None],
                                   xs[jnp.maximum(cu[1:] - j, 0)], 0.0)
                         for j in range(kk - 1, 0, -1)], 1)  # fmt: skip
        return conv, conv_cache.at[: win.shape[0]].set(win)
    window = jnp.concatenate([conv_cache[:t], xs[:, None, :]], axis=1)
    return jnp.einsum("bkd,kd->bd", window, w), conv_cache.at[:t].set(window[:, 1:])


def _mamba(model, b: Mamba2, p, x, cache, ctx, mode):
    """in_proj -> causal conv -> SSD (the standalone kernels) -> gated grouped RMSNorm ->
    out_proj; the conv window and SSM state in the cache, as `Mamba2` keeps them."""
    c, t = model.config, x.shape[0]
    d_in, d_xbc, g, n = c.mamba2_d_inner, c.mamba2_d_xbc, c.n_groups, c.ssm_state_size
    zx = (x @ p["in_proj"]).astype(F32)
    z, xbc, dt = zx[:, :d_in], zx[:, d_in : d_in + d_xbc], zx[:, d_in + d_xbc :]
    conv, conv_cache = _causal_conv(xbc, p["conv_w"].astype(F32), cache["conv"], ctx, mode)
    xbc = jax.nn.silu(conv + p["conv_b"].astype(F32))
    xs = xbc[:, :d_in].reshape(t, c.mamba_num_heads, c.mamba_head_dim)
    bb = xbc[:, d_in : d_in + g * n].reshape(t, g, n)
    cc = xbc[:, d_in + g * n :].reshape(t, g, n)
    a = -jnp.exp(p["A_log"].astype(F32))
    kw = dict(D=p["D"].astype(F32), dt_bias=p["dt_bias"].astype(F32), dt_softplus=True,
              interpret=model.interpret)  # fmt: skip
    if mode == "prefill":
        y, final = ssd_chunked_scan(xs.astype(BF16), dt, a, bb, cc, chunk_size=64,
                                    cu_seqlens=ctx["cu_seqlens"], **kw)  # fmt: skip
        state = cache["state"].at[: final.shape[0]].set(final)
    else:
        y, state = ssd_state_update(cache["state"], xs, dt, a, bb, cc, **kw)
    y = y.reshape(t, d_in).astype(F32) * jax.nn.silu(z)
    y = rms_norm(y.reshape(t, g, -1), p["gate_norm"].reshape(g, -1), b.rms_eps)
    return {"state": state, "conv": conv_cache}, y.reshape(t, d_in).astype(BF16) @ p["out_proj"]


def _gdn(model, b: GatedDeltaNet, p, x, cache, ctx, mode):
    """in_proj -> causal conv -> delta rule (the standalone kernels) -> gated RMSNorm ->
    out_proj; the conv window and state in the cache, as `GatedDeltaNet` keeps them."""
    c, t = model.config, x.shape[0]
    nk, dk, nv, dv = (c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads,
                      c.linear_value_head_dim)  # fmt: skip
    qkvz, ba = (x @ p["w_qkvz"]).astype(F32), (x @ p["w_ba"]).astype(F32)
    if b.interleaved:
        parts = jnp.split(qkvz.reshape(t, nk, -1), np.cumsum([dk, dk, nv // nk * dv]), -1)
        qkvz = jnp.concatenate([a.reshape(t, -1) for a in parts], -1)
        ba = ba.reshape(t, nk, 2, nv // nk)
        bb, aa = ba[:, :, 0].reshape(t, nv), ba[:, :, 1].reshape(t, nv)
    else:
        bb, aa = ba[:, :nv], ba[:, nv:]
    cut = 2 * nk * dk + nv * dv
    xs, z = qkvz[:, :cut], qkvz[:, cut:]
    conv, conv_cache = _causal_conv(xs, p["conv_w"].astype(F32), cache["conv"], ctx, mode)
    conv = jax.nn.silu(conv)
    kd = nk * dk
    q, k = conv[:, :kd].reshape(t, nk, dk), conv[:, kd : 2 * kd].reshape(t, nk, dk)
    v = conv[:, 2 * kd :].reshape(t, nv, dv)
    beta = jax.nn.sigmoid(bb)
    g = -jnp.exp(p["A_log"].astype(F32)) * jax.nn.softplus(aa + p["dt_bias"].astype(F32))
    if mode == "prefill":
        o, final = gdn_chunked(q, k, v, g, beta, cu_seqlens=ctx["cu_seqlens"],
                               use_qk_l2norm=True, interpret=model.interpret)  # fmt: skip
        state = cache["state"].at[: final.shape[0]].set(final)
    else:
        o, state = gdn_state_update(cache["state"], q, k, v, g, beta, use_qk_l2norm=True,
                                    interpret=model.interpret)  # fmt: skip
    y = rms_norm(o.astype(F32), p["gate_norm"].astype(F32), b.rms_eps)
    y = (y * jax.nn.silu(z.reshape(t, nv, dv))).reshape(t, nv * dv)
    return {"state": state, "conv": conv_cache}, y.astype(BF16) @ p["out_proj"]


def _blocks(model: ArenaLM, params, caches, tokens, ctx, mode):
    _check_blocks(model)
    eps = model.arch.rms_eps
    x = params["embed"][tokens].astype(F32)
    out = {}
    for key, b, p in zip(model.arch.cache_keys, model.arch.blocks, params["layers"], strict=True):
        h = rms_norm(x, p["norm"], eps, model.arch.norm_offset).astype(BF16)
        if isinstance(b, Attention):
            out[key], y = _attention(model, b, p, h, caches[key], ctx, mode)
        elif isinstance(b, MLA):
            out[key], y = _mla(model, b, p, h, caches[key], ctx, mode)
        elif isinstance(b, MoE):
            out[key], y = caches[key], _moe(model, b, p, h)
        elif isinstance(b, Mamba2):
            out[key], y = _mamba(model, b, p, h, caches[key], ctx, mode)
        elif isinstance(b, GatedDeltaNet):
            out[key], y = _gdn(model, b, p, h, caches[key], ctx, mode)
        else:
            out[key], y = caches[key], _mlp(b, p, h)
        x = x + y.astype(F32)
    return x, out


def _head(model: ArenaLM, params, x):
    h = rms_norm(x, params["final_norm"], model.arch.rms_eps, model.arch.norm_offset).astype(BF16)
    head = params["embed"].T if model.arch.tie_embeddings else params["lm_head"]
    return (h @ head).astype(F32)


def plain_prefill(model: ArenaLM, params, caches, tokens, cu_seqlens, block_tables):
    """`ArenaLM.prefill` without the arena: `(caches, logits float32[S, vocab])`."""
    t = tokens.shape[0]
    idx = jnp.arange(t, dtype=I32)
    seq = jnp.sum(cu_seqlens[None, 1:] <= idx[:, None], axis=1, dtype=I32)
    ctx = dict(positions=idx - cu_seqlens[seq], seq_ids=seq, block_tables=block_tables,
               cu_seqlens=cu_seqlens)  # fmt: skip
    x, caches = _blocks(model, params, caches, tokens, ctx, "prefill")
    return caches, _head(model, params, x[cu_seqlens[1:] - 1])


def plain_decode_step(model: ArenaLM, params, caches, tokens, positions, block_tables,
                      seq_lens):  # fmt: skip
    """`ArenaLM.decode_step` without the arena: `(caches, logits, next_tokens)`."""
    ctx = dict(positions=positions, seq_ids=jnp.arange(tokens.shape[0], dtype=I32),
               block_tables=block_tables, seq_lens=seq_lens)  # fmt: skip
    x, caches = _blocks(model, params, caches, tokens, ctx, "decode")
    logits = _head(model, params, x)
    return caches, logits, jnp.argmax(logits, -1).astype(I32)
