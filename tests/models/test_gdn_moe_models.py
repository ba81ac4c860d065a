"""Gated DeltaNet models with MoE layers (`qwen3_next_moe`: Qwen3-Next, per-expert tensors,
`norm_topk_prob=False`, one MoE and one dense layer; `qwen3_5_moe`: Qwen3.5-MoE text model,
fused experts, MoE in every layer) on the arena against transformers' float32 outputs
(tests/fixtures/checkpoints, written by tools/make_gdn_moe_fixtures.py).

Bound (bf16). The derivation both parents use (tests/models/test_pretrained.py): every bf16
store on the path to a logit is a relative perturbation of at most u = 2^-9 of a normalised
activation carried with gain <= 1, so atol = 4 u sqrt(n / 3) max|z| over the n stored
roundings. n counts the blocks' roundings as their own tests derive them, taken from those
tests so the counts stay in one place: the Gated DeltaNet, gated attention and dense MLP from
test_gdn_pretrained.ROUNDINGS (9, 6, 6), the MoE block with its gated shared expert from
test_moe_models.block_roundings (11; MoE._shared as written stores 5 times on the gated
shared expert's path where that helper counts 4: one rounding per MoE block, under 3% of
this bound, left to the helper's owner), plus the logits store. qwen3_next_moe (gdn, moe,
attention, mlp): n = 33; qwen3_5_moe (gdn, moe, attention, moe): n = 38.

Near-ties (test_moe_models' rule): the router of an MoE block reads a `norm_output` that
carries the n_r - 1 roundings before it (its own store included in n_r), so each router logit
moves by at most delta = 4 u sqrt(n_r / 3) max|router logit| and the expert choice can flip
only where transformers' float32 margin is below 2 delta; every position from a sequence's
first such near-tie on is left out of the strict comparisons. The fixture prompts are built
with every margin >= QUIET_MARGIN (0.3), above each 2 delta here (largest: 0.26, the second
MoE of qwen3_5_moe), so every prompt position is compared; the greedy continuation may have
near-ties.

Measured at the time of writing (largest prefill logit difference / bound; decode logits at
the compared steps; greedy tokens equal to transformers'): qwen3_next_moe 0.082 / 0.168,
0.095 (32 steps compared), 32 of 32 tokens; qwen3_5_moe 0.088 / 0.180, 0.067 (24 steps; the
rest follow a near-tie in the continuation), 32 of 32 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import test_gdn_pretrained as gdn_tests
import test_moe_models as moe_tests
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, check_decode_in_place
from test_pretrained import decided_and_same_context, max_abs_logit, top2_gap

from jaxarena import ModelConfig
from jaxarena.models.checkpoint import open_checkpoint
from jaxarena.models.families import family_for

NAMES = ("qwen3_next_moe", "qwen3_5_moe")
PRESETS = Path(__file__).resolve().parents[2] / "jaxarena" / "presets"


def roundings(block) -> int:
    """Stored bf16 roundings of one block (module docstring)."""
    if block.kind == "moe":
        return moe_tests.block_roundings(block)
    return gdn_tests.ROUNDINGS[block.kind]


def atol_of(lm, ref) -> float:
    """test_moe_models' bound (routing term included) with this model's roundings."""
    return moe_tests.bf16_atol(lm, ref, roundings)


def router_thresholds(lm, ref) -> np.ndarray:
    return moe_tests.router_thresholds(lm, ref, roundings)


def decided(lm, ref, i: int) -> np.ndarray:
    return moe_tests.decided(lm, ref, i, roundings)


@pytest.mark.parametrize("name", NAMES)
def test_layers_routing_and_expert_weights(runs, name):
    """MoE where transformers puts it, its options, and the experts as `[E, K, N]` stacks
    (the fused checkpoint: gate rows first, as `chunk(2, dim=-1)` splits them)."""
    lm = runs.lm(name)
    c, blocks = lm.config, lm.model.arch.blocks
    want = {"qwen3_next_moe": ("gdn", "moe", "attention", "mlp"),
            "qwen3_5_moe": ("gdn", "moe", "attention", "moe")}[name]  # fmt: skip
    assert lm.model.arch.kinds == want
    e, h, inter = c.num_experts, c.hidden_size, c.moe_intermediate_size
    ckpt = open_checkpoint(CHECKPOINTS / name)
    for i, (b, p) in enumerate(zip(blocks, lm.params["layers"], strict=True)):
        if b.kind != "moe":
            continue
        assert (b.router, b.shared, b.shared_gate) == ("softmax", "shared_expert", True)
        assert b.norm_topk_prob == (name == "qwen3_5_moe")
        assert p["w_gate_up"].shape == (e, h, 2 * inter) and p["w_down"].shape == (e, inter, h)
        assert p["s_scale"].shape == (h, 1) and p["router"].shape == (h, e)
        mlp = f"model.layers.{i // 2}.mlp"
        fused = f"{mlp}.experts.gate_up_proj" in ckpt
        assert fused == (name == "qwen3_5_moe")
        if fused:
            assert f"{mlp}.experts.0.gate_proj.weight" not in ckpt
            gate_up, down = (
                np.asarray(ckpt[f"{mlp}.experts.gate_up_proj"], np.float32),
                np.asarray(ckpt[f"{mlp}.experts.down_proj"], np.float32),
            )
        else:
            parts = [[np.asarray(ckpt[f"{mlp}.experts.{j}.{n}.weight"], np.float32)
                      for j in range(e)] for n in ("gate_proj", "up_proj", "down_proj")]  # fmt: skip
            gate_up = np.concatenate([np.stack(parts[0]), np.stack(parts[1])], 1)
            down = np.stack(parts[2])
        np.testing.assert_array_equal(np.asarray(p["w_gate_up"], np.float32),
                                      gate_up.transpose(0, 2, 1))  # fmt: skip
        np.testing.assert_array_equal(np.asarray(p["w_down"], np.float32), down.transpose(0, 2, 1))


@pytest.mark.parametrize("name", NAMES)
def test_prefill_logits_match_transformers(runs, name):
    r = runs.run(name)
    lm, ref = runs.lm(name), r["ref"]
    atol = atol_of(lm, ref)
    assert atol < max_abs_logit(ref) / 8  # well below the logits' spread
    assert router_thresholds(lm, ref).max() < moe_tests.QUIET_MARGIN
    for i, (got, want) in enumerate(zip(r["prefill"], ref["prefill"], strict=True)):
        n = got.shape[0]
        assert got.shape == want.shape and got.dtype == np.float32
        assert decided(lm, ref, i)[:n].all(), f"prompt {i} has a router near-tie"
        np.testing.assert_allclose(got, want, atol=atol, rtol=0, err_msg=f"prompt {i}")


@pytest.mark.parametrize("name", NAMES)
def test_greedy_decode_matches_transformers(runs, name):
    """Prompts of 1, 5, 11 and 16 tokens packed into one prefill, then decode steps; logits
    compared where the context is transformers' and no near-tie came before, tokens where
    transformers' top-2 gap also exceeds 2 atol."""
    r = runs.run(name)
    lm, ref = runs.lm(name), r["ref"]
    atol = atol_of(lm, ref)
    want = ref["greedy_tokens"]
    # Step j of prompt i is chosen from the logits of position len_i - 1 + j.
    ok = np.stack([decided(lm, ref, i)[n - 1 : n - 1 + want.shape[1]]
                   for i, n in enumerate(ref["prompt_lengths"])])  # fmt: skip
    same = ok & decided_and_same_context(np.full(want.shape, np.inf), r["tokens"], want, 0.0)
    assert same.sum() >= 0.5 * same.size, f"only {same.sum()} of {same.size} steps compared"
    np.testing.assert_allclose(r["logits"][same], ref["greedy_logits"][same], atol=atol, rtol=0)
    # Every choice the bound decides has to match; with the MoE routing term in the bound
    # (test_moe_models' docstring) few top-2 gaps here exceed 2 atol (measured: 3 to 5 of
    # 32), so the floor is the logit comparison above (at least half the steps).
    strict = same & (ref["greedy_top2_gap"] > 2 * atol)
    np.testing.assert_array_equal(r["tokens"][strict], want[strict])


