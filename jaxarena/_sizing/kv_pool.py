"""The serving engine's KV page pool, from the same arithmetic as `MemoryBudget`.

The engine (`jaxarena.engine`) allocates, once, what this module says: `pages + 1` KV pages
(page 0 is the null page the padding rows of a fixed-shape step write into) over every layer
whose cache is paged, and `slots` recurrent-state rows (`max_batch_size` request slots plus
one padding slot) for the Mamba-2 / Gated DeltaNet layers. The bytes mirror the caches the
models allocate (`Block.init_cache`), which the tests check against the abstract shapes:

* a page of an attention layer: `kv_block_size * 2 * kv_heads * head_dim` in the KV dtype,
  sliding-window layers included (the engine does not recycle pages inside a window: every
  attention layer writes through the one block table of its sequence; for a model whose
  layers are all windowed, e.g. Mistral v0.1, that keeps up to `max_seq_len` tokens where the
  model reads `sliding_window`);
* a page of an MLA layer: `kv_block_size * (kv_lora_rank + qk_rope_head_dim)` in the KV dtype;
* a slot of a Mamba-2 layer: its float32 conv window `(4 - 1) * d_xbc` and float32 SSM state
  `heads * head_dim * d_state`; of a Gated DeltaNet layer: its float32 conv window
  `(conv_kernel - 1) * (2 k_heads k_dim + v_heads v_dim)` and float32 state
  `v_heads * k_dim * v_dim`. (The models keep conv windows in float32: `MemoryBudget`'s
  `state_bytes_per_sequence` counts them in bf16, as the reference runtime stores them.)

`pages = (free - slots * slot_bytes) // page_bytes - 1` (a model without paged layers gets
`max_batch_size` full-length sequences' pages, which cost nothing), with `free` the budget's
`memory - weights - arena - reserve` (the reserve being 1 GiB plus the compiled or estimated
XLA temp of a step) less the sampler's temp (`sampler_temp_bytes`). Imports no jax.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from jaxarena._sizing.cache import dtype_bytes
from jaxarena._sizing.weights import layer_kinds
from jaxarena._units import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from jaxarena._config.model import ModelConfig

__all__ = ["KVPool", "kv_pool", "page_bytes", "sampler_temp_bytes", "slot_bytes"]

_MAMBA2_CONV_KERNEL = 4  # jaxarena.models.blocks.mamba2.CONV_KERNEL
_F32 = 4


# The engine's sampler holds about four float32 [max_batch_size, vocab] arrays of XLA temp at
# once when every branch runs (penalties, the top-k/top-p sort, the Gumbel noise): measured
# 153 MiB for 64 rows of Qwen3's 151,936-token vocabulary on a deviceless H200 compile,
# 3.94x one such array (jaxarena/engine/sampling.py). The step estimate does not hold it.
SAMPLER_TEMP_ARRAYS = 4


def sampler_temp_bytes(rows: int, vocab_size: int) -> int:
    """XLA temp the engine's sampler adds to a step: `SAMPLER_TEMP_ARRAYS` float32 arrays of
    `[rows, vocab_size]`."""
    return SAMPLER_TEMP_ARRAYS * rows * vocab_size * _F32


def page_bytes(config: ModelConfig, kv_block_size: int, kv_dtype: str = "bf16") -> int:
    """Bytes of one KV page (`kv_block_size` tokens) over every paged layer of `config`."""
    item = dtype_bytes(kv_dtype, "kv_dtype")
    per_token = 0
    for kind in layer_kinds(config):
        if kind == "attention":
            per_token += 2 * config.num_key_value_heads * config.head_dim * item
        elif kind == "mla":
            per_token += (config.kv_lora_rank + config.qk_rope_head_dim) * item
    return kv_block_size * per_token


def slot_bytes(config: ModelConfig) -> int:
    """Bytes of one sequence slot's recurrent state over every Mamba-2 / GDN layer."""
    c, total = config, 0
    for kind in layer_kinds(c):
        if kind == "mamba2":
            total += (_MAMBA2_CONV_KERNEL - 1) * c.mamba2_d_xbc * _F32
            total += c.mamba_num_heads * c.mamba_head_dim * c.ssm_state_size * _F32
        elif kind == "gdn":
            conv = 2 * c.linear_num_key_heads * c.linear_key_head_dim
            conv += c.linear_num_value_heads * c.linear_value_head_dim
            total += (c.conv_kernel - 1) * conv * _F32
            total += (c.linear_num_value_heads * c.linear_key_head_dim
                      * c.linear_value_head_dim * _F32)  # fmt: skip
        elif kind == "mamba1":
            raise NotImplementedError("Mamba-1 layers have no serving cache in jaxarena")
    return total


