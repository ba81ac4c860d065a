"""What `Engine.from_pretrained` reads and sizes before loading a checkpoint: its EOS ids and
context length, the device's memory, the LoRA slots' tables, and the page pool (from the
budget's arithmetic, `MemoryBudget.kv_pool`, or a given page count)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxarena import MemoryBudget, ModelConfig, Target
from jaxarena._sizing.kv_pool import KVPool, page_bytes, slot_bytes
from jaxarena._units import parse_memory

__all__ = [
    "device_memory",
    "eos_ids",
    "less_lora_tables",
    "max_positions",
    "read_json",
    "size_pool",
]


def eos_ids(path: Path, raw: dict[str, Any]) -> frozenset[int]:
    """EOS ids from `generation_config.json` (int or list), else `config.json`."""
    ids: set[int] = set()
    for source in (raw, read_json(path / "generation_config.json")):
        v = source.get("eos_token_id")
        if isinstance(v, int) and not isinstance(v, bool):
            ids.add(v)
        elif isinstance(v, list):
            ids.update(x for x in v if isinstance(x, int) and not isinstance(x, bool))
    return frozenset(ids)


def max_positions(raw: dict[str, Any]) -> int | None:
    """The model's context length (`max_position_embeddings`, also under `text_config`)."""
    for source in (raw, raw.get("text_config") or {}):
        v = source.get("max_position_embeddings")
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
        return out if isinstance(out, dict) else {}
    except (OSError, ValueError):
        return {}


def less_lora_tables(
    memory: int | str | None, utilization: float, cfg: ModelConfig, max_loras: int
) -> int | str | None:
    """`memory` less the LoRA slots' tables (which the budget's weights do not count), an
    upper bound: every layer's q/k/v/o and a dense MLP's gate/up/down in every slot (bf16 A and
    B at `adapter_max_rank`, a float32 scale). None stays None (the page count is given)."""
    if memory is None:
        memory = device_memory(utilization)
        if memory is None:
            return None
    total = parse_memory(memory)
    h, r = cfg.hidden_size, cfg.adapter_max_rank
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    inter = cfg.intermediate_size
    dims = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]
    per_slot = cfg.num_hidden_layers * sum(2 * r * (i + o) + 4 for i, o in dims)
    return total - max_loras * per_slot


def device_memory(utilization: float) -> int | None:
    """The first GPU's memory limit times `utilization`; None without a GPU."""
    import jax

    dev = jax.devices()[0]
    if dev.platform not in ("gpu", "cuda", "rocm"):
        return None
    stats = dev.memory_stats() or {}
    limit = stats.get("bytes_limit")
    return int(limit * utilization) if limit else None


def size_pool(cfg: ModelConfig, raw: dict[str, Any], *, max_batch_size: int, max_seq_len: int,
              max_batch_tokens: int, kv_block_size: int, memory: int | str | None,
              memory_utilization: float, kv_pages: int | None, kv_dtype: str,
              target: Target, log: Callable[[str], None], tp: int = 1,
              ep: int = 1) -> KVPool:  # fmt: skip
    """The page pool `Engine.from_pretrained` allocates: `kv_pages` as given, else from the
    budget of `memory` (None: the GPU's limit times `memory_utilization`; on a CPU without
    either, pages for `max_batch_size` sequences of `max_seq_len`). Under `tp` / `ep` the
    pool is one device's (`ModelConfig.shard`): pages of its KV heads, its memory."""
    if memory is None and kv_pages is None:
        memory = device_memory(memory_utilization)
        if memory is None:
            kv_pages = max_batch_size * -(-max_seq_len // kv_block_size)
            log(f"no GPU and no --memory / --kv-pages: {kv_pages} pages, "
                f"{max_batch_size} sequences of {max_seq_len} tokens")  # fmt: skip
    if memory is None:  # an explicit page count: no budget needed
        local = cfg.shard(tp=tp, ep=ep) if (tp, ep) != (1, 1) else cfg
        per_page = page_bytes(local, kv_block_size, kv_dtype)
        return KVPool(kv_block_size=kv_block_size, page_bytes=per_page,
                      slot_bytes=slot_bytes(local), slots=max_batch_size + 1, pages=kv_pages,
                      source="given")  # fmt: skip
    quant = raw.get("quantization_config") or {}
    weights = "fp8" if quant.get("quant_method") == "fp8" else "bf16"
    budget = MemoryBudget(config=cfg, memory_bytes=memory, max_batch_tokens=max_batch_tokens,
                          max_seq_len=max_seq_len, kv_block_size=kv_block_size,
                          max_batch_size=max_batch_size, weights=weights,
                          kv_dtype=kv_dtype, target=target, tp=tp, ep=ep)  # fmt: skip
    return budget.kv_pool(kv_pages)
