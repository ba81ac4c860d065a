"""`model_type` -> `Family`: the one place that says which checkpoints load. A new family is
one module under `jaxarena/models/families/` and one line in `FAMILIES`."""

from __future__ import annotations

from pathlib import Path

from jaxarena.models.families.base import Family, unsupported
from jaxarena.models.families.deepseek import DeepseekV2, DeepseekV3
from jaxarena.models.families.gemma import Gemma2, Gemma3
from jaxarena.models.families.gpt_oss import GptOss
from jaxarena.models.families.llama import Llama
from jaxarena.models.families.mamba2 import Mamba2Family
from jaxarena.models.families.moe import Mixtral, Qwen3Moe
from jaxarena.models.families.nemotron_h import NemotronH
from jaxarena.models.families.qwen2 import Qwen2
from jaxarena.models.families.qwen3 import Qwen3
from jaxarena.models.families.qwen3_5 import Qwen3_5
from jaxarena.models.families.qwen3_5_moe import Qwen3_5Moe
from jaxarena.models.families.qwen3_next import Qwen3Next

__all__ = ["FAMILIES", "SUPPORTED_FAMILIES", "family_for"]

_FAMILY_LIST: tuple[Family, ...] = (Llama(), Qwen3(), Mamba2Family(), NemotronH(), Qwen2(),
                                    Gemma2(), Gemma3(), Qwen3_5(), Qwen3Next(), DeepseekV2(),
                                    DeepseekV3(), Qwen3Moe(), Mixtral(), GptOss(), Qwen3_5Moe())  # fmt: skip
FAMILIES: dict[str, Family] = {t: f for f in _FAMILY_LIST for t in f.model_types}
SUPPORTED_FAMILIES = tuple(FAMILIES)


def family_for(model_type: object, path: Path) -> Family:
    """The family of `config.json`'s `model_type`.

    Raises:
      NotImplementedError: a model type no family reads (the message lists those that do).
    """
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise unsupported(path, f"model_type={model_type!r} is not supported; supported: "
                          f"{', '.join(SUPPORTED_FAMILIES)}")  # fmt: skip
    return family
