"""Issue 40, items 3, 5 and 6 on the config side: a dimension the family needs and the file
lacks is a ConfigError naming the key and the file (before: 0, so a Llama without
`intermediate_size` had a third of its parameters); an unknown family is read with a warning;
a config-wide `sliding_window` windows the layers the model windows; the context length and
the stored weight format are read."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from jaxarena import ConfigError, MemoryBudget, ModelConfig, Target
from jaxarena._config.hf_rules import UnknownFamilyWarning
from jaxarena._sizing.weights import param_count

# meta-llama/Llama-3.2-1B's config.json (the keys the sizing reads).
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip
# mistralai/Mistral-7B-v0.1: a 4096-token window on every layer, no `layer_types`.
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
    "sliding_window": 4096, "rope_theta": 10000.0,
}  # fmt: skip


def _write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_the_whole_llama_3_2_1b_has_its_published_parameter_count(tmp_path):
    cfg = ModelConfig.from_hf(_write(tmp_path, LLAMA_3_2_1B))
    assert param_count(cfg) == 1_235_814_400  # transformers' count of meta-llama/Llama-3.2-1B


@pytest.mark.parametrize(
    "key", ["intermediate_size", "num_attention_heads", "vocab_size", "num_hidden_layers"]
)
@pytest.mark.parametrize("how", ["missing", "null", "zero"])
def test_a_needed_dimension_missing_or_zero_names_the_key_and_the_file(tmp_path, key, how):
    data = dict(LLAMA_3_2_1B)
    if how == "missing":
        del data[key]
    else:
        data[key] = None if how == "null" else 0
    path = _write(tmp_path, data)
    rule = "must be >= 1" if how == "zero" else f"required key {key} is {how}"
    with pytest.raises(ConfigError, match=rf"^{path}: .*{rule}") as e:
        ModelConfig.from_hf(path)
    assert key in str(e.value)


def test_moe_without_an_expert_width_is_refused():
    moe = dict(LLAMA_3_2_1B, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
               num_experts=8, num_experts_per_tok=2)  # fmt: skip
    del moe["intermediate_size"]
    with pytest.raises(ConfigError, match=r"<dict>: required key moe_intermediate_size is missing"):
        ModelConfig.from_hf(moe)
    cfg = ModelConfig.from_hf(dict(moe, moe_intermediate_size=768))  # every layer MoE: enough
    assert cfg.moe_intermediate_size == 768 and cfg.intermediate_size == 0


def test_documented_defaults_still_fill_their_keys():
    # Gemma 3's text_config leaves out what Gemma3TextConfig defaults (hf_families).
    cfg = ModelConfig.from_hf({"model_type": "gemma3_text", "hidden_size": 2560})
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.vocab_size) == (26, 8, 262208)


def test_an_unknown_family_is_read_with_a_warning(tmp_path):
    path = _write(tmp_path, dict(LLAMA_3_2_1B, model_type="my_llama", architectures=["Mine"]))
    with pytest.warns(UnknownFamilyWarning, match=rf"{path}: model_type 'my_llama' is not a "
                      r"family jaxarena knows.*read as the generic decoder"):  # fmt: skip
        cfg = ModelConfig.from_hf(path)
    assert param_count(cfg) == 1_235_814_400


# -- item 5: a config-wide sliding window ---------------------------------------------------------


def test_mistral_budgets_the_window_not_the_whole_context():
    cfg = ModelConfig.from_hf(MISTRAL_7B_V01)
    assert cfg.layer_types == ("sliding_attention",) * 32
    b = MemoryBudget(config=cfg, memory_bytes="141GB", max_seq_len=32768, kv_block_size=16,
                     target=Target.preset("hopper"))  # fmt: skip
    # Every layer keeps the pages a 4096-token window touches: ceil(4095 / 16) + 1 blocks.
    window_tokens = (math.ceil(4095 / 16) + 1) * 16
    per_token = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x kv heads x head dim x bf16
    assert b.kv_bytes_per_token == 0
    assert b.state_bytes_per_sequence == window_tokens * per_token == 538_968_064
    assert b.sequence_bytes < 32768 * per_token // 7  # was 4 GiB per 32k sequence
    assert b.max_kv_tokens is None  # no cache grows with the context


def test_the_window_layers_are_the_models():
    from jaxarena.models.families.llama import Llama

    raw = json.loads(_checkpoint("mistral_window").read_text())
    cfg = ModelConfig.from_hf(raw)
    windows = Llama().windows(raw, cfg, max_seq_len=64)
    assert [w is not None for w in windows] == [t == "sliding_attention" for t in cfg.layer_types]
    assert all(windows)


def _checkpoint(name):
    return Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / name / "config.json"


@pytest.mark.parametrize("use", [True, False])
def test_qwen2_window_applies_from_max_window_layers_when_used(use):
    raw = dict(MISTRAL_7B_V01, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
               num_hidden_layers=4, use_sliding_window=use, max_window_layers=2)  # fmt: skip
    cfg = ModelConfig.from_hf(raw)
    expected = ("full_attention",) * 2 + ("sliding_attention",) * 2 if use else ()
    assert cfg.layer_types == expected


# -- item 6 and 8: the context and the stored weights are read -------------------------------------


def test_context_and_rope_scaling_and_stored_format_are_read():
    llama = ModelConfig.from_hf(LLAMA_3_2_1B)
    assert (llama.max_position_embeddings, llama.rope_scaled, llama.quant_method) == (
        131072, True, "")  # fmt: skip
    mistral = ModelConfig.from_hf(MISTRAL_7B_V01)
    assert (mistral.max_position_embeddings, mistral.rope_scaled) == (32768, False)
    assert ModelConfig.preset("gpt-oss-20b").quant_method == "mxfp4"
    assert ModelConfig.preset("deepseek-v3").quant_method == "fp8"
    with pytest.raises(ConfigError, match=r"--max-seq-len 40,000 is past the model's context: "
                       r"max_position_embeddings=32,768"):  # fmt: skip
        mistral.check_context(40_000, "--max-seq-len 40,000")
    mistral.check_context(32_768, "x")  # at the context: fine
    with pytest.warns(UserWarning, match="RoPE scaling may extend it"):
        llama.check_context(200_000, "--max-seq-len 200,000")
