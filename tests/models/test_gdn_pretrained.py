"""Qwen3.5 (Gated DeltaNet + gated attention) checkpoints on the arena against transformers'
float32 outputs (fixtures `qwen3_5_text` and `qwen3_next`, tools/make_gdn_fixtures.py).

Tolerance: the derivation of tests/models/test_pretrained.py (bf16 stores on the path to a
logit, each a relative perturbation of at most u = 2^-9 of a normalised activation carried
with gain <= 1; atol = 4 u sqrt(n / 3) max|z|), with the roundings of the new blocks:
  - Gated DeltaNet: `ssm_qkvz`, `ssm_ba`, the chunked kernel's bf16 intermediates (W, U, the
    chunk-entry state S and v_new; decode keeps its state in f32 and has fewer), the gated
    norm in `attn_output` (7); the conv output and the gates are stored in f32 (exact);
  - gated attention: `qkv_output`, the bf16 q/k/v of the KV cache, `attn_output`, and
    `attn_output` again after the sigmoid gate (4);
  - plus, as before, 2 per block (`norm_output`, `hidden_states`), 4 per SwiGLU MLP and the
    `logits` store.
For both fixtures (gdn, mlp, attention, mlp): n = 9 + 6 + 6 + 6 + 1 = 28; qwen3_5_text
max|z| = 6.30, atol = 0.150, measured at the time of writing 0.064 (prefill) and 0.066
(decode, same context), 31 of 32 greedy tokens equal (the other follows a near-tie, gap
0.034); qwen3_next max|z| = 6.84, atol = 0.163, measured 0.060 and 0.065, 32 of 32.

Greedy tokens are compared where transformers' top-2 gap exceeds 2 atol and the earlier
tokens agree (test_pretrained.py); decode logits where the earlier tokens agree.

The fixture's GDN conv taps are N(0, 1) so that the gated RMSNorm's input stays above its
`sqrt(eps)` (see tools/make_gdn_fixtures.py): below it, a sequence's first-token output is
proportional to `q . k`, whose cancellation amplifies one bf16 rounding ~10x, and the bound
above (gain <= 1) does not hold.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, check_decode_in_place, reference
from test_pretrained import U_BF16, decided_and_same_context, max_abs_logit, top2_gap

from jaxarena import ModelConfig
from jaxarena.models.blocks.base import StepContext
from jaxarena.models.blocks.causal_conv import prefill_conv
from jaxarena.models.checkpoint import open_checkpoint
from jaxarena.models.families.registry import family_for
from pallas_kernels import gdn_state_update

NAMES = ("qwen3_5_text", "qwen3_next")
ROUNDINGS = {"gdn": 2 + 7, "attention": 2 + 4, "mlp": 2 + 4}


def atol_of(lm, ref) -> float:
    n = 1 + sum(ROUNDINGS[k] for k in lm.model.arch.kinds)
    return 4 * U_BF16 * math.sqrt(n / 3) * max_abs_logit(ref)


@pytest.mark.parametrize("name", NAMES)
def test_arch_is_gdn_then_gated_attention(runs, name):
    lm = runs.lm(name)
    assert lm.model.arch.kinds == ("gdn", "mlp", "attention", "mlp")
    assert lm.model.arch.norm_offset == 1.0
    gdn, attn = lm.model.arch.blocks[0], lm.model.arch.blocks[2]
    assert (gdn.conv_kernel, gdn.interleaved) == (4, name == "qwen3_next")
    assert (attn.gated, attn.rotary_dim, attn.qk_norm, attn.norm_offset) == (True, 16, True, 1.0)


@pytest.mark.parametrize("name", NAMES)
def test_prefill_logits_match_transformers(runs, name):
    r = runs.run(name)
    atol = atol_of(runs.lm(name), r["ref"])
    assert atol < 0.2
    for i, (got, want) in enumerate(zip(r["prefill"], r["ref"]["prefill"], strict=True)):
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=atol, rtol=0, err_msg=f"prompt {i}")


@pytest.mark.parametrize("name", NAMES)
def test_greedy_decode_matches_transformers(runs, name):
    """Prompts of 1, 5, 11 and 16 tokens packed into one prefill, then 7 decode steps."""
    r = runs.run(name)
    ref = r["ref"]
    atol = atol_of(runs.lm(name), ref)
    want = ref["greedy_tokens"]
    same = decided_and_same_context(np.full(want.shape, np.inf), r["tokens"], want, 0.0)
    diff = np.abs(r["logits"] - ref["greedy_logits"]).max(-1)
    np.testing.assert_array_less(diff[same], atol)
    mask = decided_and_same_context(ref["greedy_top2_gap"], r["tokens"], want, 2 * atol)
    assert mask.sum() >= 0.4 * mask.size, f"only {mask.sum()} of {mask.size} choices decided"
    np.testing.assert_array_equal(r["tokens"][mask], want[mask])


@pytest.mark.parametrize("name", NAMES)
def test_decode_loop_equals_teacher_forcing(runs, name):
    r = runs.run(name)
    atol = atol_of(runs.lm(name), r["ref"])
    np.testing.assert_allclose(r["logits"], r["forced"], atol=2 * atol, rtol=0)
    mask = top2_gap(r["forced"]) > 4 * atol
    assert mask.sum() >= 0.2 * mask.size, f"only {mask.sum()} of {mask.size} choices decided"
    np.testing.assert_array_equal(r["tokens"][mask], np.argmax(r["forced"], -1)[mask])


@pytest.mark.parametrize("name", NAMES)
def test_decode_traced_once_in_place_guards_intact(runs, name):
    runs.run(name)
    lm = runs.lm(name)
    mem = check_decode_in_place(lm, name)
    # A copy of the arena would need at least its bytes of temp. On CPU the decode kernel
    # runs in the Pallas interpreter, which keeps its own copies of the state cache (measured:
    # 6.3 MB of temp with it, 2.1 MB with a jnp stand-in); that kernel's temp, compiled on its
    # own for the same cache and batch, is allowed on top. Compiled for a GPU the step's temp
    # is 83 KB for an 8 MB arena (tests/gpu/test_gdn_model_gpu.py).
    assert mem["temp"] < lm.arena_bytes + _state_update_temp(lm), mem


def _state_update_temp(lm) -> int:
    """Temp bytes of `gdn_state_update` alone on this model's state cache and decode batch."""
    key = next(k for k in lm.caches if k.startswith("gdn."))
    state = lm.caches[key]["state"]
    b, (_, nv, dk, dv) = lm.model.max_batch_size, state.shape
    q = jax.ShapeDtypeStruct((b, lm.config.linear_num_key_heads, dk), jnp.float32)
    v = jax.ShapeDtypeStruct((b, nv, dv), jnp.float32)
    g = jax.ShapeDtypeStruct((b, nv), jnp.float32)

    def step(st, q, k, v, g, beta):
        return gdn_state_update(st, q, k, v, g, beta, use_qk_l2norm=True)

    fn = jax.jit(step, donate_argnums=0)
    compiled = fn.lower(jax.ShapeDtypeStruct(state.shape, state.dtype), q, q, v, g, g).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def _bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("name", NAMES)
