"""Helpers shared by the kernel tests that check arena forms."""

from __future__ import annotations

import numpy as np

from jaxarena import ArenaPlan


def random_arena(plan: ArenaPlan, seed: int) -> np.ndarray:
    """The plan's arena (guards filled) with random bytes in every region, as host bytes.

    Filling regions with noise before an arena-form call makes "the kernel wrote only its
    regions" checkable byte for byte: every other byte must still hold its noise.
    """
    arena = np.array(plan.allocate())
    flat = arena.reshape(-1)
    rng = np.random.default_rng(seed)
    for r in plan.region_list:
        flat[r.offset_bytes : r.end_bytes] = rng.integers(0, 256, r.nbytes, dtype=np.uint8)
    return arena
