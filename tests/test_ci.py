"""CI tests what the project declares: the lowest jax in pyproject is the one .ci/run's lowest
job installs, the README's test command runs on Python 3.11 and 3.12 (newest jax), the test
extra brings the CUDA plugin the GPU compile gate needs, and the jobs that install it require
the gate to run (JAXARENA_REQUIRE_GPU_GATE)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

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


def _ci() -> str:
    return (ROOT / ".ci" / "run").read_text()


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    block = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)[1]
    return block.strip().split("&& ", 2)[-1]  # pip install ... && python -m pytest -q


def test_ci_runs_the_readme_command_on_python_3_11_and_the_newest_python_job():
    ci = _ci()
    assert ci.count(_readme_test_command()) == 2, "jobs 1 (python3) and 2 (Python 3.12)"
    new = re.search(r"^PYTHON_NEW=(3\.\d+)$", ci, flags=re.M)
    assert new and new.group(1) == "3.12"
    # Job 2 fails, saying so, when no Python 3.12 is found (it never falls back to python3).
    assert 'find_python "$PYTHON_NEW"' in ci and "exit 1" in ci


def test_ci_requires_the_gpu_gate_where_the_plugin_is_installed():
    ci = _ci()
    conftest = (ROOT / "tests" / "gpu" / "conftest.py").read_text()
    assert 'REQUIRE_ENV = "JAXARENA_REQUIRE_GPU_GATE"' in conftest
    jobs = ci.split("# Job ")[1:]
    assert len(jobs) == 3
    jobs[2] = jobs[2].split("\nstart=")[0]  # job 3's body, not the runner after it
    for job in jobs[:2]:  # the two jobs that install the test extra (and so the plugin)
        assert '".[test]"' in job
    for job in jobs[:2]:  # each job runs in its own subshell: its environment is its own
        assert "export JAXARENA_REQUIRE_GPU_GATE=1" in job
    assert "JAXARENA_REQUIRE_GPU_GATE" not in jobs[2] and "tests/gpu" not in jobs[2]


def test_declared_python_range_and_classifiers_match_ci():
    project = _pyproject()["project"]
    assert project["requires-python"].replace(" ", "") == ">=3.11"
    versions = sorted(
        c.rsplit(":: ", 1)[1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert versions == ["3.11", "3.12", "3.13"]
    # jax from the lowest CI job's version with no upper bound: the newest one is CI's job 2.
    [jax_dep] = [d for d in project["dependencies"] if re.match(r"jax\b", d)]
    assert "<" not in jax_dep


def test_the_two_ci_shards_run_every_test_once_and_split_the_heavy_folders(monkeypatch):
    """JAXARENA_CI_SHARD=1/2 and 2/2 (jobs 1 and 2): together every test, each file of
    tests/models, tests/gpu and tests/kernels in exactly one, every other test in both."""
    import types

    from _helpers import ci_shard

    names = ["models/test_a.py", "models/test_b.py", "models/test_c.py", "gpu/test_a.py",
             "gpu/test_b.py", "kernels/test_a.py", "engine/test_a.py", "test_cli.py"]  # fmt: skip
    items = [types.SimpleNamespace(path=ROOT / "tests" / n) for n in names for _ in range(2)]
    kept = {}
    for k in (1, 2):
        monkeypatch.setenv("JAXARENA_CI_SHARD", f"{k}/2")
        keep, drop = ci_shard.shard(items)
        assert len(keep) + len(drop) == len(items)
        kept[k] = {str(i.path.relative_to(ROOT / "tests")) for i in keep}
    for n in names:
        heavy = n.split("/")[0] in ci_shard.SHARDED_FOLDERS
        assert (n in kept[1]) + (n in kept[2]) == (1 if heavy else 2), n
    assert {"models/test_a.py", "gpu/test_a.py"} <= kept[1]
    assert {"models/test_b.py", "gpu/test_b.py"} <= kept[2]
    monkeypatch.setenv("JAXARENA_CI_SHARD", "3/2")
    with pytest.raises(ValueError, match="JAXARENA_CI_SHARD"):
        ci_shard.shard(items)
