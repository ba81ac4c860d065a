"""HuggingFace config parsing: source forms, families without a bundled preset, errors.

Every bundled preset is checked field by field in `test_presets.py`; here the families and
rules that no preset covers are checked on small hand-written configs, each expected value
derived in a comment, and malformed input is fuzzed with hypothesis.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxarena
from jaxarena import ConfigError, ModelConfig
from jaxarena._config import hf_families, hf_source
from jaxarena._config.schema import LAYER_TYPES


def load(source, **kw):
    return ModelConfig.from_hf(source, **kw)


def parse(data, *, source=hf_families.DICT_SOURCE):
    return ModelConfig(**hf_families.parse(data, source=source))


def parse_json_text(text, *, source):
    return ModelConfig(**hf_source.parse_json_text(text, source=source))

PRESET_DIR = Path(jaxarena.__file__).parent / "presets"
PRESET_JSON = {p.stem: json.loads(p.read_text()) for p in sorted(PRESET_DIR.glob("*.json"))}

QWEN3_8B = PRESET_JSON["qwen3-8b"]


def _counts(cfg: ModelConfig) -> Counter:
    return Counter(cfg.layer_types)


# -- source forms -------------------------------------------------------------------------------


def _write(tmp_path: Path, data, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_file_directory_and_dict_give_the_same_config(tmp_path):
    path = _write(tmp_path, QWEN3_8B)
    from_file = load(str(path))
    from_pathlike = load(path)
    from_dir = load(tmp_path)
    from_dict = load(QWEN3_8B)
    assert from_file == from_pathlike == from_dir == from_dict
    assert from_file.source == str(path)
    assert from_dir.source == str(path)
    assert from_dict.source == "<dict>"
    assert from_dict.model_type == "qwen3"
    assert ModelConfig.from_hf(path) == from_file


def test_mapping_that_is_not_a_dict(tmp_path):
    assert load(types.MappingProxyType(QWEN3_8B)) == load(QWEN3_8B)


def test_bare_infinity_and_nulls_are_read():
    # mamba2-2.7b has `time_step_limit: [0.0, Infinity]`; DeepSeek-V2-Lite `q_lora_rank: null`.
    assert load(PRESET_DIR / "mamba2-2.7b.json").mamba_num_heads == 80
    assert load(PRESET_DIR / "deepseek-v2-lite.json").q_lora_rank == 0


def test_directory_without_config_json(tmp_path):
    with pytest.raises(ConfigError, match="directory has no config.json") as info:
        load(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_hub_id_without_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(ConfigError, match="pip install huggingface_hub") as info:
        load("Qwen/Qwen3-8B")
    assert "Qwen/Qwen3-8B" in str(info.value)


def test_hub_id_with_huggingface_hub(tmp_path, monkeypatch):
    calls = []

    def hf_hub_download(*, repo_id, filename, revision):
        calls.append((repo_id, filename, revision))
        return str(_write(tmp_path, QWEN3_8B))

    fake = types.ModuleType("huggingface_hub")
    fake.hf_hub_download = hf_hub_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    cfg = load("Qwen/Qwen3-8B", revision="main")
    assert calls == [("Qwen/Qwen3-8B", "config.json", "main")]
    assert cfg == load(QWEN3_8B)
    assert cfg.source == "hf://Qwen/Qwen3-8B@main/config.json"


def test_hub_download_failure_is_a_config_error(monkeypatch):
    def hf_hub_download(**kwargs):
        raise RuntimeError("404 Client Error: repository not found")

    fake = types.ModuleType("huggingface_hub")
    fake.hf_hub_download = hf_hub_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    with pytest.raises(ConfigError, match="404") as info:
        load("nobody/nothing")
    assert "hf://nobody/nothing/config.json" in str(info.value)


@pytest.mark.parametrize(
    "source", ["/no/such/dir/config.json", "no-such-config.json", "a/b/c", "just-a-word"]
)
def test_missing_path_that_is_not_a_repo_id(source):
    with pytest.raises(ConfigError, match="no such file") as info:
        load(source)
    assert source in str(info.value)
    assert "pip install" not in str(info.value)


@pytest.mark.parametrize("source", [None, 3, 4.5, ["config.json"], b"config.json", ""])
def test_source_of_the_wrong_kind(source):
    with pytest.raises(ConfigError, match="source="):
        load(source)


def test_revision_only_for_hub_ids(tmp_path):
    path = _write(tmp_path, QWEN3_8B)
    with pytest.raises(ConfigError, match="revision='main' only applies to hub repo ids"):
        load(path, revision="main")
    with pytest.raises(ConfigError, match="revision=3 must be a string"):
        load("Qwen/Qwen3-8B", revision=3)


# -- families and rules without a bundled preset ------------------------------------------------

MISTRAL_7B = dict(
    model_type="mistral",
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_hidden_layers=32,
    num_key_value_heads=8,
    sliding_window=4096,
    vocab_size=32000,
)


def test_standard_attention_derives_head_dim():
    cfg = load(MISTRAL_7B)
    assert cfg.head_dim == 4096 // 32
    assert not cfg.attn_gated  # Mistral attention has no output gate (the seed said true)
    assert cfg.num_attention_layers == 32


def test_qwen2_without_kv_heads_is_multi_head():
    cfg = load(dict(model_type="qwen2", hidden_size=896, num_attention_heads=14,
                    num_hidden_layers=2, vocab_size=256, intermediate_size=4864))
    assert cfg.num_key_value_heads == 14  # HF: absent num_key_value_heads means MHA
    assert cfg.head_dim == 896 // 14


def test_qwen2_moe_shared_expert_by_name():
    cfg = load(
        dict(
            model_type="qwen2_moe",
            hidden_size=2048,
            num_attention_heads=16,
            num_key_value_heads=16,
            num_hidden_layers=24,
            num_experts=60,
            num_experts_per_tok=4,
            moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632,
            vocab_size=151936,
        )
    )
    assert (cfg.num_experts, cfg.moe_intermediate_size) == (60, 1408)
    assert cfg.shared_expert_intermediate_size == 5632


def test_deepseek_v32_indexer_and_mla_head_dim():
    data = dict(
        PRESET_JSON["deepseek-v3"],
        model_type="deepseek_v32",
        index_n_heads=64,
        index_head_dim=128,
        index_topk=2048,
        head_dim=64,  # transformers saves head_dim = qk_rope_head_dim; not the q/k width
    )
    cfg = load(data)
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (64, 128, 2048)
    assert cfg.head_dim == 128 + 64  # qk_nope_head_dim + qk_rope_head_dim
    assert cfg.num_experts == 256  # n_routed_experts
    assert not cfg.attn_gated
    assert load(dict(data, qk_head_dim=200)).head_dim == 200


def test_qwen3_next_without_layer_types_uses_the_hf_interval_default():
    data = dict(PRESET_JSON["qwen3-next-80b-a3b"])
    del data["full_attention_interval"]
    cfg = load(data)
    assert cfg.full_attention_interval == 4  # HF Qwen3NextConfig default
    assert cfg.num_attention_layers == 48 // 4
    assert cfg.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)


def test_qwen3_5_dense_gate_defaults_to_true():
    text = dict(PRESET_JSON["qwen3.5-35b-a3b"]["text_config"])
    del text["attn_output_gate"]
    cfg = load(dict(model_type="qwen3_5", text_config=text, vocab_size=1))
    assert cfg.attn_gated
    assert cfg.vocab_size == 248320  # the nested vocab wins over the top level
    cfg = load(dict(model_type="qwen3_5", text_config=dict(text, attn_output_gate=False)))
    assert not cfg.attn_gated


def test_nested_vocab_falls_back_to_top_level():
    text = dict(PRESET_JSON["qwen3-vl-8b"]["text_config"])
    del text["vocab_size"]
    assert load(dict(model_type="qwen3_vl", text_config=text, vocab_size=1234)).vocab_size == 1234


@pytest.mark.parametrize(
    ("rope_key", "rope", "expected"),
    [
        ("rope_scaling", {"mrope_interleaved": True, "mrope_section": [24, 20, 20]}, True),
        ("rope_parameters", {"mrope_interleaved": True, "mrope_section": [24, 20, 20]}, True),
        # A section without the flag is Qwen2-VL's non-interleaved MRoPE.
        ("rope_scaling", {"type": "mrope", "mrope_section": [16, 24, 24]}, False),
        ("rope_scaling", {"mrope_interleaved": False, "mrope_section": [24, 20, 20]}, False),
        ("rope_scaling", None, False),
    ],
)
def test_mrope_from_rope_scaling_or_rope_parameters(rope_key, rope, expected):
    text = dict(PRESET_JSON["qwen3-vl-8b"]["text_config"])
    del text["rope_scaling"]
    text[rope_key] = rope
    assert load(dict(model_type="qwen3_vl", text_config=text)).mrope_interleaved is expected


JAMBA_V01 = dict(
    model_type="jamba",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    attn_layer_period=8,
    attn_layer_offset=4,
    expert_layer_period=2,
    expert_layer_offset=1,
    num_experts=16,
    num_experts_per_tok=2,
    mamba_d_state=16,
    mamba_expand=2,
    vocab_size=65536,
)


def test_jamba_layers_and_experts():
    cfg = load(JAMBA_V01)
    # i % 8 == 4: layers 4, 12, 20, 28 are attention; the other 28 are Mamba-1 mixers.
    assert [i for i, k in enumerate(cfg.layer_types) if k == "full_attention"] == [4, 12, 20, 28]
    assert cfg.num_ssm_layers == 28 and _counts(cfg)["mamba"] == 28
    assert cfg.mamba_num_heads == 0  # Mamba-1 has no heads
    assert cfg.num_mamba_layers == 0
    assert (cfg.num_experts, cfg.num_experts_per_tok) == (16, 2)
    assert cfg.moe_intermediate_size == 14336  # experts are intermediate_size wide
    assert cfg.head_dim == 4096 // 32


def test_jamba_with_one_expert_is_dense():
    cfg = load(dict(JAMBA_V01, num_experts=1, num_experts_per_tok=1))
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (0, 1, 0)


def test_gemma3_nested_text_config_with_hf_defaults():
    # The published Gemma-3 4B text_config leaves heads, head_dim and vocab to the class
    # defaults (8 heads, 4 KV heads, head_dim 256, vocab 262208, sliding_window_pattern 6).
    data = dict(
        model_type="gemma3",
        text_config=dict(
            model_type="gemma3_text",
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=34,
            sliding_window=1024,
        ),
    )
    cfg = load(data)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (8, 4, 256)
    assert cfg.vocab_size == 262208
    # Pattern 6: layers 5, 11, 17, 23, 29 are global (full), the other 29 sliding.
    full = [i for i, k in enumerate(cfg.layer_types) if k == "full_attention"]
    assert full == [5, 11, 17, 23, 29]
    assert cfg.num_attention_layers == 34
    assert not cfg.attn_gated


def test_gemma3_27b_and_gemma2():
    text = dict(
        hidden_size=5376,
        intermediate_size=21504,
        num_attention_heads=32,
        num_key_value_heads=16,
        head_dim=128,
        num_hidden_layers=62,
        sliding_window_pattern=6,
        vocab_size=262208,
    )
    cfg = load(dict(model_type="gemma3", text_config=text))
    assert (cfg.head_dim, cfg.num_key_value_heads) == (128, 16)
    assert _counts(cfg)["full_attention"] == 62 // 6
    gemma2 = load(dict(text, model_type="gemma2", num_hidden_layers=4))
    assert gemma2.layer_types == ("sliding_attention", "full_attention") * 2


def test_mamba1_has_no_mamba2_dims():
    cfg = load(
        dict(
            model_type="mamba",
            hidden_size=2560,
            intermediate_size=5120,
            num_hidden_layers=64,
            state_size=16,
            vocab_size=50280,
        )
    )
    assert cfg.layer_types == ("mamba",) * 64
    assert (cfg.mamba_num_heads, cfg.num_attention_heads, cfg.intermediate_size) == (0, 0, 0)


def test_nemotron_layers_block_type_spelling():
    data = dict(PRESET_JSON["nemotron-h-8b"])
    del data["hybrid_override_pattern"]
    data["num_hidden_layers"] = 4
    data["layers_block_type"] = ["mamba", "attention", "mlp", "moe"]
    cfg = load(data)
    assert cfg.layer_types == ("mamba", "full_attention", "mlp", "moe")


def test_unknown_model_type_with_generic_fields():
    # Read with the generic rule, and said so (issue 40): the family is a guess.
    with pytest.warns(UserWarning, match=r"<dict>: model_type 'brand_new_arch' is not a family"):
        cfg = load(dict(MISTRAL_7B, model_type="brand_new_arch", n_routed_experts=4))
    assert cfg.model_type == "brand_new_arch"
    assert cfg.head_dim == 128 and cfg.num_experts == 4
    assert cfg.moe_intermediate_size == 14336  # no expert width given: intermediate_size


def test_unknown_model_type_without_hidden_size():
    with pytest.raises(ConfigError, match="model_type='brand_new_arch'.*hidden_size"):
        load(dict(model_type="brand_new_arch", d_model=512))


def test_architectures_route_when_model_type_is_absent():
    data = dict(PRESET_JSON["longcat-flash"])
    del data["model_type"]
    cfg = load(data)
    assert cfg.model_type == "longcat_flash"
    assert cfg.num_hidden_layers == 56


def test_longcat_as_transformers_saves_it():
    # transformers stores num_hidden_layers = 2 * num_layers and head_dim = qk_rope_head_dim.
    data = dict(PRESET_JSON["longcat-flash"], num_hidden_layers=56, head_dim=64)
    cfg = load(data)
    assert cfg.num_hidden_layers == 56
    assert cfg.head_dim == 128 + 64
    del data["num_layers"]
    assert load(data).num_hidden_layers == 56


def test_gpt_oss_experts_per_token_alone():
    data = dict(PRESET_JSON["gpt-oss-20b"])
    del data["num_experts_per_tok"]
    assert load(data).num_experts_per_tok == 4  # experts_per_token


def test_deepseek_v4_defaults():
    data = dict(PRESET_JSON["deepseek-v4-flash-fixture"])
    del data["head_dim"]
    # Absent head_dim: 4096 // 64 = 64, which the Flash shape (with q_lora_rank) turns to 512.
    assert load(data).head_dim == 512
    assert load(dict(data, num_attention_heads=32)).head_dim == 4096 // 32
    no_indexer = {
        k: v for k, v in data.items() if not k.startswith("index_") and k != "compress_ratios"
    }
    cfg = load(dict(no_indexer, compress_ratios=[0, 128, 0]))
    assert (cfg.index_n_heads, cfg.index_topk) == (0, 0)
    cfg = load(dict(no_indexer, compress_ratios=[0, 4]))
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (64, 128, 512)


def test_qwen4_exp_rules():
    data = copy.deepcopy(PRESET_JSON["qwen3.8-flash-next-fixture"])
    text = data["text_config"]
    assert not load(dict(data, text_config=dict(text, output_gate_type="none"))).attn_gated
    with pytest.raises(ConfigError, match=r"text_config\.hc_count.*text_config\.hc_lowrank"):
        load(dict(data, text_config={k: v for k, v in text.items() if k != "hc_lowrank"}))
    with pytest.raises(ConfigError, match=r"text_config\.layer_types is missing"):
        load(dict(data, text_config={k: v for k, v in text.items() if k != "layer_types"}))


# -- malformed input: explicit messages ---------------------------------------------------------


def _error(tmp_path: Path, data) -> str:
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message, message
    return message


def test_invalid_json_names_file_and_position(tmp_path):
    message = _error(tmp_path, '{"hidden_size": 4096,\n "oops" }')
    assert "invalid JSON at line 2" in message


def test_not_utf8(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"hidden_size": 4096, "x": "\xff"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load(path)


@pytest.mark.parametrize(
    ("change", "key", "rule"),
    [
        (dict(hidden_size=None), "hidden_size", "is null"),
        (dict(num_attention_heads="32"), "num_attention_heads", "got str"),
        (dict(hidden_size=4096.5), "hidden_size", "got float"),
        (dict(hidden_size=4096.0), "hidden_size", "got float"),
        (dict(num_hidden_layers=True), "num_hidden_layers", "got bool"),
        (dict(head_dim=-128), "head_dim", ">= 0"),
        (dict(layer_types="full_attention"), "layer_types", "must be a JSON list"),
        (dict(layer_types=["full_attention"] * 35 + ["bogus"]), "layer_types[35]", "bogus"),
        (dict(rope_scaling=[1, 2]), "rope_scaling", "must be a JSON object"),
        (dict(model_type=3), "model_type", "must be a string"),
        (dict(num_hidden_layers=10**9), "num_hidden_layers", "implausibly large"),
    ],
)
def test_bad_value_names_key_and_file(tmp_path, change, key, rule):
    message = _error(tmp_path, dict(QWEN3_8B, **change))
    assert key in message and rule in message, message


def test_missing_hidden_size(tmp_path):
    data = dict(QWEN3_8B)
    del data["hidden_size"]
    assert "hidden_size is missing" in _error(tmp_path, data)


def test_nested_keys_are_named_with_their_prefix(tmp_path):
    data = copy.deepcopy(PRESET_JSON["qwen3-vl-8b"])
    data["text_config"]["num_key_value_heads"] = "eight"
    assert "text_config.num_key_value_heads='eight'" in _error(tmp_path, data)
    data = dict(data, text_config=[1, 2])
    assert "text_config=[1, 2] must be a JSON object" in _error(tmp_path, data)


def test_nemotron_pattern_errors(tmp_path):
    data = dict(PRESET_JSON["nemotron-h-8b"])
    message = _error(tmp_path, dict(data, hybrid_override_pattern=52))
    assert "hybrid_override_pattern=52 must be a string" in message
    message = _error(tmp_path, dict(data, hybrid_override_pattern="M-X" + "M" * 49))
    assert "hybrid_override_pattern[2]='X'" in message
    message = _error(tmp_path, dict(data, hybrid_override_pattern="M*"))
    assert "hybrid_override_pattern describes 2 layers but num_hidden_layers=52" in message


def test_top_level_not_an_object(tmp_path):
    assert "top level must be a JSON object" in _error(tmp_path, [QWEN3_8B])
    with pytest.raises(ConfigError, match="<dict>"):
        parse("not a dict")


def test_model_config_rules_name_the_file(tmp_path):
    message = _error(tmp_path, dict(QWEN3_8B, num_key_value_heads=5))
    assert "num_attention_heads=32 is not a multiple of num_key_value_heads=5" in message
    message = _error(tmp_path, dict(QWEN3_8B, layer_types=["full_attention"] * 3))
    assert "len(layer_types)=3 != num_hidden_layers=36" in message


# -- malformed input: fuzzing -------------------------------------------------------------------

# Keys some family arm reads, so substitutions also land on keys a config did not have.
READ_KEYS = sorted(
    {
        "model_type",
        "architectures",
        "text_config",
        "hidden_size",
        "num_hidden_layers",
        "num_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "attention_head_dim",
        "qk_head_dim",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "kv_lora_rank",
        "q_lora_rank",
        "n_routed_experts",
        "num_local_experts",
        "num_experts",
        "experts_per_token",
        "moe_topk",
        "n_shared_experts",
        "moe_shared_expert_intermediate_size",
        "layer_types",
        "layers_block_type",
        "block_configs",
        "hybrid_override_pattern",
        "full_attention_interval",
        "attn_output_gate",
        "output_gate_type",
        "rope_scaling",
        "rope_parameters",
        "hc_count",
        "hc_lowrank",
        "indexer_n_heads",
        "indexer_budget",
        "compress_ratios",
        "attn_layer_period",
        "attn_layer_offset",
        "expert_layer_period",
        "sliding_window_pattern",
        "num_heads",
        "state_size",
    }
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["M*-E", "MX", "mamba", "moe", "attention", "none", "sigmoid"])
    | st.lists(st.sampled_from(sorted(LAYER_TYPES) + ["bogus", "mamba", "attention"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


def _targets(config: dict) -> list[dict]:
    """The objects a mutation may edit: the top level, text_config, rope dicts, block configs."""
    out = [config]
    for value in list(config.values()):
        if isinstance(value, dict):
            out.append(value)
            out.extend(v for v in value.values() if isinstance(v, dict))
        elif isinstance(value, list):
            out.extend(v for v in value if isinstance(v, dict))
    return out


def _outcome(fn, *args, **kwargs):
    """Runs fn: success or ConfigError are the only acceptable outcomes."""
    try:
        return fn(*args, **kwargs)
    except ConfigError as e:
        assert str(e)
        return e


def _assert_names_source(result, source):
    """A parsed config records where it came from (plus, for a config routed by its
    `architectures` / `auto_map`, how it was read), and a refusal says which input it refuses."""
    if isinstance(result, ModelConfig):
        assert result.source == source or result.source.startswith(f"{source} (model_type "), (
            result.source
        )
    else:
        assert source in str(result), str(result)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(PRESET_JSON)), data=st.data())
def test_fuzzed_configs_raise_only_config_error(name, data):
    config = copy.deepcopy(PRESET_JSON[name])
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        targets = _targets(config)
        target = targets[data.draw(st.integers(0, len(targets) - 1), label="object")]
        action = data.draw(st.sampled_from(["set", "set", "delete"]), label="action")
        keys = sorted(set(map(str, target)) | set(READ_KEYS))
        key = data.draw(st.sampled_from(keys), label="key")
        if action == "delete":
            target.pop(key, None)
        else:
            target[key] = data.draw(json_values, label="value")
    _assert_names_source(_outcome(parse, config), hf_families.DICT_SOURCE)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(PRESET_JSON)), data=st.data())
def test_fuzzed_json_text_raises_only_config_error(name, data):
    text = json.dumps(PRESET_JSON[name])
    mode = data.draw(st.sampled_from(["truncate", "splice", "garbage", "wrap"]), label="mode")
    if mode == "truncate":
        text = text[: data.draw(st.integers(0, len(text)), label="cut")]
    elif mode == "splice":
        at = data.draw(st.integers(0, len(text)), label="at")
        text = text[:at] + data.draw(st.text(max_size=6), label="junk") + text[at:]
    elif mode == "garbage":
        text = data.draw(st.text(max_size=40), label="garbage")
    else:
        text = data.draw(st.sampled_from(["[{}]", '"{}"', "3", "null", f"[{text}]"]))
    _assert_names_source(_outcome(parse_json_text, text, source="fuzz.json"), "fuzz.json")


@settings(max_examples=15, deadline=None)
@given(raw=st.binary(max_size=64))
def test_garbage_files_raise_only_config_error(raw):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_bytes(raw)
        result = _outcome(load, path)
        if isinstance(result, ConfigError):
            assert str(path) in str(result)
