"""GQA attention over a paged bf16 or FP8 KV cache (vLLM layout).

Optional per-head q/k RMSNorm (Qwen3) and RoPE (rotate-half; Nemotron-H has none). Prefill
runs the paged prefill Pallas kernel (causal flash attention over the cache, so a chunk of a
long prompt sees the earlier chunks), decode the split-K Pallas kernel (partials in
`splitk_workspace`); both read bf16 queries and the cache, and both outputs are values the
o_proj GEMM reads (XLA cannot give a GEMM an arena region in place: it would copy it out).
Arena regions: `splitk_workspace` (decode), the FP8 activation buffers. In decode with
Pallas kernels, the q/k norms, RoPE and the K/V page write are one kernel
(`pallas_kernels.qk_rope_kv_write`, see `Attention.fused_write_unsupported` for what stays
on the XLA path).

FP8 KV cache (`kv_dtype="fp8"`, vLLM's `kv_cache_dtype="fp8"`): the pages are
`float8_e4m3fn`, with one f32 scale per layer for K and one for V (the checkpoint's
`k_scale` / `v_scale`, else 1.0: `Reader.kv_scales`). A new key is written as
`e4m3(clamp(bf16(k) / k_scale, +-448))` (the clamp is explicit: a float -> e4m3 cast does
not saturate on every backend, XLA:CPU gives NaN past 448), and both kernels read
`k_scale * page` (the scales multiply the logits and the output, not the pages). Half the
bytes per token of the bf16 cache: what `jaxarena budget --kv-dtype fp8` counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ModelConfig, workspaces
from jaxarena.models.blocks.base import Block, Env, StepContext, dense_init
from jaxarena.models.core.arena import BF16, F32, linear, stored
from jaxarena.models.core.kernels import paged_prefill_attention, splitk_decode_attention_value
from jaxarena.models.core.lora import lora_add, lora_tables
from jaxarena.models.core.norms import rms_norm
from jaxarena.models.core.rope import rope, rope_frequencies, rope_table
from pallas_kernels.qk_rope_kv_write import fused_write_unsupported, qk_rope_kv_write

__all__ = ["Attention", "KV_DTYPES", "E4M3_MAX"]

KV_DTYPES = {"bf16": BF16, "fp8": jnp.float8_e4m3fn}
"""The KV cache dtypes by name (the names of `jaxarena budget --kv-dtype`)."""
E4M3_MAX = 448.0
"""The largest finite `float8_e4m3fn` value: quantized keys and values saturate there."""
QKV_SPLITS = 4
"""Split-K partials of decode's QKV projection that the fused write sums (what XLA's GEMM
heuristic picks for Qwen3-8B / Llama-3.1-8B widths at batch 8 and 64 on an H200: 4)."""
QKV_SPLIT_MAX_TOKENS = 64
"""Decode batches up to this many tokens get the split-K projection; larger ones the plain
GEMM (the f32 partials cost 4 x 4 bytes per output value)."""


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
      kv_dtype: the paged cache's dtype, `"bf16"` or `"fp8"` (`float8_e4m3fn` with the
        per-layer scales `k_scale`, `v_scale`; see the module docstring).

    Parameters: `wqkv` (`[hidden, (Hq + 2 Hkv) D]`, with `gated` `[hidden, (2 Hq + 2 Hkv) D]`,
    or a (q, k, v) tuple of linear weights), `wo` (`[Hq D, hidden]`), with `qk_norm` also
    `q_norm` and `k_norm` (`[D]`), with `qkv_bias` `bqkv` (`[(Hq + 2 Hkv) D]`), with `o_bias`
    `bo` (`[hidden]`), with `sinks` `sinks` (`float32[Hq]`), with `kv_dtype="fp8"` `k_scale`
    and `v_scale` (`float32[Hkv]`, one per-tensor scale repeated, or the checkpoint's per-head
    scales).
    Cache: `{"k", "v"}`, each `[num_blocks, kv_block_size, Hkv, D]` in `kv_dtype`.
    """

    kind: ClassVar[str] = "attention"
    input_in_ctx: ClassVar[bool] = True
    paged_kv: ClassVar[bool] = True
    chunked_prefill: ClassVar[bool] = True  # a chunk's queries read the earlier chunks' K/V
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
    kv_dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"Attention.kv_dtype={self.kv_dtype!r} must be one of "
                             f"{sorted(KV_DTYPES)}")  # fmt: skip
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
        if self.kv_dtype == "fp8":
            p["k_scale"] = p["v_scale"] = jnp.ones((hkv,), F32)
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
            parts = [reader.vector(f"{prefix}.{n}_proj.bias", heads * hd) for n, heads in sizes]
            if isinstance(parts[0], jax.ShapeDtypeStruct):  # the shapes-only reader (step-report)
                p["bqkv"] = jax.ShapeDtypeStruct((sum(b.shape[0] for b in parts),), parts[0].dtype)
            else:
                p["bqkv"] = np.concatenate(parts)
        if self.o_bias:
            p["bo"] = reader.vector(f"{prefix}.o_proj.bias", config.hidden_size)
        if self.sinks:
            p["sinks"] = reader.vector(f"{prefix}.sinks", config.num_attention_heads)
        # Read (and so accepted) either way; only an FP8 cache uses them.
        scales = reader.kv_scales(prefix, config.num_key_value_heads)
        if self.kv_dtype == "fp8":
            p["k_scale"], p["v_scale"] = scales
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
        """A zeroed paged KV cache, `k` and `v` `[num_blocks, kv_block_size, Hkv, D]` in
        `kv_dtype` (`kv_block_size * Hkv * D` bytes per page each with FP8, twice that bf16)."""
        shape = (num_blocks, kv_block_size, config.num_key_value_heads, config.head_dim)
        dtype = KV_DTYPES[self.kv_dtype]
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}

    def _project(self, env: Env, p, arena, ctx: StepContext):
        """QKV projection (an XLA value, rounded as `qkv_output` would store it, the bias and
        the LoRA deltas added); returns `(arena, qkv float32[T, (qw + 2 Hkv) D], qw)`, `qw` the
        q projection's heads (twice `Hq` when `gated`)."""
        c, t = env.config, ctx.num_tokens
        hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        arena, qkv = linear(env.plan, arena, ctx.x, (t, c.hidden_size), p["wqkv"],
                            workspaces.FP8_ACT_REGIONS, **env.linear_kw)  # fmt: skip
        if self.qkv_bias:
            qkv = qkv + p["bqkv"].astype(F32)
        qkv = stored(qkv)  # as `qkv_output` would hold it; a GEMM output stays an XLA value
        qw = 2 * hq if self.gated else hq
        tabs = lora_tables(p, ctx.lora_slots)
        if tabs is not None:  # q, k, v deltas on their column ranges of the fused output
            cols = [tabs.get("q_proj", qw * hd), tabs.get("k_proj", hkv * hd),
                    tabs.get("v_proj", hkv * hd)]  # fmt: skip
            arena, (qkv,) = lora_add(env.plan, arena, (qkv,), ctx.x, [cols], ctx.lora_slots,
                                     interpret=env.interpret)  # fmt: skip
        return arena, qkv, qw

    def _qkv(self, env: Env, p, arena, ctx: StepContext):
        """QKV projection (`_project`); returns `(arena, q, k, v, gate)` with the q/k norms
        and RoPE."""
        c, t = env.config, ctx.num_tokens
        hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        arena, qkv, qw = self._project(env, p, arena, ctx)
        qh = qkv[:, : qw * hd].reshape(t, hq, -1)
        q = qh[..., :hd]
        # Gated attention: each head's q projection is `[q_h | gate_h]`.
        gate = qh[..., hd:].reshape(t, hq * hd) if self.gated else None
        k = qkv[:, qw * hd : (qw + hkv) * hd].reshape(t, hkv, hd)
        v = qkv[:, (qw + hkv) * hd :].reshape(t, hkv, hd)
        if self.qk_norm:
            q, k = self._qk_norm(p, qkv, q, k, qw)
        if self.rope and self.rope_inv_freq is not None:
            q = rope_table(q, ctx.positions, self.rope_inv_freq, self.rope_scaling)
            k = rope_table(k, ctx.positions, self.rope_inv_freq, self.rope_scaling)
        elif self.rope:
            q = rope(q, ctx.positions, self.rope_theta, self.rotary_dim)
            k = rope(k, ctx.positions, self.rope_theta, self.rotary_dim)
        return arena, q, k, v, gate

    def _qk_norm(self, p, qkv, q, k, qw: int):
        """The per-head RMSNorms of q and k (`rms_norm`), in two passes: the sums of squares
        of every q and k head come from one small reduction `[T, qw + Hkv, 1]` (`qw`: the q
        projection's heads, a gated q's gate heads included, unused) that the barrier keeps
        apart; the mean, `rsqrt`, the multiply, RoPE and the bf16 cast then fuse into the pass
        that writes the kernel's q (and into the cache scatter for k). The same operations in
        the same order as `inv_rms` (jnp.mean's sum, then its division): the same numbers.
        Fused, XLA makes one normalisation fusion per q and k whose float32 `[T, heads, D]`
        output RoPE's concatenate then reads back: in prefill 64 MiB of temp for q at 8192
        tokens (16 heads of 128), 32 MiB for k; in decode one launch per layer more (Qwen3-8B
        widths, batch 8: 17 -> 16 per layer). With the barrier on `1 / rms` instead, XLA
        kept the division or the `rsqrt` in a launch of its own."""
        eps, off = self.rms_eps, self.norm_offset
        t, hkv, hd = k.shape
        x = qkv[:, : (qw + hkv) * hd].reshape(t, qw + hkv, hd)
        sq = jax.lax.optimization_barrier(jnp.sum(x * x, -1, keepdims=True))
        r = jax.lax.rsqrt(sq / hd + eps)
        rq = r[:, : qw : 2 if self.gated else 1]
        return (rms_norm(q, p["q_norm"], eps, off, scale=rq),
                rms_norm(k, p["k_norm"], eps, off, scale=r[:, qw:]))  # fmt: skip

    def _kv_scales(self, params) -> dict[str, Any]:
        """The kernels' `k_scale` / `v_scale` keywords: the layer's scales with an FP8 cache,
        none with bf16."""
        if self.kv_dtype != "fp8":
            return {}
        return {"k_scale": params["k_scale"], "v_scale": params["v_scale"]}

    def _stored_kv(self, x, scale):
        """New keys or values `[T, Hkv, D]` as the cache stores them: bf16, or e4m3 of
        `bf16(x) / scale` (per KV head) clamped to +-448 (vLLM's write: the activations are
        bf16 before they are quantized)."""
        x = x.astype(BF16)
        if self.kv_dtype != "fp8":
            return x
        y = x.astype(F32) / scale.astype(F32)[:, None]
        return jnp.clip(y, -E4M3_MAX, E4M3_MAX).astype(KV_DTYPES["fp8"])

    def _append_kv(self, env: Env, cache, k, v, ctx: StepContext, params):
        scales = self._kv_scales(params)
        k = self._stored_kv(k, scales.get("k_scale"))
        v = self._stored_kv(v, scales.get("v_scale"))
        bs = env.kv_block_size
        pos = ctx.positions
        slots = ctx.block_tables[ctx.seq_ids, pos // bs] * bs + pos % bs
        nb, _, hkv, hd = cache["k"].shape
        flat = lambda a: a.reshape(nb * bs, hkv, hd)  # noqa: E731
        return {
            "k": flat(cache["k"]).at[slots].set(k).reshape(cache["k"].shape),
            "v": flat(cache["v"]).at[slots].set(v).reshape(cache["v"].shape),
        }

    def _out(self, env: Env, p, arena, t: int, o, gate=None, lora_slots=None):
        """`o_proj` of the attention output `o` (bf16 `[T, Hq, D]`, the kernels' value); with
        `gated`, times `sigmoid(gate)` first, rounded as `attn_output` would store it; plus
        the LoRA delta of tokens with an adapter."""
        hq_d = env.config.num_attention_heads * env.config.head_dim
        src = o.reshape(t, hq_d).astype(F32)
        if gate is not None:
            src = stored(src * jax.nn.sigmoid(gate))
        arena, out = linear(env.plan, arena, src, (t, hq_d), p["wo"],
                            workspaces.FP8_ACT_REGIONS, **env.linear_kw)  # fmt: skip
        if self.o_bias:
            out = out + p["bo"].astype(F32)
        tabs = lora_tables(p, lora_slots)
        if tabs is not None and "o_proj" in tabs:
            # The base model's rows keep the unrounded output the step without LoRA gives.
            arena, (out,) = lora_add(env.plan, arena, (out,), src, [[tabs["o_proj"]]],
                                     lora_slots, rounded=False,
                                     interpret=env.interpret)  # fmt: skip
        return arena, out

    def prefill(self, env: Env, params, arena, cache, ctx: StepContext):
        """Appends the chunk's K/V to the cache; causal attention of each packed sequence's
        queries over its cached context (earlier chunks) plus the chunk itself, by the paged
        prefill Pallas kernel, its output a value that `o_proj` reads; `o_proj`. Returns
        `(arena, cache, out)`.

        The output is not written into `attn_output`: the GEMM cannot read an arena region
        in place (XLA copies the slice out first, a launch and `[T, Hq D]` bf16 of temp), and
        the kernel's own output buffer costs the same temp without the copy."""
        arena, q, k, v, gate = self._qkv(env, params, arena, ctx)
        cache = self._append_kv(env, cache, k, v, ctx, params)
        # Plain prefill: each sequence's context is its own queries.
        lens = ctx.cu_seqlens[1:] - ctx.cu_seqlens[:-1] if ctx.seq_lens is None else ctx.seq_lens
        # Prefill attention reads what decode reads: bf16 queries and the cache.
        o = paged_prefill_attention(
            q.astype(BF16), cache["k"], cache["v"], ctx.block_tables, ctx.cu_seqlens, lens,
            interpret=env.interpret, sm_scale=self.scale, window_size=self.window,
            softcap=self.softcap, sinks=params["sinks"].astype(F32) if self.sinks else None,
            **self._kv_scales(params),
            kernels=env.kernels,
        )  # fmt: skip
        arena, out = self._out(env, params, arena, ctx.num_tokens, o, gate, ctx.lora_slots)
        return arena, cache, out

    def rope_frequencies(self, head_dim: int) -> tuple[Any, float] | None:
        """`(float32[R / 2] inverse frequencies, cos/sin scale)` of this layer's RoPE (the
        table `rope` / `rope_table` use), None without RoPE."""
        if not self.rope:
            return None
        if self.rope_inv_freq is not None:
            return jnp.asarray(self.rope_inv_freq, F32), self.rope_scaling
        d = self.rotary_dim if self.rotary_dim and self.rotary_dim < head_dim else head_dim
        return rope_frequencies(self.rope_theta, d), 1.0

    def fused_write_unsupported(self, env: Env) -> str | None:
        """Why decode keeps the XLA q/k norm + RoPE + K/V scatter (None: one
        `pallas_kernels.qk_rope_kv_write` launch does it). The kernel serves decode with
        `kernels="pallas"`, with or without q/k norms and RoPE (theta, a frequency table,
        partial rotary), bf16 or FP8 caches. Not served:

        - `kernels="xla"` (the CPU backend's plain path) and prefill (its T rows are one
          normalisation pass and one scatter each already; the launches issue 39 counts are
          decode's);
        - `gated` (the q projection interleaves the gate heads: `[q_h | gate_h]`);
        - a head dim that is not a power of two, or a rotated width whose half is not
          (Triton tiles; `pallas_kernels.qk_rope_kv_write.fused_write_unsupported`)."""
        if env.kernels != "pallas":
            return f"kernels={env.kernels!r}"
        if self.gated:
            return "gated attention (q interleaved with the gate heads)"
        hd = env.config.head_dim
        freqs = self.rope_frequencies(hd)
        rotary = 0 if freqs is None else 2 * int(freqs[0].shape[0])
        return fused_write_unsupported(hd, rotary, KV_DTYPES[self.kv_dtype])

    def _qkv_splits(self, params, ctx: StepContext) -> int:
        """Split-K partials the fused decode write sums (1: none, the projection from
        `linear`): `QKV_SPLITS` for a plain bf16 `wqkv` without a bias or LoRA at up to
        `QKV_SPLIT_MAX_TOKENS` tokens whose hidden size splits into parts of >= 512."""
        w = params["wqkv"]
        if (self.qkv_bias or lora_tables(params, ctx.lora_slots) is not None
                or isinstance(w, tuple | list) or not hasattr(w, "dtype") or w.dtype != BF16
                or w.ndim != 2 or ctx.num_tokens > QKV_SPLIT_MAX_TOKENS):  # fmt: skip
            return 1
        h = w.shape[0]
        return QKV_SPLITS if h % QKV_SPLITS == 0 and h // QKV_SPLITS >= 512 else 1

    def _fused_decode_qkv(self, env: Env, params, arena, cache, ctx: StepContext):
        """Decode's projection, then `qk_rope_kv_write`: the normed, rotated bf16 q and the
        caches with the new K/V rows, in one launch (`fused_write_unsupported` is None). The
        same operations in the same order as `_qkv` + `_append_kv` (module docstring of the
        kernel: bit-equal up to the sum-of-squares order). Returns `(arena, q, cache)`."""
        c = env.config
        splits = self._qkv_splits(params, ctx)
        if splits > 1:
            # The projection as `splits` float32 partials over the hidden axis, their sum the
            # kernel's: XLA splits this GEMM (split-K) at decode's few rows anyway, and a
            # custom call cannot absorb the split-K reduction as the XLA passes it replaces
            # did (measured: a launch of its own, 14 per Qwen3-8B layer instead of 13).
            x = ctx.x.astype(BF16)  # bf16 values already (`stored`)
            t, h = x.shape
            w = params["wqkv"]
            qkv = jnp.einsum("tsk,skn->stn", x.reshape(t, splits, h // splits),
                             w.reshape(splits, h // splits, w.shape[-1]),
                             preferred_element_type=F32)  # fmt: skip
        else:
            arena, qkv, _ = self._project(env, params, arena, ctx)
            qkv = qkv.astype(BF16)  # exact: `stored` values
        freqs = self.rope_frequencies(c.head_dim)
        norms = {}
        if self.qk_norm:
            norms = dict(q_norm=params["q_norm"], k_norm=params["k_norm"], eps=self.rms_eps,
                         norm_offset=self.norm_offset)  # fmt: skip
        pos = ctx.positions.astype(jnp.int32)
        tables = ctx.block_tables.astype(jnp.int32)
        q, k, v = qk_rope_kv_write(
            qkv, cache["k"], cache["v"], pos, tables,
            num_q_heads=c.num_attention_heads, inv_freq=None if freqs is None else freqs[0],
            rope_scaling=1.0 if freqs is None else freqs[1], interpret=env.interpret,
            **norms, **self._kv_scales(params),
        )  # fmt: skip
        return arena, q, {"k": k, "v": v}

    def decode(self, env: Env, params, arena, cache, ctx: StepContext):
        """Appends the new K/V; split-K decode attention (partials in `splitk_workspace`,
        the output a value, as in prefill: read from `attn_output`, XLA copied it out for the
        GEMM, a launch per layer, and the barrier tying that read to the arena kept the
        o_proj's split-K reduction out of the next norm's fusion, another); `o_proj`.

        With Pallas kernels the q/k norms, RoPE and the K/V write are one launch
        (`_fused_decode_qkv`, `pallas_kernels.qk_rope_kv_write`) where
        `fused_write_unsupported` allows: 13 launches per Qwen3-8B / Llama-3.1-8B layer at
        batch 8 and 64 (H200, deviceless; 16 / 16 and 15 before)."""
        if self.fused_write_unsupported(env) is None:
            gate = None  # gated attention is not fused
            arena, q, cache = self._fused_decode_qkv(env, params, arena, cache, ctx)
        else:
            arena, q, k, v, gate = self._qkv(env, params, arena, ctx)
            cache = self._append_kv(env, cache, k, v, ctx, params)
        arena, o = splitk_decode_attention_value(
            arena, env.plan, q.astype(BF16), cache["k"], cache["v"], ctx.block_tables,
            ctx.seq_lens, levers=env.levers, target=env.target, interpret=env.interpret,
            sm_scale=self.scale, window_size=self.window, softcap=self.softcap,
            sinks=params["sinks"].astype(F32) if self.sinks else None, kernels=env.kernels,
            **self._kv_scales(params),
        )  # fmt: skip
        arena, out = self._out(env, params, arena, ctx.num_tokens, o, gate, ctx.lora_slots)
        return arena, cache, out
