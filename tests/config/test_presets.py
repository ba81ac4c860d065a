"""Bundled presets: listing, loading, and every preset's fields checked against its JSON.

The expected values below were derived by hand from the JSON files in `jaxarena/presets/` (the
same files as `../shared/models/`); where a value is not a plain copy of one key, the comment
says how it follows from the JSON.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

import jaxarena
from jaxarena import ConfigError, ModelConfig, presets
from jaxarena._config import hf_source

load_preset = ModelConfig.preset

PRESET_DIR = Path(jaxarena.__file__).parent / "presets"
SHARED_MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"
# Byte copies of the published configs of `../shared/models/` (the design repository beside
# CI's checkout), so that a plain clone without it still checks the digests against them.
PUBLISHED_COPIES = Path(__file__).resolve().parents[1] / "fixtures" / "published_models"

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


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_fields(name):
    cfg = load_preset(name)
    want = {**ABSENT, **EXPECTED[name]}
    model_type = want.pop("model_type")
    assert cfg.model_type == model_type
    assert cfg.source == f"jaxarena/presets/{name}.json"
    assert _observed(cfg, want) == want
    hash(cfg)  # usable as a static jit argument


# SHA-256 of the canonical JSON (sorted keys, no spaces) of each published model's config.json
# as kept in the design repository's shared/models (the configs the presets were copied from),
# recorded here so the check always runs, with or without that repository beside this one.
# Presets of our own (tiny-hybrid) have no published config.
PUBLISHED_CONFIG_SHA256 = {
    "deepseek-v2-lite": "d77621a6acc58e279d33f525d53f608cf671450e56864368095eb5ea295cc710",
    "deepseek-v3": "fed8c13b4637058cd68e600bd4bf7dc734bda4594dd583e3b49fa27c6e123cc6",
    "deepseek-v4-flash-fixture": "afe02c1fd6cd33b385ca4f110d27b3137b9ef806ca6d25955fb6cf9bef903a4e",
    "gpt-oss-20b": "fcfce87c5277689cce2b8c8ef5336a7385157bfe623dbe321cfe4904b0942102",
    "llama3.1-8b": "bf0a9ac88871834860e816600ee6174a576f3086b3845173463db3e997eb26d1",
    "longcat-flash-lite-fixture": "c37a49f777ffa3b46374653f1292d720a0a24f0b0413b4b5b743272f6206a594",
    "longcat-flash": "1e5f37b931e9b251fe6ab836426070d686fabf8a799de37876a76b646332ee3a",
    "mamba2-2.7b": "4da1708125f555bbab93b079dddab418a22f7dc8f78cf2066f556d2cead13529",
    "mixtral-8x7b": "d963f9c550de07c84fdc1012c27636d6cca86273f5b114e822cc34842e3c1a4c",
    "nemotron-3-nano-30b-a3b": "9bddf1a2459b9a8f7cb9049b31c1bd3edbe7e9d81cfa5558da030cf14572b184",
    "nemotron-h-8b": "47af4a181321128e6858c4048f391ce225707233ebc2f18c6b8b0b73f41918aa",
    "nemotron-h-puzzle-latentmoe-fixture": "4834dd9f64d4e671a63150514e33943b172513d9a675d0d7bc464b0769e69ab7",
    "qwen3-30b-a3b": "50defee8f5577af237bee7679a702159d0f1b287875c14ff28aced29d2547988",
    "qwen3-32b": "f7b15097c58db24a59030f0e57775b2b49b33e2ee294fb85ff0ade5b902c489b",
    "qwen3-8b": "fd4b10f2795e3d106d9452f6b36aba1bc573c1a3a846f8968ae209cd0e191ce9",
    "qwen3-next-80b-a3b": "8ebf20ebe78bd562409320776ba1880cd7473bd5edc6a9ec8e37d2fc01ad1741",
    "qwen3-vl-30b-a3b": "48dffe0e171228f78f22ce57d72974c8e232c30daace1a2206684dc54ea3f247",
    "qwen3-vl-8b": "475f2267704fa0828d95ed1058926b8b7d05f34ceba0eb9840d94690fa0fda34",
    "qwen3.5-35b-a3b": "43794fb330522d058bda1093c1f4ce1a6d7f13ea12bb1abfe4d10a428a564b2b",
    "qwen3.8-flash-next-fixture": "6269e67925d8db75c23169e35f84e83e5cd79ec0ea781fe85c0431ea0b19f2ee",
}


def _canonical_sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIG_SHA256))
def test_preset_is_the_published_config(name):
    bundled = json.loads((PRESET_DIR / f"{name}.json").read_text())
    assert _canonical_sha256(bundled) == PUBLISHED_CONFIG_SHA256[name]


def test_every_published_preset_has_a_digest():
    assert sorted(set(EXPECTED) - {"tiny-hybrid"}) == sorted(PUBLISHED_CONFIG_SHA256)


def test_published_model_files_agree_with_the_recorded_digests():
    """Every recorded digest is that of a published config: the files of the design
    repository's shared/models when it is beside this checkout (CI: a changed upstream config
    is noticed), else the byte copies in tests/fixtures/published_models."""
    source = SHARED_MODELS if SHARED_MODELS.is_dir() else PUBLISHED_COPIES
    for name, digest in PUBLISHED_CONFIG_SHA256.items():
        path = source / f"{name}.json"
        assert path.is_file(), f"{path} is missing: no published config to check {name!r} against"
        assert _canonical_sha256(json.loads(path.read_text())) == digest, path


def test_published_copies_are_the_shared_files():
    """The fixture copies stay byte-identical to shared/models (checked where it is present)."""
    if not SHARED_MODELS.is_dir():
        pytest.skip(f"{SHARED_MODELS} is absent (a plain clone): the copies are checked by digest")
    copies = sorted(p.name for p in PUBLISHED_COPIES.glob("*.json"))
    assert copies == sorted(f"{name}.json" for name in PUBLISHED_CONFIG_SHA256)
    for name in copies:
        assert (PUBLISHED_COPIES / name).read_bytes() == (SHARED_MODELS / name).read_bytes(), name


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
