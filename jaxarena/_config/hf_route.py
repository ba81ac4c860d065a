"""Which family reads a HuggingFace `config.json`: its `model_type` when the parser knows it,
else the family its `architectures` entry or `auto_map`'s config class names.

Aliases handled (a published `model_type` no family rule knows, with a known class):

- `kimi_k2` (Kimi K2 Instruct / Base / Thinking): `architectures: ["DeepseekV3ForCausalLM"]`,
  `auto_map.AutoConfig: "configuration_deepseek.DeepseekV3Config"` -> `deepseek_v3`, so its
  `first_k_dense_replace` dense layer is read as transformers reads it.
- `LLaMAForCausalLM` (nvidia/Llama3-ChatQA-2-8B, decapoda-research/llama-7b-hf): stems are
  compared without case, so this spelling is Llama's.
- any other `model_type` whose first known `architectures` entry (or `auto_map.AutoConfig`)
  has a stem of `CLASS_STEMS`: e.g. a fine-tune that renamed `model_type` but kept
  `LlamaForCausalLM` / `Qwen3MoeForCausalLM`.

Not handled: a multimodal wrapper whose `text_config.model_type` names the family (Kimi-VL's
`kimi_vl` over `deepseek_v3`, Mistral-Small-3.1's `mistral3` over `mistral`): the vision tower
would go uncounted, so such a config stays with the generic arm.

A config without `model_type` is routed the same way (spec §14.2 names LongCat, Qwen4-exp,
Mamba-2, Nemotron-H and Jamba classes). The note of a rerouted config is appended to
`ModelConfig.source`.
"""

from __future__ import annotations

from jaxarena._config.hf_json import Obj, show
from jaxarena._errors import ConfigError

__all__ = ["CLASS_STEMS", "family_of_class", "route"]

# HF class-name stems (`<stem>ForCausalLM`, `<stem>ForConditionalGeneration`, `<stem>Model`,
# `<stem>Config`) -> the family they name. A `model_type` this parser does not know is read as
# the family its `architectures` entry (else `auto_map`'s config class) names: Kimi K2 ships
# `model_type: kimi_k2` with `architectures: ["DeepseekV3ForCausalLM"]`.
CLASS_STEMS = {
    "Llama": "llama",
    "Mistral": "mistral",
    "Mixtral": "mixtral",
    "Qwen2": "qwen2",
    "Qwen2Moe": "qwen2_moe",
    "Qwen3": "qwen3",
    "Qwen3Moe": "qwen3_moe",
    "Qwen3Next": "qwen3_next",
    "Qwen3VL": "qwen3_vl",
    "Qwen3VLMoe": "qwen3_vl_moe",
    "Qwen3_5": "qwen3_5",
    "Qwen3_5Moe": "qwen3_5_moe",
    "Qwen4Exp": "qwen4_exp",
    "Qwen3_8FlashNext": "qwen4_exp",
    "DeepseekV2": "deepseek_v2",
    "DeepseekV3": "deepseek_v3",
    "DeepseekV32": "deepseek_v32",
    "DeepseekV4": "deepseek_v4",
    "GptOss": "gpt_oss",
    "LongcatFlash": "longcat_flash",
    "LongcatFlashNgram": "longcat_flash_ngram",
    "Mamba": "mamba",
    "FalconMamba": "falcon_mamba",
    "Mamba2": "mamba2",
    "NemotronH": "nemotron_h",
    "Jamba": "jamba",
    "Gemma": "gemma",
    "Gemma2": "gemma2",
    "Gemma3": "gemma3",
}
_CLASS_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "Model", "Config")


# Stems compared without case: `LLaMAForCausalLM` is Llama's class in the configs of
# nvidia/Llama3-ChatQA-2-8B and decapoda-research/llama-7b-hf (llama.cpp and vLLM accept it).
_STEMS_FOLDED = {stem.lower(): family for stem, family in CLASS_STEMS.items()}


def family_of_class(name: str) -> str:
    """The family a HF class name (`DeepseekV3ForCausalLM`, `configuration_x.DeepseekV3Config`)
    names, or "" when its stem is not one this parser knows."""
    name = name.rsplit(".", 1)[-1]
    for suffix in _CLASS_SUFFIXES:
        if name.endswith(suffix) and name != suffix:
            return _STEMS_FOLDED.get(name[: -len(suffix)].lower(), "")
    return ""


def route(top: Obj, known: frozenset[str]) -> tuple[str, str]:
    """`(family, note)`: the `model_type` when it is in `known`; else the family that
    `architectures` (first known entry), then `auto_map.AutoConfig`, names, with a note saying
    so (kept in `ModelConfig.source`); else the `model_type` as given (the generic arm reads
    it, or refuses it when it has no generic fields)."""
    model_type = top.str("model_type") or ""
    if model_type in known:
        return model_type, ""
    architectures = top.list("architectures") or []
    for i, entry in enumerate(architectures):
        if not isinstance(entry, str):
            raise ConfigError(
                f"{top.source}: architectures[{i}]={show(entry)} must be a string, got "
                f"{type(entry).__name__}"
            )
    candidates = [(f"architectures[{i}]", a) for i, a in enumerate(architectures)]
    auto_map = top.obj("auto_map")
    if auto_map is not None:
        config_class = auto_map.str("AutoConfig")
        if config_class:
            candidates.append(("auto_map.AutoConfig", config_class))
    for key, name in candidates:
        family = family_of_class(name)
        if family:
            if not model_type:  # nothing to reroute: the class names the family
                return family, ""
            return family, f"model_type {model_type!r} read as {family!r}, from {key}={name!r}"
    return model_type, ""
