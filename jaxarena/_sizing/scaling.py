"""Global versus per-device bytes: how each buffer scales under tensor / expert parallelism."""

from __future__ import annotations

import dataclasses
import math

from jaxarena._config.levers import Levers
from jaxarena._config.model import ModelConfig
from jaxarena._config.target import Target
from jaxarena._sizing.buffers import BufferSizes, ServeLimits
from jaxarena._units import format_bytes

__all__ = ["BufferScaling", "format_scaling_table", "scaling_table"]


@dataclasses.dataclass(frozen=True)
class BufferScaling:
    """One buffer's size for the whole model (tp=ep=1) and on one device.

    Attributes:
      name: the `BufferSizes` field.
      global_bytes: size for the unsharded model.
      device_bytes: size on one device of the tp/ep split.
      tp: the tensor-parallel degree of `device_bytes`.
    """

    name: str
    global_bytes: int
    device_bytes: int
    tp: int

    @property
    def ratio(self) -> float:
        """`device_bytes / global_bytes` (1.0 when both are 0)."""
        if self.global_bytes == 0:
            return 1.0 if self.device_bytes == 0 else math.inf
        return self.device_bytes / self.global_bytes

    @property
    def kind(self) -> str:
        """How the buffer scales: `"absent"` (0 bytes both ways), `"replicated"` (unchanged),
        `"1/tp"` (exactly `global / tp`) or `"partial"` (anything else: a max() of split and
        unsplit terms, replicated KV heads, vocabulary padding, split-K slots, ...)."""
        if self.global_bytes == 0 and self.device_bytes == 0:
            return "absent"
        if self.device_bytes == self.global_bytes:
            return "replicated"
        if self.device_bytes * self.tp == self.global_bytes:
            return "1/tp"
        return "partial"


def scaling_table(
    config: ModelConfig,
    *,
    tp: int = 1,
    ep: int = 1,
    max_batch_tokens: int,
    max_seq_len: int,
    kv_block_size: int,
    max_batch_size: int,
    levers: Levers | None = None,
    target: Target | None = None,
    vocab_multiple: int = 1,
) -> tuple[BufferScaling, ...]:
    """Buffer by buffer: the unsharded size, the per-device size under `tp`/`ep`, and so the
    ratio, at the given serve limits.

    Both columns come from `BufferSizes.from_config` (the global one of `config`, the device
    one of `config.shard(tp=tp, ep=ep, vocab_multiple=vocab_multiple)`), with the same
    `levers` and `target` (`None`: `Levers.from_env()` and `Target.detect()`, read once).

    Returns:
      One `BufferScaling` per `BufferSizes` field, in the seed's field order.

    Raises:
      ConfigError: as `ModelConfig.shard` and `BufferSizes.from_config`.
    """
    levers = Levers.from_env() if levers is None else levers
    target = Target.detect() if target is None else target
    local = config.shard(tp=tp, ep=ep, vocab_multiple=vocab_multiple)
    limits = ServeLimits(max_batch_tokens=max_batch_tokens, max_seq_len=max_seq_len,
                         kv_block_size=kv_block_size, max_batch_size=max_batch_size)  # fmt: skip
    full = BufferSizes.from_config(config, limits, levers=levers, target=target).as_dict()
    dev = BufferSizes.from_config(local, limits, levers=levers, target=target).as_dict()
    return tuple(BufferScaling(name, full[name], dev[name], tp) for name in full)


def format_scaling_table(rows: tuple[BufferScaling, ...] | list[BufferScaling]) -> str:
    """A readable table of `scaling_table`'s rows with a total line (absent buffers omitted)."""
    table = [("buffer", "global", "per device", "ratio", "scales")]
    for r in rows:
        if r.kind == "absent":
            continue
        table.append(
            (r.name, format_bytes(r.global_bytes), format_bytes(r.device_bytes),
             f"{r.ratio:.3f}", r.kind)
        )  # fmt: skip
    g = sum(r.global_bytes for r in rows)
    d = sum(r.device_bytes for r in rows)
    table.append(("total", format_bytes(g), format_bytes(d), f"{d / g:.3f}" if g else "-", ""))
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    lines = [
        "  ".join(c.ljust(w) if i in (0, 4) else c.rjust(w) for i, (c, w) in
                  enumerate(zip(row, widths, strict=True))).rstrip()
        for row in table
    ]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
