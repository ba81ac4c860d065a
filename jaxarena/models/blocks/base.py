"""What a block is: the interface every residual mixer implements, the static environment it
runs against (`Env`) and the per-step context it reads (`StepContext`).

A block is a frozen (hashable) dataclass holding only its family-specific choices (RoPE or
not, the MLP activation, ...). Its methods are pure functions of `(params, arena, cache,
ctx)`: the decoder (`jaxarena.models.stack`) does the pre-norm into `norm_output` and the
residual add; the block reads `norm_output` from the arena and returns its output rows. So
a block can run under `lax.scan` over stacked parameters (the arena and its cache as carry)
and its attention can read whatever `StepContext` carries (block tables, sequence lengths).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from jaxarena import ArenaPlan, Levers, ModelConfig, Target
from jaxarena.models.core.kernels import check_kernels

__all__ = ["SCAN_INDEX", "Block", "Env", "StatelessBlock", "StepContext", "dense_init"]

SCAN_INDEX = "scan_index"
"""The parameter key holding a scanned block's repetition (`int32` scalar) when the block has
`Block.scan_in_place` keys; absent in an unrolled step."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Env:
    """What every block of one model runs against (static, hashable).

    Attributes:
      config: the model dimensions.
      plan: the arena layout.
      kv_block_size: tokens per page of the paged KV cache.
      target, levers: the split-K decode policy (the plan's workspace was sized with them).
      interpret: Pallas interpret mode (None: on CPU).
      kernels: the kernel backend (`core.kernels`): `"pallas"` runs the Pallas kernels
        (interpreted on CPU), `"xla"` their plain-XLA implementations (the CPU's fast path).
      tp_axis: the mesh axis a tensor-parallel model runs over (`config` is one device's
        share; `jaxarena.models.tensor_parallel`), None on one device. An MoE block whose
        weights hold fewer experts than `config.num_experts` runs this device's experts
        (expert parallelism over the same axis).
      tp_groups: with `tp_axis`, the whole model's Mamba-2 `n_groups` when it may be fewer
        than the devices (`config.n_groups` is then 1, the group replicated): the gated
        RMSNorm's group then spans `tp / tp_groups` devices and its sum of squares is
        all-reduced (`Mamba2`). None, or at least `tp`: every group lies on one device.
      fp8_act_values: FP8 projections quantize their input activations as values (the
        `fp8_block_quant` kernel's own outputs) instead of into the arena's FP8 regions
        (`core.arena.linear`'s `act_values`): the decode step's choice, whose inputs are a
        few rows (at most `max_batch_size`), so no arena slice is copied out for each GEMM.
    """

    config: ModelConfig
    plan: ArenaPlan
    kv_block_size: int
    target: Target
    levers: Levers
    interpret: bool | None = None
    kernels: str = "pallas"
    tp_axis: str | None = None
    tp_groups: int | None = None
    fp8_act_values: bool = False

    def __post_init__(self) -> None:
        check_kernels(self.kernels, "Env.kernels")

    @property
    def linear_kw(self) -> dict[str, Any]:
        """The keyword arguments of `core.arena.linear` this environment sets: the Pallas
        mode, the kernel backend and where FP8 activations are quantized."""
        return {"interpret": self.interpret, "kernels": self.kernels,
                "act_values": self.fp8_act_values}  # fmt: skip


class StepContext(NamedTuple):
    """The per-step arrays every block may read (a pytree; `None` fields are absent).

    Attributes:
      positions: `int32[T]`, each token's position in its sequence.
      seq_ids: `int32[T]`, each token's sequence (its cache row and block-table row).
      block_tables: `int32[S, max_blocks_per_seq]`, the KV pages of each sequence.
      cu_seqlens: prefill only: `int32[S + 1]`, sequence `s` is tokens
        `cu_seqlens[s]:cu_seqlens[s + 1]` (packed prompts).
      x: the block's input, the pre-normed rows (`float32[T, hidden]`, bf16-rounded), for a
        block with `input_in_ctx`; None for the others, which read `norm_output`.
      seq_lens: `int32[S]`, each sequence's length after this step (decode: after its new
        token; prefill: its cached tokens plus this chunk, None in a plain prefill where it
        is the chunk's length).
      cached_lens: chunked prefill only: `int32[S]`, the tokens of each sequence already
        in the caches from earlier chunks (this chunk continues them: a block with
        `chunked_prefill` starts each sequence from its cached state); None in a plain
        prefill and in decode.
      lora_slots: `int32[T]`, each token's LoRA adapter slot (-1: the base model), for a
        model loaded with `max_lora_rank > 0` (`jaxarena.models.core.lora`); None: no LoRA.
    """

    positions: jax.Array
    seq_ids: jax.Array
    block_tables: jax.Array
    cu_seqlens: jax.Array | None = None
    seq_lens: jax.Array | None = None
    x: jax.Array | None = None
    cached_lens: jax.Array | None = None
    lora_slots: jax.Array | None = None

    @property
    def num_tokens(self) -> int:
        """T, the rows of this step (static)."""
        return self.positions.shape[0]


