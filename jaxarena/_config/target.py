"""`Target`: the build-time constants of the seed's kernels crate, as a value (spec §7.1)."""

from __future__ import annotations

import dataclasses

from jaxarena._errors import ConfigError

__all__ = ["Target"]

# name -> (SM count, declared split-K policy). Targets that declare nothing take the baseline
# (48 SMs, legacy), as the seed's build does.
_PRESETS: dict[str, tuple[int, str]] = {
    "gb10": (48, "legacy"),
    "hopper": (132, "auto"),
    "b200": (148, "legacy"),
    "b300": (148, "legacy"),
    "metal": (48, "legacy"),
    "strix": (48, "legacy"),
    "strix-hip": (48, "legacy"),
}

# GPU names accepted for a preset (every command takes the name printed on the part).
_ALIASES = {"h100": "hopper", "h200": "hopper", "h800": "hopper", "h20": "hopper",
            "gh200": "hopper"}  # fmt: skip

# Substrings of `jax.Device.device_kind` -> preset. Checked in order, first match wins.
_DEVICE_KINDS: tuple[tuple[str, str], ...] = (
    ("gb10", "gb10"),
    ("b300", "b300"),
    ("b200", "b200"),
    ("h100", "hopper"),
    ("h200", "hopper"),
    ("h800", "hopper"),
    ("h20", "hopper"),
    ("gh200", "hopper"),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """The hardware target the sizing is for.

    Attributes:
      name: preset name (`"gb10"`, `"hopper"`, ...) or a user label.
      sm_count: streaming multiprocessors; sizes the legacy split-K workspace and the auto
        split count.
      attn_decode_splitk: the declared split-K policy spelling (`"legacy"`, `"auto"`, or a
        count); the `JAXARENA_ATTN_DECODE_SPLITK` lever overrides it when it parses.
    """

    name: str
    sm_count: int
    attn_decode_splitk: str = "legacy"

    def __post_init__(self) -> None:
        if isinstance(self.sm_count, bool) or not isinstance(self.sm_count, int):
            raise ConfigError(f"Target.sm_count={self.sm_count!r} must be an int")
        if self.sm_count < 1:
            raise ConfigError(f"Target.sm_count={self.sm_count} must be >= 1")

    @classmethod
    def preset(cls, name: str) -> Target:
        """The seed's constants for target `name` (e.g. `"gb10"`, `"hopper"`, `"b200"`); the
        Hopper parts' names (`"h100"`, `"h200"`, `"h800"`, `"h20"`, `"gh200"`) are `"hopper"`.

        Raises:
          ValueError: `name` is not a string, or not a known target (the message lists them).
        """
        if not isinstance(name, str):
            raise ValueError(
                f"target name must be a str, one of {', '.join(_PRESETS)}; got "
                f"{type(name).__name__} {name!r:.60}"
            )
        key = name.strip().lower()
        key = _ALIASES.get(key, key)
        if key not in _PRESETS:
            raise ValueError(
                f"unknown target {name!r}; known targets: {', '.join(_PRESETS)} (hopper also as "
                f"{', '.join(_ALIASES)})"
            )
        sm, policy = _PRESETS[key]
        return cls(name=key, sm_count=sm, attn_decode_splitk=policy)

    @classmethod
    def detect(cls, device=None) -> Target:
        """Maps a JAX device (default: the first default-backend device) to a preset.

        CPUs and unrecognised accelerators map to the seed's baseline build, `gb10`.
        """
        if device is None:
            import jax  # only here: sizing for a named target never imports jax

            device = jax.devices()[0]
        if device.platform == "gpu" or device.platform in ("cuda", "rocm"):
            kind = str(getattr(device, "device_kind", "")).lower()
            for needle, preset in _DEVICE_KINDS:
                if needle in kind:
                    return cls.preset(preset)
        return cls.preset("gb10")
