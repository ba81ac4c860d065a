"""Reading HuggingFace `config.json` files into `ModelConfig`.

`load` accepts a path to a `config.json`, a directory holding one, an already-loaded dict, or
(with the optional `huggingface_hub` package) a hub repo id. `parse` turns one JSON object
into a `ModelConfig`, routing on the top-level `model_type`; a `model_type` no family rule
knows (or none) is read as the family its `architectures` entry or `auto_map.AutoConfig` class
names (`hf_route`: Kimi K2's `kimi_k2` is DeepSeek-V3), with a note in `ModelConfig.source`.

The parser reads what the architecture really is, which differs on purpose from the seed's Rust
parser (spec §14.2) where that parser was wrong for the sizing:

The families (`model_type` -> how it is read):

- Llama, Mistral, Qwen2/Qwen3, Qwen2/3-MoE, Mixtral, gpt-oss, DeepSeek-V2/V3/V3.2 and every
  unknown `model_type` with `hidden_size` (generic arm): fields by name; `head_dim` absent ->
  `hidden_size // num_attention_heads`; `num_key_value_heads` absent -> `num_attention_heads`;
  experts from `num_experts`, else `n_routed_experts`, else `num_local_experts`; expert FFN
  width absent -> `intermediate_size` (Mixtral, gpt-oss); top-k from `num_experts_per_tok`, else
  `experts_per_token`; shared experts from `shared_expert_intermediate_size`, else
  `n_shared_experts * moe_intermediate_size`; MLA (`kv_lora_rank > 0` with `qk_nope_head_dim`):
  `head_dim = qk_head_dim` or `qk_nope_head_dim + qk_rope_head_dim`; `attn_gated =
  attn_output_gate` (default false); no `layer_types` but a `sliding_window`: every layer
  `sliding_attention` for Llama/Mistral/Mixtral, layers from `max_window_layers` on with
  `use_sliding_window` for Qwen2/3 (`hf_rules.window_layers`). An unknown `model_type` is
  read so with an `UnknownFamilyWarning`.
- `qwen3_next`: generic + `attn_gated` always true; `layer_types` from `full_attention_interval`
  (HF default 4) when absent.
- `qwen3_5`, `qwen3_5_moe` (Qwen3.5/3.6): generic on `text_config`; `attn_gated =
  attn_output_gate` (default true); layer types as Qwen3-Next.
- `qwen3_vl`, `qwen3_vl_moe`: generic on `text_config` (no output gate).
- `qwen4_exp`, `qwen3_8_flash_next`: generic on `text_config`; `hc_count`/`hc_lowrank`,
  `indexer_*` renames; `attn_gated` from `output_gate_type`; `layer_types` required.
- `deepseek_v4`: spec §14.2(d).
- `longcat_flash`, `longcat_flash_ngram`: spec §14.2(h): renames, doubled layers, MLA head_dim.
- `mamba2`: `num_heads`/`head_dim`/`state_size`/`n_groups` are the Mamba-2 dims; no attention.
- `mamba`, `falcon_mamba`: Mamba-1: every layer `"mamba"`, no Mamba-2 heads, no MLP.
- `nemotron_h`, `nemotron_h_puzzle`: `layers_block_type` (or `layer_types`) /
  `hybrid_override_pattern` / `block_configs` -> layer types; block names as published
  (mamba / attention / mlp / moe) or as transformers 5.x writes them (linear_attention for
  the Mamba-2 mixer, full_attention, mlp, moe).
- `jamba`: attention/expert layer period and offset; Mamba-1 mixers.
- `gemma`, `gemma2`, `gemma3`, `gemma3_text`: `text_config`; sliding/full layer types; HF class
  defaults.

For every family `mrope_interleaved` is the bool `mrope_interleaved` of `rope_parameters`, else
of `rope_scaling` (of the text object), false when absent: a plain `mrope_section` without the
flag is non-interleaved MRoPE (Qwen2-VL) and reads false. Nested `text_config` supplies the
fields, with `vocab_size` falling back to the top level.

Conventions: a JSON `null` for an integer field means "not set" (as in HuggingFace: e.g.
DeepSeek-V2-Lite's `q_lora_rank: null` is 0), except that `hidden_size` is required. Integers
must be JSON integers (not floats, not booleans) and non-negative. Every problem raises
`ConfigError` naming the JSON key (with its `text_config.` prefix when nested) and the file.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

from jaxarena._config.hf_json import Obj, show
from jaxarena._config.hf_route import CLASS_STEMS, route
from jaxarena._config.hf_rules import check_needed, warn_unknown_family, window_layers
from jaxarena._config.hf_weights import weight_fields
from jaxarena._config.schema import INT_DEFAULTS
from jaxarena._errors import ConfigError

__all__ = ["parse", "known_model_types", "DICT_SOURCE"]

DICT_SOURCE = "<dict>"

# No published model has more than a few hundred layers; the bound keeps a corrupt
# `num_hidden_layers` from materialising a layer list of 10**18 entries.
_MAX_LAYERS = 1 << 16

# -- parsing ------------------------------------------------------------------------------------


def parse(data: Any, *, source: str = DICT_SOURCE) -> dict[str, Any]:
    """Turns one parsed HuggingFace config object into `ModelConfig` fields.

    Args:
      data: the JSON object (a mapping) of a `config.json`.
      source: the file name used in error messages and stored as `ModelConfig.source`.

    Returns:
      `{field: value}` for `ModelConfig(**fields)`, with `model_type` set to the routed model
      type and `source` to `source`; `ModelConfig` validates it.

    Raises:
      ConfigError: the top level is not an object, a key is missing, mistyped or negative, a
        dimension the family needs is missing or 0 (`hf_rules.check_needed`), a layer type or
        pattern character is unknown, an unknown `model_type` has no `hidden_size`. Messages
        name the key and source.

    Warns:
      UnknownFamilyWarning: a `model_type` no rule knows, read with the generic rule.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: the top level must be a JSON object (the config), got "
            f"{type(data).__name__} {show(data)}"
        )
    top = Obj(data, "", source)
    model_type, alias = route(top, known_model_types())
    if alias:
        source = f"{source} ({alias})"
        top = Obj(data, "", source)
    arm = _ARMS.get(model_type, _generic)
    kw = arm(top, model_type)
    kw.update(weight_fields(top, _text(top), model_type, kw))
    # Every dimension the family needs is there (ConfigError naming the key and file).
    check_needed(_text(top), kw, model_type, generic=arm in _GENERIC_BASED)
    if model_type not in known_model_types():
        warn_unknown_family(model_type, source)
    return {**kw, "model_type": model_type, "source": source}


