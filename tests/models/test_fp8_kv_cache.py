"""The FP8 KV cache (issue 37: `load_pretrained(..., kv_dtype="fp8")`, vLLM's
`kv_cache_dtype="fp8"`) on the qwen3 fixture, against transformers' float32 outputs stored
with it: one packed prefill of the four reference prompts and three decode steps.

Bound. The bf16 model of test_pretrained.py (`bf16_atol`, every bf16 store counted, the KV
cache's included: the keys and values are still rounded to bf16 before they are quantized,
as vLLM's activations are) plus the e4m3 rounding of every key and value the cache stores.
e4m3 keeps 3 mantissa bits, so round to nearest moves a value by at most half a step,
2^-4 relative to its binade; with the suite's FP8 model (test_pretrained.py: uniform errors,
mantissas uniform in [1, 2)) a quantized tensor carries a relative error of RMS
sigma8 = 2^-4 / sqrt(6). The pages hold `x / scale` (scale 1.0 here: the fixture has none);
values below 2^-6 are e4m3 subnormals, with an absolute error <= 2^-10 (RMS 2^-10 / sqrt(3)),
within sigma8 of any head vector whose RMS exceeds 2^-10 / (sqrt(3) sigma8) = 0.022 (the
fixture's keys, after the k norm, and values are of order 1: amax 3.75 and 7.0).
Counting as test_pretrained_mla.py counts bf16 stores: the values
enter the output linearly (gain <= 1: 1 per layer); the keys come before the attention
logits, where a relative change moves the output by up to twice as much (2 per layer). So
n8 = 3 per attention layer, 6 for the fixture's 2 layers, and
    sigma = sigma8 * sqrt(n8) * max|z|,   max|dz| <= 4 sigma + bf16_atol,   RMS|dz| <= sigma.
Measured at the time of writing: max|z| 6.70, sigma 0.419, bound 1.83 (bf16_atol 0.151);
max|dz| 0.333, RMS 0.070, all 16 greedy tokens equal transformers' (the bf16 cache: max|dz|
0.111, test_pretrained.py). With the checkpoint scales below: max|dz| 0.451, RMS 0.082, 13 of
16 tokens equal (a near-tie flips, and the context differs after it). Greedy tokens are
compared where transformers' top-2 gap exceeds twice the bound and the earlier tokens agree
(test_pretrained.py's rule); no choice of this tiny model has such a gap (0 of 16), so the
logits carry the test, as for the qwen3_fp8 weights. The same bound holds with the
checkpoint's own scales (the quantization grid moves, the relative error model does not) as
long as nothing clamps: a scale below amax / 448 would add the clamp's own error.
"""

from __future__ import annotations

import math
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, reference
from test_checkpoint_errors import tensors_of, write_safetensors
from test_pretrained import bf16_atol, decided_and_same_context, max_abs_logit

from jaxarena import MemoryBudget
from jaxarena.models import CheckpointError, load_pretrained
from jaxarena.models.blocks.attention import E4M3_MAX, Attention

NAME = "qwen3"
NEW = 4  # one prefill, three decode steps
SIGMA8 = 2.0**-4 / math.sqrt(6)
F8 = jnp.dtype(jnp.float8_e4m3fn)


def load(path=CHECKPOINTS / NAME, kv_dtype="fp8"):
    return load_pretrained(path, **LIMITS, compiler_options=FAST_CPU_COMPILE, kv_dtype=kv_dtype)


def run(lm):
    ref = reference(NAME)
    tokens, logits = lm.generate(ref["prompts"], NEW, return_logits=True)
    return np.asarray(tokens), logits


@pytest.fixture(scope="module")
def fp8_run():
    lm = load()
    return lm, *run(lm)


def bound_of(lm, ref):
    n8 = 3 * sum(b.kind == "attention" for b in lm.model.arch.blocks)
    sigma = SIGMA8 * math.sqrt(n8) * max_abs_logit(ref)
    return sigma, 4 * sigma + bf16_atol(lm, ref)


def check_against_transformers(lm, tokens, logits):
    """The logits within the bound wherever the context equals transformers', their RMS
    within sigma; the tokens equal where the bound decides. Returns (max|dz|, bound)."""
    ref = reference(NAME)
    sigma, bound = bound_of(lm, ref)
    want, want_logits = ref["greedy_tokens"][:, :NEW], ref["greedy_logits"][:, :NEW]
    same = decided_and_same_context(np.full(want.shape, np.inf), tokens, want, 0.0)
    assert same[:, 0].all()  # the prefill's logits are always compared
    diff = np.abs(logits - want_logits)[same]
    assert diff.max() <= bound, (diff.max(), bound)
    assert np.sqrt(np.mean(diff**2)) <= sigma
    decided = decided_and_same_context(ref["greedy_top2_gap"][:, :NEW], tokens, want, 2 * bound)
    np.testing.assert_array_equal(tokens[decided], want[decided])
    return float(diff.max()), bound


def test_fp8_cache_logits_within_the_e4m3_bound(fp8_run):
    lm, tokens, logits = fp8_run
    check_against_transformers(lm, tokens, logits)
    assert lm.decode_counter.count == 1
    assert lm.model.plan.check_guards(lm.arena) == []


