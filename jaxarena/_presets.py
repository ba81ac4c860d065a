"""Bundled model presets: the HuggingFace `config.json` files shipped in `jaxarena/presets/`.

A preset's name is its file stem (`qwen3-8b` for `presets/qwen3-8b.json`). The files are read
through `importlib.resources`, so presets work from an installed wheel or zip as well as from a
source checkout; any `*.json` dropped into that folder is a preset.
"""

from __future__ import annotations

import difflib
from importlib import resources
from importlib.resources.abc import Traversable

from jaxarena._config import ConfigError, ModelConfig
from jaxarena._hf import parse_json_text

__all__ = ["load_preset", "presets"]

_SUFFIX = ".json"


def _folder() -> Traversable:
    return resources.files("jaxarena") / "presets"


def presets() -> tuple[str, ...]:
    """Names of the bundled presets (file stems of `jaxarena/presets/*.json`), sorted.

    Returns:
      A sorted tuple such as `("deepseek-v3", ..., "qwen3-8b", ...)`; each name is accepted by
      `load_preset` and `ModelConfig.preset`.
    """
    folder = _folder()
    if not folder.is_dir():
        return ()
    return tuple(
        sorted(
            entry.name[: -len(_SUFFIX)]
            for entry in folder.iterdir()
            if entry.name.endswith(_SUFFIX) and entry.is_file()
        )
    )


def load_preset(name: str) -> ModelConfig:
    """Loads the bundled preset `name` (see `presets()`).

    Args:
      name: a preset name, e.g. `"qwen3-8b"` (no `.json` suffix).

    Returns:
      The preset parsed exactly as `ModelConfig.from_hf` parses its file; `source` is
      `"jaxarena/presets/<name>.json"`.

    Raises:
      ConfigError: `name` is not a string or not a bundled preset (the message lists the
        available names), or the preset file itself is invalid.
    """
    available = presets()
    if not isinstance(name, str) or name not in available:
        hint = ""
        if isinstance(name, str):
            close = difflib.get_close_matches(name.removesuffix(_SUFFIX), available, n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ConfigError(
            f"name={name!r} is not a bundled preset{hint}; available: {', '.join(available)}"
        )
    text = (_folder() / f"{name}{_SUFFIX}").read_text(encoding="utf-8")
    return parse_json_text(text, source=f"jaxarena/presets/{name}{_SUFFIX}")