@pytest.mark.parametrize("name", NAMES)
def test_decode_loop_equals_teacher_forcing(runs, name):
    """Decode and a prefill-only recomputation agree within twice the bound (each within it
    of the same float32 values where the routing agrees); tokens where the recomputation's
    top-2 gap exceeds 4 atol."""
    r = runs.run(name)
    atol = atol_of(runs.lm(name), r["ref"])
    np.testing.assert_allclose(r["logits"], r["forced"], atol=2 * atol, rtol=0)
    # Every choice decided at this margin matches (none may be, with the routing term in the
    # bound: the logits of all 32 steps are compared above).
    mask = top2_gap(r["forced"]) > 4 * atol
    np.testing.assert_array_equal(r["tokens"][mask], np.argmax(r["forced"], -1)[mask])


@pytest.mark.parametrize("name", NAMES)
def test_decode_traced_once_in_place_guards_intact(runs, name):
    runs.run(name)
    lm = runs.lm(name)
    check_decode_in_place(lm, name)
    # Temp is not compared with the arena on CPU: the grouped GEMM and the GDN decode kernel
    # run in the Pallas interpreter, whose copies exceed this tiny arena (test_moe_models).
    assert lm.step_memory("decode")["alias"] >= lm.arena_bytes + lm.cache_bytes


def _arch(raw: dict, path: Path):
    cfg = ModelConfig.from_hf(raw)
    return family_for(raw["model_type"], path).arch(raw["model_type"], raw, cfg, path, 4096)