def test_gdn_intermediates_are_what_the_block_docstring_says(runs, name):
    """Layer 0's GDN intermediates for one prompt (the step rule keeps them as XLA values:
    computed here by the block's own pieces on the stored pre-norm) against float64 from the
    checkpoint: the projection rounded as `ssm_qkvz` stores it (bf16: relative 2^-8), Qwen3-Next's
    regrouping to `[q | k | v | z]` (a copy), silu(conv1d of the sequential q|k|v) and
    `[g | beta]` (float32, as `ssm_conv_out_f32` / `ssm_gates` hold them); after a prefill,
    the arena's scratch `gc` row = the within-chunk cumsum of g.
    Bounds: f32 rounding of a few f32 operations on O(10) values (1e-5 absolute)."""
    lm = runs.lm(name)
    prompt = reference(name)["prompts"][3]
    t = len(prompt)
    lm.prefill_logits(prompt)
    c, plan, arena = lm.config, lm.model.plan, lm.arena
    ckpt = open_checkpoint(CHECKPOINTS / name)
    w = {k: np.asarray(ckpt[k], np.float64) for k in ckpt}
    pre = "model.layers.0.linear_attn."
    nk, nv, r = (
        c.linear_num_key_heads,
        c.linear_num_value_heads,
        c.linear_num_value_heads // c.linear_num_key_heads,
    )
    conv_dim = 2 * nk * 128 + nv * 128
    # Layer 0's normed input, as the decoder rounds it (bf16).
    x = w["model.embed_tokens.weight"][prompt]
    h = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    h = _bf16(h * (1 + w["model.layers.0.input_layernorm.weight"]))
    block, p0 = lm.model.arch.blocks[0], lm.params["layers"][0]
    _, conv_in, z, ba = block._project(lm.model.env, p0, arena, jnp.asarray(h, jnp.float32), t)
    qkvz = np.asarray(jnp.concatenate([conv_in, z], -1), np.float64)
    ba = np.asarray(ba, np.float64)
    if name == "qwen3_next":
        proj = h @ w[pre + "in_proj_qkvz.weight"].T
        # Per key-head group [q_g | k_g | v_g (r heads) | z_g (r heads)], regrouped as
        # [all q | all k | all v | all z].
        groups = proj.reshape(t, nk, -1)
        cuts = [0, 128, 256, 256 + r * 128, 256 + 2 * r * 128]
        proj = np.concatenate(
            [groups[:, :, a:b].reshape(t, -1) for a, b in zip(cuts[:-1], cuts[1:], strict=True)], 1
        )
        ba4 = ba.reshape(t, nk, 2, r)
        b, a = ba4[:, :, 0].reshape(t, nv), ba4[:, :, 1].reshape(t, nv)
    else:
        proj = np.concatenate(
            [h @ w[pre + "in_proj_qkv.weight"].T, h @ w[pre + "in_proj_z.weight"].T], 1
        )
        b, a = ba[:, :nv], ba[:, nv:]
    np.testing.assert_allclose(qkvz, proj, atol=0, rtol=2**-8)
    seq = qkvz
    taps = w[pre + "conv1d.weight"][:, 0, :]  # [conv_dim, 4]
    xin = np.concatenate([np.zeros((3, conv_dim)), seq[:, :conv_dim]])
    conv = sum(xin[j : j + t] * taps[:, j] for j in range(4))
    ctx = StepContext(positions=jnp.arange(t, dtype=jnp.int32),
                      seq_ids=jnp.zeros((t,), jnp.int32), block_tables=jnp.zeros((1, 1), jnp.int32),
                      cu_seqlens=jnp.asarray([0, t], jnp.int32))  # fmt: skip
    got, _ = prefill_conv(conv_in, jnp.asarray(p0["conv_w"], jnp.float32), ctx)
    got = jax.nn.silu(got)
    np.testing.assert_allclose(np.asarray(got, np.float64), conv / (1 + np.exp(-conv)),
                               atol=1e-5, rtol=0)  # fmt: skip
    g = -np.exp(w[pre + "A_log"]) * np.log1p(np.exp(a + w[pre + "dt_bias"]))
    gates = np.concatenate(block._gates(lm.model.env, p0, jnp.asarray(ba), t), 1)
    np.testing.assert_allclose(gates, np.concatenate([g, 1 / (1 + np.exp(-b))], 1), atol=1e-5)
    lo = plan.regions["gdn_fla_scratch"].offset_bytes
    from jaxarena.workspaces import gdn_fla_scratch_layout

    gc_off, _ = gdn_fla_scratch_layout(nv, lm.model.max_batch_tokens)["gc"]
    raw = np.asarray(arena).reshape(-1)[lo + gc_off : lo + gc_off + nv * 256]
    gc = raw.view(np.float32).reshape(nv, 64)[:, :t]  # chunk slot 0: the prompt's one chunk
    np.testing.assert_allclose(gc, np.cumsum(g, 0).T, atol=1e-4)


