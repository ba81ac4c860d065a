"""GPU compile gate of a Gated DeltaNet model's steps, deviceless (`jaxarena.gpu_aot`).

The `qwen3_next` fixture (GDN with interleaved projections, gated attention, SwiGLU MLPs)
loaded with compiled (not interpreted) Pallas kernels; its prefill and decode steps compiled
for an H200 with the arena and the caches donated: every kernel compiles with XLA's
register-spill switch on, the arena and the caches are aliased (written in place), and the
temp stays below the arena's bytes (a copy of the arena would need at least that many).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jaxarena import gpu_aot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
from lm_runs import CHECKPOINTS, LIMITS  # noqa: E402

TARGET = "h200"


@functools.cache
def _lm():
    try:
        gpu_aot.gpu_device(TARGET)
    except gpu_aot.GpuUnavailable as e:
        pytest.skip(f"no compile-only {TARGET} can be made here: {e.reason}")
    from jaxarena.models import load_pretrained

    return load_pretrained(CHECKPOINTS / "qwen3_next", interpret=False, **LIMITS)


def _sds(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _check(res, lm):
    assert res.alias_bytes >= lm.arena_bytes + lm.cache_bytes, res
    assert res.temp_bytes < lm.arena_bytes, (res.temp_bytes, lm.arena_bytes)


def test_decode_step_compiles_in_place():
    lm = _lm()
    b = lm.model.max_batch_size
    rows = jax.ShapeDtypeStruct((b,), jnp.int32)
    res = gpu_aot.compile_for_gpu(
        lm.model.decode_step, jax.tree.map(_sds, lm.params), _sds(lm.arena),
        jax.tree.map(_sds, lm.caches), rows, rows, _sds(lm.block_tables[:b]), rows,
        target=TARGET, donate_argnums=(1, 2), no_spills=True,
    )  # fmt: skip
    _check(res, lm)
    print(f"decode: temp {res.temp_bytes} B, alias {res.alias_bytes} B, arena {lm.arena_bytes} B")


def test_prefill_compiles_in_place():
    lm = _lm()
    t, s = lm.model.max_batch_tokens, lm.model.max_batch_size + 1
    res = gpu_aot.compile_for_gpu(
        lm.model.prefill, jax.tree.map(_sds, lm.params), _sds(lm.arena),
        jax.tree.map(_sds, lm.caches), jax.ShapeDtypeStruct((t,), jnp.int32),
        jax.ShapeDtypeStruct((s + 1,), jnp.int32), _sds(lm.block_tables[:s]),
        target=TARGET, donate_argnums=(1, 2), no_spills=True,
    )  # fmt: skip
    _check(res, lm)
    print(f"prefill: temp {res.temp_bytes} B, alias {res.alias_bytes} B, arena {lm.arena_bytes} B")