# -- routing -------------------------------------------------------------------------------------


def known_model_types() -> frozenset[str]:
    """Every `model_type` this parser reads by a rule of its own or as a generic family."""
    return frozenset(_ARMS) | frozenset(_GENERIC_FAMILIES)


def _text(top: Obj) -> Obj:
    """The object that holds the language-model fields: `text_config` merged over the top level
    when there is one (a `text_config` key wins; a key only the top level states fills the gap),
    else the top level. Nothing either level states is dropped: a config with `hidden_size` at
    the top and the layer and head counts in `text_config` reads all of them. Error messages
    name each key where its value came from (`text_config.head_dim` or `head_dim`)."""
    text = top.obj("text_config")
    if text is None:
        return top
    stated = {k: v for k, v in text.data.items() if v is not None}
    filled = {k: v for k, v in top.data.items() if k != "text_config" and k not in stated}
    # Keys neither level states are named under text_config (where they belong).
    return Obj({**filled, **stated}, text.prefix, top.source, prefixes=dict.fromkeys(filled, ""))


# -- shared rules --------------------------------------------------------------------------------


def _by_name(obj: Obj, *, layer_types: bool = True) -> dict[str, Any]:
    """Every `ModelConfig` field read under its own name (the seed's default arm); with
    `layer_types=False` the `layer_types` key is left to the family arm."""
    kw: dict[str, Any] = {"hidden_size": obj.required_int("hidden_size", "the model width")}
    for name, default in INT_DEFAULTS.items():
        if name == "adapter_max_rank":  # a serving setting (LoRA), never a model property
            continue
        maximum = _MAX_LAYERS if name == "num_hidden_layers" else None
        kw[name] = obj.int(name, default, maximum=maximum)
    kw["layer_types"] = obj.layer_types() if layer_types else ()
    kw["attn_gated"] = False
    kw["mrope_interleaved"] = _mrope_interleaved(obj)
    return kw