def test_gdn_value_width_beyond_the_attention_width_matches_transformers(runs):
    """`qwen3_next_wide` (tools/make_gdn_fixtures.py): a GDN value width of 256 beside an
    attention width of 128, once refused because `attn_output` (sized by the attention width)
    would not hold the gated norm's output; that output is an XLA value under the step rule.
    The four prompts prefilled together and two greedy decode steps against transformers,
    bound as above (n = 28 roundings; max|z| = 6.67, atol = 0.159). The fixture's seed keeps
    every first token's GDN q . k well away from 0 (tools/make_gdn_fixtures.py, SEED_OFFSETS)."""
    name = "qwen3_next_wide"
    lm = runs.lm(name)
    c = lm.config
    assert c.linear_num_value_heads * c.linear_value_head_dim > c.num_attention_heads * c.head_dim
    assert lm.model.arch.kinds == ("gdn", "mlp", "attention", "mlp")
    ref = reference(name)
    atol = atol_of(lm, ref)
    assert atol < 0.2
    steps = 3  # the first from the packed prefill (its last row reads every GDN output)
    tokens, logits = lm.generate(ref["prompts"], steps, return_logits=True)
    tokens, want = np.asarray(tokens), ref["greedy_tokens"][:, :steps]
    same = decided_and_same_context(np.full(want.shape, np.inf), tokens, want, 0.0)
    assert same[:, :2].all()
    diff = np.abs(logits - ref["greedy_logits"][:, :steps]).max(-1)
    np.testing.assert_array_less(diff[same], atol)
    mask = decided_and_same_context(ref["greedy_top2_gap"][:, :steps], tokens, want, 2 * atol)
    np.testing.assert_array_equal(tokens[mask], want[mask])


