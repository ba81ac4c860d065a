"""Where a HuggingFace `config.json` comes from: a file, a directory, a dict, a hub repo id or
a bundled preset. Every reader returns `ModelConfig` fields (`hf_families.parse`), never a
`ModelConfig`: the class builds itself from them.

Bundled presets are the `config.json` files shipped in `jaxarena/presets/`.

A preset's name is its file stem (`qwen3-8b` for `presets/qwen3-8b.json`). The files are read
through `importlib.resources`, so presets work from an installed wheel or zip as well as from a
source checkout; any `*.json` dropped into that folder is a preset.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from jaxarena._config import hf_families
from jaxarena._config.hf_families import DICT_SOURCE
from jaxarena._config.hf_json import show
from jaxarena._errors import ConfigError

__all__ = ["load", "parse_json_text", "preset_fields", "presets"]

# `owner/name` as the hub spells repo ids. A bare `name` (legacy ids such as "gpt2") is not
# accepted: a single word is far more often a mistyped local file name.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")

_SUFFIX = ".json"


def _folder() -> Traversable:
    return resources.files("jaxarena") / "presets"


def presets() -> tuple[str, ...]:
    """Names of the bundled presets (file stems of `jaxarena/presets/*.json`), sorted.

    Returns:
      A sorted tuple such as `("deepseek-v3", ..., "qwen3-8b", ...)`; each name is accepted by
      `ModelConfig.preset`.
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


def preset_fields(name: str) -> dict[str, Any]:
    """Reads the bundled preset `name` (see `presets()`) into `ModelConfig` fields.

    Args:
      name: a preset name, e.g. `"qwen3-8b"` (no `.json` suffix).

    Returns:
      The preset's fields, parsed exactly as `load` parses its file; `source` is
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


# -- files, dicts and hub ids --------------------------------------------------------------------


def load(source: Any, *, revision: str | None = None) -> dict[str, Any]:
    """Reads a HuggingFace model config into `ModelConfig` fields.

    Args:
      source: a path (str or `os.PathLike`) to a `config.json`, a directory holding one, an
        already-loaded mapping (the parsed JSON object), or a hub repo id `"owner/name"`; a repo
        id needs the optional `huggingface_hub` package (`pip install huggingface_hub`).
      revision: hub branch, tag or commit; only for repo ids.

    Returns:
      The fields of the config as the architecture really is (see `hf_families` for every
      family), with `model_type` set and `source` set to the file path, `"<dict>"` for a mapping, or
      `"hf://owner/name[@revision]/config.json"` for a hub id.

    Raises:
      ConfigError: the source does not exist or cannot be read, the JSON is invalid, a key is
        missing, mistyped or negative, or the config describes an inconsistent model. The
        message names the JSON key and the file.
    """
    if revision is not None and not isinstance(revision, str):
        raise ConfigError(
            f"revision={revision!r} must be a string (a hub branch, tag or commit) or None"
        )
    if isinstance(source, Mapping):
        _local_revision(revision, DICT_SOURCE)
        return hf_families.parse(source, source=DICT_SOURCE)
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"source={show(source)} must be a path to a config.json, a directory holding one, "
            f"a dict, or a hub repo id such as 'Qwen/Qwen3-8B'; got {type(source).__name__}"
        )
    if isinstance(source, str) and not source.strip():
        raise ConfigError(
            f"source={source!r} is empty; pass a config.json path, a directory or a dict"
        )
    try:
        path = Path(source).expanduser()
        text = str(source) if isinstance(source, str) else os.fspath(path)
        is_dir, is_file = path.is_dir(), path.is_file()
    except (TypeError, ValueError, OSError, RuntimeError) as e:
        raise ConfigError(f"source={show(source)} is not a usable path: {e}") from None
    if is_dir:
        _local_revision(revision, text)
        config = path / "config.json"
        try:
            found = config.is_file()
        except OSError as e:  # e.g. a directory without search (x) permission
            raise ConfigError(
                f"{path}: cannot look for config.json in the directory: {e.strerror or e}"
            ) from None
        if not found:
            raise ConfigError(f"{path}: directory has no config.json")
        return _parse_file(config, source=str(config))
    if is_file:
        _local_revision(revision, text)
        return _parse_file(path, source=text)
    if isinstance(source, str) and _looks_like_repo_id(source):
        return _from_hub(source, revision)
    raise ConfigError(
        f"{text}: no such file or directory (source must be a config.json path, a directory "
        f"holding one, a dict, or a hub repo id such as 'Qwen/Qwen3-8B')"
    )


def _looks_like_repo_id(text: str) -> bool:
    return bool(_REPO_ID.fullmatch(text)) and not text.endswith(".json") and ".." not in text


def _local_revision(revision: str | None, where: str) -> None:
    if revision is not None:
        raise ConfigError(
            f"revision={revision!r} only applies to hub repo ids; {where} is local (drop "
            f"revision, or check out that revision yourself)"
        )


def _from_hub(repo_id: str, revision: str | None) -> dict[str, Any]:
    at = f"@{revision}" if revision else ""
    name = f"hf://{repo_id}{at}/config.json"
    try:
        import huggingface_hub
    except ImportError:
        raise ConfigError(
            f"{repo_id}: no such file or directory; read as a HuggingFace hub repo id it needs "
            f"the optional huggingface_hub package: pip install huggingface_hub "
            f"(or pip install 'jaxarena[hub]'), or pass a local config.json"
        ) from None
    try:
        local = huggingface_hub.hf_hub_download(
            repo_id=repo_id, filename="config.json", revision=revision
        )
    except Exception as e:  # the hub raises many types (network, auth, 404); all mean "no file"
        raise ConfigError(
            f"{name}: could not download config.json from the HuggingFace hub: "
            f"{type(e).__name__}: {e}"
        ) from e
    return _parse_file(Path(local), source=name)


def _parse_file(path: Path, *, source: str) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{source}: cannot read the file: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{source}: not UTF-8 text ({e.reason} at byte {e.start}); a config.json is UTF-8 JSON"
        ) from None
    return parse_json_text(text, source=source)


def parse_json_text(text: str, *, source: str) -> dict[str, Any]:
    """Parses the text of a `config.json` (bare `Infinity`/`NaN` are accepted, as in Python).

    Args:
      text: the JSON text.
      source: the file name used in error messages and stored as `ModelConfig.source`.

    Returns:
      `ModelConfig` fields, as `hf_families.parse` gives them.

    Raises:
      ConfigError: invalid JSON, or anything `parse` refuses.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    except (ValueError, RecursionError) as e:  # e.g. a 5000-digit integer, absurd nesting
        raise ConfigError(f"{source}: invalid JSON: {e}") from None
    return hf_families.parse(data, source=source)
