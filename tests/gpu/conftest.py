"""Fixtures shared by the GPU compile gate (deviceless compiles for H200 / B200)."""

import pytest

from jaxarena import gpu_aot


@pytest.fixture(scope="session")
def h200() -> str:
    """The target name "h200", or a skip that says why no compile-only H200 can be made."""
    try:
        gpu_aot.gpu_device("h200")
    except gpu_aot.GpuUnavailable as e:
        pytest.skip(f"no compile-only H200 can be made here: {e.reason}")
    return "h200"
