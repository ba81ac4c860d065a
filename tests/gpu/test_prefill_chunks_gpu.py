"""Token-chunked prefill (`ArenaLM.prefill_chunk`) compiled for an H200 without a GPU, at the
tiny Qwen3 widths of test_step_rule_gpu.py: a 1,024-token prefill in 256-token chunks needs no
more XLA temp than a one-pass prefill of 256 tokens plus what the chunk loop carries (each
sequence's last hidden row, `float32[S, hidden]`), where the one-pass 1,024-token prefill
needs more than twice that. Measured: 5,180,416 B chunked, 5,177,872 B for one pass of 256,
12,059,408 B for one pass of 1,024; launches 163 = 4 x 38 + the loop's. The real widths are
benchmarks/step_costs.py's (`--prefill-chunk`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from jaxarena import gpu_aot

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_step_rule_gpu import TINY, S, _compile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from plain_step import abstract_caches, abstract_params, build_model  # noqa: E402

BATCH, CHUNK, TOKENS = 8, 256, 1024


def _prefill(tokens: int, chunk: int | None):
    m = build_model(TINY, max_batch_tokens=tokens, max_seq_len=tokens, max_batch_size=BATCH)
    m = dataclasses.replace(m, prefill_chunk=chunk)
    per, rows = tokens // m.kv_block_size, BATCH + 1
    caches = abstract_caches(m, num_blocks=rows * per, rows=rows)
    args = (S((tokens,), jnp.int32), S((rows + 1,), jnp.int32), S((rows, per), jnp.int32))
    c = _compile(m.prefill, abstract_params(m), S(m.plan.arena_shape, jnp.uint8), caches,
                 *args, donate=(1, 2))  # fmt: skip
    return m, c


def test_chunked_prefill_temp_is_one_chunks():
    try:
        gpu_aot.gpu_device("h200")
    except gpu_aot.GpuUnavailable as e:
        pytest.skip(f"no compile-only h200 here: {e.reason}")
    m, chunked = _prefill(TOKENS, CHUNK)
    assert m.prefill_chunk_tokens(TOKENS) == CHUNK
    _, one_chunk = _prefill(CHUNK, None)
    _, one_pass = _prefill(TOKENS, None)
    carried = (BATCH + 1) * TINY["hidden_size"] * 4
    assert chunked.temp_bytes <= one_chunk.temp_bytes + carried, (
        chunked.temp_bytes, one_chunk.temp_bytes)  # fmt: skip
    assert 2 * chunked.temp_bytes < one_pass.temp_bytes, (chunked.temp_bytes, one_pass.temp_bytes)
    # The arena and the caches are still updated in place.
    assert chunked.alias_bytes >= m.plan.total_bytes
