"""The dense MLP: `relu2` (`down(relu(up x)^2)`, Nemotron-H) or `swiglu`
(`down(silu(gate x) * up x)`, Llama / Qwen3; a Llama decoder layer is two blocks, attention
then MLP; gate and up are one weight, one GEMM). Arena regions: the FP8 activation buffers
(`fp8_act*` for K = hidden, `ffn_act_*` for K = intermediate), which the quantizer kernel
writes in place; the GEMM outputs are XLA values rounded as `expert_gate_out`,
`expert_up_out`, `moe_output` would store them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxarena import ModelConfig, workspaces
from jaxarena.models.blocks.base import Env, StatelessBlock, dense_init
from jaxarena.models.core.arena import fp8_regions, fuse_outputs, linear, stored
from jaxarena.models.core.lora import lora_add, lora_tables

__all__ = ["MLP", "FFN_QUANT_REGIONS", "MLP_ACTS", "ffn_down_regions"]

MLP_ACTS = ("relu2", "swiglu", "geglu_tanh")
# Gated MLPs: `down(act(gate x) * up x)`.
_GATES = {"swiglu": jax.nn.silu, "geglu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}
# The FFN down projection quantizes into the dense-FFN activation buffers (when its K, the
# intermediate size, is a multiple of 128; see `workspaces.ffn_fp8_uses_seed_regions` and
# `ffn_down_regions`).
FFN_QUANT_REGIONS = ("ffn_act_a", "ffn_act_scale", "ffn_act_scale_kmajor")


def ffn_down_regions(plan: Any, t: int, k: int) -> tuple[str, str, str] | None:
    """Where a down projection of input width `k` quantizes its `t` rows: the dense-FFN
    buffers (`FFN_QUANT_REGIONS`) when `k` is a multiple of 128 and they hold them (a dense
    model's seed sizes them for max(hidden, intermediate)); else the projections' `fp8_act`
    buffers when they hold them: an MoE model's seed sizes no dense-FFN buffers, yet its dense
    layers (DeepSeek's first `first_k_dense_replace`) and shared experts have FP8 down
    projections, and `fp8_act` is sized for the widest mixer projection (DeepSeek-V3's q
    width 24576 holds its 18432 and 2048). None: the bf16 input is used (see
    `core.arena.fp8_regions`)."""
    if not workspaces.ffn_fp8_uses_seed_regions(k):
        return None
    return fp8_regions(plan, t, k, FFN_QUANT_REGIONS, workspaces.FP8_ACT_REGIONS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLP(StatelessBlock):
    """A dense MLP block (see the module docstring); no cache.

    Attributes:
      act: `"relu2"`, `"swiglu"` or `"geglu_tanh"` (Gemma's `gelu_pytorch_tanh` gate).
      fp8_acts: the projections multiply FP8-quantized activations even when their weights
        are float (the reference hybrid model's choice).

    Parameters: `w_down` (`[inter, hidden]`) and `w_up` (`[hidden, inter]`, `relu2`) or, gated,
    `w_gate_up` (`[hidden, 2 inter]`: the gate's columns, then the up's; one GEMM for both, a
    launch fewer per layer than two), float or FP8 (`jaxarena.models.core.arena`; FP8
    `{"w": [2 inter, hidden], "scale_inv": [2 inter / 128, ...]}`). Where the two cannot be
    one weight (`core.arena.fuse_outputs`: FP8 with `inter % 128 != 0`, or one FP8 and one
    float) `w_gate_up` is the tuple `(gate, up)`: two GEMMs on one input quantization.
    """

    kind: ClassVar[str] = "mlp"
    act: str = "relu2"
    fp8_acts: bool = False

    def __post_init__(self) -> None:
        if self.act not in MLP_ACTS:
            raise ValueError(f"MLP.act={self.act!r} must be one of {MLP_ACTS}")

    def init_params(self, config: ModelConfig, keys: Iterator[jax.Array]) -> dict[str, Any]:
        """Random projections (the down projection scaled by 0.5)."""
        h, inter = config.hidden_size, config.intermediate_size
        p = {}
        if self.act in _GATES:
            # Two draws (the gate's, then the up's): the values of separate weights.
            gate = dense_init(keys, h, inter)
            p["w_gate_up"] = fuse_outputs(gate, dense_init(keys, h, inter))
        else:
            p["w_up"] = dense_init(keys, h, inter)
        p["w_down"] = dense_init(keys, inter, h) * 0.5
        return p

    def read_params(self, reader: Any, config: ModelConfig, prefix: str,
                    norm: str) -> dict[str, Any]:  # fmt: skip
        """`{prefix}.{gate,up,down}_proj` (no gate with `relu2`); gate and up joined into
        `w_gate_up` (see the class docstring). Under tensor parallelism the reader hands out
        this device's slice of each, so a device's `w_gate_up` is its gate slice then its up
        slice, the columns its slice of the activation needs."""
        h, inter = config.hidden_size, config.intermediate_size
        p = {"norm": reader.vector(norm, h)}
        if self.act in _GATES:
            gate = reader.linear(f"{prefix}.gate_proj", inter, h)
            p["w_gate_up"] = fuse_outputs(gate, reader.linear(f"{prefix}.up_proj", inter, h))
        else:
            p["w_up"] = reader.linear(f"{prefix}.up_proj", inter, h)
        p["w_down"] = reader.linear(f"{prefix}.down_proj", h, inter)
        return p

    def prefill(self, env: Env, params, arena, cache, ctx):
        """Every prompt token through the MLP (with its LoRA adapter, `ctx.lora_slots`)."""
        arena, out = self._forward(env, params, arena, ctx.x, ctx.num_tokens, ctx.lora_slots)
        return arena, cache, out

    def decode(self, env: Env, params, arena, cache, ctx):
        """Each sequence's new token through the MLP (with its LoRA adapter)."""
        return self.prefill(env, params, arena, cache, ctx)

    def _forward(self, env: Env, p, arena, x, t: int, lora_slots=None):
        """x (the pre-normed rows) -> up (and gate) -> activation -> down. The GEMM outputs
        stay XLA values, rounded as their regions (`expert_gate_out`, `expert_up_out`,
        `moe_output`) would store them; only the FP8 quantizer writes the arena."""
        c, plan, it = env.config, env.plan, env.interpret
        h, inter = c.hidden_size, c.intermediate_size
        quant = self.fp8_acts
        tabs = lora_tables(p, lora_slots)
        act_regions = workspaces.FP8_ACT_REGIONS
        if self.act in _GATES:
            # One GEMM of the joined weight (or, for a `(gate, up)` tuple, one input
            # quantization for both). `stored_out`: a bf16 weight's product comes out of the
            # GEMM as the bf16 values `stored` would round it to, a bf16 [T, 2 inter] output,
            # not a float32 one twice the size (48 MiB at 2048 rows of Qwen3-0.6B).
            arena, gu = linear(plan, arena, x, (t, h), p["w_gate_up"], act_regions,
                               quant=quant, **env.linear_kw,
                               split=tabs is None, stored_out=True)  # fmt: skip
            if tabs is not None:
                # With LoRA, one [T, 2 inter] output that both deltas are added into in place
                # (the gate's on its first `inter` columns, the up's on the rest).
                arena, (gu,) = lora_add(plan, arena, (gu,), x,
                                        [[tabs["gate_proj"], tabs["up_proj"]]], lora_slots,
                                        interpret=it)  # fmt: skip
                gu = (gu,)
            g, u = gu if len(gu) == 2 else (gu[0][:, :inter], gu[0][:, inter:])
            act = stored(_GATES[self.act](stored(g)) * stored(u))
        else:
            arena, up = linear(plan, arena, x, (t, h), p["w_up"], act_regions, quant=quant,
                               **env.linear_kw)  # fmt: skip
            if tabs is not None:
                arena, (up,) = lora_add(plan, arena, (stored(up),), x, [[tabs["up_proj"]]],
                                        lora_slots, interpret=it)  # fmt: skip
            act = stored(jnp.square(jax.nn.relu(up)))
        # The seed's floor(K / 128) k-major scales cannot hold ceil(K / 128) columns when the
        # intermediate size is not a multiple of 128: that projection reads its bf16 input.
        regions = ffn_down_regions(plan, t, inter)
        arena, down = linear(plan, arena, act, (t, inter), p["w_down"], regions, quant=quant,
                             **env.linear_kw, stored_out=True)  # fmt: skip
        if tabs is not None:
            arena, (down,) = lora_add(plan, arena, (stored(down),), act,
                                      [[tabs["down_proj"]]], lora_slots, interpret=it)  # fmt: skip
        return arena, stored(down)
