"""`MemoryBudget`: weights + arena + reserve + KV cache + recurrent state on one device of a
tp x ep mesh, the answers an operator asks (`max_kv_tokens`, `max_sequences`, `fits` and what
would make it fit), the unbounded `fit_max_batch_tokens` search, and a per-device plot.

The weight, KV and state figures come from `jaxarena._sizing.weights`; the arena from
`BufferSizes.from_config` and `ArenaPlan` (no second size computation); the reserve from
`jaxarena._sizing.step_temp` (the runtime's share plus the steps' XLA temp, compiled or
estimated).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

from jaxarena._arena.lifetimes import Lifetimes
from jaxarena._arena.plan import ArenaPlan
from jaxarena._config.levers import Levers
from jaxarena._config.model import ModelConfig
from jaxarena._config.target import Target
from jaxarena._errors import ConfigError
from jaxarena._figure import (
    PART_COLOURS,
    binary_ticks,
    figure_title,
    format_tick,
    output_path,
    pyplot,
    save,
)
from jaxarena._sizing.buffers import BufferSizes
from jaxarena._sizing.cache import dtype_bytes, kv_bytes_per_token, state_bytes_per_sequence
from jaxarena._sizing.kv_pool import KVPool, kv_pool
from jaxarena._sizing.step_temp import RUNTIME_RESERVE, estimate_step_temp
from jaxarena._sizing.weights import (
    WEIGHT_FORMATS,
    mtp_param_count,
    param_count,
    weight_bytes,
)
from jaxarena._units import format_bytes, parse_memory, plural

__all__ = [
    "BUDGET_KEYS",
    "MemoryBudget",
    "draw_budget",
    "fit_max_batch_tokens",
    "plot_budget",
]

# The limits a compiled `step_temp` was measured at: `replace` drops it when one changes.
_STEP_TEMP_INPUTS = ("config", "max_batch_tokens", "max_seq_len", "kv_block_size",
                     "max_batch_size", "tp", "ep", "weights", "kv_dtype", "state_dtype", "target")  # fmt: skip

# The keys of `MemoryBudget.as_dict()` (and of `jaxarena budget --json`), in order.
BUDGET_KEYS = (
    "model", "memory_bytes", "tp", "ep", "weights", "kv_dtype", "arena",
    "max_batch_tokens", "max_seq_len", "kv_block_size", "max_batch_size",
    "param_count", "mtp_param_count", "weight_bytes", "kv_bytes_per_token",
    "state_bytes_per_sequence", "sequence_bytes", "arena_bytes", "reserve_bytes",
    "step_temp_bytes", "reserve_source", "free_bytes",
    "max_kv_tokens", "max_kv_blocks", "max_sequences", "fits", "shortfall_bytes",
)  # fmt: skip


def _check_int(name: str, value: Any, lo: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name}={value!r} must be an int, got {type(value).__name__}"
    if value < lo:
        return f"{name}={value} must be >= {lo}"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryBudget:
    """Weights + arena + reserve + KV cache + recurrent state on ONE device of a tp x ep mesh.

    Build it from a config, the serve limits and the device's memory; every answer is a
    property (computed once). All byte figures are per device.

    Attributes:
      config: the whole model (`ModelConfig.preset(...)`, `ModelConfig.from_hf(...)`).
      memory_bytes: the device's memory (an int, or a string for `parse_memory`: "141GB").
      max_batch_tokens, max_seq_len, kv_block_size, max_batch_size: the serve limits, as for
        `BufferSizes.from_config` (kv_block_size 0: unpaged KV).
      tp, ep: tensor- and expert-parallel degrees (`ModelConfig.shard` rules).
      weights: "bf16", "fp8" (block-quantized) or "mxfp4" (gpt-oss's experts), see
        `weight_bytes`.
      kv_dtype: "bf16" or "fp8" for the KV cache (and sliding-window KV).
      state_dtype: "f32" (default) or "bf16" for SSM / gated-delta-net recurrent states.
      arena: "sequential" (every buffer its own bytes) or "packed" (buffers never live
        together share bytes, `ArenaPlan.packed` with `Lifetimes.standard`).
      reserve: bytes left to the runtime and XLA outside the plan (`reserve_bytes`); None
        means `RUNTIME_RESERVE` (1 GiB) + `step_temp_bytes`.
      step_temp: XLA's temp bytes of the compiled steps (the larger of prefill and decode,
        `jaxarena.step_report`); None: estimated (`jaxarena._sizing.step_temp`).
      levers, target: as for `BufferSizes.from_config` (None: from the environment / the
        detected device).
      align_bytes: arena region alignment.

    Raises:
      ValueError: a bad memory, dtype, arena kind or reserve; ConfigError for bad limits or a
        tp/ep that does not divide the model.
    """

    config: ModelConfig
    memory_bytes: int
    max_batch_tokens: int = 8192
    max_seq_len: int = 32768
    kv_block_size: int = 16
    max_batch_size: int = 64
    tp: int = 1
    ep: int = 1
    weights: str = "bf16"
    kv_dtype: str = "bf16"
    state_dtype: str = "f32"
    arena: str = "sequential"
    reserve: int | None = None
    step_temp: int | None = None
    levers: Any = None
    target: Any = None
    align_bytes: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.config, ModelConfig):
            raise ValueError(f"config must be a ModelConfig, got {type(self.config).__name__}")
        object.__setattr__(self, "memory_bytes", parse_memory(self.memory_bytes))
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights={self.weights!r} must be one of {', '.join(WEIGHT_FORMATS)}")
        dtype_bytes(self.kv_dtype, "kv_dtype")
        if self.state_dtype not in ("f32", "bf16"):
            raise ValueError(f"state_dtype={self.state_dtype!r} must be 'f32' or 'bf16'")
        if self.arena not in ("sequential", "packed"):
            raise ValueError(f"arena={self.arena!r} must be 'sequential' or 'packed'")
        problems = [
            p
            for p in (
                _check_int("max_batch_tokens", self.max_batch_tokens, 1),
                _check_int("max_seq_len", self.max_seq_len, 1),
                _check_int("kv_block_size", self.kv_block_size, 0),
                _check_int("max_batch_size", self.max_batch_size, 1),
                _check_int("tp", self.tp, 1),
                _check_int("ep", self.ep, 1),
            )
            if p
        ]
        if problems:
            raise ConfigError("invalid budget:\n  - " + "\n  - ".join(problems))
        r = self.reserve
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 0):
            raise ValueError(f"reserve={r!r} must be an int >= 0 (bytes) or None (the default)")
        t = self.step_temp
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise ValueError(f"step_temp={t!r} must be an int >= 0 (bytes) or None (estimated)")
        _ = self.local_config  # validates tp/ep against the model now, not at first use

    def replace(self, **changes: Any) -> MemoryBudget:
        """A copy with `changes` applied (e.g. `weights="fp8"`, `tp=8`); a compiled
        `step_temp` is dropped (estimated again) when a change touches what it measured."""
        if "step_temp" not in changes and any(
            k in _STEP_TEMP_INPUTS and v != getattr(self, k) for k, v in changes.items()
        ):
            changes["step_temp"] = None
        return dataclasses.replace(self, **changes)

    @property
    def reserve_bytes(self) -> int:
        """Memory left to the runtime and XLA: `reserve`, or `RUNTIME_RESERVE` (1 GiB) +
        `step_temp_bytes`."""
        return RUNTIME_RESERVE + self.step_temp_bytes if self.reserve is None else self.reserve

    @functools.cached_property
    def step_temp_bytes(self) -> int:
        """XLA's temp bytes of the steps on this device: `step_temp` when compiled, else
        `estimate_step_temp` of the sharded config at these limits."""
        if self.step_temp is not None:
            return self.step_temp
        return estimate_step_temp(self.local_config, self.max_batch_tokens, self.max_batch_size)

    @property
    def reserve_source(self) -> str:
        """Where `reserve_bytes` comes from: `"given"` (`reserve`), `"compiled"` (1 GiB + a
        compiled `step_temp`) or `"estimated"` (1 GiB + the estimate)."""
        if self.reserve is not None:
            return "given"
        return "estimated" if self.step_temp is None else "compiled"

    # -- the parts ------------------------------------------------------------------------------

    @functools.cached_property
    def local_config(self) -> ModelConfig:
        """The per-device config, `config.shard(tp=tp, ep=ep)`."""
        return self.config.shard(tp=self.tp, ep=self.ep)

    @functools.cached_property
    def param_count(self) -> int:
        """Parameters of the whole model (`param_count(config)`; MTP layers excluded)."""
        return param_count(self.config)

    @functools.cached_property
    def mtp_param_count(self) -> int:
        """Parameters of the MTP layers the checkpoint ships and transformers does not load
        (not in `param_count` nor `weight_bytes`; see `mtp_param_count`)."""
        return mtp_param_count(self.config)

    @functools.cached_property
    def weight_bytes(self) -> int:
        """Weight bytes on this device (`weight_bytes(config, weights, tp=, ep=)`)."""
        return weight_bytes(self.config, self.weights, tp=self.tp, ep=self.ep)

    @functools.cached_property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token of context on this device, over the full-attention layers."""
        return kv_bytes_per_token(self.config, self.kv_dtype, tp=self.tp, ep=self.ep)

    @functools.cached_property
    def state_bytes_per_sequence(self) -> int:
        """Fixed per-sequence bytes on this device (SSM/GDN states, sliding-window KV).

        Sliding-window layers (Gemma's, gpt-oss's, and every layer of a Mistral / Mixtral
        config with a `sliding_window`, as `ModelConfig.layer_types` lists them) count the
        KV the model reads and keeps, capped at the window: the model's semantics, not the
        pages an engine allocates (the models share one block table across layers, so they
        do not recycle window pages yet; a page pool adds that figure of its own)."""
        return state_bytes_per_sequence(
            self.config, max_seq_len=self.max_seq_len, kv_block_size=self.kv_block_size,
            kv_dtype=self.kv_dtype, state_dtype=self.state_dtype, tp=self.tp, ep=self.ep,
        )  # fmt: skip

    @property
    def _seq_tokens(self) -> int:
        b = self.kv_block_size
        return -(-self.max_seq_len // b) * b if b > 0 else self.max_seq_len

    @functools.cached_property
    def sequence_bytes(self) -> int:
        """Bytes one sequence of `max_seq_len` tokens holds: its KV (whole blocks when paged)
        plus `state_bytes_per_sequence`."""
        return self._seq_tokens * self.kv_bytes_per_token + self.state_bytes_per_sequence

    @functools.cached_property
    def arena_bytes(self) -> int:
        """The arena on this device: `ArenaPlan.sequential` (or `.packed`) of
        `BufferSizes.from_config(config.shard(tp, ep), limits)`."""
        levers = Levers.from_env() if self.levers is None else self.levers
        target = Target.detect() if self.target is None else self.target
        sizes = BufferSizes.from_config(
            self.local_config, self.max_batch_tokens, self.max_seq_len, self.kv_block_size,
            self.max_batch_size, levers=levers, target=target,
        )  # fmt: skip
        if self.arena == "packed":
            lifetimes = Lifetimes.standard(self.local_config)
            return ArenaPlan.packed(sizes, lifetimes, align_bytes=self.align_bytes).total_bytes
        return ArenaPlan.sequential(sizes, align_bytes=self.align_bytes).total_bytes

    @property
    def fixed_bytes(self) -> int:
        """Weights + arena + reserve: what the device holds before any sequence."""
        return self.weight_bytes + self.arena_bytes + self.reserve_bytes

    @property
    def free_bytes(self) -> int:
        """`memory - weights - arena - reserve`: room for KV cache and states (negative when
        even the fixed part does not fit)."""
        return self.memory_bytes - self.fixed_bytes

    def required_bytes(self, sequences: int) -> int:
        """Weights + arena + reserve + `sequences` sequences of `max_seq_len` tokens."""
        return self.fixed_bytes + sequences * self.sequence_bytes

    # -- the answers ----------------------------------------------------------------------------

    @property
    def max_kv_tokens(self) -> int | None:
        """KV-cache tokens that fit in `free_bytes` after the states of `max_batch_size`
        sequences (whole blocks when paged); None when no layer's cache grows with context."""
        if self.kv_bytes_per_token == 0:
            return None
        room = self.free_bytes - self.max_batch_size * self.state_bytes_per_sequence
        tokens = max(room, 0) // self.kv_bytes_per_token
        b = self.kv_block_size
        return tokens // b * b if b > 0 else tokens

    @property
    def max_kv_blocks(self) -> int | None:
        """`max_kv_tokens // kv_block_size`; None unpaged or without a growing KV cache."""
        tokens = self.max_kv_tokens
        if tokens is None or self.kv_block_size == 0:
            return None
        return tokens // self.kv_block_size

    @property
    def max_sequences(self) -> int | None:
        """Concurrent sequences of `max_seq_len` tokens whose KV and state fit in `free_bytes`
        (not capped by `max_batch_size`); None when a sequence holds no memory at all."""
        if self.free_bytes <= 0:
            return 0
        if self.sequence_bytes == 0:
            return None
        return self.free_bytes // self.sequence_bytes

    def kv_pool(self, kv_pages: int | None = None) -> KVPool:
        """The page pool the serving engine allocates on this device (`jaxarena.engine`):
        usable pages from `free_bytes` after `max_batch_size + 1` recurrent-state slots, every
        paged layer (sliding-window ones included) in each page, plus the null page; or
        `kv_pages` pages (`jaxarena/_sizing/kv_pool.py`).

        Raises:
          ValueError: no page fits, or a bad `kv_pages`.
        """
        return kv_pool(self, kv_pages=kv_pages)

    @property
    def fits(self) -> bool:
        """True when weights, arena, reserve and one sequence of `max_seq_len` fit."""
        return self.required_bytes(1) <= self.memory_bytes

    @property
    def shortfall_bytes(self) -> int:
        """How many bytes one sequence of `max_seq_len` is short of fitting (0 when it fits)."""
        return max(self.required_bytes(1) - self.memory_bytes, 0)

    def as_dict(self) -> dict[str, Any]:
        """`{key: value}` for every key of `BUDGET_KEYS` (what `jaxarena budget --json` prints)."""
        out = {
            "model": self.config.source or self.config.model_type,
            "memory_bytes": self.memory_bytes,
            "tp": self.tp,
            "ep": self.ep,
            "weights": self.weights,
            "kv_dtype": self.kv_dtype,
            "arena": self.arena,
            "max_batch_tokens": self.max_batch_tokens,
            "max_seq_len": self.max_seq_len,
            "kv_block_size": self.kv_block_size,
            "max_batch_size": self.max_batch_size,
            "param_count": self.param_count,
            "mtp_param_count": self.mtp_param_count,
            "weight_bytes": self.weight_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "state_bytes_per_sequence": self.state_bytes_per_sequence,
            "sequence_bytes": self.sequence_bytes,
            "arena_bytes": self.arena_bytes,
            "reserve_bytes": self.reserve_bytes,
            "step_temp_bytes": self.step_temp_bytes,
            "reserve_source": self.reserve_source,
            "free_bytes": self.free_bytes,
            "max_kv_tokens": self.max_kv_tokens,
            "max_kv_blocks": self.max_kv_blocks,
            "max_sequences": self.max_sequences,
            "fits": self.fits,
            "shortfall_bytes": self.shortfall_bytes,
        }
        assert tuple(out) == BUDGET_KEYS
        return out

    # -- what would make it fit -----------------------------------------------------------------

    def alternatives(self) -> list[str]:
        """When it does not fit: each change that would (FP8 weights, more devices, a smaller
        `max_seq_len` or `max_batch_tokens`), as readable lines; [] when it fits."""
        if self.fits:
            return []
        out = []
        if self.weights == "bf16" and self.replace(weights="fp8").fits:
            out.append("FP8 weights (--weights fp8)")
        for tp, ep in self._device_options():
            try:
                other = self.replace(tp=tp, ep=ep)
            except ValueError:
                continue
            if other.fits:
                out.append(f"tp={tp}" + (f", ep={ep}" if ep > 1 else "") + f" ({tp} devices)")
                break
        length = _largest(lambda n: self.replace(max_seq_len=n).fits, 1, self.max_seq_len - 1)
        if length:
            out.append(f"max_seq_len <= {length:,}")
        tokens = _largest(
            lambda m: self.replace(max_batch_tokens=m).fits, 1, self.max_batch_tokens - 1
        )
        if tokens:
            out.append(f"max_batch_tokens <= {tokens:,}")
        return out

    def fit_max_batch_tokens(self, sequences: int = 1) -> int | None:
        """The largest `max_batch_tokens` that leaves room for `sequences` sequences of
        `max_seq_len` (see `fit_max_batch_tokens`); None when even 1 does not fit."""
        return fit_max_batch_tokens(self, sequences)

    def plot(self, path: str, *, title: str | None = None) -> str:
        """Saves one stacked bar per device to `path` (PNG) and returns the path written
        (`.png` added when `path` has no extension). Needs matplotlib."""
        return plot_budget(self, path, title=title)

    def _device_options(self) -> Iterator[tuple[int, int]]:
        tp = self.tp * 2
        while tp <= 1024:
            yield tp, self.ep
            if self.config.is_moe and tp != self.ep:
                yield tp, tp
            tp *= 2

    def message(self) -> str:
        """One line: how much is free and how many sequences fit, or by how much it does not
        fit and what would make it fit."""

        if self.fits:
            return (
                f"fits: {format_bytes(self.free_bytes)} free for KV cache and states, "
                f"{plural(self.max_sequences, 'sequence')} of {plural(self.max_seq_len, 'token')}"
            )
        what = ", or ".join(self.alternatives()) or "nothing tried (fewer limits, more memory)"
        return (
            f"does not fit: short by {format_bytes(self.shortfall_bytes)} "
            f"(weights {format_bytes(self.weight_bytes)} + arena {format_bytes(self.arena_bytes)}"
            f" + reserve {format_bytes(self.reserve_bytes)} + one sequence "
            f"{format_bytes(self.sequence_bytes)} > {format_bytes(self.memory_bytes)}); "
            f"would fit with: {what}"
        )


def _largest(ok: Any, lo: int, hi: int) -> int | None:
    """Largest n in [lo, hi] with ok(n), for ok monotone (true then false); None if none."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_max_batch_tokens(budget: MemoryBudget, sequences: int = 1) -> int | None:
    """The largest `max_batch_tokens` m with `budget.replace(max_batch_tokens=m)
    .required_bytes(sequences) <= budget.memory_bytes`: weights + arena(m) + reserve + the KV
    and state of `sequences` sequences of `max_seq_len` fit. None when even m = 1 does not.

    Unbounded above: doubles m until it no longer fits (the arena grows with m), then
    bisects; relies on the arena being monotone in `max_batch_tokens` (a tested property).
    """
    err = _check_int("sequences", sequences, 0)
    if err:
        raise ValueError(err)

    def ok(m: int) -> bool:
        return budget.replace(max_batch_tokens=m).required_bytes(sequences) <= budget.memory_bytes

    if not ok(1):
        return None
    lo, hi = 1, 2
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 62:
            raise ValueError("max_batch_tokens beyond 2^62 still fits: the arena does not grow")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


# -- plot -----------------------------------------------------------------------------------------


def budget_segments(b: MemoryBudget) -> list[tuple[str, int]]:
    """The stacked parts of one device's memory, bottom to top: weights, arena, reserve, the KV
    and state of `max_sequences` full-length sequences, and what is left (never negative)."""
    n = b.max_sequences
    kv = n * (b.sequence_bytes - b.state_bytes_per_sequence)
    state = n * b.state_bytes_per_sequence
    parts = [
        ("weights", b.weight_bytes),
        ("arena", b.arena_bytes),
        ("reserve", b.reserve_bytes),
        (f"KV cache ({n:,} x {plural(b.max_seq_len, 'token')})", kv),
        ("SSM / sliding-window state", state),
    ]
    used = sum(v for _, v in parts)
    parts.append(("free", max(b.memory_bytes - used, 0)))
    return parts


_PART_KEYS = ("weights", "arena", "reserve", "kv", "state", "free")


def draw_budget(b: MemoryBudget, *, title: str | None = None) -> Any:
    """The budget picture as a matplotlib `Figure` (what `plot_budget` saves): one stacked bar
    per device (at most 16; one bar for "each of" more), parts bottom to top as in
    `budget_segments`, each bar patch's `gid` the part's key (`weights`, `arena`, `reserve`,
    `kv`, `state`, `free`); the device's memory as a dashed line (`gid="memory"`). Ticks,
    colours and title follow `jaxarena._figure`, like the plan's memory map.
    """
    plt = pyplot()
    devices = max(b.tp, b.ep)
    bars = min(devices, 16)
    segments = budget_segments(b)
    used = sum(v for key, (_, v) in zip(_PART_KEYS, segments, strict=True) if key != "free")
    y_max = max(b.memory_bytes, used) * 1.03
    fig, ax = plt.subplots(figsize=(max(3.2, 1.4 + 0.55 * bars), 6.0))
    xs = list(range(bars))
    bottom = [0] * bars
    for key, (label, nbytes) in zip(_PART_KEYS, segments, strict=True):
        if nbytes == 0:
            continue
        drawn = ax.bar(xs, [nbytes] * bars, bottom=bottom, color=PART_COLOURS[key],
                       edgecolor="white", linewidth=0.4, width=0.7,
                       label=f"{label} {format_bytes(nbytes)}")  # fmt: skip
        for patch in drawn:
            patch.set_gid(key)
        bottom = [y + nbytes for y in bottom]
    ax.axhline(b.memory_bytes, color="black" if b.fits else "#c44e52", ls="--", lw=1.0,
               gid="memory", label=f"device memory {format_bytes(b.memory_bytes)}")  # fmt: skip
    ax.set_ylim(0, y_max)
    _, ticks = binary_ticks(y_max)
    ax.set_yticks(ticks, [format_tick(t) for t in ticks], fontsize=7)
    ax.set_ylabel("bytes per device", fontsize=8)
    names = [f"dev {i}" for i in xs] if bars == devices else [f"each of {devices}"]
    ax.set_xticks(xs if bars == devices else [0], names, fontsize=7)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    target = "auto" if b.target is None else getattr(b.target, "name", str(b.target))
    verdict = "fits" if b.fits else f"short by {format_bytes(b.shortfall_bytes)}"
    text = figure_title(
        f"{title or 'model'} [{b.config.model_type or 'custom'}]: memory per device",
        [
            f"target {target}, tp={b.tp} ep={b.ep}, weights {b.weights}, KV {b.kv_dtype}, "
            f"state {b.state_dtype}, {b.arena} arena",
            f"max_batch_tokens={b.max_batch_tokens}, max_seq_len={b.max_seq_len}, "
            f"kv_block_size={b.kv_block_size}, max_batch_size={b.max_batch_size}",
        ],
        f"{format_bytes(b.memory_bytes)} per device: {verdict}, "
        f"{plural(b.max_sequences, 'sequence')} of {plural(b.max_seq_len, 'token')}",
    )
    ax.set_title(text, fontsize=8, loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    return fig


def plot_budget(b: MemoryBudget, path: str, *, title: str | None = None) -> str:
    """Saves `draw_budget(b)` to `path` (PNG; `.png` is added when `path` has no extension)
    and returns the path written. The dashed line is the device's memory; a bar that crosses
    it does not fit.

    Raises:
      ImportError: matplotlib is not installed (`pip install "jaxarena[plot]"`).
    """
    out = output_path(path)
    save(draw_budget(b, title=title), out, dpi=100, bbox_inches="tight")
    return out
