"""DeepSeek-V2 / V3 checkpoints (multi-head latent attention, routed MoE layers) on the arena
against transformers' float32 outputs (fixtures `deepseek_v2`, `deepseek_v3`, built by
tools/make_mla_fixtures.py: layer 0 dense, layer 1 a routed MoE with shared experts; V2 routes
with softmax `group_limited_greedy`, V3 with the sigmoid, corrected, group-limited router).

Tolerance: the model of tests/models/test_pretrained.py (each bf16 store a uniform relative
rounding u = 2^-9 of a value carried to the logits with gain <= 1; four standard deviations
of the sum, atol = 4 u sqrt(n / 3) max|z_ref|), with the MLA block's stores counted as:
  - the block's `norm_output` and `hidden_states` (2);
  - after the logits, each feeding `o_proj` linearly (gain <= 1): the latent attention output
    in `attn_output`, the `[T, H v]` rows after `W_uv`, and in prefill the probabilities the
    paged prefill kernel rounds to bf16 for its P.V product (split-K decode keeps them
    exact) (3 at most);
  - stores BEFORE the attention logits count twice. A relative rounding delta of one query
    or key element moves a logit s_t by delta * scale * q_i k_ti, and the softmax carries a
    logit change into the output as sum_t p_t ds_t (v_t - o), at most |ds| max|v - o| <=
    2 |ds| max|v|: up to twice the effect of rounding the output itself. Those stores are
    the query (`qkv_output`, then the bf16 absorbed query `[q_nope W_uk^T | q_rope]`, in
    prefill as in decode: 2), with a q LoRA the normed q latent (`ssm_ba`, 1), and the key
    path (the raw latent in `qkv_output`, the bf16 latent cache: 2).
  So MLA counts 2 + 3 + 2 * (2 + 2) = 13 (15 with a q LoRA); the SwiGLU MLP 6, the MoE block
  with its shared expert 11 (tests/models/test_moe_models.py's count). The routed layer adds
  test_moe_models' routing term (the routing weights' response to the router-logit error),
  which dominates these fixtures' bound: 0.678 (v2) and 0.556 (v3), against 0.197 / 0.204
  from the roundings alone.
Near-ties: test_moe_models.py's rule (a position whose transformers router margin is below
the derived `2 delta` and everything after it in its sequence are left out of the strict
comparison); the fixture prompts have none, so every prompt position is compared.
Per fixture (n; bound; largest difference measured when written, prefill / greedy decode on
decided positions; router `2 delta`, below the fixtures' 0.3 quiet margin; greedy tokens equal
to transformers'): deepseek_v2 (44; 0.678; 0.090 / 0.083; 0.279; 30 of 32), deepseek_v3 (48;
0.556; 0.103 / 0.157; 0.224; 31 of 32); decode against the prefill recomputation: 0.070 and
0.068 (bound 2 atol). (With the former expanded einsum prefill, whose count was also 13:
0.102 / 0.083 and 0.125 / 0.164; 0.102 and 0.106.)

Greedy tokens and teacher forcing: as in test_moe_models.py (compared where the position is
decided, the earlier tokens agree and transformers' top-2 gap exceeds 2 atol, resp. the
recomputation's exceeds 4 atol).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from lm_runs import CHECKPOINTS, LIMITS, check_decode_in_place, reference
from test_moe_models import QUIET_MARGIN, bf16_atol, decided, max_abs_logit, router_thresholds
from test_moe_models import block_roundings as moe_block_roundings

from jaxarena import ModelConfig
from jaxarena.models import load_pretrained
from jaxarena.models.blocks.mla import MLA
from jaxarena.models.families import family_for

FIXTURES = ("deepseek_v2", "deepseek_v3")
PRESETS = Path(__file__).resolve().parents[2] / "jaxarena" / "presets"


def block_counter(config):
    """`block -> stored roundings` for this config's blocks (module docstring)."""
    mla = 2 + 3 + 2 * (2 + 2) + (2 if config.q_lora_rank else 0)
    return lambda b: mla if isinstance(b, MLA) else moe_block_roundings(b)


