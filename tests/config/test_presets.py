"""Bundled presets: listing, loading, and every preset's fields checked against its JSON.

The expected values below were derived by hand from the JSON files in `jaxarena/presets/` (the
same files as `../shared/models/`); where a value is not a plain copy of one key, the comment
says how it follows from the JSON.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import jaxarena
from jaxarena import ConfigError, ModelConfig, presets
from jaxarena._config import hf_source

load_preset = ModelConfig.preset

PRESET_DIR = Path(jaxarena.__file__).parent / "presets"

# What a field is when a model does not have the feature (ModelConfig's defaults).
ABSENT = dict(
    attn_gated=False,
    mrope_interleaved=False,
    num_experts=0,
    num_experts_per_tok=1,
    moe_intermediate_size=0,
    shared_expert_intermediate_size=0,
    zero_expert_num=0,
    moe_latent_size=0,
    linear_num_key_heads=0,
    linear_key_head_dim=0,
    linear_num_value_heads=0,
    linear_value_head_dim=0,
    mamba_num_heads=0,
    mamba_head_dim=0,
    ssm_state_size=0,
    n_groups=0,
    kv_lora_rank=0,
    q_lora_rank=0,
    qk_rope_head_dim=0,
    o_lora_rank=0,
    o_groups=0,
    hc_mult=0,
    hc_lowrank=0,
    index_n_heads=0,
    index_head_dim=0,
    index_topk=0,
    index_compress_ratio=0,
    num_ssm_layers=0,
    moe_layers=0,
    mlp_layers=0,
)

# One row per bundled preset. `layers` is num_hidden_layers, `attn` num_attention_layers.
EXPECTED: dict[str, dict] = {
    # Kimi K2: `model_type: kimi_k2`, read as its architecture (DeepseekV3ForCausalLM).
    "kimi-k2-instruct": dict(
        model_type="deepseek_v3",
        hidden_size=7168,
        layers=61,
        attn=61,
        num_attention_heads=64,
        num_key_value_heads=64,
        head_dim=192,  # 128 + 64
        vocab_size=163840,
        intermediate_size=18432,
        num_experts=384,
        num_experts_per_tok=8,
        moe_intermediate_size=2048,
        shared_expert_intermediate_size=2048,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
    ),
    "llama3.1-8b": dict(
        model_type="llama",
        hidden_size=4096,
        layers=32,
        attn=32,  # no layer_types: every layer is attention
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,  # no head_dim key: hidden_size 4096 // 32 heads
        vocab_size=128256,
        intermediate_size=14336,
    ),
    "mixtral-8x7b": dict(
        model_type="mixtral",
        hidden_size=4096,
        layers=32,
        attn=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,  # 4096 // 32
        vocab_size=32000,
        intermediate_size=14336,
        num_experts=8,  # num_local_experts
        num_experts_per_tok=2,
        moe_intermediate_size=14336,  # Mixtral experts are intermediate_size wide
    ),
    "gpt-oss-20b": dict(
        model_type="gpt_oss",
        hidden_size=2880,
        layers=24,
        attn=24,  # 12 sliding_attention + 12 full_attention
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=201088,
        intermediate_size=2880,
        num_experts=32,  # num_local_experts
        num_experts_per_tok=4,
        moe_intermediate_size=2880,  # = intermediate_size
    ),
    "qwen3-8b": dict(
        model_type="qwen3",
        hidden_size=4096,
        layers=36,
        attn=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        intermediate_size=12288,
    ),
    "qwen3-32b": dict(
        model_type="qwen3",
        hidden_size=5120,
        layers=64,
        attn=64,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,  # stated (5120 // 64 would be 80)
        vocab_size=151936,
        intermediate_size=25600,
    ),
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe",
        hidden_size=2048,
        layers=48,
        attn=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        intermediate_size=6144,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
    ),
    "qwen3-next-80b-a3b": dict(
        model_type="qwen3_next",
        hidden_size=2048,
        layers=48,
        attn=12,  # full_attention_interval 4: layers 3, 7, ..., 47 -> 48 // 4
        num_ssm_layers=36,  # the other 48 - 12 are gated delta nets
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        vocab_size=151936,
        intermediate_size=5120,
        attn_gated=True,  # Qwen3-Next attention always has the output gate
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_num_value_heads=32,
        linear_value_head_dim=128,
        num_experts=512,
        num_experts_per_tok=10,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    ),
    "qwen3.5-35b-a3b": dict(
        model_type="qwen3_5_moe",
        hidden_size=2048,  # all text fields from text_config
        layers=40,
        attn=10,  # layer_types: [linear x3, full] x 10
        num_ssm_layers=30,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        vocab_size=248320,
        intermediate_size=0,  # no dense FFN key
        attn_gated=True,  # attn_output_gate: true
        mrope_interleaved=True,  # rope_parameters.mrope_interleaved
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_num_value_heads=32,
        linear_value_head_dim=128,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    ),
    "qwen3-vl-8b": dict(
        model_type="qwen3_vl",
        hidden_size=4096,  # text_config
        layers=36,
        attn=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        intermediate_size=12288,
        mrope_interleaved=True,  # text_config.rope_scaling.mrope_interleaved
    ),
    "qwen3-vl-30b-a3b": dict(
        model_type="qwen3_vl_moe",
        hidden_size=2048,
        layers=48,
        attn=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        intermediate_size=6144,
        mrope_interleaved=True,  # text_config.rope_scaling.mrope_interleaved
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
    ),
    "qwen3.8-flash-next-fixture": dict(
        model_type="qwen4_exp",
        hidden_size=2560,
        layers=4,
        attn=1,  # layer_types: linear x3, full
        num_ssm_layers=3,
        num_attention_heads=24,
        num_key_value_heads=2,
        head_dim=256,
        vocab_size=248320,
        intermediate_size=0,
        attn_gated=True,  # output_gate_type "sigmoid"
        mrope_interleaved=True,
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_num_value_heads=48,
        linear_value_head_dim=128,
        num_experts=512,
        num_experts_per_tok=10,
        moe_intermediate_size=640,
        shared_expert_intermediate_size=640,
        hc_mult=4,  # hc_count
        hc_lowrank=320,
        index_n_heads=4,  # indexer_n_heads
        index_head_dim=128,  # indexer_head_dim
        index_topk=2048,  # indexer_budget
        index_compress_ratio=4,  # indexer_compress_ratio
    ),
    "deepseek-v2-lite": dict(
        model_type="deepseek_v2",
        hidden_size=2048,
        layers=27,
        attn=27,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=192,  # MLA: qk_nope_head_dim 128 + qk_rope_head_dim 64
        vocab_size=102400,
        intermediate_size=10944,
        num_experts=64,  # n_routed_experts
        num_experts_per_tok=6,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=2816,  # n_shared_experts 2 * moe_intermediate_size 1408
        kv_lora_rank=512,
        q_lora_rank=0,  # q_lora_rank: null
        qk_rope_head_dim=64,
    ),
    "deepseek-v3": dict(
        model_type="deepseek_v3",
        hidden_size=7168,
        layers=61,
        attn=61,
        num_attention_heads=128,
        num_key_value_heads=128,
        head_dim=192,  # 128 + 64
        vocab_size=129280,
        intermediate_size=18432,
        num_experts=256,  # n_routed_experts
        num_experts_per_tok=8,
        moe_intermediate_size=2048,
        shared_expert_intermediate_size=2048,  # 1 * 2048
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
    ),
    # DeepSeek-V3's published config with V3.2's `model_type`, architecture and the three
    # lightning-indexer keys its published config.json adds (their values as published).
    "deepseek-v3.2": dict(
        model_type="deepseek_v32",
        hidden_size=7168,
        layers=61,
        attn=61,
        num_attention_heads=128,
        num_key_value_heads=128,
        head_dim=192,
        vocab_size=129280,
        intermediate_size=18432,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=2048,
        shared_expert_intermediate_size=2048,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
        index_n_heads=64,
        index_head_dim=128,
        index_topk=2048,
    ),
    "deepseek-v4-flash-fixture": dict(
        model_type="deepseek_v4",
        hidden_size=4096,
        layers=43,
        attn=43,  # spec §14.2(d): every layer full_attention
        num_attention_heads=64,
        num_key_value_heads=1,
        head_dim=512,
        vocab_size=129280,
        intermediate_size=0,
        num_experts=256,  # n_routed_experts
        num_experts_per_tok=6,
        moe_intermediate_size=2048,
        shared_expert_intermediate_size=2048,  # n_shared_experts 1 * 2048
        kv_lora_rank=512,  # absent -> 512 (§14.2(d))
        q_lora_rank=1024,
        qk_rope_head_dim=64,
        o_lora_rank=1024,
        o_groups=0,  # not in the fixture
        hc_mult=4,  # absent -> 4 (§14.2(d))
        index_n_heads=64,
        index_head_dim=128,
        index_topk=512,
        index_compress_ratio=0,  # V4 keeps the JSON value (absent), §14.2(d)
    ),
    "longcat-flash": dict(
        model_type="longcat_flash",
        hidden_size=6144,
        layers=56,  # num_layers 28, two attention sublayers each
        attn=56,
        num_attention_heads=64,
        num_key_value_heads=64,  # absent -> num_attention_heads
        head_dim=192,  # qk_nope 128 + qk_rope 64
        vocab_size=131072,
        intermediate_size=12288,  # ffn_hidden_size
        num_experts=512,  # n_routed_experts
        num_experts_per_tok=12,  # moe_topk
        moe_intermediate_size=2048,  # expert_ffn_hidden_size
        zero_expert_num=256,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
    ),
    "longcat-flash-lite-fixture": dict(
        model_type="longcat_flash_ngram",
        hidden_size=3072,
        layers=28,  # num_layers 14 * 2
        attn=28,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=192,
        vocab_size=131072,
        intermediate_size=6144,  # ffn_hidden_size
        num_experts=256,
        num_experts_per_tok=12,
        moe_intermediate_size=1024,
        zero_expert_num=128,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
    ),
    "mamba2-2.7b": dict(
        model_type="mamba2",
        hidden_size=2560,
        layers=64,
        attn=0,  # no attention at all
        num_ssm_layers=64,
        num_attention_heads=0,  # JSON num_heads/head_dim are the Mamba-2 mixer's
        num_key_value_heads=0,
        head_dim=0,
        vocab_size=50288,
        intermediate_size=0,
        mamba_num_heads=80,  # num_heads (80 * 64 = expand 2 * hidden 2560)
        mamba_head_dim=64,  # head_dim
        ssm_state_size=128,  # state_size
        n_groups=1,
    ),
    "nemotron-h-8b": dict(
        model_type="nemotron_h",
        hidden_size=4096,
        layers=52,
        # hybrid_override_pattern "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-":
        # 24 M, 24 '-', 4 '*' (52 characters).
        attn=4,
        num_ssm_layers=24,
        mlp_layers=24,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,  # attention_head_dim
        vocab_size=131072,
        intermediate_size=21504,
        mamba_num_heads=128,
        mamba_head_dim=64,
        ssm_state_size=128,
        n_groups=8,
    ),
    "tiny-hybrid": dict(
        model_type="nemotron_h",
        hidden_size=128,
        layers=6,
        # pattern "M*-M*-": 2 M (Mamba-2), 2 '*' (attention), 2 '-' (MLP).
        attn=2,
        num_ssm_layers=2,
        mlp_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=512,
        intermediate_size=256,
        mamba_num_heads=8,
        mamba_head_dim=32,
        ssm_state_size=16,
        n_groups=2,
    ),
    "nemotron-3-nano-30b-a3b": dict(
        model_type="nemotron_h",
        hidden_size=2688,
        layers=52,
        # pattern "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME": 23 M, 23 E, 6 '*'.
        attn=6,
        num_ssm_layers=23,
        moe_layers=23,
        num_attention_heads=32,
        num_key_value_heads=2,
        head_dim=128,
        vocab_size=131072,
        intermediate_size=1856,
        num_experts=128,  # n_routed_experts
        num_experts_per_tok=6,
        moe_intermediate_size=1856,
        shared_expert_intermediate_size=3712,  # moe_shared_expert_intermediate_size
        mamba_num_heads=64,
        mamba_head_dim=64,
        ssm_state_size=128,
        n_groups=8,
    ),
    "nemotron-h-puzzle-latentmoe-fixture": dict(
        model_type="nemotron_h_puzzle",
        hidden_size=4096,
        layers=4,  # num_hidden_layers null -> len(layers_block_type)
        attn=1,  # layers_block_type: mamba, moe, attention, moe
        num_ssm_layers=1,
        moe_layers=2,
        num_attention_heads=32,
        num_key_value_heads=2,
        head_dim=128,
        vocab_size=131072,
        intermediate_size=21504,
        num_experts=512,  # n_routed_experts
        num_experts_per_tok=22,  # max over the moe block_configs (4, 22)
        moe_intermediate_size=2688,  # max over the moe block_configs (1280, 2688)
        shared_expert_intermediate_size=5376,  # moe_shared_expert_intermediate_size
        moe_latent_size=1024,
        mamba_num_heads=128,
        mamba_head_dim=64,
        ssm_state_size=96,
        n_groups=8,
    ),
}


def _observed(cfg: ModelConfig, names) -> dict:
    counts = Counter(cfg.layer_types)
    derived = dict(
        layers=cfg.num_hidden_layers,
        attn=cfg.num_attention_layers,
        num_ssm_layers=cfg.num_ssm_layers,
        moe_layers=counts["moe"],
        mlp_layers=counts["mlp"],
    )
    return {n: derived[n] if n in derived else getattr(cfg, n) for n in names}


def test_presets_lists_the_json_files_sorted():
    names = presets()
    on_disk = sorted(p.stem for p in PRESET_DIR.glob("*.json"))
    assert list(names) == on_disk
    assert names == tuple(sorted(names))
    assert "qwen3-8b" in names


def test_every_preset_has_a_row():
    # A new preset needs a row in EXPECTED (its fields derived by hand from its JSON).
    assert sorted(presets()) == sorted(EXPECTED)


# Presets whose `model_type` the parser routes by their architecture, with the note it keeps.
ROUTED = {
    "kimi-k2-instruct": (
        "model_type 'kimi_k2' read as 'deepseek_v3', from architectures[0]='DeepseekV3ForCausalLM'"
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_fields(name):
    cfg = load_preset(name)
    want = {**ABSENT, **EXPECTED[name]}
    model_type = want.pop("model_type")
    assert cfg.model_type == model_type
    note = ROUTED.get(name)
    assert cfg.source == f"jaxarena/presets/{name}.json" + (f" ({note})" if note else "")
    assert _observed(cfg, want) == want
    hash(cfg)  # usable as a static jit argument


def test_preset_equals_from_hf_of_its_file():
    for name in ("qwen3-8b", "nemotron-h-8b", "qwen3.5-35b-a3b"):
        assert load_preset(name) == ModelConfig.from_hf(PRESET_DIR / f"{name}.json")


def test_unknown_preset_lists_available_names():
    with pytest.raises(ConfigError) as info:
        load_preset("qwen3-8")
    message = str(info.value)
    assert "qwen3-8" in message and "did you mean" in message
    for name in presets():
        assert name in message


@pytest.mark.parametrize("bad", [None, 3, ["qwen3-8b"], "qwen3-8b.json", ""])
def test_bad_preset_names_raise_config_error(bad):
    with pytest.raises(ConfigError, match="not a bundled preset"):
        load_preset(bad)


def test_presets_pick_up_any_json_in_the_folder(tmp_path, monkeypatch):
    (tmp_path / "tiny-hybrid.json").write_text(
        json.dumps(
            dict(
                model_type="nemotron_h",
                hidden_size=64,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                hybrid_override_pattern="M*-",
                vocab_size=256,
                mamba_num_heads=4,
                mamba_head_dim=16,
                ssm_state_size=8,
                n_groups=1,
            )
        )
    )
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "notes.txt").write_text("ignored")
    monkeypatch.setattr(hf_source, "_folder", lambda: tmp_path)
    assert presets() == ("broken", "tiny-hybrid")
    cfg = load_preset("tiny-hybrid")
    assert cfg.layer_types == ("mamba", "full_attention", "mlp")
    with pytest.raises(ConfigError, match=r"jaxarena/presets/broken\.json: invalid JSON"):
        load_preset("broken")
