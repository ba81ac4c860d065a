"""Mamba-2 at tp 4: the fixtures read with more, narrower groups (a group per device).

The mamba2 / nemotron_h fixtures have 2 SSM groups (test_tensor_parallel.py runs them at tp 4
against transformers, each group spanning 2 devices). The same safetensors files are valid checkpoints
of models with 4 groups of half the state size (`in_proj`, the conv and every other tensor keep
their shapes: B and C are `n_groups * state_size` wide): other models, with no transformers
reference, so each is held against its own one-device run. (Gated DeltaNet has no such reading:
qwen3_next's 2 key heads of 128 would become 4 of 64, and the arena's GDN scratch is sized for
128 x 128 heads; test_tensor_parallel.py runs the qwen3_next_tp4 fixture, 4 key heads of 128,
at tp 4 against transformers.) Both runs are within
their derived bounds of the exact values (the fixtures' own rounding counts, test_tensor_parallel
.py's docstring for the sharded one), so they differ by at most the sum of the two bounds, with
max|z| the one-device run's largest logit; greedy tokens are compared where the one-device
run's top-2 gap exceeds twice that.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import test_pretrained as dense_tests
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, NEW_TOKENS, reference
from tp_checks import base_count

from jaxarena.models import load_pretrained

U_BF16 = 2.0**-9
TP = 4
WIDER = {
    "mamba2": {"n_groups": 4, "state_size": 8},
    "nemotron_h": {"n_groups": 4, "ssm_state_size": 8},
}


def derived(name: str, folder):
    """The fixture's files with the config of `WIDER[name]`."""
    folder.mkdir()
    src = CHECKPOINTS / name
    config = {**json.loads((src / "config.json").read_text()), **WIDER[name]}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").symlink_to(src / "model.safetensors")
    return folder


def run(path, **mesh):
    lm = load_pretrained(path, **LIMITS, kernels="xla", compiler_options=FAST_CPU_COMPILE, **mesh)
    prompts = reference(path.name.split("-")[0])["prompts"]
    prefill = np.concatenate([lm.prefill_logits(p) for p in prompts])
    tokens, logits = lm.generate(prompts, NEW_TOKENS, return_logits=True)
    return lm, prefill, np.asarray(tokens), logits


@pytest.mark.parametrize("name", sorted(WIDER))
def test_four_way_split_matches_one_device(name, tmp_path):
    path = derived(name, tmp_path / f"{name}-wider")
    one, p1, t1, l1 = run(path)
    lm, p4, t4, l4 = run(path, mesh=TP)
    assert lm.model.config.n_groups == 1  # one group per device
    count = base_count(name, one.config)
    n = 1 + sum(count(b) for b in one.model.arch.blocks)
    z = float(max(np.abs(p1).max(), np.abs(l1).max()))
    atol = 4 * U_BF16 * z * (math.sqrt(n / 3) + math.sqrt((n + 2 * len(one.model.arch.blocks)) / 3))
    assert atol < z / 4
    np.testing.assert_allclose(p4, p1, atol=atol, rtol=0)
    same = dense_tests.decided_and_same_context(np.inf, t4, t1, -np.inf)
    np.testing.assert_allclose(l4[same], l1[same], atol=atol, rtol=0)
    mask = dense_tests.decided_and_same_context(dense_tests.top2_gap(l1), t4, t1, 2 * atol)
    np.testing.assert_array_equal(t4[mask], t1[mask])
    assert same.mean() >= 0.4, f"only {same.sum()} of {same.size} steps share the context"
