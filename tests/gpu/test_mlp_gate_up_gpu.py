"""The gated MLP's gate and up projections are ONE GEMM on the GPU (issue 39): a one-layer
decode step at Qwen3-8B's widths (hidden 4096, intermediate 12288; a 512-token vocabulary to
keep the LM head small), compiled for an H200 without a GPU, launches 5 GEMMs: the layer's
qkv, o, gate|up and down projections and the LM head. With gate and up as two weights it
launched 6 (XLA's dot merger does not join them at these widths: it would concatenate the
weights every step). Compile only; ~10 s on a CI core.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from decode_launches import kind_of  # noqa: E402
from plain_step import abstract_caches, abstract_params, build_model  # noqa: E402

from jaxarena.gpu_aot import compile_for_gpu  # noqa: E402
from jaxarena.gpu_dump import walk  # noqa: E402

S, I32, U8 = jax.ShapeDtypeStruct, jnp.int32, jnp.uint8
_PRESET = Path(__file__).resolve().parents[2] / "jaxarena" / "presets" / "qwen3-8b.json"
BATCH, MAX_SEQ = 8, 256
# Per decoder layer: qkv, o_proj, gate|up, down_proj; one LM head for the step.
GEMMS = 4 + 1


def test_one_layer_decode_runs_gate_and_up_as_one_gemm(h200):
    raw = dict(json.loads(_PRESET.read_text()), num_hidden_layers=1, vocab_size=512)
    m = build_model(raw, max_batch_tokens=BATCH, max_seq_len=MAX_SEQ, max_batch_size=BATCH)
    assert [b.kind for b in m.arch.blocks] == ["attention", "mlp"]
    per = MAX_SEQ // m.kv_block_size
    params = abstract_params(m)
    c = m.config
    assert params["layers"][1]["w_gate_up"].shape == (c.hidden_size, 2 * c.intermediate_size)
    caches = abstract_caches(m, num_blocks=BATCH * per, rows=BATCH)
    v, tables = S((BATCH,), I32), S((BATCH, per), I32)
    res = compile_for_gpu(m.decode_step, params, S(m.plan.arena_shape, U8), caches, v, v,
                          tables, v, target=h200, donate_argnums=(1, 2), dump_dir=True)  # fmt: skip
    kinds = [kind_of(t, res.thunk_names.get(t.thunk_id, "")) for t in walk(res.thunks)
             if not t.sections]  # fmt: skip
    assert kinds.count("gemm") == GEMMS, kinds
