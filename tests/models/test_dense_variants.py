"""Dense variants (issue #25) against transformers' float32 outputs: Llama with llama3 RoPE,
Qwen2 (q/k/v biases), Mistral with a sliding window shorter than the prompts, Gemma 2
(soft-caps, four norms, GeGLU, query_pre_attn_scalar) and Gemma 3 text (q/k norms, sliding
and global layers with their own RoPE, linear-scaled global RoPE). Fixtures:
tools/make_dense_fixtures.py.

Tolerance. The roundings on the path to a logit are those of test_pretrained.py (a GeGLU MLP
stores what a SwiGLU one does; Gemma's post-norms, embedding scale (sqrt(64) = 8, exact in
bf16), biases and soft-caps add no store): n roundings, each moving a logit by at most
u * max|z| (a relative perturbation of a normalised activation carried with gain <= 1).
- Largest difference: the worst case of that model, atol = n * u * max|z| (no independence
  assumed: the errors of one position's 256 logits all come from one hidden-state error, so
  they are correlated and heavier-tailed than test_pretrained's 4-sigma rule assumes; a Qwen2
  logit lands at 5 sigma in prefill and 6.7 sigma in decode).
- RMS difference: with independent roundings, sigma = u * sqrt(n / 3) * max|z|.
Greedy decode: logits are compared where the sequence's earlier tokens agree with
transformers' (a near-tie that flips a token changes the context after it: mistral_window
flips one at a top-2 gap of 0.036); tokens where transformers' gap exceeds 2 * atol.
Teacher forcing (decode loop vs prefill of the same tokens): each within atol of exact.

Measured at the time of writing (bound; prefill max / RMS; decode max where the context
agrees; tokens equal to transformers'): llama3 (0.294; 0.116 / 0.021; 0.119; 31 of 32),
qwen2 (0.285; 0.172 / 0.022; 0.230; 32), mistral_window (0.301; 0.126 / 0.018; 0.082; 28,
one near-tie flip at step 4 of prompt 1), gemma2 (0.198; 0.048 / 0.009; 0.044; 32),
gemma3_text (0.288; 0.043 / 0.010; 0.054; 32).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, check_decode_in_place, reference

from jaxarena import ModelConfig
from jaxarena.models import load_pretrained
from jaxarena.models.families.registry import family_for

VARIANTS = ("llama3", "qwen2", "mistral_window", "gemma2", "gemma3_text")
U_BF16 = 2.0**-9
ROUNDINGS = {"attention": 2 + 3, "swiglu": 2 + 4, "geglu_tanh": 2 + 4}


def max_abs(ref) -> float:
    return float(
        max(np.abs(ref["greedy_logits"]).max(), *(np.abs(x).max() for x in ref["prefill"]))
    )


def roundings(lm) -> int:
    kinds = [b.act if b.kind == "mlp" else b.kind for b in lm.model.arch.blocks]
    return 1 + sum(ROUNDINGS[k] for k in kinds)


def sigma(lm, ref) -> float:
    return U_BF16 * math.sqrt(roundings(lm) / 3) * max_abs(ref)


def atol(lm, ref) -> float:
    return roundings(lm) * U_BF16 * max_abs(ref)


def same_context(got, want):
    """Steps whose earlier generated tokens agree with transformers'."""
    eq = np.concatenate([np.ones((got.shape[0], 1), bool), got[:, :-1] == want[:, :-1]], 1)
    return np.cumprod(eq, 1).astype(bool)


@pytest.mark.parametrize("name", VARIANTS)
def test_prefill_logits_match_transformers(runs, name):
    r = runs.run(name)
    lm, ref = runs.lm(name), r["ref"]
    bound, s = atol(lm, ref), sigma(lm, ref)
    diffs = np.concatenate([(g - w).ravel() for g, w in zip(r["prefill"], ref["prefill"],
                                                            strict=True)])  # fmt: skip
    assert np.abs(diffs).max() <= bound, (np.abs(diffs).max(), bound)
    assert np.sqrt(np.mean(diffs**2)) <= s


@pytest.mark.parametrize("name", VARIANTS)
def test_greedy_decode_matches_transformers(runs, name):
    """Prompts of 1, 5, 11 and 16 tokens packed into one prefill, then 7 decode steps."""
    r = runs.run(name)
    lm, ref = runs.lm(name), r["ref"]
    bound = atol(lm, ref)
    want = ref["greedy_tokens"]
    same = same_context(r["tokens"], want)
    assert same.mean() >= 0.75
    diff = (r["logits"] - ref["greedy_logits"])[same]
    assert np.abs(diff).max() <= bound and np.sqrt(np.mean(diff**2)) <= sigma(lm, ref)
    decided = same & (ref["greedy_top2_gap"] > 2 * bound)
    # Measured: 9 (llama3) to 17 (qwen2) of 32 choices decided; the floor keeps this from
    # being vacuous.
    assert decided.sum() >= 0.25 * decided.size
    np.testing.assert_array_equal(r["tokens"][decided], want[decided])


