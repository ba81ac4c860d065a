"""Shared by the tests that launch several JAX processes (tests/distributed/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from jaxarena.launch import LaunchResult

# The scripts the launched processes run.
WORKERS = Path(__file__).resolve().parents[1] / "distributed" / "workers"
# Generous for a 2-core CI machine (a JAX launch takes ~5-10 s there); a hang still ends.
JAX_TIMEOUT_S = 150.0
# JAX catches SIGTERM (its preemption notifier), so its processes only end at the SIGKILL:
# a short grace keeps the failure tests quick.
GRACE_S = 1.0


def load_worker(name: str) -> ModuleType:
    """Imports `WORKERS/<name>.py` as a module (workers run their `main` only as scripts)."""
    spec = importlib.util.spec_from_file_location(f"_worker_{name}", WORKERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def explain(result: LaunchResult) -> str:
    """The launch's message and the last lines of every process's output, for a failed assert."""
    tails = [result.message]
    for p in result.processes:
        tails.append(f"--- p{p.process_id} ({p.how()}) stdout:\n" + "\n".join(p.stdout[-20:]))
        tails.append(f"--- p{p.process_id} stderr:\n" + "\n".join(p.stderr[-40:]))
    return "\n".join(tails)
