"""Loaded fixture checkpoints for the model tests: each is loaded and compiled once for the
whole session (the `runs` fixture in conftest.py), and its runs on the reference prompts are
shared by every test."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from jaxarena.models import load_pretrained

CHECKPOINTS = Path(__file__).resolve().parent.parent / "fixtures" / "checkpoints"
# Serve limits of every fixture run: prompts of <= 16 tokens + 8 new ones, 4 per batch.
LIMITS = dict(max_batch_tokens=64, max_seq_len=32, kv_block_size=16, max_batch_size=4)
NEW_TOKENS = 8
# XLA:CPU compiles of the fixtures' steps with LLVM at -O0 and without its expensive passes:
# measured on the qwen3_moe fixture, 22.2 s of backend compile -> 13.7 s (the runs 30.4 s ->
# 21.9 s); outputs bit-identical on qwen3, qwen3_moe and mamba2 but for one bf16 ulp of one
# mamba2 decode logit (FMA contraction), far inside every derived bound. The GPU gate's
# compiles (tests/gpu, jaxarena.gpu_aot) do not go through these runs and keep XLA's defaults.
FAST_CPU_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def reference(name: str) -> dict[str, Any]:
    """transformers' outputs for fixture `name` (see tests/fixtures/checkpoints/README.md)."""
    with np.load(CHECKPOINTS / name / "reference.npz") as r:
        ref = {k: r[k] for k in r.files}
    n = len(ref["prompt_lengths"])
    ref["prompts"] = [
        ref["prompt_ids"][i, :m].tolist() for i, m in enumerate(ref["prompt_lengths"])
    ]
    ref["prefill"] = [ref[f"prefill_logits_{i}"] for i in range(n)]
    ref["greedy_logits"] = np.stack([ref[f"greedy_logits_{i}"] for i in range(n)])
    return ref


class Runs:
    """Loads a fixture once and runs it once on the reference prompts."""

    def __init__(self) -> None:
        self._lm: dict[str, Any] = {}
        self._runs: dict[str, dict[str, Any]] = {}

    def lm(self, name: str):
        if name not in self._lm:
            self._lm[name] = load_pretrained(CHECKPOINTS / name, **LIMITS,
                                             compiler_options=FAST_CPU_COMPILE)  # fmt: skip
        return self._lm[name]

    def run(self, name: str) -> dict[str, Any]:
        if name not in self._runs:
            lm, ref = self.lm(name), reference(name)
            prefill = [lm.prefill_logits(p) for p in ref["prompts"]]
            tokens, logits = lm.generate(ref["prompts"], NEW_TOKENS, return_logits=True)
            tokens = np.asarray(tokens)
            # Teacher forcing: the whole sequence recomputed by prefill alone; row len(p) - 1 + j
            # chose new token j.
            forced = []
            for p, new in zip(ref["prompts"], tokens, strict=True):
                full = lm.prefill_logits(p + new[:-1].tolist())
                forced.append(full[len(p) - 1 :])
            self._runs[name] = dict(
                ref=ref, prefill=prefill, tokens=tokens, logits=logits, forced=np.stack(forced)
            )
        return self._runs[name]


def check_decode_in_place(lm, name: str) -> dict[str, int]:
    """Generate again on another batch size (2 prompts, 3 tokens) with "donated buffers were
    not usable" as an error: the decode step is still the one traced step, the arena stays at
    its buffer, its guard bands are intact, and the arena and caches are aliased (written in
    place). Returns the decode step's memory figures for further checks."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lm.generate(reference(name)["prompts"][:2], 3)
    assert lm.decode_counter.count == 1
    assert lm.arena.unsafe_buffer_pointer() == lm.arena_pointer
    assert lm.model.plan.check_guards(lm.arena) == []
    mem = lm.step_memory("decode")
    assert mem["alias"] >= lm.arena_bytes + lm.cache_bytes
    return mem
