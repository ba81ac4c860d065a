"""Tensor and expert parallelism of the MoE fixtures on the session's 8 CPU devices against
transformers: qwen3_moe (an untied LM head; experts split column-/row-parallel at ep 1, whole
experts per device at ep = tp) and deepseek_v2 (MLA + MoE, whole experts at ep = tp = 2). The
bound and the checks are test_tensor_parallel.py's (tp_checks.py), with the routing term and
the router near-ties of the fixtures' own test (test_moe_models.py)."""

from __future__ import annotations

import pytest
from tp_checks import case_ids, check_budget, check_greedy, check_logits, sharded_runs  # noqa: F401

CASES = [
    ("qwen3_moe", 2, 1, "xla"),
    ("qwen3_moe", 4, 4, "xla"),
    ("deepseek_v2", 2, 2, "xla"),
]


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_sharded_logits_match_transformers(sharded, case):
    check_logits(sharded, case)


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_sharded_greedy_tokens_match_transformers(sharded, case):
    check_greedy(sharded, case)


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_each_device_holds_its_budget(sharded, case):
    check_budget(sharded, case)