@dataclasses.dataclass(frozen=True, kw_only=True)
class KVPool:
    """The page pool the engine allocates (see the module docstring).

    Attributes:
      kv_block_size: tokens per page.
      page_bytes: bytes of one page over every paged layer.
      slot_bytes: bytes of one slot's recurrent state over every recurrent layer.
      slots: recurrent-state rows (`max_batch_size + 1`).
      pages: usable pages (the allocation holds one more, the null page 0).
      source: `"budget"` (from the device memory) or `"given"` (an explicit page count).
      free_bytes: what the budget left for the pool (None when the count was given).
    """

    kv_block_size: int
    page_bytes: int
    slot_bytes: int
    slots: int
    pages: int
    source: str
    free_bytes: int | None = None

    @property
    def kv_bytes(self) -> int:
        """Bytes of the pages, the null page included."""
        return (self.pages + 1) * self.page_bytes

    @property
    def state_bytes(self) -> int:
        """Bytes of the recurrent-state slots."""
        return self.slots * self.slot_bytes

    @property
    def total_bytes(self) -> int:
        """What the engine allocates for its caches: `kv_bytes + state_bytes`."""
        return self.kv_bytes + self.state_bytes

    @property
    def kv_tokens(self) -> int:
        """Tokens of context the usable pages hold."""
        return self.pages * self.kv_block_size

    def table(self) -> str:
        """The arithmetic, one line each (what `jaxarena serve` prints at start-up)."""
        lines = []
        if self.free_bytes is not None:
            lines.append(f"free for the pool   {format_bytes(self.free_bytes):>12}")
        lines += [
            f"state slots         {self.slots:>12,} x {format_bytes(self.slot_bytes)}"
            f" = {format_bytes(self.state_bytes)}",
            f"KV pages            {self.pages:>12,} (+1 null) x {format_bytes(self.page_bytes)}"
            f" = {format_bytes(self.kv_bytes)} ({self.kv_tokens:,} tokens of"
            f" {self.kv_block_size})",
            f"pool total          {format_bytes(self.total_bytes):>12} ({self.source})",
        ]
        return "\n".join(lines)


def kv_pool(budget: Any, *, kv_pages: int | None = None) -> KVPool:
    """The engine's pool for `budget`'s model, limits and device memory (a `MemoryBudget`),
    or `kv_pages` pages.

    Raises:
      ValueError: `kv_pages` < 1, or the budget leaves no room for one page per slot after
        the weights, arena, reserve and states (the message gives the figures).
    """
    c = budget.config
    if (budget.tp, budget.ep) != (1, 1):
        c = budget.local_config
    per_page = page_bytes(c, budget.kv_block_size, budget.kv_dtype)
    per_slot = slot_bytes(c)
    slots = budget.max_batch_size + 1
    common: dict[str, Any] = dict(kv_block_size=budget.kv_block_size, page_bytes=per_page,
                                  slot_bytes=per_slot, slots=slots)  # fmt: skip
    if kv_pages is not None:
        if isinstance(kv_pages, bool) or not isinstance(kv_pages, int) or kv_pages < 1:
            raise ValueError(f"kv_pages={kv_pages!r} must be an int >= 1")
        return KVPool(pages=kv_pages, source="given", **common)
    free = budget.free_bytes - sampler_temp_bytes(budget.max_batch_size, c.vocab_size)
    room = free - slots * per_slot
    if per_page == 0:
        # No paged layer (Mamba-2 alone): pages cost nothing, so every slot gets its full
        # length's worth; only the states must fit.
        pages = budget.max_batch_size * -(-budget.max_seq_len // budget.kv_block_size)
        pages = pages if room >= 0 else 0
    else:
        pages = room // per_page - 1
    if pages < 1:
        raise ValueError(
            f"no KV pages fit: {format_bytes(budget.memory_bytes)} of memory minus weights "
            f"{format_bytes(budget.weight_bytes)}, arena {format_bytes(budget.arena_bytes)} and "
            f"reserve {format_bytes(budget.reserve_bytes)} leaves {format_bytes(free)}, and "
            f"{slots} state slots take {format_bytes(slots * per_slot)}; give more memory, "
            "lower max_batch_size / max_batch_tokens, or quantize the weights"
        )  # fmt: skip
    return KVPool(pages=pages, source="budget", free_bytes=free, **common)
