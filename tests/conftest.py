"""Suite-wide setup: eight virtual CPU devices for the sharding tests, the `_helpers` package on
`sys.path` (so the suite runs from any working directory), and the Hypothesis CI profile.

XLA reads the flag once, when the backend starts, so it is set here, before any test module
imports JAX. Single-device tests keep using device 0.
"""

import os
import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

# CI runs every property test on the same derandomized examples, so a landing is never decided
# by the draw; local runs keep exploring new examples.
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_addoption(parser):
    parser.addoption(
        "--one-case-per-test", action="store_true", default=False,
        help="run only the first parametrization of each test function (CI's lowest-JAX job: "
        "every test function on that JAX once; the full grids run in the other jobs)",
    )  # fmt: skip


# CI's two full jobs split the heaviest folders between them (JAXARENA_CI_SHARD; see there).
from _helpers.ci_shard import shard as _shard  # noqa: E402


def pytest_collection_modifyitems(config, items):
    keep, drop = _shard(items)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if not config.getoption("--one-case-per-test"):
        return
    seen: set[str] = set()
    keep, drop = [], []
    for item in items:
        function = item.nodeid.split("[", 1)[0]
        (drop if function in seen else keep).append(item)
        seen.add(function)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code_after_each_module():
    """After each test module, drop JAX's caches of traced and compiled computations (the
    session's loaded fixtures keep their own compiled steps) and collect garbage: the CI jobs
    run the whole suite in one process each, two at once, and the compiled executables of
    every module's jitted functions otherwise accumulate (XLA:CPU segfaulted in a compile
    past 60% of the suite on a 24 GB machine)."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
