"""RoPE pieces of DeepSeek's multi-head latent attention: YaRN inverse frequencies, the YaRN
softmax scale (`mscale_all_dim`) and the pairwise (interleaved) or rotate-half rotation.

The numbers follow transformers: `modeling_rope_utils.ROPE_INIT_FUNCTIONS["yarn"]` for the
inverse frequencies and the cos/sin factor, `yarn_apply_mscale` for the softmax scale.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Yarn", "yarn_mscale", "mla_rope", "inverse_frequencies"]


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude factor `0.1 * mscale * ln(factor) + 1` (1 for `factor <= 1`)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Yarn:
    """YaRN RoPE scaling (`rope_type: "yarn"` in `config.json`).

    Attributes:
      factor: context extension factor.
      original_max_position_embeddings: the pretraining context.
      beta_fast, beta_slow: rotation counts bounding the interpolation ramp (default 32, 1).
      mscale, mscale_all_dim: DeepSeek's magnitude factors (0: absent).
      attention_factor: an explicit cos/sin factor (None: derived from the above).
      truncate: round the ramp bounds outwards to whole dimensions (default True).
    """

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    @classmethod
    def from_config(cls, rp: dict[str, Any], max_position_embeddings: int) -> Yarn:
        """From a `rope_parameters` / `rope_scaling` dict of type `yarn`."""
        factor = rp.get("factor")
        orig = rp.get("original_max_position_embeddings")
        if factor is None and orig:
            factor = max_position_embeddings / orig
        if factor is None or not orig:
            raise ValueError(f"yarn rope_parameters need factor and "
                             f"original_max_position_embeddings, got {rp}")  # fmt: skip
        return cls(factor=float(factor), original_max_position_embeddings=int(orig),
                   beta_fast=float(rp.get("beta_fast") or 32), beta_slow=float(rp.get("beta_slow") or 1),
                   mscale=float(rp.get("mscale") or 0), mscale_all_dim=float(rp.get("mscale_all_dim") or 0),
                   attention_factor=rp.get("attention_factor"),
                   truncate=bool(rp.get("truncate", True)))  # fmt: skip

    def cos_sin_factor(self) -> float:
        """The factor transformers multiplies cos and sin by (`attention_scaling`)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(
                self.factor, self.mscale_all_dim
            )
        return yarn_mscale(self.factor)

    def softmax_factor(self) -> float:
        """The factor on the softmax scale, `mscale(factor, mscale_all_dim)^2` (1 without
        `mscale_all_dim`), as transformers' DeepSeek attention applies it."""
        if not self.mscale_all_dim:
            return 1.0
        return yarn_mscale(self.factor, self.mscale_all_dim) ** 2

    def inverse_frequencies(self, dim: int, base: float) -> np.ndarray:
        """`float32[dim // 2]`: each pair's frequency, interpolated by `factor` below the ramp,
        kept above it, linearly blended across it."""
        orig = self.original_max_position_embeddings

        def corr(rot: float) -> float:
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr(self.beta_fast), corr(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
        extra = 1.0 - ramp.astype(np.float32)
        pos = (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)).astype(np.float32)
        return ((1.0 / (self.factor * pos)) * (1 - extra) + (1.0 / pos) * extra).astype(np.float32)


def inverse_frequencies(dim: int, base: float, yarn: Yarn | None) -> np.ndarray:
    """`float32[dim // 2]`, plain `base^(-2i/dim)` or YaRN's."""
    if yarn is not None:
        return yarn.inverse_frequencies(dim, base)
    return (1.0 / base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)).astype(np.float32)


def mla_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray, *, interleave: bool,
             scale: float = 1.0) -> jax.Array:  # fmt: skip
    """Rotates `x [T, heads, D]` at `positions int32[T]`, f32 angles `pos * inv_freq`.

    `interleave`: the pairs are `(x[2i], x[2i+1])` (DeepSeek's checkpoints); the result lists
    the rotated first elements then the rotated second elements (a fixed permutation of the
    rotated pairs: queries and keys get the same one, so their dot products are unchanged).
    Otherwise the pairs are `(x[i], x[i + D/2])` (rotate-half). `scale` multiplies cos and
    sin (YaRN's `cos_sin_factor`).
    """
    d = x.shape[-1]
    ang = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]
    cos, sin = jnp.cos(ang)[:, None, :] * scale, jnp.sin(ang)[:, None, :] * scale
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
