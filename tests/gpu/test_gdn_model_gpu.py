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


def test_decode_temp_does_not_grow_with_gdn_layers(tmp_path):
    """Each GDN layer's decode copies its conv window (`f32[B, kernel - 1, conv_dim]`) before
    writing the shifted window over it; XLA sank every layer's update of the donated conv
    cache to the step's end, each copy alive until then, so the decode temp grew by one
    window per GDN layer (768 KiB each for Qwen3-Next at batch 8: 27 MiB over its 36 GDN
    layers). The Qwen3-Next preset's GDN widths (conv_dim 8192)
    around small attention/MoE widths, at 4 and 8 layers (3 GDN + 1 attention per 4): going
    from 4 to 8 layers adds three GDN layers' windows if the copies are alive together, and
    must add less than ONE window (what else grows per layer is small at these widths)."""
    import importlib.resources
    import json

    from jaxarena.step_report import step_report_details

    try:
        gpu_aot.gpu_device(TARGET)
    except gpu_aot.GpuUnavailable as e:
        pytest.skip(f"no compile-only {TARGET} can be made here: {e.reason}")
    preset = importlib.resources.files("jaxarena") / "presets" / "qwen3-next-80b-a3b.json"
    raw = json.loads(preset.read_text())
    raw.update(hidden_size=256, intermediate_size=512, moe_intermediate_size=64, num_experts=8,
               num_experts_per_tok=2, shared_expert_intermediate_size=64, vocab_size=1024,
               num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    batch = 8
    temps = {}
    for layers in (4, 8):
        path = tmp_path / f"L{layers}" / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(dict(raw, num_hidden_layers=layers)))
        d = step_report_details(str(path), target=TARGET, steps=("decode",), max_batch_size=batch,
                                max_seq_len=64, max_batch_tokens=64)  # fmt: skip
        temps[layers] = d["report"]["steps"]["decode"]["temp_bytes"]
    conv_dim = 2 * raw["linear_num_key_heads"] * raw["linear_key_head_dim"] + (
        raw["linear_num_value_heads"] * raw["linear_value_head_dim"]
    )
    window = batch * (raw["linear_conv_kernel_dim"] - 1) * conv_dim * 4
    assert temps[8] - temps[4] < window, (temps, window)