def test_real_configs_and_the_layer_rule():
    """Qwen3-Next-80B-A3B: 48 MoE layers (renormalised); with `decoder_sparse_step=2` and
    `mlp_only_layers=[3]` only layers 1, 5, 7, ... are MoE. Qwen3.5-35B-A3B (the
    ConditionalGeneration config): MoE in all 40 layers whatever `mlp_only_layers` says."""
    path = Path("/checkpoints/x")
    nxt = json.loads((PRESETS / "qwen3-next-80b-a3b.json").read_text())
    moe = [b for b in _arch(nxt, path).blocks[1::2] if b.kind == "moe"]
    assert len(moe) == 48 and moe[0].norm_topk_prob and moe[0].shared_gate
    sparse = _arch({**nxt, "decoder_sparse_step": 2, "mlp_only_layers": [3]}, path)
    kinds = sparse.kinds[1::2]
    assert [i for i, k in enumerate(kinds) if k == "moe"] == [i for i in range(1, 48, 2) if i != 3]
    assert set(kinds) == {"moe", "mlp"}
    q35 = json.loads((PRESETS / "qwen3.5-35b-a3b.json").read_text())
    q35["text_config"] = {**q35["text_config"], "mlp_only_layers": [0, 1]}
    arch = _arch(q35, path)
    assert arch.kinds[1::2] == ("moe",) * 40 and arch.kinds[6] == "attention"
    assert arch.blocks[1].norm_topk_prob and arch.blocks[1].shared == "shared_expert"
    q35["text_config"]["shared_expert_intermediate_size"] = 0
    with pytest.raises(NotImplementedError, match="shared_expert_intermediate_size=0"):
        _arch(q35, path)


def test_conditional_generation_layout_reads_the_text_model(runs, tmp_path):
    """A `Qwen3_5MoeForConditionalGeneration` checkpoint (`model_type = "qwen3_5_moe"`, the text
    config under `text_config`, tensors under `model.language_model`, vision and MTP tensors)
    loads the same blocks and weights as the text-only fixture (no step is compiled)."""
    from jaxarena.models import load_pretrained

    src = CHECKPOINTS / "qwen3_5_moe"
    ckpt = open_checkpoint(src)
    tensors = {(k if k == "lm_head.weight" else k.replace("model.", "model.language_model.", 1)):
               np.asarray(ckpt[k]) for k in ckpt}  # fmt: skip
    tensors["model.visual.patch_embed.proj.weight"] = np.zeros((4, 4), ml_dtypes.bfloat16)
    tensors["mtp.fc.weight"] = np.zeros((4, 4), ml_dtypes.bfloat16)
    gdn_tests._write_safetensors(tmp_path / "model.safetensors", tensors)
    text = json.loads((src / "config.json").read_text())
    top = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
           "tie_word_embeddings": text["tie_word_embeddings"], "text_config": text}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(top))
    lm, want = (
        load_pretrained(tmp_path, **LIMITS, compiler_options=FAST_CPU_COMPILE),
        runs.lm("qwen3_5_moe"),
    )
    assert lm.model.arch == want.model.arch
    for got, ref in zip(lm.params["layers"], want.params["layers"], strict=True):
        assert set(got) == set(ref)
        for key in got:
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(ref[key]), key)


def test_fused_experts_reader_passes_through_and_refuses_fused_fp8():
    """Per-expert names without a fused tensor go to the wrapped reader unchanged; fused
    experts in an FP8 checkpoint are refused (valid, not implemented), unless the config
    leaves the experts unquantized."""
    from types import SimpleNamespace

    from jaxarena.models.checkpoint import FP8Spec
    from jaxarena.models.families.fused_experts import FusedExpertsReader

    class Ckpt(dict):
        path = Path("/ckpt")

    calls = []
    inner = SimpleNamespace(ckpt=Ckpt({"m.mlp.experts.gate_up_proj": None}), fp8=None,
                            linear=lambda *a: calls.append(a) or "inner")  # fmt: skip
    reader = FusedExpertsReader(inner, num_experts=8)
    assert reader.linear("x.mlp.experts.3.up_proj", 32, 64) == "inner"
    assert reader.linear("m.mlp.shared_expert.up_proj", 32, 64) == "inner"
    assert calls == [("x.mlp.experts.3.up_proj", 32, 64), ("m.mlp.shared_expert.up_proj", 32, 64)]
    inner.fp8 = FP8Spec(block=(128, 128), skip=())
    with pytest.raises(NotImplementedError, match="FP8 experts stored fused"):
        reader.linear("m.mlp.experts.0.gate_proj", 32, 64)
    inner.fp8 = FP8Spec(block=(128, 128), skip=("experts",))
    inner.raw = lambda name, shape, dtypes: np.arange(np.prod(shape)).reshape(shape)
    gate, up = (reader.linear(f"m.mlp.experts.1.{n}", 4, 3) for n in ("gate_proj", "up_proj"))
    full = np.arange(8 * 8 * 3).reshape(8, 8, 3)[1]  # expert 1: [2 * 4 rows, 3]
    np.testing.assert_array_equal(gate, full[:4].T)
    np.testing.assert_array_equal(up, full[4:].T)
