"""Shared by the tests that launch several JAX processes (test_launch.py, test_multiprocess.py)."""

from __future__ import annotations

from pathlib import Path

from jaxarena.launch import LaunchResult

WORKERS = Path(__file__).parent
# Generous for a 2-core CI machine (a JAX launch takes ~5-10 s there); a hang still ends.
JAX_TIMEOUT_S = 150.0
# JAX catches SIGTERM (its preemption notifier), so its processes only end at the SIGKILL:
# a short grace keeps the failure tests quick.
GRACE_S = 1.0


def explain(result: LaunchResult) -> str:
    """The launch's message and the last lines of every process's output, for a failed assert."""
    tails = [result.message]
    for p in result.processes:
        tails.append(f"--- p{p.process_id} ({p.how()}) stdout:\n" + "\n".join(p.stdout[-20:]))
        tails.append(f"--- p{p.process_id} stderr:\n" + "\n".join(p.stderr[-40:]))
    return "\n".join(tails)
