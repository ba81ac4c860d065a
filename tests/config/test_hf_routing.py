"""Which family reads a config.json: routing an unknown `model_type` by its `architectures`
entry or `auto_map` class (issue 31), and Nemotron-H as transformers 5.x writes it (issue 24)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import jaxarena
from jaxarena import ConfigError, ModelConfig

PRESET_DIR = Path(jaxarena.__file__).parent / "presets"
PRESET_JSON = {p.stem: json.loads(p.read_text()) for p in sorted(PRESET_DIR.glob("*.json"))}


def load(source):
    return ModelConfig.from_hf(source)


# -- routing by architecture (issue 31) ---------------------------------------------------------


def test_unknown_model_type_is_read_as_its_architecture():
    # Kimi K2: `model_type: kimi_k2`, `architectures: ["DeepseekV3ForCausalLM"]`. Read by the
    # generic arm it lost `first_k_dense_replace: 1` (every layer MoE, 16.6 B parameters more).
    cfg = load(PRESET_JSON["kimi-k2-instruct"])
    assert cfg.model_type == "deepseek_v3"
    assert "model_type 'kimi_k2' read as 'deepseek_v3'" in cfg.source
    assert cfg.ffn_layer_types == ("dense",) + ("moe",) * 60
    as_v3 = load(dict(PRESET_JSON["kimi-k2-instruct"], model_type="deepseek_v3"))
    assert cfg == as_v3 and as_v3.source == "<dict>"  # no note when nothing was rerouted


def test_auto_map_config_class_routes_when_architectures_does_not():
    data = dict(PRESET_JSON["kimi-k2-instruct"], architectures=["KimiK2ForCausalLM"])
    cfg = load(data)
    assert cfg.model_type == "deepseek_v3"
    assert "auto_map.AutoConfig='configuration_deepseek.DeepseekV3Config'" in cfg.source


def test_renamed_model_type_with_a_known_class_routes_to_it():
    # A fine-tune that renamed `model_type` but kept Qwen3-MoE's class: its `mlp_only_layers`
    # rule applies, which the generic arm would not read.
    data = dict(PRESET_JSON["qwen3-30b-a3b"], model_type="my_finetune", mlp_only_layers=[0])
    cfg = load(data)
    assert cfg.model_type == "qwen3_moe" and cfg.ffn_layer_types[:2] == ("dense", "moe")
    assert "from architectures[0]='Qwen3MoeForCausalLM'" in cfg.source


def test_neither_model_type_nor_class_known_names_both_keys():
    with pytest.raises(ConfigError, match=r"model_type='brand_new_arch'.*architectures=\['X'\]"):
        load(dict(model_type="brand_new_arch", architectures=["X"], d_model=512))
    with pytest.raises(ConfigError, match=r"architectures\[1\]=3 must be a string"):
        load(dict(model_type="brand_new_arch", architectures=["X", 3], hidden_size=8))


# -- Nemotron-H as transformers 5.x writes it (issue 24) ----------------------------------------

NEMOTRON_V5 = Path(__file__).parent.parent / "fixtures" / "nemotron_h_transformers5" / "config.json"


def test_nemotron_h_as_transformers_5_saves_it():
    # tools/make_nemotron_h_v5_config.py: NemotronHConfig(**preset).save_pretrained writes
    # `layers_block_type` with linear_attention (Mamba-2) / full_attention / moe, and no
    # `hybrid_override_pattern` or `num_hidden_layers`. Before: a ConfigError.
    saved = json.loads(NEMOTRON_V5.read_text())
    assert "hybrid_override_pattern" not in saved and "num_hidden_layers" not in saved
    assert set(saved["layers_block_type"]) == {"linear_attention", "full_attention", "moe"}
    cfg = ModelConfig.from_hf(NEMOTRON_V5)
    assert cfg == ModelConfig.preset("nemotron-3-nano-30b-a3b")
    kinds = Counter(cfg.layer_types)
    assert kinds == {"mamba": 23, "moe": 23, "full_attention": 6}
    assert cfg.num_mamba_layers == 23 and cfg.num_attention_layers == 6


def test_nemotron_h_both_block_vocabularies_and_the_layer_types_alias():
    old_names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    new_names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    base = dict(PRESET_JSON["nemotron-h-8b"])
    pattern = base.pop("hybrid_override_pattern")
    want = load(PRESET_JSON["nemotron-h-8b"]).layer_types
    assert {"mamba", "full_attention", "mlp"} <= set(want)
    for names in (old_names, new_names):
        listed = [names[c] for c in pattern]
        assert load(dict(base, layers_block_type=listed)).layer_types == want
    # transformers 5.x maps `layer_types` to `layers_block_type` (NemotronHConfig.attribute_map)
    listed = [new_names[c] for c in pattern]
    assert load(dict(base, layer_types=listed)).layer_types == want
    with pytest.raises(ConfigError, match=r"layers_block_type\[0\]='ssm' is not a known block"):
        load(dict(base, layers_block_type=["ssm"] + listed[1:]))


def test_llama_class_spelled_llama_in_capitals_routes_to_llama():
    # nvidia/Llama3-ChatQA-2-8B and decapoda-research/llama-7b-hf name their class
    # `LLaMAForCausalLM` (llama.cpp #9485, vLLM #251); without a model_type it is Llama.
    data = dict(PRESET_JSON["llama3.1-8b"], architectures=["LLaMAForCausalLM"])
    del data["model_type"]
    assert load(data) == load(PRESET_JSON["llama3.1-8b"])
    assert load(data).model_type == "llama"
    renamed = load(dict(data, model_type="chatqa"))
    assert renamed.model_type == "llama" and "'chatqa' read as 'llama'" in renamed.source
