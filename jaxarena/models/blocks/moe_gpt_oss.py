"""gpt-oss's mixture-of-experts block: `MoE` with a biased router, biased experts and a
clamped GLU, as transformers 5.x computes it (`gpt_oss/modeling_gpt_oss.py`:
`GptOssTopKRouter.forward`, `GptOssExperts._apply_gate` and `.forward`).

Per token `x` (the bf16 `norm_output`, widened to float32 for the router):

1. router logits `x @ W_r.T + b_r`; top-k on the logits, softmax over the k chosen
   (`moe_routing.gpt_oss_route`);
2. per chosen expert `j`: `[gate | up] = x @ W_gu[j] + b_gu[j]`, `gate = min(gate, limit)`,
   `up = clip(up, -limit, limit)`, `glu = gate * sigmoid(alpha * gate)`, `a = (up + 1) * glu`;
3. `y_j = a @ W_d[j] + b_d[j]`, and the token's output `sum_j w_j y_j`: the down bias is
   scaled by the routing weight like the rest of the row.

Only the hooks of `MoE` are overridden (`_router_logits`, `_route`, `_act`, `_down_bias`); the
step, its grouped GEMMs and its arena regions are `MoE._forward`'s. The gate/up biases are
added to the float32 rows read back from `expert_gate_out` / `expert_up_out` (the grouped
GEMM has no bias), the down bias before `expert_down_out` is stored.

Checkpoint layout (what `GptOssForCausalLM.save_pretrained` writes, and the bf16 releases):
`{prefix}.router.weight [E, hidden]`, `{prefix}.router.bias [E]`,
`{prefix}.experts.gate_up_proj [E, hidden, 2 * inter]` with gate and up INTERLEAVED along the
last axis (gate = columns 0, 2, 4, ..., up = 1, 3, 5, ...), `gate_up_proj_bias [E, 2 * inter]`
(interleaved too), `down_proj [E, inter, hidden]`, `down_proj_bias [E, hidden]`. They are
de-interleaved once at load into `MoE`'s `[gate | up]` layout. MXFP4 experts (the hub's
`gate_up_proj_blocks` / `_scales`) are refused.

Tensor parallelism (`models.tensor_parallel`): with `ep == 1` each device reads a contiguous
cut of the interleaved axis (`moe_intermediate_size / tp` whole `(g_i, u_i)` pairs, the even
cut the reader's default rule makes) of `gate_up_proj` and its bias, the matching rows of
`down_proj`, and `down_proj_bias` on device 0 only (zeros elsewhere: the block's all-reduce adds
it once). With `ep == tp` a device reads its experts (`Reader.expert_ids`) whole, with their
biases; the picks of other devices' experts index past its biases and get zero ones (`_bias`),
so their rows, which the grouped GEMMs write as zeros, stay zero.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ModelConfig
from jaxarena.models.blocks.moe import MoE, _transposed
from jaxarena.models.blocks.moe_routing import gpt_oss_route
from jaxarena.models.checkpoint import FLOAT_DTYPES
from jaxarena.models.core.arena import F32

__all__ = ["GptOssMoE", "deinterleave"]


def deinterleave(a: Any) -> Any:
    """`[..., 2n]` with gate and up interleaved (`g0 u0 g1 u1 ...`) -> `[..., 2n]` as
    `[gate | up]` (`g0 g1 ... u0 u1 ...`); a `ShapeDtypeStruct` passes through."""
    if isinstance(a, jax.ShapeDtypeStruct):
        return a
    return np.concatenate([a[..., 0::2], a[..., 1::2]], axis=-1)


def _bias(b: jax.Array, expert: jax.Array) -> jax.Array:
    """The float32 bias row of each row's expert; zeros for an expert past `b`'s rows (another
    device's, under expert parallelism: `MoE._forward` sends those picks to group `held`)."""
    return b.astype(F32).at[expert].get(mode="fill", fill_value=0.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GptOssMoE(MoE):
    """gpt-oss's routed experts (see the module docstring); no cache.

    Attributes:
      alpha: the GLU's sigmoid gain (`swiglu_alpha`, 1.702).
      limit: the clamp of gate (above) and up (both sides) (`swiglu_limit`, 7.0).

    `MoE`'s routing options do not apply (the router is always gpt-oss's); `act` stays
    `"swiglu"` (the `[gate | up]` GEMM layout), without shared experts or latent projections.

    Parameters: `MoE`'s (`norm`, `router [hidden, E]`, `w_gate_up [E, hidden, 2 * inter]`
    as `[gate | up]`, `w_down [E, inter, hidden]`) plus `router_bias [E]`, `b_gate_up
    [E, 2 * inter]` (`[gate | up]`) and `b_down [E, hidden]`, in the checkpoint's dtype
    (added in float32).
    """

    kind: ClassVar[str] = "moe_gpt_oss"
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.act != "swiglu" or self.shared or self.latent:
            raise ValueError(f"GptOssMoE(act={self.act!r}, shared={self.shared!r}, latent="
                             f"{self.latent}): gpt-oss experts are gated (act='swiglu'), "
                             "without shared experts or latent projections")  # fmt: skip
        if not self.alpha > 0:
            raise ValueError(f"GptOssMoE.alpha={self.alpha!r} must be > 0 (swiglu_alpha)")
        if not self.limit > 0:
            raise ValueError(f"GptOssMoE.limit={self.limit!r} must be > 0 (swiglu_limit)")

    def read_params(self, reader: Any, config: ModelConfig, prefix: str,
                    norm: str) -> dict[str, Any]:  # fmt: skip
        """`{prefix}.router.*` and the fused `{prefix}.experts.*` tensors (module docstring).

        Raises:
          NotImplementedError: MXFP4 or FP8 expert weights.
          CheckpointError: a missing tensor or a shape the config does not imply.
        """
        h, e, inter = config.hidden_size, config.num_experts, config.moe_intermediate_size
        n_all = e  # the router scores every expert
        ex = f"{prefix}.experts"
        if reader.ckpt is not None and f"{ex}.gate_up_proj_blocks" in reader.ckpt:
            raise NotImplementedError(f"{reader.ckpt.path}: {ex}.gate_up_proj_blocks: MXFP4 "
                                      "gpt-oss experts are not implemented; load a bf16 "
                                      "checkpoint")  # fmt: skip
        if reader.fp8 is not None and reader.fp8.quantized(ex):
            raise NotImplementedError(f"{reader.ckpt.path}: FP8 gpt-oss experts ({ex}) are "
                                      "not implemented")  # fmt: skip

        # This device's experts (all of them but under expert parallelism, where the reader
        # cuts the expert axis to the same contiguous range).
        ids = reader.expert_ids(e)
        if len(ids) != e and (ids.step != 1 or ids.start % len(ids)):
            raise NotImplementedError(f"{ex}: expert ids {ids} are not a contiguous block")
        e = len(ids)

        def get(name: str, *shape: int) -> Any:  # as stored (bf16 in releases)
            a = reader.raw(name, shape, FLOAT_DTYPES)
            if a.size > 1 and not any(a.strides):  # the shapes-only reader's zero-strided view
                return jax.ShapeDtypeStruct(a.shape, a.dtype)
            return np.array(a)

        return {
            "norm": reader.vector(norm, h),
            "router": _transposed(reader.matrix(f"{prefix}.router.weight", n_all, h)),
            "router_bias": get(f"{prefix}.router.bias", n_all),
            "w_gate_up": deinterleave(get(f"{ex}.gate_up_proj", e, h, 2 * inter)),
            "b_gate_up": deinterleave(get(f"{ex}.gate_up_proj_bias", e, 2 * inter)),
            "w_down": get(f"{ex}.down_proj", e, inter, h),
            "b_down": get(f"{ex}.down_proj_bias", e, h),
        }

    # -- MoE's hooks ---------------------------------------------------------------------------

    def _router_logits(self, p, x: jax.Array) -> jax.Array:
        """`x @ W_r.T + b_r` in float32 (`GptOssTopKRouter`'s `F.linear` with its bias)."""
        return x @ p["router"].astype(F32) + p["router_bias"].astype(F32)

    def _route(self, p, logits: jax.Array, top_k: int):
        return gpt_oss_route(logits, top_k)

    def _act(self, p, gu: jax.Array, expert: jax.Array) -> jax.Array:
        """The clamped GLU of the `[gate | up]` rows plus their expert's biases."""
        inter = gu.shape[-1] // 2
        gu = gu + _bias(p["b_gate_up"], expert)
        gate = jnp.minimum(gu[:, :inter], self.limit)
        up = jnp.clip(gu[:, inter:], -self.limit, self.limit)
        return (up + 1.0) * (gate * jax.nn.sigmoid(self.alpha * gate))

    def _down_bias(self, p, y: jax.Array, expert: jax.Array) -> jax.Array:
        """The down projection's rows plus their expert's bias (weighted later with them)."""
        return y + _bias(p["b_down"], expert)
