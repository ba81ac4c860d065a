"""The Mamba-2 mixer: in_proj -> causal depthwise conv1d (kernel 4) -> SSD scan (prefill: the
`ssd_chunked_scan` Pallas kernel with its scratch in `ssd_scratch`; decode: the one-step
`ssd_state_update` kernel) -> gate with silu(z) -> grouped RMSNorm -> out_proj. A chunk of a
chunked prefill starts each continued sequence's conv from its cached window and its scan
from its cached state (`causal_conv`).
Under the step rule (jaxarena/models/README.md, "what goes through the arena"): the arena holds
only what a kernel writes in place, the SSD scratch (`ssd_scratch`, prefill) and the FP8
activation buffers; the in_proj output, the conv output and the gated, normalised y are XLA
values rounded to bf16 as their regions (`ssm_qkvz`, `ssm_deinterleaved`, `attn_output`) would
store them, so the numbers are those of the stored form.
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
from jaxarena.models.core.arena import BF16, F32, linear, stored
from jaxarena.models.core.kernels import ssd_chunked_scan_into, ssd_state_update
from jaxarena.models.core.norms import rms_norm

__all__ = ["Mamba2", "CONV_KERNEL"]

CONV_KERNEL = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mamba2(Block):
    """A Mamba-2 mixer (see the module docstring).

    Attributes:
      rms_eps: epsilon of the grouped gate RMSNorm.

    Parameters: `in_proj` (`[hidden, in_proj_size]`), `conv_w` (`[4, d_xbc]`), `conv_b`
    (`[d_xbc]`), `dt_bias`, `A_log`, `D` (`[H]`), `gate_norm` (`[d_inner]`), `out_proj`
    (`[d_inner, hidden]`). Cache: `state` `float32[rows, H, P, N]` and `conv`
    `float32[rows, 3, d_xbc]` (the last three pre-conv inputs); sequence `s` uses row `s`.
    A chunked prefill continues each sequence from its row (`chunked_prefill`).
    """

    kind: ClassVar[str] = "mamba"
    input_in_ctx: ClassVar[bool] = True
    chunked_prefill: ClassVar[bool] = True
    rms_eps: float = 1e-5

    def init_params(self, config: ModelConfig, keys: Iterator[jax.Array]) -> dict[str, Any]:
        """Random weights: A in [1, 8], softplus(dt_bias) small, D = 1, unit gate norm."""
        nh, d_in, d_xbc = config.mamba_num_heads, config.mamba2_d_inner, config.mamba2_d_xbc
        p = {"in_proj": dense_init(keys, config.hidden_size, config.mamba2_in_proj_size)}
        p["conv_w"] = jax.random.normal(next(keys), (CONV_KERNEL, d_xbc), F32) * 0.5
        p["conv_b"] = jax.random.normal(next(keys), (d_xbc,), F32) * 0.1
        p["dt_bias"] = jax.random.uniform(next(keys), (nh,), F32, -3.0, -1.0)
        p["A_log"] = jnp.log(jax.random.uniform(next(keys), (nh,), F32, 1.0, 8.0))
        p["D"] = jnp.ones((nh,), F32)
        p["gate_norm"] = jnp.ones((d_in,), F32)
        p["out_proj"] = dense_init(keys, d_in, config.hidden_size)
        return p

    def read_params(self, reader: Any, config: ModelConfig, prefix: str,
                    norm: str) -> dict[str, Any]:  # fmt: skip
        """`{prefix}.{in_proj,conv1d,dt_bias,A_log,D,norm,out_proj}` (transformers' names)."""
        h, nh, d_in, d_xbc = (config.hidden_size, config.mamba_num_heads,
                              config.mamba2_d_inner, config.mamba2_d_xbc)  # fmt: skip
        conv = reader.raw(f"{prefix}.conv1d.weight", (d_xbc, 1, CONV_KERNEL), FLOAT_DTYPES)
        if config.mamba_conv_bias:
            conv_b = reader.vector(f"{prefix}.conv1d.bias", d_xbc)
        else:
            conv_b = np.zeros((d_xbc,), conv.dtype)
        return {
            "norm": reader.vector(norm, h),
            "in_proj": reader.linear(f"{prefix}.in_proj", config.mamba2_in_proj_size, h),
            "conv_w": np.ascontiguousarray(conv[:, 0, :].T),
            "conv_b": conv_b,
            "dt_bias": reader.vector(f"{prefix}.dt_bias", nh),
            "A_log": reader.vector(f"{prefix}.A_log", nh),
            "D": reader.vector(f"{prefix}.D", nh),
            "gate_norm": reader.vector(f"{prefix}.norm.weight", d_in),
            "out_proj": reader.linear(f"{prefix}.out_proj", h, d_in),
        }

    def init_cache(self, config: ModelConfig, *, num_blocks: int, kv_block_size: int,
                   rows: int) -> dict[str, jax.Array]:  # fmt: skip
        """Zeroed `state` (`float32[rows, H, P, N]`) and `conv` (`float32[rows, 3, d_xbc]`)."""
        c = config
        return {
            "state": jnp.zeros(
                (rows, c.mamba_num_heads, c.mamba_head_dim, c.ssm_state_size), F32
            ),  # fmt: skip
            "conv": jnp.zeros((rows, CONV_KERNEL - 1, c.mamba2_d_xbc), F32),
        }

    # -- pieces ------------------------------------------------------------------------------

    def _zxbcdt(self, env: Env, p, arena, x, t: int):
        """in_proj of the pre-normed rows `x`, rounded as `ssm_qkvz` stores it, split into
        z, xBC and dt; returns `(arena, z, xbc, dt)`."""
        c = env.config
        # The GEMM writes the bf16 values `stored` rounds to (a float32 in_proj output is
        # `[T, in_proj width]`: 86 MB per 2048 tokens of mamba2-2.7b).
        arena, zx = linear(env.plan, arena, x, (t, c.hidden_size), p["in_proj"],
                           workspaces.FP8_ACT_REGIONS, **env.linear_kw,
                           stored_out=True)  # fmt: skip
        zx = stored(zx)
        d_in, d_xbc = c.mamba2_d_inner, c.mamba2_d_xbc
        return arena, zx[:, :d_in], zx[:, d_in : d_in + d_xbc], zx[:, d_in + d_xbc :]

    def _split_xbc(self, env: Env, xbc):
        c = env.config
        t = xbc.shape[0]
        d_in, gn = c.mamba2_d_inner, c.n_groups * c.ssm_state_size
        x = xbc[:, :d_in].reshape(t, c.mamba_num_heads, c.mamba_head_dim)
        b = xbc[:, d_in : d_in + gn].reshape(t, c.n_groups, c.ssm_state_size)
        cc = xbc[:, d_in + gn :].reshape(t, c.n_groups, c.ssm_state_size)
        return x, b, cc

    def _out(self, env: Env, p, arena, y, z, t: int):
        """Gate y with silu(z), grouped RMSNorm (rounded as `attn_output` stores it),
        out_proj."""
        c = env.config
        y = y.reshape(t, c.mamba2_d_inner) * jax.nn.silu(z)
        span = self._norm_span(env)
        if span > 1:
            y = self._spanning_norm(env, y, p["gate_norm"], span)
        else:
            g = c.n_groups
            y = rms_norm(y.reshape(t, g, -1), p["gate_norm"].reshape(g, -1), self.rms_eps)
        return linear(env.plan, arena, stored(y.reshape(t, -1)), (t, c.mamba2_d_inner),
                      p["out_proj"], workspaces.FP8_ACT_REGIONS, **env.linear_kw)  # fmt: skip

    @staticmethod
    def _norm_span(env: Env) -> int:
        """Devices one gated-RMSNorm group spans: `tp / n_groups` over a mesh with fewer
        groups than devices (`Env.tp_groups`), else 1."""
        if env.tp_axis is None or not env.tp_groups:
            return 1
        tp = jax.lax.axis_size(env.tp_axis)
        return tp // env.tp_groups if env.tp_groups < tp else 1

    def _spanning_norm(self, env: Env, y, w, span: int):
        """The gated RMSNorm of `y` (`[T, local channels]`, all of one group) when its group
        spans `span` devices: each device's float32 sum of squares goes into its group's slot
        of a `[T, n_groups]` vector (zeros elsewhere), one `psum` over the whole axis adds the
        devices of each group, and every device divides by the group's whole width. The
        vector is tiny (`n_groups` floats a token); the sum's order differs from one device's
        (a float32 reorder, ~1e-7 relative, far below the bf16 roundings around it)."""
        whole, d_local = env.tp_groups, env.config.mamba2_d_inner
        group = jax.lax.axis_index(env.tp_axis) // span
        mine = jax.nn.one_hot(group, whole, dtype=F32)  # [n_groups]
        y = y.astype(F32)
        sums = jax.lax.psum(jnp.sum(y * y, -1, keepdims=True) * mine, env.tp_axis)
        mean = jnp.sum(sums * mine, -1, keepdims=True) / (d_local * span)
        return y * jax.lax.rsqrt(mean + self.rms_eps) * w

    # -- steps -------------------------------------------------------------------------------

    def prefill(self, env: Env, params, arena, cache, ctx: StepContext):
        """Conv and chunked SSD scan within each packed sequence; rows `0..S-1` of the cache
        get each sequence's final state and conv window. In a chunked prefill
        (`ctx.cached_lens`), a sequence with cached tokens continues from its cache row's
        state and window (`causal_conv`); one with no token in the chunk keeps them."""
        p, t = params, ctx.num_tokens
        cu = ctx.cu_seqlens
        s = cu.shape[0] - 1
        arena, z, xbc_in, dt = self._zxbcdt(env, p, arena, ctx.x, t)
        window = cached_or_zeros(cache["conv"], ctx)
        init = cached_or_zeros(cache["state"], ctx)
        conv, win = prefill_conv(xbc_in, p["conv_w"], ctx, bias=p["conv_b"], window=window)
        conv_cache = cache["conv"].at[:s].set(win)
        conv_cache, arena = jax.lax.optimization_barrier((conv_cache, arena))
        x, b, cc = self._split_xbc(env, stored(jax.nn.silu(conv)))  # as `ssm_deinterleaved`
        arena, y, final = ssd_chunked_scan_into(
            arena, env.plan, x.astype(BF16), dt, -jnp.exp(p["A_log"].astype(F32)), b, cc,
            D=p["D"].astype(F32), dt_bias=p["dt_bias"].astype(F32), dt_softplus=True,
            initial_states=init, cu_seqlens=cu, interpret=env.interpret, kernels=env.kernels,
        )  # fmt: skip
        cache = {"state": cache["state"].at[:s].set(final), "conv": conv_cache}
        cache, arena = jax.lax.optimization_barrier((cache, arena))
        arena, out = self._out(env, p, arena, y.astype(F32), z, t)
        return arena, cache, out

    def decode(self, env: Env, params, arena, cache, ctx: StepContext):
        """One conv tap and one SSD state update per sequence (cache rows `0..B-1`)."""
        p, bsz = params, ctx.num_tokens
        arena, z, xbc_in, dt = self._zxbcdt(env, p, arena, ctx.x, bsz)
        window = jnp.concatenate([cache["conv"][:bsz], xbc_in[:, None, :]], axis=1)
        conv = p["conv_b"] + jnp.einsum("bkd,kd->bd", window, p["conv_w"].astype(F32))
        conv_cache = cache["conv"].at[:bsz].set(window[:, 1:])
        x, b, cc = self._split_xbc(env, stored(jax.nn.silu(conv)))  # as `ssm_deinterleaved`
        # The decode-step kernel updates rows 0..bsz-1 of the (donated) state cache in place,
        # B and C per group, softplus(dt + dt_bias) as in the prefill scan.
        y, state = ssd_state_update(
            cache["state"], x, dt, -jnp.exp(p["A_log"].astype(F32)), b, cc,
            D=p["D"].astype(F32), dt_bias=p["dt_bias"].astype(F32), dt_softplus=True,
            interpret=env.interpret, kernels=env.kernels,
        )  # fmt: skip
        # No barrier: nothing here reads the arena (its only writes would be the FP8 buffers,
        # whose products `linear` ties itself).
        cache = {"state": state, "conv": conv_cache}
        arena, out = self._out(env, p, arena, stored(y), z, bsz)
        return arena, cache, out