def _mrope_interleaved(obj: Obj) -> bool:
    # Newer transformers write `rope_parameters`, older ones `rope_scaling`; the first that
    # states the flag wins. A section without the flag is plain (non-interleaved) MRoPE.
    for name in ("rope_parameters", "rope_scaling"):
        rope = obj.obj(name)
        if rope is not None and rope.has("mrope_interleaved"):
            return rope.bool("mrope_interleaved", False)
    return False


def _mla_head_dim(obj: Obj) -> int:
    """The MLA q/k head width: `qk_head_dim`, else `qk_nope_head_dim + qk_rope_head_dim`."""
    if obj.has("qk_head_dim"):
        return obj.int("qk_head_dim")
    if obj.has("qk_nope_head_dim"):
        return obj.int("qk_nope_head_dim") + obj.int("qk_rope_head_dim")
    return 0


def _attention_shape(kw: dict[str, Any], obj: Obj) -> None:
    heads = kw["num_attention_heads"]
    if not obj.has("num_key_value_heads"):
        kw["num_key_value_heads"] = heads  # HF's rule: no key means multi-head attention
    # MLA: the `head_dim` key, where present, is the rope width (transformers saves
    # `head_dim = qk_rope_head_dim` for DeepSeek and LongCat), not the q/k width we size for.
    mla = _mla_head_dim(obj) if kw["kv_lora_rank"] > 0 else 0
    if mla:
        kw["head_dim"] = mla
    elif kw["head_dim"] == 0 and heads > 0:
        kw["head_dim"] = kw["hidden_size"] // heads


def _experts(kw: dict[str, Any], obj: Obj) -> None:
    if kw["num_experts"] == 0:
        for name in ("n_routed_experts", "num_local_experts"):
            if obj.has(name):
                kw["num_experts"] = obj.int(name)
                break
    if not obj.has("num_experts_per_tok") and obj.has("experts_per_token"):
        kw["num_experts_per_tok"] = obj.int("experts_per_token")
    if kw["num_experts"] > 0 and kw["moe_intermediate_size"] == 0:
        # Mixtral, gpt-oss, Jamba: the expert FFN is `intermediate_size` wide.
        kw["moe_intermediate_size"] = kw["intermediate_size"]
    if kw["shared_expert_intermediate_size"] == 0:
        shared = obj.int("moe_shared_expert_intermediate_size")
        if shared == 0:
            shared = obj.int("n_shared_experts") * kw["moe_intermediate_size"]
        kw["shared_expert_intermediate_size"] = shared


def _vocab(kw: dict[str, Any], top: Obj, default: int = 0) -> None:
    if kw["vocab_size"] == 0:
        kw["vocab_size"] = top.int("vocab_size", default)


def _periodic(obj: Obj, n: int, key: str, period: int, hit: str, miss: str) -> tuple[str, ...]:
    """Layer `i` is `hit` when `(i + 1) % period == 0`, else `miss` (the HF hybrid rule)."""
    if period < 1:
        raise obj.error(key, "must be >= 1 (one layer in every `period` is the other kind)")
    return tuple(hit if (i + 1) % period == 0 else miss for i in range(n))


# -- family arms ---------------------------------------------------------------------------------

_Arm = Callable[[Obj, str], dict[str, Any]]

# Families the generic arm reads correctly as they are (for the unknown-model_type message).
_GENERIC_FAMILIES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "qwen3_vl",
    "qwen3_vl_moe",
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "gpt_oss",
)


