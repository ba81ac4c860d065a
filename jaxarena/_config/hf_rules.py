"""Rules that complete a family's reading of a HuggingFace `config.json` (`hf_families`): the
dimensions a family cannot do without, the layers a config-wide `sliding_window` windows, and
the note on a config no family rule knows.

Design (issue 40): a dimension the family needs that the file lacks, with no documented
default, is a `ConfigError` naming the key and the file (before: read as 0, so a Llama without
`intermediate_size` had a third of its parameters); an unknown `model_type` is still read with
the generic (Llama-layout) rule, since renamed fine-tunes are common, but with a
`ConfigWarning` saying so.
"""

from __future__ import annotations

import warnings
from typing import Any

from jaxarena._config.hf_json import Obj
from jaxarena._config.schema import ATTENTION_KINDS, INT_MAXIMA
from jaxarena._errors import ConfigError, ConfigWarning

__all__ = ["UnknownFamilyWarning", "check_needed", "warn_unknown_family", "window_layers"]

_DICT_SOURCE = "<dict>"


class UnknownFamilyWarning(ConfigWarning):
    """A config whose `model_type` and `architectures` name no known family was read with the
    generic (Llama-layout) rule."""


def warn_unknown_family(model_type: str, source: str) -> None:
    """Warns that `source` was read as the generic decoder (a dict without `model_type` is a
    caller's own config, and is read so silently)."""
    if not model_type and source == _DICT_SOURCE:
        return
    named = f"model_type {model_type!r}" if model_type else "no model_type"
    warnings.warn(
        f"{source}: {named} is not a family jaxarena knows, nor is any architectures entry; "
        f"read as the generic decoder (Llama's layout: attention + SwiGLU MLP, or MoE when it "
        f"lists experts); check the sizes, or set model_type to a known family",
        UnknownFamilyWarning,
        stacklevel=3,
    )


def check_needed(obj: Obj, kw: dict[str, Any], model_type: str, *, generic: bool) -> None:
    """Refuses a config (`obj`, read into `kw`) that lacks a dimension its family needs and
    has no documented default for: layers and vocabulary always, query heads when a layer
    runs attention, and for the generic-rule families (`generic`) the FFN widths the layers
    use. A key present but 0 is named as such.

    Raises:
      ConfigError: naming the key (with its `text_config.` prefix) and the file.
    """
    if any(isinstance(v, int) and v > INT_MAXIMA.get(k, v) for k, v in kw.items()):
        return  # a corrupt value: `ModelConfig` names it, which says more than a missing key

    def need(name: str, why: str, aliases: tuple[str, ...] = ()) -> None:
        if kw.get(name, 0) >= 1:
            return
        for key in (name, *aliases):
            if obj.has(key):
                raise obj.error(key, f"must be >= 1 ({why})")
        state = "null" if name in obj.data else "missing"
        raise ConfigError(
            f"{obj.source}: required key {obj.key(name)} is {state} ({why}; model_type "
            f"{model_type!r} has no default for it)"
        )

    longcat = model_type in ("longcat_flash", "longcat_flash_ngram")
    need("num_hidden_layers", "the number of decoder layers", ("num_layers",) if longcat else ())
    need("vocab_size", "the embedding and LM-head rows")
    types = kw.get("layer_types") or ()
    if any(k in ATTENTION_KINDS for k in types) if types else "mamba" not in model_type:
        need("num_attention_heads", "the attention layers' query heads")
    if not generic:
        return  # the family arms name their own widths (and their HF defaults)
    if kw.get("num_experts", 0) == 0:
        need("intermediate_size", "the MLP width of every layer")
        return
    need("moe_intermediate_size", "the routed experts' FFN width", ("intermediate_size",))
    # Qwen3.5/3.6-MoE run experts in every layer whatever `mlp_only_layers` lists (the models'
    # rule), so their dense-layer width is never needed.
    qwen3_5 = model_type.startswith(("qwen3_5", "qwen3_6"))
    if "dense" in kw.get("ffn_layer_types", ()) and not qwen3_5:
        need("intermediate_size", "the MLP width of the dense layers")


# Families whose config-wide `sliding_window` windows every layer when `layer_types` is absent
# (transformers' Mistral and Mixtral; jaxarena's Llama family reads Llama the same way), and
# those whose window applies only with `use_sliding_window`, from `max_window_layers` on
# (transformers' Qwen2/Qwen3 rule, default 28).
_WINDOW_ALWAYS = frozenset({"llama", "mistral", "mixtral"})
_WINDOW_OPT_IN = frozenset({"qwen2", "qwen3", "qwen2_moe", "qwen3_moe"})


def window_layers(obj: Obj, model_type: str, n: int) -> tuple[str, ...]:
    """`layer_types` of a family whose config states a window but no per-layer types, as the
    model runs it: each windowed layer `sliding_attention`, so the KV budget caps it at the
    window as it caps Gemma's; () when no window applies."""
    if obj.int("sliding_window") == 0:
        return ()
    if model_type in _WINDOW_ALWAYS:
        first = 0
    elif model_type in _WINDOW_OPT_IN and obj.bool("use_sliding_window", False):
        first = obj.int("max_window_layers", 28)
    else:
        return ()
    return tuple("sliding_attention" if i >= first else "full_attention" for i in range(n))
