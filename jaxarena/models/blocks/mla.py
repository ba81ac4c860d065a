"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) over a paged latent cache.

Per token: the query (`q_proj`, or `q_a_proj -> q_a_layernorm -> q_b_proj` with a q LoRA) is
`H` heads of `[nope | rope]`; `kv_a_proj_with_mqa` gives the latent `c` (`kv_lora_rank`,
normed by `kv_a_layernorm`) and one shared RoPE key (`qk_rope_head_dim`). The cache holds only
`[c | k_rope]` per token (`[num_blocks, kv_block_size, 1, kv_lora_rank + qk_rope_head_dim]`,
what the memory budget counts). `kv_b_proj` maps the latent to each head's `k_nope` and `v`.

Decode ABSORBS `kv_b_proj`: the query becomes `[q_nope W_uk^T | q_rope]` per head (width
`kv_lora_rank + rope`), attention runs over the latent cache itself (split-K's latent path,
the values being the cache's first `kv_lora_rank` columns) and the latent output is mapped
through `W_uv` before `o_proj`. Per step that reads `L * (kv_lora + rope)` cache values per
sequence instead of expanding `L * H * (nope + v)`.

Prefill absorbs it as well: the absorbed queries `[q_nope W_uk^T | q_rope]` of the chunk
run through the paged prefill kernel's latent path (`v_cache=None`, `v_head_dim=kv_lora`)
over the latent cache the chunk was appended to, so a chunk of a long prompt reads the
earlier chunks' latents (`chunked_prefill`) and nothing grows as `T^2` (the dense `[H, T, T]`
logits of the former expanded einsum prefill: 6.4 GiB of temp at 2048 tokens on DeepSeek-V3's
widths). The FLOP trade: per query-key pair and head the absorbed form multiplies
`kv_lora + rope` (logits) plus `kv_lora` (values) = 1088 for DeepSeek-V3, against
`nope + rope + v` = 320 for attention over expanded keys and values (3.4x); the projections
through `kv_b_proj` cost the same `T * H * kv_lora * (nope + v)` in both (the queries and the
outputs instead of the keys and values). The expanded form would need the `[L, H, nope + v]`
keys and values of the whole context per chunk (or an expanded cache). vLLM's MLA backends
expand for prefill (compute-bound) and absorb for decode; this block absorbs in both for one
path over the latent cache, memory bounded by the chunk and chunked prefill.
The latent output `[T, H, kv_lora]` is written in place into `attn_output`, which the sizing
makes `T * H * (kv_lora + rope)` bf16 wide for MLA (it holds `max_batch_tokens` rows); `W_uv`
and `o_proj` read it from there. Measured with a deviceless H200 compile of DeepSeek-V3's
widths (`benchmarks/step_costs.py`, 4 layers: 3 with a dense MLP, 1 with a routed MoE): prefill temp
6441 -> 808 MiB at 2048 tokens and 66864 -> 3233 MiB at 8192 (the absorbed query
`[T, H, kv_lora + rope]` and its GEMM output most of it), launches 138 -> 136 and 162 -> 142.
Decode (35 launches and 3.0 MB temp per layer at 8 sequences) is unchanged.