def _generic(top: Obj, model_type: str) -> dict[str, Any]:
    obj = _text(top)
    if not obj.has("hidden_size") and model_type not in _GENERIC_FAMILIES:
        named = top.list("architectures") or []
        raise ConfigError(
            f"{top.source}: model_type={model_type!r} is not a family this parser knows, "
            f"neither is architectures={show(named)} (nor auto_map.AutoConfig), and the config "
            f"has no usable generic fields (key {obj.key('hidden_size')} is missing); known "
            f"families: {sorted(known_model_types())}; known classes: "
            f"<stem>ForCausalLM etc. for stems {sorted(CLASS_STEMS)}"
        )
    kw = _by_name(obj)
    _vocab(kw, top)
    _experts(kw, obj)
    _attention_shape(kw, obj)
    kw["attn_gated"] = obj.bool("attn_output_gate", False)
    if not kw["layer_types"]:
        kw["layer_types"] = window_layers(obj, model_type, kw["num_hidden_layers"])
    return kw


def _qwen3_next(top: Obj, model_type: str) -> dict[str, Any]:
    kw = _generic(top, model_type)
    obj = _text(top)
    kw["attn_gated"] = True  # Qwen3-Next attention always has the sigmoid output gate
    _gdn_layers(kw, obj)
    return kw


def _qwen3_5(top: Obj, model_type: str) -> dict[str, Any]:
    kw = _generic(top, model_type)
    obj = _text(top)
    kw["attn_gated"] = obj.bool("attn_output_gate", True)
    _gdn_layers(kw, obj)
    return kw


def _gdn_layers(kw: dict[str, Any], obj: Obj) -> None:
    # The HF class default interval is 4 for Qwen3-Next and Qwen3.5; a config that omits it
    # relies on that, not on the seed's 1.
    kw["full_attention_interval"] = obj.int("full_attention_interval", 4)
    if not kw["layer_types"]:
        kw["layer_types"] = _periodic(
            obj,
            kw["num_hidden_layers"],
            "full_attention_interval",
            kw["full_attention_interval"],
            "full_attention",
            "linear_attention",
        )


def _qwen4_exp(top: Obj, model_type: str) -> dict[str, Any]:
    kw = _generic(top, model_type)
    obj = _text(top)
    hc = _all_or_none(obj, ("hc_count", "hc_lowrank"))
    if hc:
        kw["hc_mult"], kw["hc_lowrank"] = hc
    index = _all_or_none(obj, ("indexer_n_heads", "indexer_head_dim", "indexer_budget"))
    if index:
        kw["index_n_heads"], kw["index_head_dim"], kw["index_topk"] = index
    kw["index_compress_ratio"] = obj.int("indexer_compress_ratio", kw["index_compress_ratio"])
    gate = obj.str("output_gate_type")
    if gate is not None:
        kw["attn_gated"] = gate not in ("", "none")
    if not kw["layer_types"]:
        raise ConfigError(
            f"{top.source}: required key {obj.key('layer_types')} is missing (model_type "
            f"{model_type!r} lists one layer type per layer)"
        )
    return kw


def _all_or_none(obj: Obj, names: tuple[str, ...]) -> tuple[int, ...] | None:
    present = [n for n in names if obj.has(n)]
    if not present:
        return None
    if len(present) != len(names):
        missing = [obj.key(n) for n in names if n not in present]
        raise ConfigError(
            f"{obj.source}: {', '.join(obj.key(n) for n in present)} given without "
            f"{', '.join(missing)}; these keys go together"
        )
    return tuple(obj.int(n) for n in names)


