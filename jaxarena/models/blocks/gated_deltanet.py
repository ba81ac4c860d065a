"""The Gated DeltaNet mixer of Qwen3-Next and Qwen3.5 (transformers' `*GatedDeltaNet`).

    in_proj -> [q | k | v | z], [b | a]   (Qwen3-Next: interleaved per key-head group)
    causal depthwise conv1d (no bias) + silu over [q | k | v], its window in the cache
    beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)
    delta rule on L2-normalised q, k (prefill: the chunked `gdn_chunked_into` kernel with its
      scratch in `gdn_fla_scratch`, from the cached state in a chunked prefill's continued
      sequences; decode: the in-place `gdn_state_update` kernel)
    gated RMSNorm: rmsnorm(o) * w * silu(z) per value head -> out_proj

Under the step rule (jaxarena/models/README.md, "what goes through the arena") the arena holds
only the chunked kernel's scratch (`gdn_fla_scratch`, prefill) and the FP8 activation buffers.
The other intermediates are XLA values, rounded as their regions would store them (T rows;
`kd = Hk Dk`, `vd = Hv Dv`):
- the q/k/v/z projection `[T, 2 kd + 2 vd]` as the checkpoint lays it out, bf16 like
  `ssm_qkvz` (Qwen3.5: `[q | k | v | z]`; Qwen3-Next: per key head `[q_h | k_h | v_h | z_h]`,
  reordered to `[q | k | v | z]`, transformers' `fix_query_key_value_ordering`, a copy);
- the b/a projection `[T, 2 Hv]`, bf16 like `ssm_ba`;
- silu(conv1d) of `[q | k | v]` and the gates `[g | beta]`, float32 like `ssm_conv_out_f32`
  and `ssm_gates` (no rounding);
- the gated norm's output `[T, vd]`, the input of out_proj, bf16 like `attn_output`.
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
from jaxarena.models.blocks.causal_conv import cached_or_zeros, prefill_conv
from jaxarena.models.checkpoint import FLOAT_DTYPES
from jaxarena.models.core.arena import F32, linear, stored
from jaxarena.models.core.kernels import gdn_chunked_into, gdn_state_update
from jaxarena.models.core.norms import rms_norm

__all__ = ["GatedDeltaNet"]


def _dims(c: ModelConfig) -> tuple[int, int, int, int]:
    return (c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads,
            c.linear_value_head_dim)  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class GatedDeltaNet(Block):
    """A Gated DeltaNet mixer (see the module docstring).

    Attributes:
      conv_kernel: taps of the depthwise causal conv (`linear_conv_kernel_dim`, >= 2).
      rms_eps: epsilon of the gated RMSNorm.
      interleaved: Qwen3-Next's fused `in_proj_qkvz` / `in_proj_ba`, whose outputs are
        grouped per key head; else Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`,
        `in_proj_a`.

    Parameters: `w_qkvz` (`[hidden, 2 kd + 2 vd]`, or a (qkv, z) tuple of linear weights),
    `w_ba` (`[hidden, 2 Hv]`), `conv_w` (`[conv_kernel, 2 kd + vd]`), `A_log`, `dt_bias`
    (`[Hv]`), `gate_norm` (`[Dv]`), `out_proj` (`[vd, hidden]`). Cache: `state`
    `float32[rows, Hv, Dk, Dv]` and `conv` `float32[rows, conv_kernel - 1, 2 kd + vd]` (the
    last pre-conv inputs); sequence `s` uses row `s`. A chunked prefill continues each
    sequence from its row (`chunked_prefill`).
    """

    kind: ClassVar[str] = "gdn"
    input_in_ctx: ClassVar[bool] = True
    chunked_prefill: ClassVar[bool] = True
    conv_kernel: int = 4
    rms_eps: float = 1e-6
    interleaved: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.conv_kernel, bool) or not isinstance(self.conv_kernel, int) or (
            self.conv_kernel < 2
        ):  # fmt: skip
            raise ValueError(f"GatedDeltaNet.conv_kernel={self.conv_kernel!r} must be an int >= 2")

    # -- weights -----------------------------------------------------------------------------

    def init_params(self, config: ModelConfig, keys: Iterator[jax.Array]) -> dict[str, Any]:
        """Random weights: A in [1, 16], softplus(dt_bias) small, unit gate norm."""
        h = config.hidden_size
        nk, dk, nv, dv = _dims(config)
        conv_dim = 2 * nk * dk + nv * dv
        return {
            "w_qkvz": dense_init(keys, h, config.ssm_qkvz_size),
            "w_ba": dense_init(keys, h, 2 * nv),
            "conv_w": jax.random.normal(next(keys), (self.conv_kernel, conv_dim), F32) * 0.5,
            "A_log": jnp.log(jax.random.uniform(next(keys), (nv,), F32, 1.0, 16.0)),
            "dt_bias": jax.random.uniform(next(keys), (nv,), F32, -3.0, -1.0),
            "gate_norm": jnp.ones((dv,), F32),
            "out_proj": dense_init(keys, nv * dv, h),
        }

    def read_params(self, reader: Any, config: ModelConfig, prefix: str,
                    norm: str) -> dict[str, Any]:  # fmt: skip
        """`{prefix}.{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a}` (Qwen3.5) or
        `{prefix}.{in_proj_qkvz,in_proj_ba}` (Qwen3-Next), `.conv1d`, `.A_log`, `.dt_bias`,
        `.norm`, `.out_proj`."""
        h = config.hidden_size
        nk, dk, nv, dv = _dims(config)
        conv_dim = 2 * nk * dk + nv * dv
        if self.interleaved:
            w_qkvz = reader.linear(f"{prefix}.in_proj_qkvz", config.ssm_qkvz_size, h)
            w_ba = reader.linear(f"{prefix}.in_proj_ba", 2 * nv, h)
        else:
            qkv = reader.linear(f"{prefix}.in_proj_qkv", conv_dim, h)
            z = reader.linear(f"{prefix}.in_proj_z", nv * dv, h)
            both = isinstance(qkv, np.ndarray) and isinstance(z, np.ndarray)
            w_qkvz = np.concatenate([qkv, z], axis=1) if both else (qkv, z)
            b = reader.linear(f"{prefix}.in_proj_b", nv, h)
            a = reader.linear(f"{prefix}.in_proj_a", nv, h)
            w_ba = np.concatenate([b, a], axis=1) if isinstance(b, np.ndarray) else (b, a)
        conv = reader.raw(f"{prefix}.conv1d.weight", (conv_dim, 1, self.conv_kernel),
                          FLOAT_DTYPES)  # fmt: skip
        return {
            "norm": reader.vector(norm, h),
            "w_qkvz": w_qkvz,
            "w_ba": w_ba,
            "conv_w": np.ascontiguousarray(conv[:, 0, :].T),
            "A_log": reader.vector(f"{prefix}.A_log", nv),
            "dt_bias": reader.vector(f"{prefix}.dt_bias", nv),
            "gate_norm": reader.vector(f"{prefix}.norm.weight", dv),
            "out_proj": reader.linear(f"{prefix}.out_proj", h, nv * dv),
        }

    def init_cache(self, config: ModelConfig, *, num_blocks: int, kv_block_size: int,
                   rows: int) -> dict[str, jax.Array]:  # fmt: skip
        """Zeroed `state` (`float32[rows, Hv, Dk, Dv]`) and `conv` window."""
        nk, dk, nv, dv = _dims(config)
        return {
            "state": jnp.zeros((rows, nv, dk, dv), F32),
            "conv": jnp.zeros((rows, self.conv_kernel - 1, 2 * nk * dk + nv * dv), F32),
        }

    # -- pieces ------------------------------------------------------------------------------

    def _project(self, env: Env, p, arena, x, t: int):
        """in_proj of the pre-normed rows `x`: returns `(arena, conv input [q | k | v], z,
        ba)`, the projections rounded as `ssm_qkvz` / `ssm_ba` store them; Qwen3-Next's
        reordered to `[q | k | v | z]` first."""
        c, plan = env.config, env.plan
        regions = workspaces.FP8_ACT_REGIONS
        h = c.hidden_size
        kw = dict(**env.linear_kw, stored_out=True)
        arena, qkvz = linear(plan, arena, x, (t, h), p["w_qkvz"], regions, **kw)
        arena, ba = linear(plan, arena, x, (t, h), p["w_ba"], regions, **kw)
        qkvz, ba = stored(qkvz), stored(ba)
        nk, dk, nv, dv = _dims(c)
        if self.interleaved:
            g = qkvz.reshape(t, nk, -1)
            q, k, v, z = jnp.split(g, np.cumsum([dk, dk, nv // nk * dv]), axis=-1)
            qkvz = jnp.concatenate([a.reshape(t, -1) for a in (q, k, v, z)], -1)
        cut = 2 * nk * dk + nv * dv
        return arena, qkvz[:, :cut], qkvz[:, cut:], ba

    def _gates(self, env: Env, p, ba, t: int):
        """`(g, beta)`, each float32 `[T, Hv]`, from the b/a projection."""
        nk, _, nv, _ = _dims(env.config)
        if self.interleaved:
            ba = ba.reshape(t, nk, 2, nv // nk)
            b, a = ba[:, :, 0].reshape(t, nv), ba[:, :, 1].reshape(t, nv)
        else:
            b, a = ba[:, :nv], ba[:, nv:]
        beta = jax.nn.sigmoid(b)
        g = -jnp.exp(p["A_log"].astype(F32)) * jax.nn.softplus(a + p["dt_bias"].astype(F32))
        return g, beta

    def _split_conv(self, env: Env, x):
        """q, k `[T, Hk, Dk]` and v `[T, Hv, Dv]` of silu(conv1d) `x`."""
        nk, dk, nv, dv = _dims(env.config)
        t, kd = x.shape[0], nk * dk
        return (x[:, :kd].reshape(t, nk, dk), x[:, kd : 2 * kd].reshape(t, nk, dk),
                x[:, 2 * kd :].reshape(t, nv, dv))  # fmt: skip

    def _out(self, env: Env, p, arena, o, z, t: int):
        """Gated RMSNorm per value head (rounded as `attn_output` stores it), out_proj."""
        _, _, nv, dv = _dims(env.config)
        y = rms_norm(o.reshape(t, nv, dv), p["gate_norm"].astype(F32), self.rms_eps)
        y = stored((y * jax.nn.silu(z.reshape(t, nv, dv))).reshape(t, nv * dv))
        return linear(env.plan, arena, y, (t, nv * dv), p["out_proj"],
                      workspaces.FP8_ACT_REGIONS, **env.linear_kw)  # fmt: skip

    # -- steps -------------------------------------------------------------------------------

    def prefill(self, env: Env, params, arena, cache, ctx: StepContext):
        """Conv and chunked delta rule within each packed sequence; rows `0..S-1` of the cache
        get each sequence's final state and conv window (its last `conv_kernel - 1` pre-conv
        inputs). In a chunked prefill (`ctx.cached_lens`), a sequence with cached tokens
        continues from its cache row's state and window (`causal_conv`); one with no token in
        the chunk keeps them."""
        p, t = params, ctx.num_tokens
        s = ctx.cu_seqlens.shape[0] - 1
        arena, x, z, ba = self._project(env, p, arena, ctx.x, t)
        window = cached_or_zeros(cache["conv"], ctx)
        init = cached_or_zeros(cache["state"], ctx)
        conv, win = prefill_conv(x, p["conv_w"].astype(F32), ctx, window=window)
        conv = jax.nn.silu(conv)
        conv_cache = cache["conv"].at[:s].set(win)
        conv_cache, arena = jax.lax.optimization_barrier((conv_cache, arena))
        g, beta = self._gates(env, p, ba, t)
        q, k, v = self._split_conv(env, conv)
        arena, o, final = gdn_chunked_into(
            arena, env.plan, q, k, v, g, beta, cu_seqlens=ctx.cu_seqlens, initial_states=init,
            use_qk_l2norm=True, interpret=env.interpret, kernels=env.kernels,
        )  # fmt: skip
        cache = {"state": cache["state"].at[:s].set(final), "conv": conv_cache}
        cache, arena = jax.lax.optimization_barrier((cache, arena))
        arena, out = self._out(env, p, arena, o.astype(F32), z, t)
        return arena, cache, out

    def decode(self, env: Env, params, arena, cache, ctx: StepContext):
        """One conv tap and one delta-rule state update per sequence (cache rows `0..B-1`)."""
        p, bsz = params, ctx.num_tokens
        arena, x, z, ba = self._project(env, p, arena, ctx.x, bsz)
        w, prev = p["conv_w"].astype(F32), cache["conv"][:bsz]
        conv = jnp.einsum("bkd,kd->bd", prev, w[:-1]) + x * w[-1]
        # The conv reads the old window before the shifted window is written over it: without
        # the barrier XLA fuses both into one pass, which must first copy the (donated) conv
        # cache (f32[B, kk - 1, conv_dim] of temp per layer: 768 KiB for Qwen3-Next at B = 8);
        # with it, one more launch per layer.
        conv, prev = jax.lax.optimization_barrier((conv, prev))
        conv_cache = cache["conv"].at[:bsz].set(jnp.concatenate([prev[:, 1:], x[:, None]], 1))
        g, beta = self._gates(env, p, ba, bsz)
        q, k, v = self._split_conv(env, jax.nn.silu(conv))
        # Rows 0..B-1 of the (donated) state cache are updated in place.
        o, state = gdn_state_update(cache["state"], q, k, v, g, beta, use_qk_l2norm=True,
                                    interpret=env.interpret, kernels=env.kernels)  # fmt: skip
        # No barrier on the arena: nothing here reads it (the FP8 products `linear` ties
        # itself). The conv window's update is tied to the state update's output, which the
        # rest of the layer reads: else XLA sank every layer's update of the (donated) conv
        # cache to the step's end, each layer's window copy alive until then, and the decode
        # temp grew by a window per GDN layer (Qwen3-Next at batch 64: 6 MiB each, 4.5 MiB per
        # layer on one device, 3.4 at tp 4; now flat in the layers, 10.5 and 18.6 MiB at 8
        # layers, the same launches on one device and 0.5 per layer fewer at tp 4).
        conv_cache, o = jax.lax.optimization_barrier((conv_cache, o))
        cache = {"state": state, "conv": conv_cache}
        arena, out = self._out(env, p, arena, o.astype(F32), z, bsz)
        return arena, cache, out
