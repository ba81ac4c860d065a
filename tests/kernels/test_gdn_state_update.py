"""The Gated DeltaNet decode step against the float64 sequential recurrence (one token per
sequence), in place in the state cache.

Tolerance: FLA's rule for its recurrent kernel: max |diff| <= 1e-6, else RMS(diff) / RMS(ref)
< 0.002. The kernel is float32 throughout (relative error ~K * 2^-24 ~ 1e-5 from the K-term
sums), then rounds `o` to bf16 (v's dtype): against the f64 output that rounding alone is an
RMS ratio ~1.5e-3 (measured 1.57e-3), so `o` is compared with the reference rounded to bf16
the same way: the two roundings differ only where a bf16 rounding boundary falls within
~1e-5 of the value (a fraction ~1e-5 / 2^-8 of the entries, by one ulp), an RMS ratio
~2e-4. The f32 state is compared as it is (measured: within FLA's 1e-6 max-abs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.gdn_chunked import gdn_sequential_reference
from pallas_kernels.gdn_state_update import gdn_state_update

RECURRENT_RATIO = 0.002  # FLA's rule (module docstring)


def fla_error(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    d = got - ref
    return 0.0 if np.abs(d).max() <= 1e-6 else float(np.sqrt(np.mean(d * d) / np.mean(ref * ref)))


@pytest.mark.parametrize("K", [32, 128])
def test_update_matches_the_recurrence_in_place(K):
    """Three rows updating slots [4, 0, 2] of a 5-slot cache, GVA (4 value heads on 2 key
    heads), q/k L2 norm: o and the named slots match the recurrence run one token from the
    slot's state; slots 1 and 3 keep their bytes; the cache is updated in its own buffer."""
    rng = np.random.default_rng(K)
    slots, B, H, HV, V = 5, 3, 2, 4, 32
    state = jnp.asarray(rng.standard_normal((slots, HV, K, V)), jnp.float32)
    q, k = (jnp.asarray(rng.standard_normal((B, H, K)), jnp.bfloat16) for _ in range(2))
    v = jnp.asarray(rng.standard_normal((B, HV, V)), jnp.bfloat16)
    g = jnp.asarray(np.log(rng.uniform(0.5, 1.0, (B, HV))), jnp.float32)
    beta = jnp.asarray(rng.uniform(0.0, 1.0, (B, HV)), jnp.float32)
    idx = [4, 0, 2]
    before = np.asarray(state)
    ref_o, ref_s = gdn_sequential_reference(
        q, k, v, g, beta, cu_seqlens=np.arange(B + 1), initial_states=before[idx],
        use_qk_l2norm=True,
    )  # fmt: skip
    o, new = gdn_state_update(state, q, k, v, g, beta, state_indices=idx, use_qk_l2norm=True)
    assert o.dtype == jnp.bfloat16 and o.shape == (B, HV, V)
    assert fla_error(o, np.asarray(jnp.asarray(ref_o, jnp.bfloat16))) < RECURRENT_RATIO
    got = np.asarray(new)
    assert fla_error(got[idx], ref_s) < RECURRENT_RATIO
    np.testing.assert_array_equal(got[[1, 3]], before[[1, 3]])


def test_update_aliases_the_cache_under_jit():
    """Donated to a jit, the cache is the call's output buffer (aliased). The interpreter
    itself copies a whole-array ref it indexes dynamically (temp ~6x the cache on CPU), so
    "no temporary" is checked where it matters, compiled for a GPU: tests/gpu/test_gdn_gpu.py
    (H200 / B200: one launch, the cache aliased, 0 B temp)."""
    sds = jax.ShapeDtypeStruct
    args = (sds((5, 4, 32, 32), jnp.float32), sds((3, 2, 32), jnp.bfloat16),
            sds((3, 2, 32), jnp.bfloat16), sds((3, 4, 32), jnp.bfloat16),
            sds((3, 4), jnp.float32), sds((3, 4), jnp.float32), sds((3,), jnp.int32))  # fmt: skip
    fn = jax.jit(lambda s, *x: gdn_state_update(s, *x[:5], state_indices=x[5]), donate_argnums=0)
    mem = fn.lower(*args).compile().memory_analysis()
    assert mem.alias_size_in_bytes == 5 * 4 * 32 * 32 * 4


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"state_indices": [0, 0]}, "repeats slot 0"),
        ({"state_indices": [0, 9]}, r"state_indices\[1\]=9"),
        ({"v": jnp.zeros((2, 3, 32))}, "v.shape"),
        ({"scale": "x"}, "scale"),
    ],
)
def test_bad_arguments_are_refused(over, match):
    kw = dict(state=jnp.zeros((4, 4, 32, 32)), q=jnp.zeros((2, 2, 32)), k=jnp.zeros((2, 2, 32)),
              v=jnp.zeros((2, 4, 32)), g=jnp.zeros((2, 4)), beta=jnp.zeros((2, 4))) | over  # fmt: skip
    pos = [kw.pop(n) for n in ("state", "q", "k", "v", "g", "beta")]
    with pytest.raises(ValueError, match=match):
        gdn_state_update(*pos, **kw)
