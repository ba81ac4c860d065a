"""RoPE parameters from a `config.json`: the inverse frequencies and the cos/sin scale of every
RoPE type transformers' `ROPE_INIT_FUNCTIONS` knows that a fixed compiled step can run.

`rope_spec(params, ...)` -> `RopeSpec(inv_freq, attention_scaling)`; the attention block
rotates the first `2 * len(inv_freq)` channels of each head (rotate-half form) with angles
`position * inv_freq` and multiplies cos and sin by `attention_scaling` (YaRN's and
LongRoPE's attention factor: the q.k logits scale by its square).

Types: `default`, `linear` (inverse frequencies / factor), `llama3` (Llama 3.1's smoothed
low/high-frequency split), `yarn` (ramp between interpolated and extrapolated frequencies,
attention factor from `mscale`/`mscale_all_dim` or `0.1 ln(factor) + 1`), `dynamic` and
`longrope`. The last two depend on the current sequence length in transformers; a step
compiled once cannot follow it, so they run only where they equal a fixed table:
`dynamic` (NTK) when `max_seq_len <= max_position_embeddings` (transformers then uses the
unscaled frequencies), `longrope` when `max_seq_len <= original_max_position_embeddings`
(the short factors). Beyond that `NotImplementedError`.

`partial_rotary_factor` (in the RoPE parameters or the config) rotates the first
`int(head_dim * factor)` channels only.

Frequencies are computed in float64 and rounded once to float32 (transformers computes
them in float32: they agree to a few float32 ulps, tests/models/test_rope_params.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = ["RopeSpec", "rope_parameters", "rope_spec", "ROPE_TYPES"]

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


@dataclasses.dataclass(frozen=True)
class RopeSpec:
    """Static RoPE tables of one attention layer (hashable).

    Attributes:
      inv_freq: float32 values (as Python floats), one per rotated channel pair; the rotated
        width is `2 * len(inv_freq)` (<= head_dim).
      attention_scaling: the factor cos and sin are multiplied by (1.0 for most types).
    """

    inv_freq: tuple[float, ...]
    attention_scaling: float = 1.0

    @property
    def rotary_dim(self) -> int:
        """Channels rotated per head."""
        return 2 * len(self.inv_freq)


def rope_parameters(raw: dict[str, Any], layer_type: str | None = None) -> dict[str, Any]:
    """The RoPE parameter dict of `config.json` (of `layer_type` when they are per layer type,
    as Gemma 3's `{"full_attention": {...}, "sliding_attention": {...}}`), merged over the
    legacy keys: `rope_scaling` (`type` -> `rope_type`), top-level `rope_theta`,
    `partial_rotary_factor`, and for Gemma 3's sliding layers `rope_local_base_freq`.
    Returns a new dict with at least `rope_type`."""
    rp = raw.get("rope_parameters")
    legacy = raw.get("rope_scaling")
    per_type = isinstance(rp, dict) and layer_type is not None and layer_type in rp
    out: dict[str, Any] = {}
    if layer_type == "sliding_attention" and raw.get("rope_local_base_freq") is not None:
        # Gemma 3 (released configs): local layers use the default RoPE with their own base;
        # rope_scaling applies to the global layers only.
        out = {"rope_type": "default", "rope_theta": raw["rope_local_base_freq"]}
        legacy = None
    if per_type:
        out = dict(rp[layer_type])
    elif isinstance(rp, dict) and not any(isinstance(v, dict) for v in rp.values()):
        out = {**out, **rp}
    if isinstance(legacy, dict) and not per_type:
        out = {**legacy, **out}
    if "type" in out and "rope_type" not in out:
        out["rope_type"] = out.pop("type")
    out.setdefault("rope_type", "default")
    if "rope_theta" not in out and raw.get("rope_theta") is not None:
        out["rope_theta"] = raw["rope_theta"]
    if "partial_rotary_factor" not in out and raw.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = raw["partial_rotary_factor"]
    return out


def _base_inv_freq(base: float, dim: int) -> np.ndarray:
    return 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def rope_spec(params: dict[str, Any], *, head_dim: int, max_position_embeddings: int,
              max_seq_len: int, default_theta: float = 10000.0) -> RopeSpec:  # fmt: skip
    """The inverse frequencies and cos/sin scale of RoPE parameters `params`
    (`rope_parameters(...)`), for heads of `head_dim` channels and steps serving up to
    `max_seq_len` tokens.

    Raises:
      ValueError: a parameter is missing or out of range (names it).
      NotImplementedError: an unknown RoPE type, or `dynamic` / `longrope` beyond the range
        where a fixed table equals transformers' (see the module docstring).
    """
    kind = params.get("rope_type", "default")
    base = float(params.get("rope_theta") or default_theta)
    prf = float(params.get("partial_rotary_factor", 1.0) or 1.0)
    if not 0.0 < prf <= 1.0:
        raise ValueError(f"partial_rotary_factor={prf} must be in (0, 1]")
    dim = int(head_dim * prf)
    if dim < 2 or dim % 2:
        raise ValueError(f"rotary width int(head_dim={head_dim} * partial_rotary_factor={prf})"
                         f" = {dim} must be even and >= 2")  # fmt: skip
    inv = _base_inv_freq(base, dim)
    scaling = 1.0

    def need(key: str) -> float:
        if params.get(key) is None:
            raise ValueError(f"rope_type={kind!r} needs {key!r} in its RoPE parameters, got "
                             f"{sorted(params)}")  # fmt: skip
        return float(params[key])

    if kind == "default":
        pass
    elif kind == "linear":
        inv = inv / need("factor")
    elif kind == "llama3":
        factor, lo, hi = need("factor"), need("low_freq_factor"), need("high_freq_factor")
        old = need("original_max_position_embeddings")
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        inv = np.where(medium, smoothed, scaled)
    elif kind == "yarn":
        orig = need("original_max_position_embeddings")
        factor = params.get("factor")
        factor = max_position_embeddings / orig if factor is None else float(factor)
        scaling = _yarn_attention_factor(params, factor)
        fast = float(params.get("beta_fast") or 32)
        slow = float(params.get("beta_slow") or 1)

        def corr(rot: float) -> float:
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr(fast), corr(slow)
        if params.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        # transformers builds the ramp in float32; its values are exact small rationals
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extra = 1 - ramp
        inv = (inv / factor) * (1 - extra) + inv * extra
    elif kind == "dynamic":
        need("factor")
        if max_seq_len > max_position_embeddings:
            raise NotImplementedError(
                f"rope_type='dynamic' with max_seq_len={max_seq_len} > max_position_embeddings="
                f"{max_position_embeddings}: dynamic NTK changes the frequencies with the current"
                " length, which one compiled decode step cannot follow; up to "
                "max_position_embeddings it equals the default RoPE (served that way)"
            )
    elif kind == "longrope":
        orig = params.get("original_max_position_embeddings") or max_position_embeddings
        if max_seq_len > orig:
            raise NotImplementedError(
                f"rope_type='longrope' with max_seq_len={max_seq_len} > "
                f"original_max_position_embeddings={orig}: transformers switches to the long "
                "factors past that length, which one compiled step cannot follow"
            )
        short = np.asarray(params.get("short_factor") or [], np.float64)
        if short.shape != (dim // 2,):
            raise ValueError(f"longrope short_factor has {short.size} entries, expected "
                             f"{dim // 2}")  # fmt: skip
        inv = 1.0 / (short * base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        factor = params.get("factor")
        factor = max_position_embeddings / orig if factor is None else float(factor)
        scaling = params.get("attention_factor")
        if scaling is None:
            scaling = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    else:
        raise NotImplementedError(f"rope_type={kind!r}; implemented: {', '.join(ROPE_TYPES)}")
    inv32 = np.asarray(inv, np.float32)
    return RopeSpec(tuple(float(x) for x in inv32), float(scaling))


def _yarn_attention_factor(params: dict[str, Any], factor: float) -> float:
    """YaRN's cos/sin scale: `attention_factor`, else `mscale(factor, mscale) /
    mscale(factor, mscale_all_dim)` when both are set, else `mscale(factor)`, with
    `mscale(s, m) = 0.1 m ln(s) + 1` (1 for s <= 1)."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])

    def mscale(s: float, m: float = 1.0) -> float:
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    if m and m_all:
        return float(mscale(factor, m) / mscale(factor, m_all))
    return mscale(factor)
