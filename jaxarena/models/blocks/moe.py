"""The mixture-of-experts block: a router, dropless routed experts on the grouped GEMM, and
optional shared experts and latent projections.

One step (`MoE._forward`), every intermediate in the arena region the seed sizes for it:

1. the router input, float32, into `moe_router_in_f32` (transformers routes in float32 for
   its float32 reference and for the sigmoid routers); the router logits `x @ W` into
   `gate_logits_f32` (float32, what the routing reads) and `gate_logits` (bf16);
2. routing (`moe_routing`): softmax top-k (Qwen3-MoE, Mixtral) or sigmoid group-limited
   top-k (Nemotron-H, DeepSeek-V3); then the rows are sorted by expert (`sort_by_expert`);
3. LatentMoE only: `fc1_latent_proj` (hidden -> latent) into `ssm_ba`;
4. gate and up of every (token, expert) row in one grouped GEMM, the sorted rows gathered
   from the input by token: the gate half into `expert_gate_out`, the up half into
   `expert_up_out` (`T * top_k` rows), then `silu(gate) * up` (or `relu(up)^2` for
   non-gated experts) back into `expert_up_out`;
5. the down projection (a second grouped GEMM) into `expert_down_out`;
6. combine: the `top_k` rows of each token weighted and summed in float32, into
   `moe_output` (LatentMoE: `fc2_latent_proj` back to hidden, into `moe_output`);
7. shared experts (a dense MLP on the block input): up into `ssm_qkvz`, gate into
   `expert_gate_out`, down into `expert_down_out`, optionally times
   `sigmoid(x @ shared_expert_gate)` (Qwen2-MoE / Qwen3-Next), added into `moe_output`.

Expert weights are `[E, K, N]` float (bf16 from a checkpoint) for
`pallas_kernels.grouped_gemm`, or block-FP8 `{"w": float8_e4m3fn[E, N, K], "scale_inv":
float32[E, ceil(N/128), ceil(K/128)]}`; those run `grouped_gemm_fp8_into`, whose quantized
activations, scales, work list and tile counter live in `moe_fp8_scratch` at the offsets of
`workspaces.moe_fp8_scratch_layout` for the step's `ceil16(T)` rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ModelConfig, workspaces
from jaxarena.models.blocks.base import Block, Env, StepContext
from jaxarena.models.blocks.mlp import FFN_QUANT_REGIONS
from jaxarena.models.blocks.moe_routing import (
    DEEPSEEK_V2_TOPK_METHODS,
    combine,
    qwen3_moe_route,
    sigmoid_group_route,
    softmax_group_route,
    sort_by_expert,
)
from jaxarena.models.core.arena import BF16, F32, get, is_fp8, linear, put
from pallas_kernels.grouped_gemm import grouped_gemm, grouped_gemm_fp8_into

__all__ = ["MoE", "MOE_ROUTERS"]

MOE_ROUTERS = ("softmax", "sigmoid_group", "softmax_group")
_ACTS = ("swiglu", "relu2")


def _stack_experts(parts: list[Any]) -> Any:
    """Per-expert `Reader.linear` results -> one `[E, in, out]` float array or one FP8 dict
    `{"w": [E, out, in], "scale_inv": [E, ...]}` (the grouped GEMMs' layouts)."""
    if all(is_fp8(p) for p in parts):
        return {k: np.stack([p[k] for p in parts]) for k in ("w", "scale_inv")}
    if any(is_fp8(p) for p in parts):
        raise NotImplementedError("experts with FP8 and float weights mixed in one layer")
    return np.stack(parts)


def _concat_out(a: Any, b: Any, width: int) -> Any:
    """Gate and up weights side by side along the output (one GEMM for both)."""
    if is_fp8(a):
        if width % workspaces.FP8_BLOCK:
            raise NotImplementedError(f"FP8 experts need moe_intermediate_size % 128 == 0, got "
                                      f"{width}")  # fmt: skip
        return {k: np.concatenate([a[k], b[k]], axis=1) for k in ("w", "scale_inv")}
    return np.concatenate([a, b], axis=-1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoE(Block):
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
    (`[E, inter, in]`); shared: `s_up`, `s_down`, `s_gate` (swiglu), `s_scale` (`[hidden,
    1]`); latent: `w_lat_in`, `w_lat_out` (float or FP8 as in `core.arena.linear`).
    """

    kind: ClassVar[str] = "moe"
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

    def read_params(self, reader: Any, config: ModelConfig, prefix: str,
                    norm: str) -> dict[str, Any]:  # fmt: skip
        """`{prefix}.gate.weight` (the router, always float), `{prefix}.experts.{j}.*`, and the
        shared expert / latent projections when the block has them."""
        c = config
        h, e, inter, d = c.hidden_size, c.num_experts, c.moe_intermediate_size, c.moe_input_size
        gname, uname, dname = self.expert_names
        p: dict[str, Any] = {"norm": reader.vector(norm, h)}
        p["router"] = np.ascontiguousarray(reader.matrix(f"{prefix}.gate.weight", e, h).T)
        if self.router == "sigmoid_group":
            p["bias"] = reader.vector(f"{prefix}.gate.e_score_correction_bias", e).astype(F32)

        def experts(name: str, out: int, inp: int) -> Any:
            return _stack_experts([reader.linear(f"{prefix}.experts.{j}.{name}", out, inp)
                                   for j in range(e)])  # fmt: skip

        up = experts(uname, inter, d)
        p["w_down"] = experts(dname, d, inter)
        if self.act == "swiglu":
            p["w_gate_up"] = _concat_out(experts(gname, inter, d), up, inter)
        else:
            p["w_up"] = up
        if self.shared:
            s, si = f"{prefix}.{self.shared}", c.shared_expert_intermediate_size
            p["s_up"] = reader.linear(f"{s}.up_proj", si, h)
            p["s_down"] = reader.linear(f"{s}.down_proj", h, si)
            if self.act == "swiglu":
                p["s_gate"] = reader.linear(f"{s}.gate_proj", si, h)
            if self.shared_gate:
                p["s_scale"] = np.ascontiguousarray(
                    reader.matrix(f"{prefix}.shared_expert_gate.weight", 1, h).T
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
    def _gemm(env: Env, arena, src: str, shape: tuple[int, int], w, sizes, token, t: int):
        """Grouped GEMM of region `src` (`shape = (R, K)`, rows gathered by `token` when
        given) with per-expert weights `w`, for a step of `t` tokens; returns
        `(arena, float32[rows, N])`."""
        c, plan, it = env.config, env.plan, env.interpret
        x = plan.view(arena, src, shape, BF16)
        if is_fp8(w):
            layout = workspaces.moe_fp8_scratch_layout(
                rows=workspaces.fp8_rows(t), top_k=c.num_experts_per_tok,
                num_experts=c.num_experts, hidden_size=c.hidden_size,
                moe_intermediate_size=c.moe_intermediate_size,
                shared_expert_intermediate_size=c.shared_expert_intermediate_size)  # fmt: skip
            return grouped_gemm_fp8_into(arena, plan, x, w["w"], w["scale_inv"], sizes,
                                         layout=layout, row_ids=token, out_dtype=F32,
                                         interpret=it)  # fmt: skip
        lhs = x if token is None else x[token]
        return arena, grouped_gemm(lhs, w.astype(BF16), sizes, out_dtype=F32, interpret=it)

    def _shared(self, env: Env, p, arena, t: int):
        """The shared expert on `norm_output`, added into `moe_output`."""
        c, plan, it = env.config, env.plan, env.interpret
        h, si = c.hidden_size, c.shared_expert_intermediate_size
        act_regions = workspaces.FP8_ACT_REGIONS
        arena, u = linear(plan, arena, "norm_output", (t, h), p["s_up"], act_regions,
                          interpret=it)  # fmt: skip
        arena = put(plan, arena, "ssm_qkvz", u)
        if self.act == "swiglu":
            arena, g = linear(plan, arena, "norm_output", (t, h), p["s_gate"], act_regions,
                              interpret=it)  # fmt: skip
            arena = put(plan, arena, "expert_gate_out", g)
            g = get(plan, arena, "expert_gate_out", (t, si))
            a = jax.nn.silu(g) * get(plan, arena, "ssm_qkvz", (t, si))
        else:
            a = jnp.square(jax.nn.relu(get(plan, arena, "ssm_qkvz", (t, si))))
        arena = put(plan, arena, "ssm_qkvz", a)
        regions = FFN_QUANT_REGIONS if workspaces.ffn_fp8_uses_seed_regions(si) else None
        arena, y = linear(plan, arena, "ssm_qkvz", (t, si), p["s_down"], regions, interpret=it)
        if self.shared_gate:
            x = get(plan, arena, "norm_output", (t, h))
            y = y * jax.nn.sigmoid(x @ p["s_scale"].astype(F32))
        arena = put(plan, arena, "expert_down_out", y)
        out = get(plan, arena, "moe_output", (t, h)) + get(plan, arena, "expert_down_out", (t, h))
        return put(plan, arena, "moe_output", out)

    def _forward(self, env: Env, p, arena, t: int):
        c, plan, it = env.config, env.plan, env.interpret
        h, e, k = c.hidden_size, c.num_experts, c.num_experts_per_tok
        inter, d = c.moe_intermediate_size, c.moe_input_size
        # 1. router, in float32
        arena = plan.write(arena, "moe_router_in_f32", get(plan, arena, "norm_output", (t, h)))
        xr = plan.view(arena, "moe_router_in_f32", (t, h), F32)
        logits = self._router_logits(p, xr)
        arena = plan.write(arena, "gate_logits_f32", logits)
        arena = put(plan, arena, "gate_logits", logits)
        # 2. routing and the dropless layout
        weights, ids = self._route(p, plan.view(arena, "gate_logits_f32", (t, e), F32), k)
        order, sizes, token = sort_by_expert(ids, e)
        expert = ids.reshape(-1)[order]
        src = "norm_output"
        if self.latent:  # 3.
            arena, lat = linear(plan, arena, "norm_output", (t, h), p["w_lat_in"],
                                workspaces.FP8_ACT_REGIONS, interpret=it)  # fmt: skip
            arena, src = put(plan, arena, "ssm_ba", lat), "ssm_ba"
        # 4. gate / up, activation
        rows = t * k
        w_in = p["w_gate_up"] if self.act == "swiglu" else p["w_up"]
        arena, gu = self._gemm(env, arena, src, (t, d), w_in, sizes, token, t)
        if self.act == "swiglu":
            arena = put(plan, arena, "expert_gate_out", gu[:, :inter])
            arena = put(plan, arena, "expert_up_out", gu[:, inter:])
            gu = jnp.concatenate([get(plan, arena, "expert_gate_out", (rows, inter)),
                                  get(plan, arena, "expert_up_out", (rows, inter))], axis=-1)  # fmt: skip
        arena = put(plan, arena, "expert_up_out", self._act(p, gu, expert))
        # 5. down
        arena, y = self._gemm(env, arena, "expert_up_out", (rows, inter), p["w_down"], sizes,
                              None, t)  # fmt: skip
        arena = put(plan, arena, "expert_down_out", self._down_bias(p, y, expert))
        # 6. combine in float32
        y = get(plan, arena, "expert_down_out", (rows, d))
        arena = put(plan, arena, "moe_output", combine(y, order, weights, F32))
        if self.latent:
            arena, out = linear(plan, arena, "moe_output", (t, d), p["w_lat_out"],
                                workspaces.FP8_ACT_REGIONS, interpret=it)  # fmt: skip
            arena = put(plan, arena, "moe_output", out)
        if self.shared:  # 7.
            arena = self._shared(env, p, arena, t)
        return arena, get(plan, arena, "moe_output", (t, h))

    def prefill(self, env: Env, params, arena, cache, ctx: StepContext):
        """The experts of every prompt token; the cache (None) passes through."""
        arena, out = self._forward(env, params, arena, ctx.num_tokens)
        return arena, cache, out

    def decode(self, env: Env, params, arena, cache, ctx: StepContext):
        """The experts of each sequence's new token; the cache (None) passes through."""
        arena, out = self._forward(env, params, arena, ctx.num_tokens)
        return arena, cache, out
