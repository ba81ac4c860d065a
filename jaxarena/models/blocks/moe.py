"""The mixture-of-experts block: a router, dropless routed experts on the grouped GEMM, and
optional shared experts and latent projections.

One step (`MoE._forward`) on the block input `ctx.x` (the pre-normed rows; the block has
`input_in_ctx`). Under the step rule (jaxarena/models/README.md, "what goes through the
arena") the intermediates are XLA values, each rounded to bf16 where the seed's region for it
would have stored it (`core.arena.stored`), so the numbers are those of a step that stores
them; only the FP8 grouped GEMM's slab `moe_fp8_scratch` (and the FP8 activation buffers of
the shared expert / latent projections) is written in the arena, because a kernel reads it in
place:

1. the router in float32: the input widened exactly (`moe_router_in_f32`), the logits
   `x @ W` kept in float32 (`gate_logits_f32`, what the routing reads);
2. routing (`moe_routing`): softmax top-k (Qwen3-MoE, Mixtral) or sigmoid group-limited
   top-k (Nemotron-H, DeepSeek-V3); then the rows are sorted by expert (`sort_by_expert`);
3. LatentMoE only: `fc1_latent_proj` (hidden -> latent), rounded as `ssm_ba`;
4. gate and up of every (token, expert) row in one grouped GEMM, the sorted rows gathered
   from the input by token: rounded as `expert_gate_out` / `expert_up_out` (`T * top_k`
   rows), then `silu(gate) * up` (or `relu(up)^2` for non-gated experts), rounded as
   `expert_up_out`;
5. the down projection (a second grouped GEMM), rounded as `expert_down_out`;
6. combine: the `top_k` rows of each token weighted and summed in float32, rounded as
   `moe_output` (LatentMoE: `fc2_latent_proj` back to hidden, rounded again);
7. shared experts (a dense MLP on the block input; gate and up one weight, one GEMM): up
   rounded as `ssm_qkvz`, gate as `expert_gate_out`, the activation as `ssm_qkvz`, down as
   `expert_down_out`, optionally
   times `sigmoid(x @ shared_expert_gate)` (Qwen2-MoE / Qwen3-Next), added to the routed
   output and rounded as `moe_output`.

Expert weights are `[E, K, N]` float (bf16 from a checkpoint) for
`pallas_kernels.grouped_gemm`, or block-FP8 `{"w": float8_e4m3fn[E, N, K], "scale_inv":
float32[E, ceil(N/128), ceil(K/128)]}`; those run `grouped_gemm_fp8_into`, whose quantized
activations, scales, work list and tile counter live in `moe_fp8_scratch` at the offsets of
`workspaces.moe_fp8_scratch_layout` for the step's `ceil16(T)` rows.
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
from jaxarena.models.blocks.base import SCAN_INDEX, Env, StatelessBlock, dense_init
from jaxarena.models.blocks.mlp import ffn_down_regions
from jaxarena.models.blocks.moe_routing import (
    DEEPSEEK_V2_TOPK_METHODS,
    combine,
    qwen3_moe_route,
    sigmoid_group_route,
    softmax_group_route,
    sort_by_expert,
)
from jaxarena.models.core.arena import BF16, F32, fuse_outputs, is_fp8, linear, stored
from jaxarena.models.core.kernels import grouped_gemm, grouped_gemm_fp8_into

__all__ = ["MoE", "MOE_ROUTERS"]

MOE_ROUTERS = ("softmax", "sigmoid_group", "softmax_group")
_ACTS = ("swiglu", "relu2")


# The weight helpers below also take `jax.ShapeDtypeStruct`s (the shapes-only reader of
# `jaxarena.step_report`) and return the shape the arrays would have.


def _stack(parts: list[Any]) -> Any:
    if isinstance(parts[0], jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((len(parts), *parts[0].shape), parts[0].dtype)
    return np.stack(parts)


def _concat(a: Any, b: Any, axis: int) -> Any:
    if isinstance(a, jax.ShapeDtypeStruct):
        shape = list(a.shape)
        shape[axis] += b.shape[axis]
        return jax.ShapeDtypeStruct(tuple(shape), a.dtype)
    return np.concatenate([a, b], axis=axis)


def _transposed(a: Any) -> Any:
    if isinstance(a, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(a.shape[::-1], a.dtype)
    return np.ascontiguousarray(a.T)


def _as_f32(a: Any) -> Any:
    if isinstance(a, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(a.shape, F32)
    return a.astype(F32)


def _stack_experts(parts: list[Any]) -> Any:
    """Per-expert `Reader.linear` results -> one `[E, in, out]` float array or one FP8 dict
    `{"w": [E, out, in], "scale_inv": [E, ...]}` (the grouped GEMMs' layouts)."""
    if all(is_fp8(p) for p in parts):
        return {k: _stack([p[k] for p in parts]) for k in ("w", "scale_inv")}
    if any(is_fp8(p) for p in parts):
        raise NotImplementedError("experts with FP8 and float weights mixed in one layer")
    return _stack(parts)


def _experts_held(w: Any) -> int:
    """How many experts' weights `w` (`[E, ...]` or the FP8 dict) holds."""
    return (w["w"] if is_fp8(w) else w).shape[0]


def _concat_out(a: Any, b: Any, width: int) -> Any:
    """Gate and up weights side by side along the output (one GEMM for both)."""
    if is_fp8(a):
        if width % workspaces.FP8_BLOCK:
            raise NotImplementedError(f"FP8 experts need moe_intermediate_size % 128 == 0, got "
                                      f"{width}")  # fmt: skip
        return {k: _concat(a[k], b[k], 1) for k in ("w", "scale_inv")}
    return _concat(a, b, -1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoE(StatelessBlock):
    """A routed-experts block (see the module docstring); no cache.

    Attributes:
      router: `"softmax"` (softmax over the experts, top-k, renormalised when
        `norm_topk_prob`: Qwen3-MoE, Mixtral with `norm_topk_prob=True`) or
        `"sigmoid_group"` (sigmoid scores, `e_score_correction_bias` for the choice,
        `n_group` / `topk_group`, `routed_scaling_factor`: Nemotron-H, DeepSeek-V3) or
        `"softmax_group"` (softmax, `topk_method` greedy or group_limited_greedy, times
        `routed_scaling_factor`, no renormalisation: DeepSeek-V2).
      norm_topk_prob, n_group, topk_group, routed_scaling_factor, topk_method: the router's
        options (`topk_method` is read by `"softmax_group"` only).
      act: `"swiglu"` (gated experts) or `"relu2"` (non-gated: `down(relu(up x)^2)`).
      expert_names: the module names of gate, up and down under `experts.{j}` (Mixtral:
        `w1`, `w3`, `w2`; gate unused with `relu2`).
      shared: `"shared_experts"` / `"shared_expert"`: the shared expert's module, or `""`.
      shared_gate: the shared expert is scaled by `sigmoid(x @ shared_expert_gate)`.
      latent: LatentMoE: the experts run in `moe_latent_size` (`fc1_latent_proj`,
        `fc2_latent_proj` around them).

    Parameters: `norm`, `router` (`[hidden, E]`), `bias` (`f32[E]`, sigmoid routers),
    `w_gate_up` (`[E, in, 2 * inter]`, swiglu) or `w_up` (`[E, in, inter]`), `w_down`
    (`[E, inter, in]`); shared: `s_down`, `s_up` (relu2) or `s_gate_up` (swiglu: `[hidden,
    2 shared_inter]`, the gate's columns then the up's, one GEMM; the `(gate, up)` tuple where
    `core.arena.fuse_outputs` cannot join them), `s_scale` (`[hidden, 1]`); latent:
    `w_lat_in`, `w_lat_out` (float or FP8 as in `core.arena.linear`).
    """

    kind: ClassVar[str] = "moe"
    # Under `scan_layers` the experts stay stacked (`[R * E, ...]`) and the grouped GEMMs read
    # this layer's at `group_offset = SCAN_INDEX * E`: no per-layer copy of the experts.
    scan_in_place: ClassVar[tuple[str, ...]] = ("w_gate_up", "w_up", "w_down")
    router: str = "softmax"
    norm_topk_prob: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    topk_method: str = "greedy"
    act: str = "swiglu"
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    shared: str = ""
    shared_gate: bool = False
    latent: bool = False

    def __post_init__(self) -> None:
        if self.router not in MOE_ROUTERS:
            raise ValueError(f"MoE.router={self.router!r} must be one of {MOE_ROUTERS}")
        if self.act not in _ACTS:
            raise ValueError(f"MoE.act={self.act!r} must be one of {_ACTS}")
        if self.router == "softmax_group" and self.topk_method not in DEEPSEEK_V2_TOPK_METHODS:
            raise ValueError(f"MoE.topk_method={self.topk_method!r} must be one of "
                             f"{DEEPSEEK_V2_TOPK_METHODS}")  # fmt: skip

    # -- weights ---------------------------------------------------------------------------

    def init_params(self, config: ModelConfig, keys: Iterator[jax.Array]) -> dict[str, Any]:
        """Random float32 weights in `read_params`' layout (the down projections scaled by
        0.5; a zero correction bias for sigmoid routers); at most 9 keys."""
        c = config
        h, e, inter, d = c.hidden_size, c.num_experts, c.moe_intermediate_size, c.moe_input_size

        def experts(fan_in: int, fan_out: int) -> jax.Array:
            shape = (e, fan_in, fan_out)
            return jax.random.normal(next(keys), shape, jnp.float32) / math.sqrt(fan_in)

        p: dict[str, Any] = {"router": dense_init(keys, h, e)}
        if self.router == "sigmoid_group":
            p["bias"] = jnp.zeros((e,), jnp.float32)
        p["w_gate_up" if self.act == "swiglu" else "w_up"] = experts(
            d, 2 * inter if self.act == "swiglu" else inter
        )
        p["w_down"] = experts(inter, d) * 0.5
        if self.shared:
            si = c.shared_expert_intermediate_size
            up = dense_init(keys, h, si)
            p["s_down"] = dense_init(keys, si, h) * 0.5
            if self.act == "swiglu":
                p["s_gate_up"] = fuse_outputs(dense_init(keys, h, si), up)
            else:
                p["s_up"] = up
            if self.shared_gate:
                p["s_scale"] = dense_init(keys, h, 1)
        if self.latent:
            p["w_lat_in"] = dense_init(keys, h, d)
            p["w_lat_out"] = dense_init(keys, d, h)
        return p

    def read_params(self, reader: Any, config: ModelConfig, prefix: str,
                    norm: str) -> dict[str, Any]:  # fmt: skip
        """`{prefix}.gate.weight` (the router, always float), `{prefix}.experts.{j}.*`, and the
        shared expert / latent projections when the block has them. The shared expert's gate
        and up are joined into `s_gate_up` (`core.arena.fuse_outputs`); under tensor
        parallelism the reader hands out this device's slice of each, so a device's
        `s_gate_up` is its gate slice then its up slice."""
        c = config
        h, e, inter, d = c.hidden_size, c.num_experts, c.moe_intermediate_size, c.moe_input_size
        gname, uname, dname = self.expert_names
        p: dict[str, Any] = {"norm": reader.vector(norm, h)}
        p["router"] = _transposed(reader.matrix(f"{prefix}.gate.weight", e, h))
        if self.router == "sigmoid_group":
            p["bias"] = _as_f32(reader.vector(f"{prefix}.gate.e_score_correction_bias", e))

        def experts(name: str, out: int, inp: int) -> Any:
            return _stack_experts([reader.linear(f"{prefix}.experts.{j}.{name}", out, inp)
                                   for j in reader.expert_ids(e)])  # fmt: skip

        up = experts(uname, inter, d)
        p["w_down"] = experts(dname, d, inter)
        if self.act == "swiglu":
            p["w_gate_up"] = _concat_out(experts(gname, inter, d), up, inter)
        else:
            p["w_up"] = up
        if self.shared:
            s, si = f"{prefix}.{self.shared}", c.shared_expert_intermediate_size
            up = reader.linear(f"{s}.up_proj", si, h)
            p["s_down"] = reader.linear(f"{s}.down_proj", h, si)
            if self.act == "swiglu":
                p["s_gate_up"] = fuse_outputs(reader.linear(f"{s}.gate_proj", si, h), up)
            else:
                p["s_up"] = up
            if self.shared_gate:
                p["s_scale"] = _transposed(
                    reader.matrix(f"{prefix}.shared_expert_gate.weight", 1, h)
                )
        if self.latent:
            p["w_lat_in"] = reader.linear(f"{prefix}.fc1_latent_proj", d, h)
            p["w_lat_out"] = reader.linear(f"{prefix}.fc2_latent_proj", h, d)
        return p

    # -- the step ----------------------------------------------------------------------------
    # Hooks a variant block overrides (gpt-oss: router bias, expert biases, clamped GLU); the
    # defaults are the plain router and activations above. `expert` is `int32[T * top_k]`,
    # the expert of each sorted row.

    def _router_logits(self, p, x: jax.Array) -> jax.Array:
        """Router logits, float32 `[T, E]`, from the float32 router input `x [T, hidden]`."""
        return x @ p["router"].astype(F32)

    def _act(self, p, gu: jax.Array, expert: jax.Array) -> jax.Array:
        """The expert activation of the first grouped GEMM's float32 rows: `[gate | up]`
        (`[rows, 2 * inter]`, swiglu) or `up` (`[rows, inter]`, relu2) -> `[rows, inter]`."""
        if self.act == "swiglu":
            inter = gu.shape[-1] // 2
            return jax.nn.silu(gu[:, :inter]) * gu[:, inter:]
        return jnp.square(jax.nn.relu(gu))

    def _down_bias(self, p, y: jax.Array, expert: jax.Array) -> jax.Array:
        """The down projection's float32 rows before the routing weights (no bias here)."""
        return y

    def _route(self, p, logits: jax.Array, top_k: int):
        if self.router == "softmax":
            return qwen3_moe_route(logits, top_k, self.norm_topk_prob)
        if self.router == "softmax_group":
            return softmax_group_route(logits, top_k=top_k, topk_method=self.topk_method,
                                       n_group=self.n_group, topk_group=self.topk_group,
                                       routed_scaling_factor=self.routed_scaling_factor)  # fmt: skip
        return sigmoid_group_route(logits, p["bias"], top_k=top_k, n_group=self.n_group,
                                   topk_group=self.topk_group,
                                   norm_topk_prob=self.norm_topk_prob,
                                   routed_scaling_factor=self.routed_scaling_factor)  # fmt: skip

    @staticmethod
    def _gemm(env: Env, arena, x: jax.Array, w, sizes, token, t: int, offset=None):
        """Grouped GEMM of the rows `x` (`[R, K]`, bf16 or bf16-rounded float32; the sorted
        rows are `x[token]` when `token` is given) with per-expert weights `w`, for a step of
        `t` tokens; returns `(arena, float32[rows, N])`. FP8 weights quantize `x` into
        `moe_fp8_scratch`, which the FP8 grouped GEMM reads in place. `offset`: a scanned
        layer's first expert in the layer-stacked `w` (`[R * E, ...]`), or None."""
        c, plan, it = env.config, env.plan, env.interpret
        if is_fp8(w):
            x = x.astype(BF16)  # exact: `x` is bf16-rounded
            layout = workspaces.moe_fp8_scratch_layout(
                rows=workspaces.fp8_rows(t), top_k=c.num_experts_per_tok,
                num_experts=c.num_experts, hidden_size=c.hidden_size,
                moe_intermediate_size=c.moe_intermediate_size,
                shared_expert_intermediate_size=c.shared_expert_intermediate_size)  # fmt: skip
            arena, out = grouped_gemm_fp8_into(arena, plan, x, w["w"], w["scale_inv"], sizes,
                                               layout=layout, row_ids=token, out_dtype=F32,
                                               interpret=it, group_offset=offset,
                                               kernels=env.kernels)  # fmt: skip
            # The GEMM read the slab: tie its output to this arena before the next write.
            out, arena = jax.lax.optimization_barrier((out, arena))
            return arena, out
        # Gathered, then narrowed (exact): XLA fuses the two, no bf16 copy of `x`.
        lhs = (x if token is None else x[token]).astype(BF16)
        return arena, grouped_gemm(lhs, w.astype(BF16), sizes, out_dtype=F32, interpret=it,
                                   group_offset=offset, kernels=env.kernels)  # fmt: skip

    def _shared(self, env: Env, p, arena, x: jax.Array, t: int):
        """The shared expert on the block input `x`: `(arena, float32[T, hidden])`, rounded
        where `ssm_qkvz` (up, then the activation), `expert_gate_out` (gate) and
        `expert_down_out` (down) stored it."""
        c, plan = env.config, env.plan
        h, si = c.hidden_size, c.shared_expert_intermediate_size
        act_regions = workspaces.FP8_ACT_REGIONS
        if self.act == "swiglu":
            # One GEMM of the joined weight (a `(gate, up)` tuple: two GEMMs on one input
            # quantization). No `stored_out`: a float32 product, like the router's, is one
            # XLA's dot merger joins with the router's GEMM in decode (a bf16 one is not:
            # measured +1 GEMM launch per layer, DeepSeek-V2-Lite at batch 8).
            arena, gu = linear(plan, arena, x, (t, h), p["s_gate_up"], act_regions,
                               **env.linear_kw, split=True)  # fmt: skip
            if len(gu) == 1:  # joined: the gate's columns, then the up's
                half = gu[0].shape[1] // 2
                gu = (gu[0][:, :half], gu[0][:, half:])
            g, u = gu
            a = jax.nn.silu(stored(g)) * stored(u)
        else:
            arena, u = linear(plan, arena, x, (t, h), p["s_up"], act_regions, **env.linear_kw)
            a = jnp.square(jax.nn.relu(stored(u)))
        regions = ffn_down_regions(plan, t, si)
        arena, y = linear(plan, arena, stored(a), (t, si), p["s_down"], regions, **env.linear_kw)
        if self.shared_gate:
            y = y * jax.nn.sigmoid(x @ p["s_scale"].astype(F32))
        return arena, stored(y)

    def _forward(self, env: Env, p, arena, x: jax.Array, t: int):
        """The block on its input `x` (the pre-normed rows, float32 bf16-rounded); returns
        `(arena, float32[T, hidden])`. The intermediates are XLA values rounded to bf16 where
        the seed's regions (module docstring) would have stored them."""
        c, plan = env.config, env.plan
        h, e, k = c.hidden_size, c.num_experts, c.num_experts_per_tok
        d = c.moe_input_size
        # 1. router, in float32 (the input widened exactly, as `moe_router_in_f32` held it;
        # the logits float32 as `gate_logits_f32` held them). The input is kept as bf16
        # (exact) until the gather, as the plain step keeps it (measured: 2 launches fewer in
        # the tiny step-rule test's prefill than with the float32 value).
        xb = x.astype(BF16)
        logits = self._router_logits(p, xb.astype(F32))
        # 2. routing and the dropless layout
        weights, ids = self._route(p, logits, k)
        held = _experts_held(p["w_down"]) if env.tp_axis is not None else e
        if held < e:
            # Expert parallelism: this device holds experts [r held, (r + 1) held); the picks
            # of the others go to a group past its weights, whose rows the grouped GEMMs
            # write as zeros (their contract: rows past `sum(group_sizes)`), so they add
            # nothing to the combine; the block's all-reduce adds the devices' outputs.
            ids = ids - jax.lax.axis_index(env.tp_axis) * held
            ids = jnp.where((ids >= 0) & (ids < held), ids, held)
            order, sizes, token = sort_by_expert(ids, held + 1)
            sizes = sizes[:held]
        else:
            order, sizes, token = sort_by_expert(ids, e)
        expert = ids.reshape(-1)[order]
        # scan_layers: this layer's experts in the stacked weights (`Block.scan_in_place`).
        off = p[SCAN_INDEX] * e if SCAN_INDEX in p else None
        src = xb
        if self.latent:  # 3. (`ssm_ba`)
            arena, lat = linear(plan, arena, x, (t, h), p["w_lat_in"],
                                workspaces.FP8_ACT_REGIONS, **env.linear_kw)  # fmt: skip
            src = stored(lat)
        # 4. gate / up (`expert_gate_out`, `expert_up_out`), activation (`expert_up_out`)
        w_in = p["w_gate_up"] if self.act == "swiglu" else p["w_up"]
        arena, gu = self._gemm(env, arena, src, w_in, sizes, token, t, off)
        if self.act == "swiglu":
            gu = stored(gu)
        a = stored(self._act(p, gu, expert))
        # 5. down (`expert_down_out`)
        arena, y = self._gemm(env, arena, a, p["w_down"], sizes, None, t, off)
        y = stored(self._down_bias(p, y, expert))
        # 6. combine in float32 (`moe_output`)
        out = stored(combine(y, order, weights, F32))
        if self.latent:
            arena, out = linear(plan, arena, out, (t, d), p["w_lat_out"],
                                workspaces.FP8_ACT_REGIONS, **env.linear_kw)  # fmt: skip
            out = stored(out)
        if self.shared:  # 7. (`moe_output`)
            arena, y = self._shared(env, p, arena, x, t)
            out = stored(out + y)
        return arena, out