@pytest.mark.parametrize("name", VARIANTS)
def test_decode_loop_equals_teacher_forcing_in_place(runs, name):
    r = runs.run(name)
    lm, ref = runs.lm(name), r["ref"]
    bound = atol(lm, ref)
    np.testing.assert_allclose(r["logits"], r["forced"], atol=2 * bound, rtol=0)
    mem = check_decode_in_place(lm, name)
    assert mem["temp"] < lm.arena_bytes


def test_the_variants_build_the_blocks_their_configs_ask_for(runs):
    llama3 = runs.lm("llama3").model.arch.blocks[0]
    assert llama3.rope_inv_freq is not None and llama3.rope_scaling == 1.0
    assert runs.lm("qwen2").model.arch.blocks[0].qkv_bias
    assert not runs.lm("qwen2").model.arch.blocks[0].o_bias
    assert {b.window for b in runs.lm("mistral_window").model.arch.blocks[::2]} == {4}
    g2 = runs.lm("gemma2").model.arch
    assert [b.window for b in g2.blocks[::2]] == [4, None]
    assert g2.blocks[0].softcap == 1.5 and g2.final_softcap == 5.0 and g2.embed_scale == 8.0
    assert g2.blocks[0].scale == 24**-0.5 and g2.blocks[1].act == "geglu_tanh"
    g3 = runs.lm("gemma3_text").model.arch.blocks
    assert g3[0].qk_norm and g3[0].rope_theta == 1e4 and g3[0].rope_inv_freq is None
    # global layer: linear x8 at theta 1e6 (first frequency 1 / 8)
    assert g3[2].rope_inv_freq[0] == pytest.approx(1 / 8) and g3[2].window is None


def test_sliding_window_that_never_binds_is_full_attention(tmp_path):
    """A window of at least max_seq_len equals full attention: the same model as Llama's."""
    d = tmp_path / "m"
    shutil.copytree(CHECKPOINTS / "mistral_window", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["sliding_window"] = LIMITS["max_seq_len"]
    (d / "config.json").write_text(json.dumps(cfg))
    lm = load_pretrained(d, **LIMITS, compiler_options=FAST_CPU_COMPILE)
    assert {b.window for b in lm.model.arch.blocks[::2]} == {None}


def test_gemma3_conditional_generation_layout(runs, tmp_path):
    """Gemma3ForConditionalGeneration: the language model under `language_model.model.*`
    (released) with a vision tower and projector the text model does not read, and the text
    fields under `text_config`: the same logits as the text-only checkpoint."""
    import ml_dtypes
    from test_checkpoint_errors import tensors_of, write_safetensors

    src = CHECKPOINTS / "gemma3_text"
    d = tmp_path / "gemma3"
    d.mkdir()
    text = json.loads((src / "config.json").read_text())
    cfg = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
           "text_config": {**text, "model_type": "gemma3_text"},
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8,
                             "intermediate_size": 16, "num_hidden_layers": 1,
                             "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
           "mm_tokens_per_image": 4, "tie_word_embeddings": False}  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg))
    tensors = {k.replace("model.", "language_model.model.", 1): v
               for k, v in tensors_of("gemma3_text").items()}  # fmt: skip
    tensors["vision_tower.vision_model.post_layernorm.weight"] = np.ones(8, ml_dtypes.bfloat16)
    tensors["multi_modal_projector.mm_input_projection_weight"] = np.ones((8, 64),
                                                                          ml_dtypes.bfloat16)  # fmt: skip
    write_safetensors(d / "model.safetensors", tensors)
    lm = load_pretrained(d, **LIMITS, compiler_options=FAST_CPU_COMPILE)
    assert lm.model.arch == runs.lm("gemma3_text").model.arch
    prompt = reference("gemma3_text")["prompts"][3]
    np.testing.assert_array_equal(lm.prefill_logits(prompt),
                                  runs.lm("gemma3_text").prefill_logits(prompt))  # fmt: skip


def test_llama31_preset_config_builds_its_llama3_rope():
    """The bundled llama3.1-8b config (legacy `rope_scaling` spelling, llama3 type) builds
    attention blocks with the table transformers computes for it (rope_reference.npz
    `llama3`, the same parameters)."""
    import jaxarena

    path = Path(jaxarena.__file__).parent / "presets" / "llama3.1-8b.json"
    raw = json.loads(path.read_text())
    cfg = ModelConfig.from_hf(path)
    arch = family_for(raw["model_type"], path.parent).arch(raw["model_type"], raw, cfg,
                                                           path.parent, 8192)  # fmt: skip
    with np.load(CHECKPOINTS.parent / "rope_reference.npz") as r:
        want = r["llama3_inv_freq"]
    blocks = arch.blocks[::2]
    assert len(blocks) == 32 and len({b.rope_inv_freq for b in blocks}) == 1
    np.testing.assert_allclose(np.array(blocks[0].rope_inv_freq), want, rtol=2.0**-24 * 64)