def atol_of(lm, ref) -> float:
    """test_moe_models' bound (its routing term included) with the MLA blocks' roundings."""
    return bf16_atol(lm, ref, block_counter(lm.config))


def top2_gap(logits: np.ndarray) -> np.ndarray:
    top = np.sort(logits, -1)
    return top[..., -1] - top[..., -2]


def greedy_mask(lm, r) -> np.ndarray:
    """Greedy steps chosen at decided positions whose earlier tokens agree with transformers."""
    ref, count = r["ref"], block_counter(lm.config)
    got, want = r["tokens"], ref["greedy_tokens"]
    ok = np.stack([decided(lm, ref, i, count)[n - 1 : n - 1 + want.shape[1]]
                   for i, n in enumerate(ref["prompt_lengths"])])  # fmt: skip
    same = np.cumprod(np.concatenate([np.ones((got.shape[0], 1), bool),
                                      got[:, :-1] == want[:, :-1]], 1), 1).astype(bool)  # fmt: skip
    return ok & same


@pytest.mark.parametrize("name", FIXTURES)
def test_prefill_and_decode_logits_match_transformers(runs, name):
    r = runs.run(name)
    lm, ref = runs.lm(name), r["ref"]
    atol, count = atol_of(lm, ref), block_counter(lm.config)
    assert atol < max_abs_logit(ref) / 8  # well below the logits' spread
    assert router_thresholds(lm, ref, count).max() < QUIET_MARGIN
    for i, (got, want) in enumerate(zip(r["prefill"], ref["prefill"], strict=True)):
        assert decided(lm, ref, i, count)[: len(got)].all(), f"near-tie in prompt {i}"
        np.testing.assert_allclose(got, want, atol=atol, rtol=0, err_msg=f"prompt {i}")
    mask = greedy_mask(lm, r)
    np.testing.assert_allclose(r["logits"][mask], ref["greedy_logits"][mask], atol=atol, rtol=0)


@pytest.mark.parametrize("name", FIXTURES)
def test_greedy_tokens_match_transformers(runs, name):
    r = runs.run(name)
    lm, ref = runs.lm(name), r["ref"]
    atol = atol_of(lm, ref)
    mask = greedy_mask(lm, r)
    # The logits of at least 6 greedy steps are compared (measured: 31 (v2) and 32 (v3) of
    # 32, the continuations being free of router near-ties), so the check is never vacuous.
    assert mask.sum() >= 6, f"only {mask.sum()} of {mask.size} greedy steps compared"
    np.testing.assert_allclose(r["logits"][mask], ref["greedy_logits"][mask], atol=atol, rtol=0)
    # Every choice the bound decides (top-2 gap above 2 atol) has to match. With the MoE
    # routing term in the bound (test_moe_models' docstring) few gaps are that wide here.
    strict = mask & (ref["greedy_top2_gap"] > 2 * atol)
    np.testing.assert_array_equal(r["tokens"][strict], ref["greedy_tokens"][strict])


@pytest.mark.parametrize("name", FIXTURES)
def test_decode_loop_equals_teacher_forcing(runs, name):
    """The split-K decode loop against the paged prefill kernel recomputing the same
    sequences (both absorbed, over the same latent cache rows)."""
    r = runs.run(name)
    atol = atol_of(runs.lm(name), r["ref"])
    np.testing.assert_allclose(r["logits"], r["forced"], atol=2 * atol, rtol=0)
    forced = np.argmax(r["forced"], -1)
    # Every choice decided at this margin matches; the logits of all 32 steps are compared
    # above, so the test is not vacuous where the (routing-term) bound decides few choices.
    mask = top2_gap(r["forced"]) > 4 * atol
    np.testing.assert_array_equal(r["tokens"][mask], forced[mask])


@pytest.mark.parametrize("name", FIXTURES)
def test_decode_traced_once_in_place(runs, name):
    runs.run(name)
    lm = runs.lm(name)
    check_decode_in_place(lm, name)


