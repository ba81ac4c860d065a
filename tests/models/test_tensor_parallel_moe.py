"""Tensor and expert parallelism of the MoE fixtures on the session's 8 CPU devices against
transformers: qwen3_moe (an untied LM head; experts split column-/row-parallel at ep 1, whole
experts per device at ep = tp) and deepseek_v2 (MLA + MoE, whole experts at ep = tp = 2). The
bound and the checks are test_tensor_parallel.py's (tp_checks.py), with the routing term and
the router near-ties of the fixtures' own test (test_moe_models.py)."""

from __future__ import annotations

from tp_checks import (  # noqa: F401 - the shared tests, their fixture and parametrization
    pytest_generate_tests,
    sharded_runs,
    test_each_device_holds_its_budget,
    test_sharded_greedy_tokens_match_transformers,
    test_sharded_logits_match_transformers,
)

CASES = [
    ("qwen3_moe", 2, 1, "xla"),
    ("qwen3_moe", 4, 4, "xla"),
    ("deepseek_v2", 2, 2, "xla"),
]
