"""Lowering a jitted function for CUDA on a machine without a GPU (text only, no compile).

jax >= 0.11 asks Pallas-Triton which GPU it lowers for and refuses without one unless an
abstract GPU device is set; `jaxarena.gpu_aot.abstract_gpu` sets an H200 (sm_90). Older jax
lowers without it and ignores the abstract mesh. No CUDA plugin is needed: this is the
StableHLO text with the Triton kernels embedded, not a compile.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxarena.gpu_aot import abstract_gpu

__all__ = ["cuda_lowering_text"]


def cuda_lowering_text(fn: Any, *args: Any, **kwargs: Any) -> str:
    """The StableHLO text of `jax.jit(fn)` lowered for CUDA (an H200) at these arguments."""
    with abstract_gpu("h200"):
        return jax.jit(fn).trace(*args, **kwargs).lower(lowering_platforms=("cuda",)).as_text()
