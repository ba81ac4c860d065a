"""GQA attention over a paged bf16 KV cache (vLLM layout).

Optional per-head q/k RMSNorm (Qwen3) and RoPE (rotate-half; Nemotron-H has none). Prefill
attends densely within each packed sequence (reading what decode reads: bf16 queries and the
bf16 cache); decode runs the split-K Pallas kernel (partials in `splitk_workspace`, output
in `attn_output`). Arena regions: `qkv_output`, `attn_output`, the FP8 activation buffers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ModelConfig, workspaces
from jaxarena.models.blocks.base import Block, Env, StepContext, dense_init
from jaxarena.models.core.arena import BF16, F32, get, linear, put
from jaxarena.models.core.norms import rms_norm
from jaxarena.models.core.rope import rope, rope_table
from pallas_kernels import splitk_decode_attention_into

__all__ = ["Attention"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attention(Block):
    """GQA attention with a paged KV cache (see the module docstring).

    Attributes:
      rope: apply rotary embeddings (rotate-half form) with `rope_theta`.
      qk_norm: RMS-normalize each q and k head before RoPE (Qwen3).
      rms_eps: epsilon of the q/k norms.
      rope_inv_freq, rope_scaling: a RoPE table (`core.rope_params.rope_spec`: scaled
        frequencies, partial rotary, YaRN's cos/sin factor) used instead of `rope_theta`.
      qkv_bias, o_bias: the q/k/v (Qwen2, `attention_bias`) and o projections add a bias.
      window: sliding window: a query sees the `window` most recent keys, itself included
        (transformers' `sliding_window`); None: all.
      softcap: attention-logit soft-cap `c * tanh(x / c)` (Gemma 2); None: none.
      scale: the logit scale (Gemma's `query_pre_attn_scalar ** -0.5`); None: `head_dim ** -0.5`.
      sinks: one learned extra logit per query head joins each softmax's denominator
        (gpt-oss's `sinks`); its value row is zero.

      rotary_dim: rotate only the first `rotary_dim` values of each head (partial RoPE,
        Qwen3-Next / Qwen3.5: `partial_rotary_factor * D`); 0 = all of them.
      gated: the q projection also yields a gate per head (`[q_h | gate_h]` per head, as
        Qwen3-Next / Qwen3.5 store it); the attention output is multiplied by
        `sigmoid(gate)` in `attn_output` before `o_proj`.
      norm_offset: the q/k norms scale by `w + norm_offset` (1: the `(1 + w)` norms).

    Parameters: `wqkv` (`[hidden, (Hq + 2 Hkv) D]`, with `gated` `[hidden, (2 Hq + 2 Hkv) D]`,
    or a (q, k, v) tuple of linear weights), `wo` (`[Hq D, hidden]`), with `qk_norm` also
    `q_norm` and `k_norm` (`[D]`), with `qkv_bias` `bqkv` (`[(Hq + 2 Hkv) D]`), with `o_bias`
    `bo` (`[hidden]`), with `sinks` `sinks` (`float32[Hq]`).
    Cache: `{"k", "v"}`, each `bfloat16[num_blocks, kv_block_size, Hkv, D]`.
    """

    kind: ClassVar[str] = "attention"
    rope: bool = True
    rope_theta: float = 10000.0
    qk_norm: bool = False
    rms_eps: float = 1e-5
    rope_inv_freq: tuple[float, ...] | None = None
    rope_scaling: float = 1.0
    qkv_bias: bool = False
    o_bias: bool = False
    window: int | None = None
    softcap: float | None = None
    scale: float | None = None
    sinks: bool = False

    rotary_dim: int = 0
    gated: bool = False
    norm_offset: float = 0.0

    def __post_init__(self) -> None:
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"Attention.window={self.window!r} must be None or an int >= 1")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"Attention.softcap={self.softcap!r} must be None or > 0")

    def init_params(self, config: ModelConfig, keys: Iterator[jax.Array]) -> dict[str, Any]:
        """Random `wqkv` and `wo` (unit q/k norms with `qk_norm`)."""
        h, hq, hkv, hd = (config.hidden_size, config.num_attention_heads,
                          config.num_key_value_heads, config.head_dim)  # fmt: skip
        qw = 2 * hq if self.gated else hq
        p = {"wqkv": dense_init(keys, h, (qw + 2 * hkv) * hd), "wo": dense_init(keys, hq * hd, h)}
        if self.qk_norm:
            p["q_norm"] = p["k_norm"] = jnp.ones((hd,), F32)
        if self.qkv_bias:
            p["bqkv"] = jnp.zeros(((hq + 2 * hkv) * hd,), F32)
        if self.o_bias:
            p["bo"] = jnp.zeros((h,), F32)
        if self.sinks:
            p["sinks"] = jnp.zeros((hq,), F32)
        return p

    def read_params(self, reader: Any, config: ModelConfig, prefix: str,
                    norm: str) -> dict[str, Any]:  # fmt: skip
        """`{prefix}.{q,k,v,o}_proj` (and `{prefix}.{q,k}_norm` with `qk_norm`)."""
        hd = config.head_dim
        p = {
            "norm": reader.vector(norm, config.hidden_size),
            "wqkv": self._read_qkv(reader, config, prefix),
            "wo": reader.linear(
                f"{prefix}.o_proj", config.hidden_size, config.num_attention_heads * hd
            ),  # fmt: skip
        }
        if self.qk_norm:
            p["q_norm"] = reader.vector(f"{prefix}.q_norm.weight", hd)
            p["k_norm"] = reader.vector(f"{prefix}.k_norm.weight", hd)
        if self.qkv_bias:
            sizes = (("q", config.num_attention_heads), ("k", config.num_key_value_heads),
                     ("v", config.num_key_value_heads))  # fmt: skip
            p["bqkv"] = np.concatenate(
                [reader.vector(f"{prefix}.{n}_proj.bias", heads * hd) for n, heads in sizes]
            )
        if self.o_bias:
            p["bo"] = reader.vector(f"{prefix}.o_proj.bias", config.hidden_size)
        if self.sinks:
            p["sinks"] = reader.vector(f"{prefix}.sinks", config.num_attention_heads)
        return p

    def _read_qkv(self, reader: Any, config: ModelConfig, prefix: str) -> Any:
        """`reader.qkv`, with a q projection twice as wide when `gated`."""
        if not self.gated:
            return reader.qkv(prefix, config)
        h, hd = config.hidden_size, config.head_dim
        parts = [reader.linear(f"{prefix}.{n}_proj", heads * hd, h) for n, heads in
                 (("q", 2 * config.num_attention_heads), ("k", config.num_key_value_heads),
                  ("v", config.num_key_value_heads))]  # fmt: skip
        if all(isinstance(x, np.ndarray) for x in parts):
            return np.concatenate(parts, axis=1)
        return tuple(parts)

    def init_cache(self, config: ModelConfig, *, num_blocks: int, kv_block_size: int,
                   rows: int) -> dict[str, jax.Array]:  # fmt: skip
        """A zeroed paged KV cache, `k` and `v` `bfloat16[num_blocks, kv_block_size, Hkv, D]`."""
        shape = (num_blocks, kv_block_size, config.num_key_value_heads, config.head_dim)
        return {"k": jnp.zeros(shape, BF16), "v": jnp.zeros(shape, BF16)}

    def _qkv(self, env: Env, p, arena, ctx: StepContext):
        """QKV projection into `qkv_output`; returns (arena, q, k, v) with q/k norm and RoPE."""
        c, t = env.config, ctx.num_tokens
        hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        arena, qkv = linear(env.plan, arena, "norm_output", (t, c.hidden_size), p["wqkv"],
                            workspaces.FP8_ACT_REGIONS, interpret=env.interpret)  # fmt: skip
        if self.qkv_bias:
            qkv = qkv + p["bqkv"].astype(F32)
        arena = put(env.plan, arena, "qkv_output", qkv)
        qw = 2 * hq if self.gated else hq
        qkv = get(env.plan, arena, "qkv_output", (t, (qw + 2 * hkv) * hd))
        q = qkv[:, : qw * hd].reshape(t, hq, -1)[..., :hd]
        k = qkv[:, qw * hd : (qw + hkv) * hd].reshape(t, hkv, hd)
        v = qkv[:, (qw + hkv) * hd :].reshape(t, hkv, hd)
        if self.qk_norm:
            eps, off = self.rms_eps, self.norm_offset
            q, k = rms_norm(q, p["q_norm"], eps, off), rms_norm(k, p["k_norm"], eps, off)
        if self.rope and self.rope_inv_freq is not None:
            q = rope_table(q, ctx.positions, self.rope_inv_freq, self.rope_scaling)
            k = rope_table(k, ctx.positions, self.rope_inv_freq, self.rope_scaling)
        elif self.rope:
            q = rope(q, ctx.positions, self.rope_theta, self.rotary_dim)
            k = rope(k, ctx.positions, self.rope_theta, self.rotary_dim)
        return arena, q, k, v

    def _append_kv(self, env: Env, cache, k, v, ctx: StepContext):
        bs = env.kv_block_size
        pos = ctx.positions
        slots = ctx.block_tables[ctx.seq_ids, pos // bs] * bs + pos % bs
        nb, _, hkv, hd = cache["k"].shape
        flat = lambda a: a.reshape(nb * bs, hkv, hd)  # noqa: E731
        return {
            "k": flat(cache["k"]).at[slots].set(k.astype(BF16)).reshape(cache["k"].shape),
            "v": flat(cache["v"]).at[slots].set(v.astype(BF16)).reshape(cache["v"].shape),
        }

    def _out(self, env: Env, p, arena, t: int):
        hq_d = env.config.num_attention_heads * env.config.head_dim
        if self.gated:
            arena = self._apply_gate(env, arena, t)
        arena, out = linear(env.plan, arena, "attn_output", (t, hq_d), p["wo"],
                            workspaces.FP8_ACT_REGIONS, interpret=env.interpret)  # fmt: skip
        if self.o_bias:
            out = out + p["bo"].astype(F32)
        return arena, out

    def _apply_gate(self, env: Env, arena, t: int):
        """`attn_output *= sigmoid(gate)`, the gate read back from `qkv_output` (the second
        half of each head's q projection)."""
        c = env.config
        hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        qkv = get(env.plan, arena, "qkv_output", (t, (2 * hq + 2 * hkv) * hd))
        gate = qkv[:, : 2 * hq * hd].reshape(t, hq, 2 * hd)[..., hd:].reshape(t, hq * hd)
        o = get(env.plan, arena, "attn_output", (t, hq * hd))
        return put(env.plan, arena, "attn_output", o * jax.nn.sigmoid(gate))

    def prefill(self, env: Env, params, arena, cache, ctx: StepContext):
        """Appends the prompts' K/V to the cache; dense causal attention within each packed
        sequence; `o_proj`. Returns `(arena, cache, out)`."""
        c, t = env.config, ctx.num_tokens
        arena, q, k, v = self._qkv(env, params, arena, ctx)
        cache = self._append_kv(env, cache, k, v, ctx)
        # Prefill attention reads what decode reads: bf16 queries and the bf16 cache.
        q, k, v = (x.astype(BF16).astype(F32) for x in (q, k, v))
        g = c.num_attention_heads // c.num_key_value_heads
        kk, vv = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
        scale = 1 / math.sqrt(c.head_dim) if self.scale is None else self.scale
        logits = jnp.einsum("thd,uhd->htu", q, kk) * scale
        if self.softcap is not None:
            logits = self.softcap * jnp.tanh(logits / self.softcap)
        idx, seq = jnp.arange(t, dtype=jnp.int32), ctx.seq_ids
        mask = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])
        if self.window is not None:  # keys within the `window` most recent, the query's own
            pos = ctx.positions
            mask &= pos[:, None] - pos[None, :] < self.window
        logits = jnp.where(mask[None], logits, -jnp.inf)
        if self.sinks:  # an extra column per head: the sink's logit, with a zero value row
            sink = jnp.broadcast_to(
                params["sinks"].astype(F32)[:, None, None], (*logits.shape[:2], 1)
            )
            probs = jax.nn.softmax(jnp.concatenate([logits, sink], -1), axis=-1)[..., :-1]
        else:
            probs = jax.nn.softmax(logits, axis=-1)
        o = jnp.einsum("htu,uhd->thd", probs, vv).reshape(t, -1)
        cache, arena = jax.lax.optimization_barrier((cache, arena))
        arena = put(env.plan, arena, "attn_output", o)
        arena, out = self._out(env, params, arena, t)
        return arena, cache, out

    def decode(self, env: Env, params, arena, cache, ctx: StepContext):
        """Appends the new K/V; split-K decode attention into `attn_output`; `o_proj`."""
        arena, q, k, v = self._qkv(env, params, arena, ctx)
        cache = self._append_kv(env, cache, k, v, ctx)
        arena = splitk_decode_attention_into(
            arena, env.plan, q.astype(BF16), cache["k"], cache["v"], ctx.block_tables,
            ctx.seq_lens, levers=env.levers, target=env.target, interpret=env.interpret,
            sm_scale=self.scale, window_size=self.window, softcap=self.softcap,
            sinks=params["sinks"].astype(F32) if self.sinks else None,
        )  # fmt: skip
        arena, out = self._out(env, params, arena, ctx.num_tokens)
        return arena, cache, out
