"""The engine's page pool: what `MemoryBudget.kv_pool` reports is what the models allocate,
to the byte, checked on the abstract shapes of the caches (`jax.eval_shape`, nothing is
allocated) of real presets: dense, MoE, MLA, Mamba-2 hybrid and Gated DeltaNet hybrid."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxarena
from jaxarena import MemoryBudget, ModelConfig, Target
from jaxarena._sizing.kv_pool import sampler_temp_bytes
from jaxarena.models.families.registry import family_for

PRESETS = Path(jaxarena.__file__).parent / "presets"
LIMITS = dict(max_batch_tokens=8192, max_seq_len=32768, kv_block_size=16, max_batch_size=64)


def _cache_bytes(name: str, pages: int, slots: int) -> int:
    """Bytes of the caches the model's blocks make for `pages + 1` pages and `slots` rows."""
    path = PRESETS / f"{name}.json"
    raw = json.loads(path.read_text())
    cfg = ModelConfig.preset(name)
    arch = family_for(raw["model_type"], path.parent).arch(raw["model_type"], raw, cfg,
                                                           path.parent, LIMITS["max_seq_len"])  # fmt: skip
    shapes = jax.eval_shape(lambda: arch.init_caches(cfg, num_blocks=pages + 1,
                                                     kv_block_size=LIMITS["kv_block_size"],
                                                     rows=slots))  # fmt: skip
    return sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in jax.tree.leaves(shapes))


@pytest.mark.parametrize("name,memory", [
    ("qwen3-8b", "141GB"),            # dense
    ("qwen3-30b-a3b", "141GB"),       # MoE
    ("deepseek-v2-lite", "80GB"),     # MLA latent pages
    ("nemotron-h-8b", "141GB"),       # Mamba-2 hybrid: state slots + attention pages
    ("qwen3-next-80b-a3b", "400GB"),  # Gated DeltaNet hybrid
])  # fmt: skip
def test_budget_pool_equals_the_allocation(name, memory):
    budget = MemoryBudget(config=ModelConfig.preset(name), memory_bytes=memory,
                          target=Target.preset("hopper"), **LIMITS)  # fmt: skip
    pool = budget.kv_pool()
    assert pool.source == "budget" and pool.slots == LIMITS["max_batch_size"] + 1
    assert pool.total_bytes == _cache_bytes(name, pool.pages, pool.slots)
    # Nothing beyond the budget's free bytes less the sampler's temp, and less than one page
    # left over.
    free = budget.free_bytes - sampler_temp_bytes(LIMITS["max_batch_size"],
                                                  budget.config.vocab_size)  # fmt: skip
    assert pool.free_bytes == free
    assert pool.total_bytes <= free < pool.total_bytes + pool.page_bytes
    # The pool's paged bytes per token agree with the budget's KV arithmetic where no layer
    # is windowed (the budget counts windowed layers as fixed per-sequence state).
    assert pool.page_bytes == LIMITS["kv_block_size"] * budget.kv_bytes_per_token


def test_explicit_pages_and_errors():
    budget = MemoryBudget(config=ModelConfig.preset("qwen3-8b"), memory_bytes="24GB",
                          target=Target.preset("hopper"), **LIMITS)  # fmt: skip
    assert budget.kv_pool(kv_pages=7).pages == 7
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="kv_pages"):
            budget.kv_pool(kv_pages=bad)
    small = budget.replace(memory_bytes="17GB")  # the weights alone take 16.4 GB
    with pytest.raises(ValueError, match="no KV pages fit"):
        small.kv_pool()
