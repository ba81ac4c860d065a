"""The GPU compile gate's one rule for when it runs, skips or fails (every file in tests/gpu).

The gate needs two things from the environment: the CUDA PJRT plugin (`jax[cuda13-local]` at
jaxlib's version) and `ptxas` (on PATH or in `$CUDA_ROOT/bin`). Both are checked here directly,
not through `jaxarena.gpu_aot`, so a regression in that module cannot pass for a missing
plugin:

- one of them missing: the test skips with the reason, or FAILS with it when
  `JAXARENA_REQUIRE_GPU_GATE=1` (CI sets it in the jobs that install the plugin, so CI cannot go
  green with the gate skipped);
- both present: the compile-only device must be made. `GpuUnavailable` from `gpu_aot` is then
  an error of the test (a broken harness or a plugin that does not match jaxlib), never a skip.

Tests that need a device take the `h200` fixture (the target name "h200") or `target`
(parametrized over "h200" and "b200"); tests of the dump parsers take neither and always run.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil

import pytest

from jaxarena import gpu_aot

REQUIRE_ENV = "JAXARENA_REQUIRE_GPU_GATE"
_PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def _gate_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


@functools.cache
def environment_gap() -> str | None:
    """What this environment lacks for the gate (None when it has the plugin and ptxas)."""
    if not any(_find_spec(name) for name in _PLUGINS):
        return (
            "the CUDA PJRT plugin is not installed (no jax_plugins.xla_cuda13 or xla_cuda12); "
            'install it at jaxlib\'s version: pip install "jax[cuda13-local]"'
        )
    root = os.environ.get("CUDA_ROOT", "")
    if shutil.which("ptxas") is None and not os.path.exists(os.path.join(root, "bin", "ptxas")):
        return (
            "no ptxas on PATH nor in $CUDA_ROOT/bin: install CUDA 12.8+/13's ptxas, or "
            "pip install nvidia-cuda-nvcc and point CUDA_ROOT at it"
        )
    return None


def _find_spec(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def need_gate(target: str) -> str:
    """`target` when the gate can run; else a skip, or a failure under JAXARENA_REQUIRE_GPU_GATE."""
    gap = environment_gap()
    if gap is not None:
        message = f"GPU compile gate ({target}) cannot run here: {gap}"
        if _gate_required():
            pytest.fail(f"{message} ({REQUIRE_ENV} is set)", pytrace=False)
        pytest.skip(message)
    gpu_aot.gpu_device(target)  # GpuUnavailable here is a failure, not a skip
    return target


@pytest.fixture(scope="session")
def h200() -> str:
    """The target name "h200" (see the module docstring for when this skips or fails)."""
    return need_gate("h200")


@pytest.fixture(scope="session", params=["h200", "b200"])
def target(request) -> str:
    """The target names "h200" and "b200" in turn (see the module docstring for when this skips or fails)."""
    return need_gate(request.param)
