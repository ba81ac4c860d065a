"""A whole model over a mesh spanning processes: the qwen3 fixture's weights read as 8 heads
(tests/distributed/workers/model_tp_worker.py) with tensor parallelism over 2 processes x 4
CPU devices (gloo collectives, started by `jaxarena.launch`), so every block's all-reduce, the
embedding's and the logits' all-gather cross processes.

Both processes must read the same logits and tokens (they are replicated outputs), each must
hold only its four devices' slices, and the results must be those of the same 8-way split run
in ONE process: the same program, only the collectives' transport differs, so the greedy
tokens are equal and the logits agree within one bf16 rounding of a logit (2^-8 relative of
the largest |logit|: a float32 all-reduce summed in another order may round a stored bf16
activation the other way; tests/models/test_tensor_parallel.py bounds both against
transformers).
"""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytest
from _helpers.launch import GRACE_S, JAX_TIMEOUT_S, WORKERS, load_worker
from _helpers.launch import explain as _explain

from jaxarena import launch as L

PROCESSES, DEVICES = 2, 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("model_tp")
    ckpt = out / "qwen3_8_heads"
    load_worker("model_tp_worker").write_checkpoint(ckpt)
    result = L.launch([sys.executable, str(WORKERS / "model_tp_worker.py"), str(ckpt), str(out)],
                      processes=PROCESSES, devices_per_process=DEVICES,
                      timeout=2 * JAX_TIMEOUT_S, grace_s=GRACE_S)  # fmt: skip
    assert result.ok, _explain(result)
    return ckpt, [dict(np.load(out / f"model_tp_p{i}.npz")) for i in range(PROCESSES)]


def test_the_model_across_processes_matches_one_process(runs):
    ckpt, (p0, p1) = runs
    results = [k for k in p0 if k.startswith(("prefill_", "tokens", "logits"))]
    for k in results:
        np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)
    # Each process holds its four devices' slices only: 4 x one device's weights.
    assert len(p0["local_devices"]) == len(p1["local_devices"]) == DEVICES
    assert set(p0["local_devices"]).isdisjoint(p1["local_devices"])
    for p in (p0, p1):
        assert p["local_param_bytes"] == DEVICES * p["weight_bytes"]
    one = load_worker("model_tp_worker").run_model(ckpt, jax.devices()[: PROCESSES * DEVICES])
    np.testing.assert_array_equal(one["tokens"], p0["tokens"])
    scale = max(float(np.abs(one[k]).max()) for k in results if k != "tokens")
    for k in results:
        np.testing.assert_allclose(p0[k], one[k], atol=2.0**-8 * scale, rtol=0, err_msg=k)
    assert one["weight_bytes"] == p0["weight_bytes"]