def test_fp8_pages_are_the_budgets_bytes(fp8_run):
    """Every attention layer's pages are e4m3 with unit scales (the fixture has none), and one
    page of the whole cache is `kv_block_size` tokens of what `jaxarena budget --kv-dtype fp8`
    counts per token (the fixture has no sliding-window layer, so every layer's cache grows
    with the context): half the bf16 figure."""
    lm = fp8_run[0]
    assert not lm.config.sliding_window
    leaves = jax.tree.leaves(lm.caches)
    assert leaves and {x.dtype for x in leaves} == {F8}
    num_pages = {x.shape[0] for x in leaves}
    assert len(num_pages) == 1
    per_page = lm.cache_bytes // num_pages.pop()
    budget = MemoryBudget(config=lm.config, memory_bytes="1TB", kv_dtype="fp8",
                          max_batch_tokens=LIMITS["max_batch_tokens"],
                          max_seq_len=LIMITS["max_seq_len"],
                          kv_block_size=LIMITS["kv_block_size"])  # fmt: skip
    assert per_page == LIMITS["kv_block_size"] * budget.kv_bytes_per_token
    bf16 = MemoryBudget(config=lm.config, memory_bytes="1TB", kv_dtype="bf16")
    assert 2 * budget.kv_bytes_per_token == bf16.kv_bytes_per_token
    for layer in lm.params["layers"]:
        if "wqkv" in layer:
            for key in ("k_scale", "v_scale"):
                assert layer[key].dtype == jnp.float32
                np.testing.assert_array_equal(np.asarray(layer[key]), 1.0)


# Per-layer scales written into a copy of the fixture, under two of the names vLLM reads.
# Chosen above amax / 448, so nothing clamps (the fixture's keys reach 3.25 and 3.75, its
# values 7.0 and 5.5: 288, 291, 329 and 322 on the grid), and far from 1 (another grid than
# the unit-scale run's, with no subnormals).
SCALES = {0: (0.0113, 0.0213), 1: (0.0129, 0.0171)}


def scaled_checkpoint(tmp_path, *, bad_shape=False):
    d = tmp_path / "qwen3_kv_scales"
    shutil.copytree(CHECKPOINTS / NAME, d)
    tensors = tensors_of(NAME)
    for layer, (ks, vs) in SCALES.items():
        pre = f"model.layers.{layer}.self_attn"
        if layer == 0:  # llm-compressor's names, f32 scalars
            tensors[f"{pre}.k_scale"] = np.asarray(ks, np.float32)
            tensors[f"{pre}.v_scale"] = np.asarray(vs, np.float32)
        else:  # the older compressed-tensors names, bf16 [1]
            shape = (3,) if bad_shape else (1,)
            tensors[f"{pre}.k_proj.output_scale"] = np.full(shape, ks, ml_dtypes.bfloat16)
            tensors[f"{pre}.v_proj.output_scale"] = np.full((1,), vs, ml_dtypes.bfloat16)
    write_safetensors(d / "model.safetensors", tensors)
    return d


def test_checkpoint_scales_are_read_and_applied(fp8_run, tmp_path):
    """The checkpoint's `k_scale` / `v_scale` become the layers' scales; the same compiled
    steps (the scales are data) give logits within the same bound, not those of unit scales.
    A bf16 cache accepts and ignores them, as vLLM does."""
    lm = load(scaled_checkpoint(tmp_path))
    layers = [p for p in lm.params["layers"] if "wqkv" in p]
    for i, p in enumerate(layers):
        ks, vs = SCALES[i]
        rounded = (lambda x: x) if i == 0 else (lambda x: float(ml_dtypes.bfloat16(x)))
        np.testing.assert_array_equal(np.asarray(p["k_scale"]), np.float32(rounded(ks)))
        np.testing.assert_array_equal(np.asarray(p["v_scale"]), np.float32(rounded(vs)))
    tokens, logits = run(lm)
    assert not lm.compile_seconds.get("decode", 0) > 1.0  # the executables were shared
    check_against_transformers(lm, tokens, logits)
    assert np.abs(logits - fp8_run[2]).max() > 0  # another grid: other roundings
    plain = load(lm.path, kv_dtype="bf16")
    assert all("k_scale" not in p for p in plain.params["layers"])
    assert {x.dtype for x in jax.tree.leaves(plain.caches)} == {jnp.dtype(jnp.bfloat16)}


def test_bad_scales_and_kv_dtypes_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"k_proj\.output_scale' has shape \[3\]; a KV cache"):
        load(scaled_checkpoint(tmp_path, bad_shape=True))
    with pytest.raises(ValueError, match=r"kv_dtype='fp16' must be one of \['bf16', 'fp8'\]"):
        load(kv_dtype="fp16")
    # MLA's latent cache stays bf16: refused before any weight is read.
    with pytest.raises(NotImplementedError, match=r"kv_dtype='fp8'.*\['mla'\].*MLA's latent"):
        load(CHECKPOINTS / "deepseek_v2")


def test_quantized_write_rounds_to_nearest_and_saturates():
    """A new key or value is stored as e4m3(clamp(bf16(x) / scale, +-448)), per KV head:
    ml_dtypes' round-to-nearest-even of the scaled value where it is in range, +-448 past it
    (a plain cast gives NaN there on CPU), NaN kept."""
    block = Attention(kv_dtype="fp8")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 2, 16)).astype(np.float32) * 3
    x[0, 0, :4] = [1e4, -1e4, np.nan, 0.0]
    scale = np.asarray([0.01, 0.5], np.float32)
    got = np.asarray(block._stored_kv(jnp.asarray(x), jnp.asarray(scale)))
    assert got.dtype == F8
    xb = x.astype(ml_dtypes.bfloat16).astype(np.float32) / scale[:, None]
    want = np.clip(xb, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    assert got[0, 0, :2].astype(np.float32).tolist() == [448.0, -448.0]
    assert np.isnan(got[0, 0, 2].astype(np.float32))
    assert (np.abs(xb) > E4M3_MAX).sum() > 2  # the small scale saturates more than the two