def test_real_config_shapes():
    """The bundled Qwen3.5-35B-A3B preset: a dense `qwen3_5` model_type with experts is refused
    clearly (`qwen3_5_moe` is its own family, tests/models/test_gdn_moe_models.py); the same
    config with a dense MLP builds 30 GDN and 10 gated-attention mixers with rotary dim 64
    (0.25 x 256) and 4-tap convs."""
    import json
    from pathlib import Path

    import jaxarena

    preset = Path(jaxarena.__file__).parent / "presets" / "qwen3.5-35b-a3b.json"
    raw = json.loads(preset.read_text())
    path = Path("/checkpoints/qwen3.5")
    moe = ModelConfig.from_hf(raw)
    with pytest.raises(NotImplementedError, match="num_experts=256 under a dense Qwen3.5"):
        family_for("qwen3_5", path).arch("qwen3_5", raw, moe, path, 4096)
    dense = json.loads(json.dumps(raw))
    dense["model_type"] = "qwen3_5"
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size"):  # fmt: skip
        dense["text_config"].pop(key)
    dense["text_config"].update(model_type="qwen3_5_text", intermediate_size=6144)
    cfg = ModelConfig.from_hf(dense)
    arch = family_for("qwen3_5", path).arch("qwen3_5", dense, cfg, path, 4096)
    kinds = arch.kinds[::2]
    assert (kinds.count("gdn"), kinds.count("attention")) == (30, 10)
    assert kinds[3] == "attention" and kinds[:3] == ("gdn",) * 3
    assert arch.blocks[6].rotary_dim == 64 and arch.blocks[0].conv_kernel == 4


def _write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    """A minimal safetensors writer (header length, JSON header, data), numpy only."""
    import json
    import struct

    names = {"bfloat16": "BF16", "float32": "F32"}
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": names[arr.dtype.name], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(data)]}  # fmt: skip
        blobs.append(data)
        off += len(data)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_conditional_generation_layout_reads_the_text_model(runs, tmp_path):
    """A `Qwen3_5ForConditionalGeneration` checkpoint (`model_type = "qwen3_5"`, the text
    config under `text_config`, tensors under `model.language_model`, a vision tower) loads
    its language model only and computes what the text-only checkpoint computes."""
    import json

    from lm_runs import LIMITS

    from jaxarena.models import load_pretrained

    src = CHECKPOINTS / "qwen3_5_text"
    ckpt = open_checkpoint(src)
    tensors = {}
    for k in ckpt:
        new = k if k == "lm_head.weight" else k.replace("model.", "model.language_model.", 1)
        tensors[new] = np.asarray(ckpt[k])
    tensors["model.visual.patch_embed.proj.weight"] = np.zeros((4, 4), ml_dtypes.bfloat16)
    _write_safetensors(tmp_path / "model.safetensors", tensors)
    text = json.loads((src / "config.json").read_text())
    top = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
           "tie_word_embeddings": text["tie_word_embeddings"], "text_config": text}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(top))
    lm = load_pretrained(tmp_path, **LIMITS, compiler_options=FAST_CPU_COMPILE)
    assert lm.model.arch == runs.lm("qwen3_5_text").model.arch
    prompt = reference("qwen3_5_text")["prompts"][2]
    np.testing.assert_array_equal(
        lm.prefill_logits(prompt), runs.lm("qwen3_5_text").prefill_logits(prompt)
    )


def test_packed_plan_gives_identical_logits(runs):
    """A packed arena (buffers never live together share bytes, from the recorded lifetimes of
    the GDN block's regions and its kernels' scratch) is smaller and computes the same bits."""
    from lm_runs import LIMITS

    from jaxarena.models import load_pretrained

    seq = runs.lm("qwen3_next")
    packed = load_pretrained(
        CHECKPOINTS / "qwen3_next", packed=True, **LIMITS, compiler_options=FAST_CPU_COMPILE
    )
    assert packed.arena_bytes < seq.arena_bytes
    prompt = reference("qwen3_next")["prompts"][3]
    np.testing.assert_array_equal(packed.prefill_logits(prompt), seq.prefill_logits(prompt))
    assert packed.model.plan.check_guards(packed.arena) == []