class Block:
    """A residual mixer: `x += mixer(rmsnorm(x))`. Subclasses are frozen dataclasses that set
    `kind` (their name in `jaxarena.models.blocks.registry.BLOCKS`) and implement:

    - `init_params(config, keys)`: random weights (the reference hybrid), drawing keys from
      the iterator `keys` in a fixed order;
    - `read_params(reader, config, prefix, norm)`: the weights of a HuggingFace checkpoint,
      the mixer's tensors under `prefix` and the pre-norm weight named `norm`;
    - `init_cache(config, *, num_blocks, kv_block_size, rows)`: its zeroed decode cache (None
      when it keeps none);
    - `prefill(env, params, arena, cache, ctx)` and `decode(...)`: read `norm_output`
      (`[T, hidden]`) from the arena, return `(arena, cache, out float32[T, hidden])`.

    Every parameter dict also holds `"norm"`, the pre-norm weight the decoder applies.
    """

    kind: ClassVar[str] = ""
    # True: the block reads its input from `ctx.x` (an XLA value), so the decoder does not
    # store it in `norm_output`; False: from the arena's `norm_output`.
    input_in_ctx: ClassVar[bool] = False
    # True: the cache is paged, every leaf `[num_blocks, ...]` indexed only through
    # `ctx.block_tables` (a scanned run joins its layers' pages: `models/scan_layers.py`).
    paged_kv: ClassVar[bool] = False
    # True: `prefill` continues sequences from earlier chunks (`ctx.cached_lens`): a prompt
    # may be prefilled in pieces. False: the decoder refuses chunked prefill for the model.
    chunked_prefill: ClassVar[bool] = False
    # Parameter keys a scanned run (`models/scan_layers.py`) does not slice per repetition:
    # their stacked leaves `[R, E, ...]` reach the block whole as `[R * E, ...]` (a free
    # reshape), with the repetition in `params[SCAN_INDEX]`, and the block reads its `E`
    # entries at `SCAN_INDEX * E` in place (the MoE block's experts: no per-layer copy).
    scan_in_place: ClassVar[tuple[str, ...]] = ()

    def init_params(self, config: ModelConfig, keys: Iterator[jax.Array]) -> dict[str, Any]:
        """Random float32 weights of this mixer (without the pre-norm)."""
        raise NotImplementedError(f"{type(self).__name__} has no random initialisation")

    def read_params(self, reader: Any, config: ModelConfig, prefix: str,
                    norm: str) -> dict[str, Any]:  # fmt: skip
        """This mixer's weights (and its pre-norm's, `"norm"`) from a checkpoint reader."""
        raise NotImplementedError(f"{type(self).__name__} cannot read checkpoints")

    def init_cache(self, config: ModelConfig, *, num_blocks: int, kv_block_size: int,
                   rows: int) -> Any:  # fmt: skip
        """The zeroed decode cache of this block; None when it keeps none."""
        return None

    def prefill(self, env: Env, params: dict[str, Any], arena: jax.Array, cache: Any,
                ctx: StepContext) -> tuple[jax.Array, Any, jax.Array]:  # fmt: skip
        """The packed prompts' pass; returns `(arena, cache, out float32[T, hidden])`."""
        raise NotImplementedError

    def decode(self, env: Env, params: dict[str, Any], arena: jax.Array, cache: Any,
               ctx: StepContext) -> tuple[jax.Array, Any, jax.Array]:  # fmt: skip
        """One new token per sequence; returns `(arena, cache, out float32[B, hidden])`."""
        raise NotImplementedError


class StatelessBlock(Block):
    """A block that keeps no cache and treats prompt and decode tokens alike (MLP, MoE):
    subclasses implement `_forward(env, params, arena, x, t) -> (arena, out float32[T,
    hidden])` on the pre-normed rows `x` (`input_in_ctx`); the cache (None) passes through."""

    input_in_ctx: ClassVar[bool] = True
    chunked_prefill: ClassVar[bool] = True  # nothing carries across tokens

    def _forward(self, env: Env, params: dict[str, Any], arena: jax.Array, x: jax.Array,
                 t: int) -> tuple[jax.Array, jax.Array]:  # fmt: skip
        raise NotImplementedError

    def prefill(self, env: Env, params: dict[str, Any], arena: jax.Array, cache: Any,
                ctx: StepContext) -> tuple[jax.Array, Any, jax.Array]:  # fmt: skip
        """Every prompt token through `_forward`; the cache (None) passes through."""
        arena, out = self._forward(env, params, arena, ctx.x, ctx.num_tokens)
        return arena, cache, out

    def decode(self, env: Env, params: dict[str, Any], arena: jax.Array, cache: Any,
               ctx: StepContext) -> tuple[jax.Array, Any, jax.Array]:  # fmt: skip
        """Each sequence's new token through `_forward`; the cache (None) passes through."""
        arena, out = self._forward(env, params, arena, ctx.x, ctx.num_tokens)
        return arena, cache, out


def dense_init(keys: Iterator[jax.Array], fan_in: int, fan_out: int) -> jax.Array:
    """A random `float32[fan_in, fan_out]` weight, N(0, 1/fan_in), from the next key."""
    return jax.random.normal(next(keys), (fan_in, fan_out), jnp.float32) / math.sqrt(fan_in)