def test_decode_step_keeps_the_arena_in_place():
    """As test_pretrained.py's check: the decode step aliases the arena and the caches and
    needs fewer temp bytes than the arena (a kept copy would need at least the arena). At the
    shared LIMITS this model's arena (357 kB) is below the step's fixed CPU temp (652 kB
    measured, with the MoE layer's interpreted grouped GEMM), so this one run has room for 512
    prompt tokens (arena 2.0 MB; measured temp 1.37 MB)."""
    lm = load_pretrained(CHECKPOINTS / "deepseek_v3", **{**LIMITS, "max_batch_tokens": 512})
    lm.generate(reference("deepseek_v3")["prompts"][:2], 2)
    mem = lm.step_memory("decode")
    assert mem["alias"] >= lm.arena_bytes + lm.cache_bytes
    assert mem["temp"] < lm.arena_bytes, mem


def _real(name: str) -> tuple[dict, ModelConfig, object]:
    path = PRESETS / name
    raw = json.loads(path.read_text())
    return raw, ModelConfig.from_hf(path), family_for(raw["model_type"], path.parent)


@pytest.mark.parametrize(
    ("name", "moe_layers", "router"),
    [
        ("deepseek-v2-lite.json", 26, dict(router="softmax_group", topk_method="greedy",
                                           routed_scaling_factor=1.0, norm_topk_prob=False)),
        ("deepseek-v3.json", 58, dict(router="sigmoid_group", n_group=8, topk_group=4,
                                      routed_scaling_factor=2.5, norm_topk_prob=True)),
        ("kimi-k2-instruct.json", 60, dict(router="sigmoid_group", n_group=1, topk_group=1,
                                           routed_scaling_factor=2.827, norm_topk_prob=True)),
    ],
)  # fmt: skip
def test_real_configs(name, moe_layers, router, tmp_path):
    """The released configs map to MLA blocks with their RoPE, dense MLPs for the first
    `first_k_dense_replace` layers and routed MoE blocks (with their router and a shared
    expert of width n_shared_experts * moe_intermediate_size) after them."""
    raw, cfg, fam = _real(name)
    arch = fam.arch(raw["model_type"], raw, cfg, tmp_path, 4096)
    mla = arch.blocks[0]
    assert isinstance(mla, MLA) and len(arch.blocks) == 2 * raw["num_hidden_layers"]
    ffn = [b.kind for b in arch.blocks[1::2]]
    first = raw["first_k_dense_replace"]
    assert ffn == ["mlp"] * first + ["moe"] * moe_layers
    moe = arch.blocks[2 * first + 1]
    assert moe.shared == "shared_experts" and moe.act == "swiglu"
    assert (
        cfg.shared_expert_intermediate_size
        == raw["n_shared_experts"] * raw["moe_intermediate_size"]
    )
    assert cfg.num_experts == raw["n_routed_experts"]
    for key, value in router.items():
        assert getattr(moe, key) == value, key
    assert (cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (512, 64)
    assert cfg.head_dim == raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"]
    cache = mla.init_cache(cfg, num_blocks=1, kv_block_size=16, rows=1)
    assert cache["latent"].shape == (1, 16, 1, 576)  # only the latent and the RoPE key
    assert cfg.head_dim == 192
    scale = 1 / math.sqrt(192)
    rp = raw.get("rope_scaling") or {}
    if rp.get("type", rp.get("rope_type")) == "yarn":
        assert mla.yarn is not None and mla.yarn.factor == rp["factor"]
        scale *= (0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1) ** 2
    else:
        assert mla.yarn is None
    assert math.isclose(mla.sm_scale(cfg), scale, rel_tol=1e-12)


def test_moe_layer_freq(tmp_path):
    """Layer i is routed when i >= first_k_dense_replace and i % moe_layer_freq == 0 (the
    sizing's rule, DeepSeek's code's; every released config has moe_layer_freq 1)."""
    raw, _, fam = _real("deepseek-v2-lite.json")
    raw = {**raw, "num_hidden_layers": 6, "first_k_dense_replace": 1, "moe_layer_freq": 2}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_hf(tmp_path / "config.json")
    arch = fam.arch(raw["model_type"], raw, cfg, tmp_path, 4096)
    assert [b.kind for b in arch.blocks[1::2]] == ["mlp", "mlp", "moe", "mlp", "moe", "mlp"]


@pytest.mark.parametrize(
    ("name", "change", "match"),
    [
        ("deepseek-v2-lite.json", dict(norm_topk_prob=True), "norm_topk_prob=true"),
        ("deepseek-v2-lite.json", dict(topk_method="noaux_tc"), "topk_method='noaux_tc'"),
        ("deepseek-v2-lite.json", dict(scoring_func="sigmoid"), "scoring_func='sigmoid'"),
        ("deepseek-v3.json", dict(topk_method="group_limited_greedy"), "noaux_tc"),
    ],
)
def test_unsupported_routing_is_refused(name, change, match, tmp_path):
    raw, cfg, fam = _real(name)
    with pytest.raises(NotImplementedError, match=match):
        fam.arch(raw["model_type"], {**raw, **change}, cfg, tmp_path, 4096)


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("deepseek-v3.json", dict(n_group=7)),  # 256 experts
        ("deepseek-v3.json", dict(topk_group=9)),  # of 8 groups
        ("kimi-k2-instruct.json", dict(n_group=384)),  # groups of 1: no top-2 per group
        ("deepseek-v2-lite.json", dict(topk_method="group_limited_greedy", n_group=3)),  # 64
    ],
)
def test_bad_groups_are_config_errors(name, change, tmp_path):
    from jaxarena import ConfigError

    raw, cfg, fam = _real(name)
    with pytest.raises(ConfigError, match=f"n_group={change.get('n_group', raw['n_group'])}"):
        fam.arch(raw["model_type"], {**raw, **change}, cfg, tmp_path, 4096)


