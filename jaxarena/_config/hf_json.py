"""Typed getters over one JSON object of a HuggingFace `config.json`; every error names the
full key (`text_config.head_dim`) and the file."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from jaxarena._config.schema import LAYER_TYPES
from jaxarena._errors import ConfigError

__all__ = ["Obj", "show"]


def show(value: Any) -> str:
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # ints past the str-conversion limit, deep nesting
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


class Obj:
    """One JSON object of the config (the top level or `text_config`) with typed getters.

    Every getter raises `ConfigError` naming the full key (`text_config.head_dim`) and the file.
    `null` reads as absent.
    """

    def __init__(
        self, data: Mapping, prefix: str, source: str, *, prefixes: Mapping[str, str] = {}
    ) -> None:
        self.data = data
        self.prefix = prefix
        self.source = source
        # Per-key prefixes of a merged object (`text_config` over the top level): each key is
        # named where its value came from.
        self.prefixes = prefixes

    def key(self, name: str) -> str:
        return self.prefixes.get(name, self.prefix) + name

    def error(self, name: str, rule: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.key(name)}={show(self.data.get(name))} {rule}")

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def int(self, name: str, default: int = 0, *, maximum: int | None = None) -> int:
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise self.error(name, f"must be a non-negative integer, got {type(value).__name__}")
        value = int(value)
        if value < 0:
            raise self.error(name, "must be >= 0")
        if maximum is not None and value > maximum:
            raise self.error(name, f"is implausibly large (at most {maximum})")
        return value

    def required_int(self, name: str, why: str) -> int:
        if not self.has(name):
            state = "null" if name in self.data else "missing"
            raise ConfigError(f"{self.source}: required key {self.key(name)} is {state} ({why})")
        return self.int(name)

    def bool(self, name: str, default: bool) -> bool:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(name, f"must be true or false, got {type(value).__name__}")
        return value

    def str(self, name: str) -> str | None:
        value = self.data.get(name)
        if value is not None and not isinstance(value, str):
            raise self.error(name, f"must be a string, got {type(value).__name__}")
        return value

    def list(self, name: str) -> list | None:
        value = self.data.get(name)
        if value is not None and not isinstance(value, (list, tuple)):
            raise self.error(name, f"must be a JSON list, got {type(value).__name__}")
        return None if value is None else list(value)

    def obj(self, name: str) -> Obj | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.error(name, f"must be a JSON object, got {type(value).__name__}")
        return Obj(value, self.key(name) + ".", self.source)

    def item_obj(self, name: str, index: int, value: Any) -> Obj:
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{self.source}: {self.key(name)}[{index}]={show(value)} must be a JSON object, "
                f"got {type(value).__name__}"
            )
        return Obj(value, f"{self.key(name)}[{index}].", self.source)

    def layer_types(self, name: str = "layer_types") -> tuple[str, ...]:
        value = self.list(name)
        if value is None:
            return ()
        for i, kind in enumerate(value):
            if not isinstance(kind, str) or kind not in LAYER_TYPES:
                raise ConfigError(
                    f"{self.source}: {self.key(name)}[{i}]={show(kind)} is not a known layer "
                    f"type; known: {sorted(LAYER_TYPES)}"
                )
        return tuple(value)