Softmax scale: `(nope + rope)^-1/2`, times YaRN's `mscale(factor, mscale_all_dim)^2` when
the config has YaRN with `mscale_all_dim` (transformers' `yarn_apply_mscale`); cos/sin carry
YaRN's `attention_factor` (see `jaxarena.models.core.mla_rope`).

Under the step rule (jaxarena/models/README.md, "what goes through the arena") the arena holds
what the attention kernels write (the latent output `[T, H * kv_lora]` in `attn_output`,
split-K's partials in `splitk_workspace`) and the FP8 activation buffers. The rest are XLA values
rounded to bf16 as their regions would store them: the normed q latent (`ssm_ba`), the
`[q | c_raw | k_rope_raw]` rows (`qkv_output`), the absorbed query (`ssm_deinterleaved`) and
the `[T, H * v]` rows into `o_proj` (`attn_output`).

Block-FP8 checkpoints (DeepSeek-V3 and Kimi-K2 as released): `q_a` / `q_b` (or `q_proj`),
`kv_a` and `o_proj` stay e4m3 with their 128 x 128 block scales and multiply 1 x 128
quantized activations (`core.arena.linear`, the `fp8_act` buffers, as a dense FP8 model's
projections); `kv_b` is dequantized to bf16 once at load (`_bf16_weight` says why).
Measured (`step_report`, deviceless H200, DeepSeek-V3 widths with 4 layers, the 3 dense first;
prefill 2048 tokens, decode 8 sequences): FP8 prefill 209 launches / 982 MB temp, decode
239 / 2.2 MB (the FP8 products through the FP8 grouped GEMM kernel with one group,
`core.arena.fp8_block_matmul`; with the former float32 `[T, N, K / 128]` partial products
17.4 GB and 67 MB); the same model with bf16 weights 138 / 6.75 GB and 124 / 5.2 MB.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxarena import ModelConfig, workspaces
from jaxarena.models.blocks.base import Block, Env, StepContext, dense_init
from jaxarena.models.core.arena import (
    BF16,
    F32,
    dequant_weight,
    fp8_regions,
    get,
    is_fp8,
    linear,
    stored,
)
from jaxarena.models.core.kernels import (
    paged_prefill_attention_into,
    splitk_decode_attention_value,
)
from jaxarena.models.core.mla_rope import Yarn, inverse_frequencies, mla_rope
from jaxarena.models.core.norms import rms_norm
from pallas_kernels.splitk_decode_attention import splitk_num_splits

__all__ = ["MLA", "mla_dims"]


def mla_dims(config: ModelConfig) -> tuple[int, int, int, int, int, int]:
    """`(H, nope, rope, v, kv_lora, q_lora)` of an MLA config (`head_dim = nope + rope`)."""
    rope = config.qk_rope_head_dim
    nope = config.head_dim - rope
    v = config.v_head_dim or nope
    return config.num_attention_heads, nope, rope, v, config.kv_lora_rank, config.q_lora_rank


def _bf16_weight(w: Any) -> Any:
    """A float `kv_b_proj` as read; a block-FP8 one as `bfloat16[in, out]`, dequantized once
    (each 128 x 128 block's e4m3 values times its `scale_inv`, rounded to bf16), or its
    `ShapeDtypeStruct` for a shapes-only reader (`jaxarena.step_report`).

    Why not FP8 like the other projections: `kv_b` is no `x @ W` of block-quantized
    activations. Decode contracts the query with `W_uk` over each head's `nope` rows and the
    latent output with `W_uv` over the latent (absorption), prefill expands the latent rows
    through it, all as einsums against the whole weight; no FP8 kernel takes those forms, so
    FP8 storage would mean dequantizing it in every step of every layer (a float32 temporary
    of 4 * kv_lora * H * (nope + v) bytes, 67 MB per DeepSeek-V3 layer, plus its launches).
    bf16 keeps `_mul`'s products exact for bf16 operands, as for a bf16 checkpoint, at one
    more byte per element than FP8: 16.8 MB per DeepSeek-V3 layer, 1.0 GB over its 61
    layers (what `jaxarena._sizing.weights` counts). The cost is one bf16 rounding of each
    weight (relative <= 2^-9); DeepSeek's own inference code also multiplies a dequantized
    bf16 `wkv_b` in its absorbed attention."""
    if not is_fp8(w):
        return w
    q, s = w["w"], w["scale_inv"]
    n, k = q.shape
    if isinstance(q, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((k, n), BF16)
    blk = workspaces.FP8_BLOCK
    full = np.repeat(np.repeat(np.asarray(s, np.float32), blk, 0), blk, 1)[:n, :k]
    deq = np.asarray(q).astype(np.float32) * full
    return np.ascontiguousarray(deq.T.astype(ml_dtypes.bfloat16))


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLA(Block):
    """Multi-head latent attention (see the module docstring); dimensions from the config
    (`head_dim = qk_nope + qk_rope`, `qk_rope_head_dim`, `v_head_dim`, `kv_lora_rank`,
    `q_lora_rank`, 0 for a plain `q_proj`).

    Attributes:
      rope_theta: the RoPE base.
      rope_interleave: RoPE pairs are adjacent dimensions (DeepSeek's checkpoints; transformers'
        `rope_interleave`, always so for `deepseek_v2`), else the rotate-half halves.
      yarn: YaRN scaling, or None.
      rms_eps: epsilon of `q_a_layernorm` and `kv_a_layernorm`.

    Parameters: `wq` (`[hidden, H (nope + rope)]`) or `wq_a` (`[hidden, q_lora]`), `q_a_norm`,
    `wq_b` (`[q_lora, H (nope + rope)]`); `wkv_a` (`[hidden, kv_lora + rope]`), `kv_a_norm`
    (`[kv_lora]`), `wkv_b` (`[kv_lora, H (nope + v)]`), `wo` (`[H v, hidden]`).
    Cache: `{"latent": bfloat16[num_blocks, kv_block_size, 1, kv_lora + rope]}`.
    """

    kind: ClassVar[str] = "mla"
    input_in_ctx: ClassVar[bool] = True
    chunked_prefill: ClassVar[bool] = True  # a chunk's queries read the earlier chunks' latents
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    yarn: Yarn | None = None
    rms_eps: float = 1e-6

    def sm_scale(self, config: ModelConfig) -> float:
        """The softmax scale (see the module docstring)."""
        s = 1.0 / math.sqrt(config.head_dim)
        return s * (self.yarn.softmax_factor() if self.yarn is not None else 1.0)

    def _rope(self, x, positions, rope: int):
        inv = inverse_frequencies(rope, self.rope_theta, self.yarn)
        scale = self.yarn.cos_sin_factor() if self.yarn is not None else 1.0
        return mla_rope(x, positions, inv, interleave=self.rope_interleave, scale=scale)

    def init_params(self, config: ModelConfig, keys: Iterator[jax.Array]) -> dict[str, Any]:
        """Random projections (unit norms)."""
        hd, nope, rope, v, kv_lora, q_lora = mla_dims(config)
        h = config.hidden_size
        p: dict[str, Any] = {}
        if q_lora:
            p["wq_a"] = dense_init(keys, h, q_lora)
            p["q_a_norm"] = jnp.ones((q_lora,), F32)
            p["wq_b"] = dense_init(keys, q_lora, hd * (nope + rope))
        else:
            p["wq"] = dense_init(keys, h, hd * (nope + rope))
        p["wkv_a"] = dense_init(keys, h, kv_lora + rope)
        p["kv_a_norm"] = jnp.ones((kv_lora,), F32)
        p["wkv_b"] = dense_init(keys, kv_lora, hd * (nope + v))
        p["wo"] = dense_init(keys, hd * v, h)
        return p

    def read_params(self, reader: Any, config: ModelConfig, prefix: str,
                    norm: str) -> dict[str, Any]:  # fmt: skip
        """`{prefix}.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}`, `kv_a_proj_with_mqa`,
        `kv_a_layernorm`, `kv_b_proj`, `o_proj`. Block-FP8 projections stay FP8 (`linear`
        multiplies them with quantized activations) except `kv_b_proj`, dequantized to bf16
        here (`_bf16_weight`)."""
        H, nope, rope, v, kv_lora, q_lora = mla_dims(config)
        h = config.hidden_size
        p = {"norm": reader.vector(norm, h)}
        if q_lora:
            p["wq_a"] = reader.linear(f"{prefix}.q_a_proj", q_lora, h)
            p["q_a_norm"] = reader.vector(f"{prefix}.q_a_layernorm.weight", q_lora)
            p["wq_b"] = reader.linear(f"{prefix}.q_b_proj", H * (nope + rope), q_lora)
        else:
            p["wq"] = reader.linear(f"{prefix}.q_proj", H * (nope + rope), h)
        p["wkv_a"] = reader.linear(f"{prefix}.kv_a_proj_with_mqa", kv_lora + rope, h)
        p["kv_a_norm"] = reader.vector(f"{prefix}.kv_a_layernorm.weight", kv_lora)
        p["wkv_b"] = _bf16_weight(reader.linear(f"{prefix}.kv_b_proj", H * (nope + v), kv_lora))
        p["wo"] = reader.linear(f"{prefix}.o_proj", h, H * v)
        return p

    def init_cache(self, config: ModelConfig, *, num_blocks: int, kv_block_size: int,
                   rows: int) -> dict[str, jax.Array]:  # fmt: skip
        """A zeroed paged latent cache `bfloat16[num_blocks, kv_block_size, 1, kv_lora + rope]`."""
        _, _, rope, _, kv_lora, _ = mla_dims(config)
        return {"latent": jnp.zeros((num_blocks, kv_block_size, 1, kv_lora + rope), BF16)}

    # -- shared pieces -----------------------------------------------------------------------------

    def _project(self, env: Env, p, arena, ctx: StepContext):
        """q and the raw latent of the pre-normed rows `ctx.x`, rounded as `qkv_output` stores
        them; returns `(arena, q [T, H, nope + rope] (RoPE applied), latent
        [T, kv_lora + rope] (normed c, RoPE'd key))`."""
        c, t, plan, x = env.config, ctx.num_tokens, env.plan, ctx.x
        H, nope, rope, v, kv_lora, q_lora = mla_dims(c)
        h, regions = c.hidden_size, workspaces.FP8_ACT_REGIONS
        if q_lora:
            arena, qa = linear(plan, arena, x, (t, h), p["wq_a"], regions, **env.linear_kw)
            qa = stored(rms_norm(qa, p["q_a_norm"], self.rms_eps))  # as `ssm_ba` holds it
            # The q latent (q_lora <= hidden in every release) fits the `fp8_act` buffers,
            # sized for the widest projection input.
            q_regions = fp8_regions(plan, t, q_lora, regions)
            arena, q = linear(plan, arena, qa, (t, q_lora), p["wq_b"], q_regions, **env.linear_kw)
        else:
            arena, q = linear(plan, arena, x, (t, h), p["wq"], regions, **env.linear_kw)
        arena, kv = linear(plan, arena, x, (t, h), p["wkv_a"], regions, **env.linear_kw)
        q, kv = stored(q), stored(kv)
        q = q.reshape(t, H, nope + rope)
        q = jnp.concatenate([q[..., :nope], self._rope(q[..., nope:], ctx.positions, rope)], -1)
        lat = rms_norm(kv[:, :kv_lora], p["kv_a_norm"], self.rms_eps)
        k_rope = self._rope(kv[:, None, kv_lora:], ctx.positions, rope)[:, 0]
        return arena, q, jnp.concatenate([lat, k_rope], -1)

    def _append(self, env: Env, cache, latent, ctx: StepContext):
        bs = env.kv_block_size
        pos = ctx.positions
        slots = ctx.block_tables[ctx.seq_ids, pos // bs] * bs + pos % bs
        full = cache["latent"]
        flat = full.reshape(-1, full.shape[-1])
        return {"latent": flat.at[slots].set(latent.astype(BF16)).reshape(full.shape)}

    def _kv_b(self, p, config: ModelConfig):
        """`kv_b_proj` as `[kv_lora, H, nope + v]` (each head's `W_uk | W_uv`) in the stored
        float dtype (an FP8 checkpoint's is bf16 from `read_params`; an FP8 dict given
        otherwise is dequantized to float32 here, per step). It is used whole, never sliced,
        and a bf16 copy stays bf16: a sliced or float32 copy would be a temporary of up to
        4 * kv_lora * H * (nope + v) bytes per layer (67 MB for DeepSeek-V3)."""
        H, nope, _, v, kv_lora, _ = mla_dims(config)
        w = p["wkv_b"]
        return (dequant_weight(w) if is_fp8(w) else w).reshape(kv_lora, H, nope + v)

    @staticmethod
    def _mul(spec: str, x, w):
        """`einsum(spec, x, w)` accumulated in float32, `x` in `w`'s dtype. Every `x` this
        block passes holds bf16 values (read from the arena or the bf16 cache), so a bf16
        `w` makes it exact."""
        return jnp.einsum(spec, x.astype(w.dtype), w, preferred_element_type=F32)

    def _out(self, env: Env, p, arena, o):
        """`o_proj` of the `[T, H, v]` rows, rounded as `attn_output` would store them."""
        t = o.shape[0]
        return linear(env.plan, arena, stored(o.reshape(t, -1)), (t, o.shape[1] * o.shape[2]),
                      p["wo"], workspaces.FP8_ACT_REGIONS, **env.linear_kw)  # fmt: skip

    # -- steps -------------------------------------------------------------------------------------

    def _absorb_prefill(self, q, w, nope: int):
        """The absorbed prefill query `[q_nope W_uk^T | q_rope]` (`[T, H, kv_lora + rope]`,
        bf16 as `ssm_deinterleaved` would hold it). Unlike decode's, this multiplies by the
        `W_uk` slice of `w`: a copy of `kv_lora * H * nope` weights, against the `[T, H, v]`
        zero padding of the query that using `w` whole would cost (smaller from a few hundred
        tokens on: 256 for DeepSeek-V3)."""
        q_lat = self._mul("thn,chn->thc", q[..., :nope], w[..., :nope])
        return jnp.concatenate([q_lat, q[..., nope:]], -1).astype(BF16)

    def prefill(self, env: Env, params, arena, cache, ctx: StepContext):
        """Appends the chunk's latents; absorbed causal attention of each packed sequence's
        queries over its cached latents (earlier chunks, `ctx.cached_lens`) plus the chunk's
        own, by the paged prefill kernel's latent path written in place into `attn_output`;
        `W_uv`; `o_proj`. Returns `(arena, cache, out)`."""
        c, t = env.config, ctx.num_tokens
        H, nope, rope, v, kv_lora, _ = mla_dims(c)
        arena, q, latent = self._project(env, params, arena, ctx)
        cache = self._append(env, cache, latent, ctx)
        w = self._kv_b(params, c)
        # Plain prefill: each sequence's context is its own queries.
        lens = ctx.cu_seqlens[1:] - ctx.cu_seqlens[:-1] if ctx.seq_lens is None else ctx.seq_lens
        arena = paged_prefill_attention_into(
            arena, env.plan, self._absorb_prefill(q, w, nope), cache["latent"], None,
            ctx.block_tables, ctx.cu_seqlens, lens, sm_scale=self.sm_scale(c),
            v_head_dim=kv_lora, interpret=env.interpret, kernels=env.kernels,
        )  # fmt: skip
        o_lat = get(env.plan, arena, "attn_output", (t, H, kv_lora))
        o = self._mul("thc,chv->thv", o_lat, w[..., nope:])
        arena, out = self._out(env, params, arena, o)
        return arena, cache, out

    def decode(self, env: Env, params, arena, cache, ctx: StepContext):
        """Appends the new latents; absorbed split-K attention over the latent cache (its
        latent output a value); `W_uv`; `o_proj`."""
        c, b, plan = env.config, ctx.num_tokens, env.plan
        H, nope, rope, v, kv_lora, _ = mla_dims(c)
        arena, q, latent = self._project(env, params, arena, ctx)
        cache = self._append(env, cache, latent, ctx)
        w = self._kv_b(params, c)
        # q_nope W_uk^T over the whole `kv_b` (zeros against W_uv): B rows cost nothing extra,
        # a sliced W_uk would be a copy of the weight.
        q_pad = jnp.pad(q[..., :nope], ((0, 0), (0, 0), (0, v)))
        q_lat = self._mul("bhd,chd->bhc", q_pad, w)
        # The absorbed query, bf16 as `ssm_deinterleaved` would hold it.
        qa = jnp.concatenate([q_lat, q[..., nope:]], -1).astype(BF16)
        # The latent output a value (as `get` of `attn_output` would give it: bf16): the
        # W_uv product reads it without a copy out of the arena.
        arena, o_lat = splitk_decode_attention_value(
            arena, plan, qa, cache["latent"], None, ctx.block_tables, ctx.seq_lens,
            num_splits=self._num_splits(env, b), sm_scale=self.sm_scale(c),
            v_head_dim=kv_lora, levers=env.levers, target=env.target, interpret=env.interpret,
            kernels=env.kernels,
        )  # fmt: skip
        o_lat = o_lat.astype(F32)
        o = self._mul("bhc,chd->bhd", o_lat, w)[..., nope:]
        arena, out = self._out(env, params, arena, o)
        return arena, cache, out

    def _num_splits(self, env: Env, b: int) -> int:
        """The policy's split count, lowered until the latent partials (`kv_lora + 2` f32 per
        slot, wider than the `head_dim + 2` the workspace is sized by) fit the region."""
        c = env.config
        H, kv_lora = c.num_attention_heads, c.kv_lora_rank
        n = splitk_num_splits(b, H, levers=env.levers, target=env.target)
        cap = env.plan.regions["splitk_workspace"].nbytes if n > 1 else 0
        while n > 1 and b * H * n * workspaces.splitk_slot_bytes(kv_lora) > cap:
            n -= 1
        return n