@pytest.mark.parametrize("name", FIXTURES)
def test_moe_layer_of_the_fixtures(runs, name):
    """Layer 0 dense, layer 1 routed with the fixture's router; bf16 `[E, K, N]` experts and
    the shared expert's weights."""
    lm = runs.lm(name)
    c = lm.config
    blocks, params = lm.model.arch.blocks, lm.params["layers"]
    assert [b.kind for b in blocks] == ["mla", "mlp", "mla", "moe"]
    moe, p = blocks[3], params[3]
    want = {"deepseek_v2": dict(router="softmax_group", topk_method="group_limited_greedy",
                                n_group=4, topk_group=2, routed_scaling_factor=1.5),
            "deepseek_v3": dict(router="sigmoid_group", n_group=4, topk_group=2,
                                norm_topk_prob=True, routed_scaling_factor=2.5)}[name]  # fmt: skip
    for key, value in want.items():
        assert getattr(moe, key) == value, key
    e, h, inter = c.num_experts, c.hidden_size, c.moe_intermediate_size
    assert p["w_gate_up"].shape == (e, h, 2 * inter) and p["w_down"].shape == (e, inter, h)
    si = {"deepseek_v2": 2 * inter, "deepseek_v3": inter}[name]
    assert c.shared_expert_intermediate_size == si
    assert p["s_gate_up"].shape == (h, 2 * si) and p["s_down"].shape == (si, h)  # gate|up joined
    assert ("bias" in p) == (name == "deepseek_v3")


def test_mtp_layers_are_skipped_other_extra_tensors_are_not(tmp_path):
    """Tensors of layers past `num_hidden_layers` (DeepSeek-V3's multi-token-prediction
    layers) load and are not read; an unknown tensor of a decoder layer is still an error."""
    from test_checkpoint_errors import make, tensors_of

    from jaxarena.models import CheckpointError

    t = tensors_of("deepseek_v3")
    mtp = {"model.layers.2.eh_proj.weight": t["model.layers.0.mlp.up_proj.weight"],
           "model.layers.2.self_attn.kv_b_proj.weight": t["model.layers.0.self_attn.kv_b_proj.weight"]}  # fmt: skip
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    lm = load_pretrained(make(tmp_path / "a", "deepseek_v3", tensors={**t, **mtp}), **LIMITS)
    assert len(lm.model.arch.blocks) == 4
    extra = {"model.layers.1.self_attn.q_proj.weight": t["model.layers.0.mlp.up_proj.weight"]}
    with pytest.raises(CheckpointError, match="q_proj"):
        load_pretrained(make(tmp_path / "b", "deepseek_v3", tensors={**t, **extra}), **LIMITS)
