"""RoPE tables (`jaxarena.models.core.rope_params`) against transformers' own
`ROPE_INIT_FUNCTIONS` outputs, committed in tests/fixtures/rope_reference.npz by
tools/make_dense_fixtures.py (no torch here).

Tolerance: transformers evaluates `base ** (2i / dim)` and the type's arithmetic in float32
(a few roundings of 2^-24 each, the power's error growing with the exponent's magnitude,
log2(1e6) ~ 20 bits of it carried into the mantissa's error: at most ~2^-24 * 20 * 2); ours are
float64 rounded once to float32. rtol = 2^-24 * 64 ~ 3.8e-6 covers both with room.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from jaxarena.models.core.rope import rope, rope_table
from jaxarena.models.core.rope_params import rope_parameters, rope_spec

REF = Path(__file__).resolve().parent.parent / "fixtures" / "rope_reference.npz"
RTOL = 2.0**-24 * 64


def _ref():
    with np.load(REF) as r:
        return {k: r[k] for k in r.files}


CASES = sorted(json.loads(str(_ref()["cases"])))


@pytest.mark.parametrize("case", CASES)
def test_inverse_frequencies_and_scaling_match_transformers(case):
    ref = _ref()
    c = json.loads(str(ref["cases"]))[case]
    spec = rope_spec(c["params"], head_dim=c["head_dim"], max_seq_len=4096,
                     max_position_embeddings=c["max_position_embeddings"])  # fmt: skip
    want = ref[f"{case}_inv_freq"]
    assert len(spec.inv_freq) == want.shape[0]
    np.testing.assert_allclose(np.array(spec.inv_freq), want, rtol=RTOL, atol=0)
    assert spec.attention_scaling == pytest.approx(float(ref[f"{case}_scaling"]), rel=1e-12)


def test_the_cases_exercise_every_branch():
    """The reference cases differ from the default table where their type should (so the
    comparisons above could fail for a type treated as the default)."""
    ref = _ref()
    base = ref["default_inv_freq"]
    assert not np.allclose(ref["llama3_inv_freq"], base[: ref["llama3_inv_freq"].size])
    assert ref["yarn_scaling"] > 1 and ref["yarn_mscale_scaling"] == 1.0  # mscale ratio 1
    assert ref["longrope_scaling"] > 1
    np.testing.assert_array_equal(ref["dynamic_inv_freq"], base)  # unscaled at these lengths


def test_dynamic_and_longrope_refuse_lengths_a_fixed_table_cannot_serve():
    dyn = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    with pytest.raises(NotImplementedError, match="dynamic NTK"):
        rope_spec(dyn, head_dim=64, max_seq_len=8192, max_position_embeddings=4096)
    lr = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 32,
          "long_factor": [2.0] * 32, "original_max_position_embeddings": 4096}  # fmt: skip
    with pytest.raises(NotImplementedError, match="long factors"):
        rope_spec(lr, head_dim=64, max_seq_len=8192, max_position_embeddings=131072)
    with pytest.raises(NotImplementedError, match="rope_type='mrope'"):
        rope_spec({"rope_type": "mrope"}, head_dim=64, max_seq_len=8, max_position_embeddings=8)
    with pytest.raises(ValueError, match="needs 'factor'"):
        rope_spec({"rope_type": "linear"}, head_dim=64, max_seq_len=8, max_position_embeddings=8)


def test_rope_parameters_reads_every_spelling():
    legacy = {"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert rope_parameters(legacy) == {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}
    gemma3 = {"rope_theta": 1e6, "rope_local_base_freq": 1e4,
              "rope_scaling": {"rope_type": "linear", "factor": 8.0}}  # fmt: skip
    assert rope_parameters(gemma3, "full_attention") == {
        "rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}  # fmt: skip
    assert rope_parameters(gemma3, "sliding_attention") == {
        "rope_type": "default", "rope_theta": 1e4}  # fmt: skip
    per_type = {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 7.0},
                                    "sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 3.0}}}  # fmt: skip
    assert rope_parameters(per_type, "sliding_attention")["rope_theta"] == 3.0


def test_rope_table_against_numpy_partial_rotary_and_scaling():
    """Rotate-half on the first 2 * len(inv_freq) channels, the rest unchanged, cos and sin
    times the scaling; the full-width default table equals `rope` with its theta. float32
    angles and products on both sides (a few ulps: rtol 1e-6)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3, 16)).astype(np.float32)
    pos = np.array([0, 1, 7, 30, 200], np.int32)
    inv = np.array([1.0, 0.1, 0.01, 0.001], np.float32)
    got = np.asarray(rope_table(jnp.asarray(x), jnp.asarray(pos), tuple(inv.tolist()), 1.25))
    ang = pos[:, None].astype(np.float32) * inv[None]
    c, s = (np.cos(ang) * 1.25)[:, None], (np.sin(ang) * 1.25)[:, None]
    a, b = x[..., :4], x[..., 4:8]
    want = np.concatenate([a * c - b * s, b * c + a * s, x[..., 8:]], -1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    full = rope_spec({"rope_type": "default", "rope_theta": 1e4}, head_dim=16, max_seq_len=8,
                     max_position_embeddings=8)  # fmt: skip
    np.testing.assert_allclose(
        np.asarray(rope_table(jnp.asarray(x), jnp.asarray(pos), full.inv_freq)),
        np.asarray(rope(jnp.asarray(x), jnp.asarray(pos), 1e4)), rtol=1e-5, atol=2e-5)  # fmt: skip
