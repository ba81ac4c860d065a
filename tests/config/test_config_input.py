"""Issue 17, the config's side: every integer field has a sane range, `text_config` is merged
(never dropped), and bad input of any type raises `ConfigError` / `ValueError`, never a
`TypeError`, `AttributeError` or `PermissionError`. Each test failed before the fix."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from jaxarena import ConfigError, Levers, ModelConfig, Target
from jaxarena._config.hf_weights import WEIGHT_DEFAULTS
from jaxarena._config.schema import INT_DEFAULTS, INT_MAXIMA

INT_FIELDS = [
    f.name
    for f in dataclasses.fields(ModelConfig)
    if f.type == "int" and f.name not in ("model_type", "source")
]


def test_every_int_field_has_a_range():
    # One table covers every int field of ModelConfig, the seed's and the weight-only ones.
    assert (
        set(INT_FIELDS)
        == set(INT_MAXIMA)
        == {"hidden_size", *INT_DEFAULTS}
        | {k for k, v in WEIGHT_DEFAULTS.items() if type(v) is int}
    )


@pytest.mark.parametrize("name", sorted(INT_MAXIMA))
def test_each_field_refuses_one_past_its_maximum(name):
    top = INT_MAXIMA[name]
    base = {"hidden_size": 64}
    # Values that other rules tie together stay consistent at the maximum.
    if name == "num_experts_per_tok":
        base["num_experts"] = INT_MAXIMA["num_experts"]
    if name == "mamba_num_heads":
        base.update(mamba_head_dim=1, ssm_state_size=1, n_groups=1)
    ModelConfig(**{**base, name: top})
    with pytest.raises(ConfigError, match=rf"{name}={top + 1} is beyond the sane range 0\.\."):
        ModelConfig(**{**base, name: top + 1})


def test_a_400_digit_dimension_is_a_config_error_from_a_file_too(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": ' + "9" * 400 + "}")
    with pytest.raises(ConfigError, match=r"hidden_size=9999.*\.\.\. is beyond the sane range"):
        ModelConfig.from_hf(path)


@pytest.mark.parametrize("entry", [[1], {"a": 1}, {1, 2}, None, 3, b"mamba"])
def test_layer_types_entries_of_any_type_give_a_config_error(entry):
    # Unhashable entries used to escape as TypeError from a set comprehension.
    with pytest.raises(ConfigError, match="layer_types has unknown entries"):
        ModelConfig(hidden_size=8, num_hidden_layers=2, layer_types=("mamba", entry))


def test_text_config_is_merged_not_dropped():
    # hidden_size only at the top, every other text-model field in text_config: before the
    # fix the text_config was ignored and the model had 0 layers and 0 heads.
    cfg = ModelConfig.from_hf(
        {
            "model_type": "qwen3_vl",
            "hidden_size": 64,
            "vocab_size": 7,
            "text_config": {
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "vocab_size": 100,
                "intermediate_size": None,  # null reads as absent: the top level fills it
            },
            "intermediate_size": 128,
        }
    )
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 2, 4)
    assert (cfg.num_key_value_heads, cfg.head_dim) == (2, 16)
    assert cfg.vocab_size == 100  # text_config wins
    assert cfg.intermediate_size == 128  # the top level fills the gap


def test_merged_text_config_errors_name_where_each_key_came_from():
    with pytest.raises(ConfigError, match=r"text_config\.head_dim=-1"):
        ModelConfig.from_hf({"hidden_size": 64, "text_config": {"head_dim": -1}})
    with pytest.raises(ConfigError, match=r"<dict>: head_dim=-1"):
        ModelConfig.from_hf({"hidden_size": 64, "head_dim": -1, "text_config": {}})


def test_unsearchable_directory_is_a_config_error(tmp_path, monkeypatch):
    # Root ignores permissions, so the OS error is simulated where Path raises it.
    real = pathlib.Path.is_file

    def is_file(self):
        if self.name == "config.json":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(pathlib.Path, "is_file", is_file)
    with pytest.raises(ConfigError, match="cannot look for config.json.*Permission denied"):
        ModelConfig.from_hf(tmp_path)


@pytest.mark.parametrize("name", [5, None, b"hopper", ["hopper"], 1.5])
def test_target_preset_of_a_non_string(name):
    with pytest.raises(ValueError, match="target name must be a str"):
        Target.preset(name)


def test_levers_and_target_fields_of_the_wrong_type_are_config_errors():
    with pytest.raises(ConfigError, match="Levers.fp8_rowwise='1' must be a bool"):
        Levers(fp8_rowwise="1")
    with pytest.raises(ConfigError, match="Levers.attn_decode_splitk=4 must be a str"):
        Levers(attn_decode_splitk=4)
    with pytest.raises(ConfigError, match="Target.sm_count='48' must be an int"):
        Target(name="x", sm_count="48")
    with pytest.raises(ConfigError, match="Target.sm_count=0 must be >= 1"):
        Target(name="x", sm_count=0)
