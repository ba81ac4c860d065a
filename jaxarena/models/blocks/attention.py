"""GQA attention over a paged bf16 KV cache (vLLM layout).

Optional per-head q/k RMSNorm (Qwen3) and RoPE (rotate-half; Nemotron-H has none). Prefill
runs the paged prefill Pallas kernel (causal flash attention over the cache, so a chunk of a
long prompt sees the earlier chunks; output in `attn_output`), decode the split-K Pallas
kernel (partials in `splitk_workspace`, output in `attn_output`); both read bf16 queries and
the bf16 cache. Arena regions: `qkv_output`, `attn_output`, the FP8 activation buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxarena import ModelConfig, workspaces
from jaxarena.models.blocks.base import Block, Env, StepContext, dense_init
from jaxarena.models.core.arena import BF16, F32, linear, stored
from jaxarena.models.core.norms import rms_norm
from jaxarena.models.core.rope import rope
from pallas_kernels import paged_prefill_attention_into, splitk_decode_attention_into

__all__ = ["Attention"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attention(Block):
    """GQA attention with a paged KV cache (see the module docstring).

    Attributes:
      rope: apply rotary embeddings (rotate-half form) with `rope_theta`.
      qk_norm: RMS-normalize each q and k head before RoPE (Qwen3).
      rms_eps: epsilon of the q/k norms.

    Parameters: `wqkv` (`[hidden, (Hq + 2 Hkv) D]`, or a (q, k, v) tuple of linear weights),
    `wo` (`[Hq D, hidden]`), with `qk_norm` also `q_norm` and `k_norm` (`[D]`).
    Cache: `{"k", "v"}`, each `bfloat16[num_blocks, kv_block_size, Hkv, D]`.
    """

    kind: ClassVar[str] = "attention"
    input_in_ctx: ClassVar[bool] = True
    rope: bool = True
    rope_theta: float = 10000.0
    qk_norm: bool = False
    rms_eps: float = 1e-5

    def init_params(self, config: ModelConfig, keys: Iterator[jax.Array]) -> dict[str, Any]:
        """Random `wqkv` and `wo` (unit q/k norms with `qk_norm`)."""
        h, hq, hkv, hd = (config.hidden_size, config.num_attention_heads,
                          config.num_key_value_heads, config.head_dim)  # fmt: skip
        p = {"wqkv": dense_init(keys, h, (hq + 2 * hkv) * hd), "wo": dense_init(keys, hq * hd, h)}
        if self.qk_norm:
            p["q_norm"] = p["k_norm"] = jnp.ones((hd,), F32)
        return p

    def read_params(self, reader: Any, config: ModelConfig, prefix: str,
                    norm: str) -> dict[str, Any]:  # fmt: skip
        """`{prefix}.{q,k,v,o}_proj` (and `{prefix}.{q,k}_norm` with `qk_norm`)."""
        hd = config.head_dim
        p = {
            "norm": reader.vector(norm, config.hidden_size),
            "wqkv": reader.qkv(prefix, config),
            "wo": reader.linear(
                f"{prefix}.o_proj", config.hidden_size, config.num_attention_heads * hd
            ),  # fmt: skip
        }
        if self.qk_norm:
            p["q_norm"] = reader.vector(f"{prefix}.q_norm.weight", hd)
            p["k_norm"] = reader.vector(f"{prefix}.k_norm.weight", hd)
        return p

    def init_cache(self, config: ModelConfig, *, num_blocks: int, kv_block_size: int,
                   rows: int) -> dict[str, jax.Array]:  # fmt: skip
        """A zeroed paged KV cache, `k` and `v` `bfloat16[num_blocks, kv_block_size, Hkv, D]`."""
        shape = (num_blocks, kv_block_size, config.num_key_value_heads, config.head_dim)
        return {"k": jnp.zeros(shape, BF16), "v": jnp.zeros(shape, BF16)}

    def _qkv(self, env: Env, p, arena, ctx: StepContext):
        """QKV projection into `qkv_output`; returns (arena, q, k, v) with q/k norm and RoPE."""
        c, t = env.config, ctx.num_tokens
        hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        arena, qkv = linear(env.plan, arena, ctx.x, (t, c.hidden_size), p["wqkv"],
                            workspaces.FP8_ACT_REGIONS, interpret=env.interpret)  # fmt: skip
        qkv = stored(qkv)  # as `qkv_output` would hold it; a GEMM output stays an XLA value
        q = qkv[:, : hq * hd].reshape(t, hq, hd)
        k = qkv[:, hq * hd : (hq + hkv) * hd].reshape(t, hkv, hd)
        v = qkv[:, (hq + hkv) * hd :].reshape(t, hkv, hd)
        if self.qk_norm:
            q, k = rms_norm(q, p["q_norm"], self.rms_eps), rms_norm(k, p["k_norm"], self.rms_eps)
        if self.rope:
            q = rope(q, ctx.positions, self.rope_theta)
            k = rope(k, ctx.positions, self.rope_theta)
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
        return linear(env.plan, arena, "attn_output", (t, hq_d), p["wo"],
                      workspaces.FP8_ACT_REGIONS, interpret=env.interpret)  # fmt: skip

    def prefill(self, env: Env, params, arena, cache, ctx: StepContext):
        """Appends the chunk's K/V to the cache; causal attention of each packed sequence's
        queries over its cached context (earlier chunks) plus the chunk itself, by the paged
        prefill Pallas kernel written in place into `attn_output`; `o_proj`. Returns
        `(arena, cache, out)`."""
        arena, q, k, v = self._qkv(env, params, arena, ctx)
        cache = self._append_kv(env, cache, k, v, ctx)
        # Plain prefill: each sequence's context is its own queries.
        lens = ctx.cu_seqlens[1:] - ctx.cu_seqlens[:-1] if ctx.seq_lens is None else ctx.seq_lens
        # Prefill attention reads what decode reads: bf16 queries and the bf16 cache.
        arena = paged_prefill_attention_into(
            arena, env.plan, q.astype(BF16), cache["k"], cache["v"], ctx.block_tables,
            ctx.cu_seqlens, lens, interpret=env.interpret,
        )  # fmt: skip
        arena, out = self._out(env, params, arena, ctx.num_tokens)
        return arena, cache, out

    def decode(self, env: Env, params, arena, cache, ctx: StepContext):
        """Appends the new K/V; split-K decode attention into `attn_output`; `o_proj`."""
        arena, q, k, v = self._qkv(env, params, arena, ctx)
        cache = self._append_kv(env, cache, k, v, ctx)
        arena = splitk_decode_attention_into(
            arena, env.plan, q.astype(BF16), cache["k"], cache["v"], ctx.block_tables,
            ctx.seq_lens, levers=env.levers, target=env.target, interpret=env.interpret,
        )  # fmt: skip
        arena, out = self._out(env, params, arena, ctx.num_tokens)
        return arena, cache, out