def _deepseek_v4(top: Obj, model_type: str) -> dict[str, Any]:
    # Spec §14.2(d), in the seed's order.
    obj = _text(top)
    kw = _by_name(obj)
    _vocab(kw, top)
    _experts(kw, obj)
    if not obj.has("num_key_value_heads"):
        kw["num_key_value_heads"] = 1  # V4 attention is multi-query over one compressed KV head
    if kw["kv_lora_rank"] == 0:
        kw["kv_lora_rank"] = 512
    heads = kw["num_attention_heads"]
    if kw["head_dim"] == 0 and heads > 0:
        head_dim = kw["hidden_size"] // heads
        if (head_dim, kw["hidden_size"], heads) == (64, 4096, 64) and kw["q_lora_rank"] > 0:
            head_dim = 512  # the Flash shape: 64 heads of 512 over a 4096-wide model
        kw["head_dim"] = head_dim
    if kw["q_lora_rank"] == 0:
        kw["q_lora_rank"] = 1024
    kw["layer_types"] = ("full_attention",) * kw["num_hidden_layers"]
    ratios = obj.list("compress_ratios") or []
    for i, ratio in enumerate(ratios):
        if isinstance(ratio, bool) or not isinstance(ratio, numbers.Integral) or ratio < 0:
            raise ConfigError(
                f"{obj.source}: {obj.key('compress_ratios')}[{i}]={show(ratio)} must be a "
                f"non-negative integer"
            )
    if 4 in ratios:  # layers compressed 4x run the sparse indexer
        for name, value in (("index_n_heads", 64), ("index_head_dim", 128), ("index_topk", 512)):
            kw[name] = kw[name] or value
    kw["hc_mult"] = kw["hc_mult"] or 4
    return kw