def test_attention_sinks_in_prefill_agree_with_split_k_decode():
    """Attention sinks (gpt-oss; no dense family here uses them): the llama fixture with a sink
    logit of 1.5 per head on every attention block. The decode loop (split-K kernel with
    `sinks`, tested against its own reference in tests/kernels) and a prefill-only
    recomputation of the same tokens (the dense softmax with the sink column) agree within
    2 * atol (each within atol of the exact values), and the sinks change the logits by far more
    than that."""
    import dataclasses

    import jax.numpy as jnp

    from jaxarena.models.runtime import CausalLM

    base = load_pretrained(CHECKPOINTS / "llama", **LIMITS, compiler_options=FAST_CPU_COMPILE)
    ref = reference("llama")
    arch = base.model.arch
    blocks = tuple(dataclasses.replace(b, sinks=True) if b.kind == "attention" else b
                   for b in arch.blocks)  # fmt: skip
    model = dataclasses.replace(base.model, arch=dataclasses.replace(arch, blocks=blocks))
    hq = base.config.num_attention_heads
    params = {**base.params, "layers": [
        {**p, "sinks": jnp.full((hq,), 1.5, jnp.float32)} if b.kind == "attention" else p
        for b, p in zip(blocks, base.params["layers"], strict=True)]}  # fmt: skip
    plain_logits = base.prefill_logits(ref["prompts"][2])
    lm = CausalLM(model=model, params=params, path=base.path, model_type="llama", fp8=False,
                  arena=model.plan.allocate(), caches=model.init_caches(
                      num_blocks=base.caches["attention.000"]["k"].shape[0],
                      rows=LIMITS["max_batch_size"] + 1),
                  block_tables=base.block_tables)  # fmt: skip
    prompt = ref["prompts"][2]
    tokens, logits = lm.generate([prompt], 6, return_logits=True)
    forced = lm.prefill_logits(prompt + tokens[0][:-1])[len(prompt) - 1 :]
    bound = roundings(base) * U_BF16 * float(np.abs(forced).max())
    np.testing.assert_allclose(logits[0], forced, atol=2 * bound, rtol=0)
    assert np.abs(forced[0] - plain_logits[-1]).max() > 4 * bound


def _with_config(tmp_path, src: str, **changes) -> Path:
    d = tmp_path / src
    shutil.copytree(CHECKPOINTS / src, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_rope_types_a_fixed_step_cannot_serve_are_refused_naming_the_file(tmp_path):
    dyn = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    d = _with_config(tmp_path, "llama3", rope_parameters=dyn, max_position_embeddings=16)
    with pytest.raises(NotImplementedError, match=r"config\.json: rope_type='dynamic'"):
        load_pretrained(d, **LIMITS, compiler_options=FAST_CPU_COMPILE)
    d = _with_config(tmp_path / "b", "llama3", rope_parameters=dyn, max_position_embeddings=64)
    assert (
        load_pretrained(d, **LIMITS, compiler_options=FAST_CPU_COMPILE)
        .model.arch.blocks[0]
        .rope_theta
        == 1e4
    )  # unscaled


def test_yarn_and_partial_rotary_configs_build_their_tables(tmp_path):
    yarn = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
            "original_max_position_embeddings": 32, "partial_rotary_factor": 0.5}  # fmt: skip
    lm = load_pretrained(
        _with_config(tmp_path, "llama3", rope_parameters=yarn),
        **LIMITS,
        compiler_options=FAST_CPU_COMPILE,
    )
    block = lm.model.arch.blocks[0]
    assert len(block.rope_inv_freq) == 4  # head_dim 16 x 0.5 = 8 rotated channels
    assert block.rope_scaling == pytest.approx(0.1 * math.log(4.0) + 1)


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("mistral_window", {"sliding_window": None}),
        ("gemma2", {"attn_logit_softcapping": None}),
        ("gemma3_text", {"rope_scaling": None}),
    ],
)
def test_the_fixtures_exercise_their_feature(runs, tmp_path, name, change):
    """Without the feature a fixture is built for (the window, the attention soft-cap, the
    global RoPE scaling), the 16-token prompt's logits miss transformers' by more than the
    bound: the comparisons above could fail for an implementation that ignored it."""
    lm, ref = runs.lm(name), reference(name)
    bound = atol(lm, ref)
    other = load_pretrained(
        _with_config(tmp_path, name, **change), **LIMITS, compiler_options=FAST_CPU_COMPILE
    )
    got = other.prefill_logits(ref["prompts"][3])
    assert np.abs(got - ref["prefill"][3]).max() > bound
