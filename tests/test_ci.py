"""CI tests what the project declares: the lowest jax in pyproject is the one .ci/run's second
job installs, and the test extra brings the CUDA plugin the GPU compile gate needs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_lowest_declared_jax_is_the_one_ci_tests():
    deps = _pyproject()["project"]["dependencies"]
    [jax_dep] = [d for d in deps if re.match(r"jax\b", d) and not d.startswith("jaxlib")]
    declared = re.fullmatch(r"jax>=([\d.]+)", jax_dep.replace(" ", ""))
    assert declared, f"pyproject declares {jax_dep!r}; expected 'jax>=X.Y.Z'"
    ci = (ROOT / ".ci" / "run").read_text()
    pinned = re.search(r"^LOWEST_JAX=([\d.]+)$", ci, flags=re.M)
    assert pinned, ".ci/run sets no LOWEST_JAX"
    assert pinned.group(1) == declared.group(1)
    assert '"jax==$LOWEST_JAX" "jaxlib==$LOWEST_JAX"' in ci


def test_test_extra_brings_the_cuda_plugin():
    test_extra = _pyproject()["project"]["optional-dependencies"]["test"]
    assert any(d.replace(" ", "").startswith("jax[cuda13-local]") for d in test_extra)