def _longcat(top: Obj, model_type: str) -> dict[str, Any]:
    # Spec §14.2(h). A LongCat "layer" holds two attention (MLA) sublayers, so the attention
    # layer count is 2 * num_layers (transformers stores the same as num_hidden_layers).
    obj = _text(top)
    kw = _by_name(obj)
    _vocab(kw, top)
    if obj.has("num_layers"):
        kw["num_hidden_layers"] = 2 * obj.int("num_layers", maximum=_MAX_LAYERS // 2)
    for target, alias in (
        ("num_experts", "n_routed_experts"),
        ("num_experts_per_tok", "moe_topk"),
        ("moe_intermediate_size", "expert_ffn_hidden_size"),
        ("intermediate_size", "ffn_hidden_size"),
    ):
        if not obj.has(target):
            kw[target] = obj.int(alias, kw[target])
    _experts(kw, obj)
    _attention_shape(kw, obj)
    kw["head_dim"] = _mla_head_dim(obj) or kw["head_dim"]  # MLA even when kv_lora_rank is absent
    if not kw["layer_types"]:
        kw["layer_types"] = ("full_attention",) * kw["num_hidden_layers"]
    return kw


def _mamba2(top: Obj, model_type: str) -> dict[str, Any]:
    # `num_heads`/`head_dim`/`state_size`/`n_groups` are the Mamba-2 mixer's; there is no
    # attention and no MLP. Absent keys take the HF Mamba2Config defaults.
    obj = _text(top)
    n = obj.int("num_hidden_layers", maximum=_MAX_LAYERS)
    return dict(
        hidden_size=obj.required_int("hidden_size", "the model width"),
        num_hidden_layers=n,
        vocab_size=obj.int("vocab_size"),
        mamba_num_heads=obj.int("num_heads", 128),
        mamba_head_dim=obj.int("head_dim", 64),
        ssm_state_size=obj.int("state_size", 128),
        n_groups=obj.int("n_groups", 8),
        layer_types=("mamba",) * n,
        mrope_interleaved=False,
    )


def _mamba1(top: Obj, model_type: str) -> dict[str, Any]:
    # Mamba-1 has no heads, so none of the Mamba-2 dims apply; its `intermediate_size` is the
    # mixer's inner width, not an MLP, so it is not copied.
    obj = _text(top)
    n = obj.int("num_hidden_layers", maximum=_MAX_LAYERS)
    return dict(
        hidden_size=obj.required_int("hidden_size", "the model width"),
        num_hidden_layers=n,
        vocab_size=obj.int("vocab_size"),
        layer_types=("mamba",) * n,
    )


_NEMOTRON_PATTERN = {"M": "mamba", "*": "full_attention", "-": "mlp", "E": "moe"}
# Block names: the published configs' (`block_configs`, transformers 4.x `layers_block_type`:
# mamba / attention / mlp / moe) and transformers 5.x's, which `NemotronHConfig` writes to
# `layers_block_type` (also readable as `layer_types`): linear_attention is the Mamba-2 mixer.
_NEMOTRON_BLOCKS = {
    "mamba": "mamba", "attention": "full_attention", "mlp": "mlp", "moe": "moe",
    "linear_attention": "mamba", "full_attention": "full_attention",
}  # fmt: skip


def _nemotron_h(top: Obj, model_type: str) -> dict[str, Any]:
    obj = _text(top)
    kw = _by_name(obj, layer_types=False)  # its `layer_types` uses the block names below
    _vocab(kw, top)
    block_types, widest = _nemotron_blocks(obj)
    # Puzzle (LatentMoE) blocks differ per layer; the workspace must fit the widest one.
    kw.update(widest)
    kw["head_dim"] = kw["head_dim"] or obj.int("attention_head_dim")
    _experts(kw, obj)
    _attention_shape(kw, obj)
    if not kw["layer_types"]:
        layer_types, key = _nemotron_layers(obj, block_types)
        if not obj.has("num_hidden_layers"):
            kw["num_hidden_layers"] = len(layer_types)  # Puzzle: `num_hidden_layers: null`
        elif layer_types and len(layer_types) != kw["num_hidden_layers"]:
            raise ConfigError(
                f"{obj.source}: {key} describes {len(layer_types)} layers but "
                f"{obj.key('num_hidden_layers')}={kw['num_hidden_layers']}"
            )
        kw["layer_types"] = layer_types
    return kw


def _nemotron_blocks(obj: Obj) -> tuple[list[str], dict[str, int]]:
    """Layer kinds of `block_configs` and the largest positive per-MoE-block sizes."""
    blocks = obj.list("block_configs") or []
    if len(blocks) > _MAX_LAYERS:
        raise obj.error("block_configs", f"has {len(blocks)} entries (at most {_MAX_LAYERS})")
    kinds: list[str] = []
    widest: dict[str, int] = {}
    for i, block in enumerate(blocks):
        entry = obj.item_obj("block_configs", i, block)
        kind = entry.str("block_type")
        if kind not in _NEMOTRON_BLOCKS:
            raise entry.error(
                "block_type", f"is not a known block; known: {list(_NEMOTRON_BLOCKS)}"
            )
        kinds.append(_NEMOTRON_BLOCKS[kind])
        if kind == "moe":
            for name in ("moe_intermediate_size", "num_experts_per_tok"):
                value = entry.int(name)
                if value > widest.get(name, 0):
                    widest[name] = value
    return kinds, widest


def _nemotron_layers(obj: Obj, block_kinds: list[str]) -> tuple[tuple[str, ...], str]:
    """Layer types from `layers_block_type` (or its transformers 5.x alias `layer_types`),
    else `hybrid_override_pattern`, else `block_configs`."""
    name = "layers_block_type" if obj.has("layers_block_type") else "layer_types"
    listed = obj.list(name)
    if listed is not None:
        key = obj.key(name)
        if len(listed) > _MAX_LAYERS:
            raise obj.error(name, f"has {len(listed)} entries (at most {_MAX_LAYERS})")
        out = []
        for i, kind in enumerate(listed):
            if not isinstance(kind, str) or kind not in _NEMOTRON_BLOCKS:
                raise ConfigError(
                    f"{obj.source}: {key}[{i}]={show(kind)} is not a known block; known: "
                    f"{list(_NEMOTRON_BLOCKS)}"
                )
            out.append(_NEMOTRON_BLOCKS[kind])
        return tuple(out), key
    pattern = obj.str("hybrid_override_pattern")
    if pattern:
        key = obj.key("hybrid_override_pattern")
        if len(pattern) > _MAX_LAYERS:
            raise obj.error("hybrid_override_pattern", f"is longer than {_MAX_LAYERS} layers")
        for i, char in enumerate(pattern):
            if char not in _NEMOTRON_PATTERN:
                raise ConfigError(
                    f"{obj.source}: {key}[{i}]={char!r} is not a known block character; known: "
                    f"M (mamba), * (attention), - (MLP), E (MoE)"
                )
        return tuple(_NEMOTRON_PATTERN[c] for c in pattern), key
    return tuple(block_kinds), obj.key("block_configs")


def _jamba(top: Obj, model_type: str) -> dict[str, Any]:
    # Layer i runs attention when i % attn_layer_period == attn_layer_offset, else a Mamba-1
    # mixer (no heads: the Mamba-2 dims stay 0). Its FFN is MoE when i % expert_layer_period ==
    # expert_layer_offset; `layer_types` holds the mixer, so the MoE layers are not a layer
    # type here (a `moe` layer type is a layer with no mixer, Nemotron-H's `E`). Absent keys
    # take the HF JambaConfig defaults.
    obj = _text(top)
    kw = _by_name(obj)
    _vocab(kw, top)
    n = kw["num_hidden_layers"]
    attn_period, attn_offset = _period(obj, "attn_layer_period", 8, "attn_layer_offset", 4)
    expert_period, expert_offset = _period(obj, "expert_layer_period", 2, "expert_layer_offset", 1)
    if not kw["layer_types"]:
        kw["layer_types"] = tuple(
            "full_attention" if i % attn_period == attn_offset else "mamba" for i in range(n)
        )
    kw["num_experts"] = obj.int("num_experts", 16)
    kw["num_experts_per_tok"] = obj.int("num_experts_per_tok", 2)
    has_moe_layer = any(i % expert_period == expert_offset for i in range(n))
    if kw["num_experts"] <= 1 or not has_moe_layer:  # one expert is a dense FFN
        kw["num_experts"], kw["num_experts_per_tok"] = 0, 1
    _experts(kw, obj)
    _attention_shape(kw, obj)
    return kw


def _period(obj: Obj, period_key: str, period: int, offset_key: str, offset: int) -> tuple:
    period = obj.int(period_key, period)
    offset = obj.int(offset_key, offset)
    if period < 1:
        raise obj.error(period_key, "must be >= 1")
    if offset >= period:
        raise obj.error(offset_key, f"must be < {obj.key(period_key)}={period}")
    return period, offset


# Gemma3TextConfig defaults: the published Gemma-3 4B/12B `text_config` leaves these out.
_GEMMA3_DEFAULTS = {
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "vocab_size": 262208,
}


def _gemma(top: Obj, model_type: str) -> dict[str, Any]:
    obj = _text(top)
    kw = _by_name(obj)
    gemma3 = model_type in ("gemma3", "gemma3_text")
    if gemma3:
        for name, value in _GEMMA3_DEFAULTS.items():
            if not obj.has(name) and not (name == "vocab_size" and top.has(name)):
                kw[name] = value
    _vocab(kw, top)
    if not obj.has("num_key_value_heads") and not gemma3:
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    if kw["head_dim"] == 0:
        kw["head_dim"] = 256  # every Gemma config class defaults to 256, not hidden // heads
    n = kw["num_hidden_layers"]
    if not kw["layer_types"] and model_type == "gemma2":
        # Gemma-2 alternates, starting with a sliding layer (HF Gemma2Config).
        kw["layer_types"] = tuple(
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)
        )
    elif not kw["layer_types"] and gemma3:
        pattern = obj.int("sliding_window_pattern", 6)
        kw["layer_types"] = _periodic(
            obj, n, "sliding_window_pattern", pattern, "full_attention", "sliding_attention"
        )
    return kw


# The arms that start from `_generic`: their FFN widths are the generic rule's.
_GENERIC_BASED = frozenset({_generic, _qwen3_next, _qwen3_5, _qwen4_exp})

_ARMS: dict[str, _Arm] = {
    "qwen3_next": _qwen3_next,
    **dict.fromkeys(
        ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_6", "qwen3_6_moe"),
        _qwen3_5,
    ),
    **dict.fromkeys(("qwen4_exp", "qwen4_exp_text", "qwen3_8_flash_next"), _qwen4_exp),
    "deepseek_v4": _deepseek_v4,
    **dict.fromkeys(("longcat_flash", "longcat_flash_ngram"), _longcat),
    "mamba2": _mamba2,
    **dict.fromkeys(("mamba", "falcon_mamba"), _mamba1),
    **dict.fromkeys(("nemotron_h", "nemotron_h_puzzle"), _nemotron_h),
    "jamba": _jamba,
    **dict.fromkeys(("gemma", "gemma2", "gemma3", "gemma3_text"), _gemma),
}
