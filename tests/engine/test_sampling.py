"""The device sampler (`jaxarena.engine.sampling`) against a NumPy float64 reference of the
distribution each setting defines, written here from the definitions (vLLM's order), not from
the sampler's code: penalties, temperature, top-k (ties at the k-th value kept), top-p (token i
kept when the probability strictly above it is < top_p, so a tie is kept whole), min-p.

For every case: (1) `processed_logits` keeps exactly the reference's support and its softmax
equals the reference probabilities within a float32 bound; (2) `sample`'s draws (one row per
draw, every row the same request with its own seed, all cases in one call: one compile) lie in
the support, and their counts pass a chi-square test against the reference probabilities.

Statistical bound. N_DRAWS draws per case; bins are the support's tokens, those with an
expected count below 20 pooled into one bin (the chi-square approximation of the multinomial
is then good in the tail); the statistic must stay below the chi-square quantile at
ALPHA = 1e-6 with (bins - 1) degrees of freedom. A correct sampler fails a case with
probability ~1e-6 (the 16 cases: ~2e-5 in all); the seeds are fixed, so a run is repeatable.
`test_chi_square_has_power` shows the bound rejects a temperature of 0.5 drawn for 1.0.

Float32 bound on the probabilities. The test takes the sampler's f32 processed logits z and
does the softmax in float64, so only z's own error counts. z = (x penalized) / T takes at most
6 roundings (x/rep or x*rep; freq*count and its subtraction; the presence subtraction; / T),
each a relative u = 2^-24 of a value at most W = (max(rep, 1/rep)|x| + |freq| count + |pres|)
/ T in size (times T before the division), so |dz| <= 6uW, W the row's largest. p_i is
exp(z_i) over the sum of them: off by a relative |dz_i| + max|dz| <= 12uW. The test allows
16uW.

Logprob bound. The sampler computes x - lse in f32, lse = m + log(s), s = sum exp(x_i - m):
each x_i - m rounds by u|x_i - m|, which exp turns into a relative error, each exp adds a few
ulp and each of the V additions u, so s is off by a relative u (max|x - m| + 2(V + 2)); log
adds u log V, m + log(s) u|lse| and the last subtraction u|result|:
|err| <= u (max|x - m| + 2(V + 2) + log V + |lse| + |result| + 1).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxarena.engine.sampling import (
    PenaltyState,
    empty_penalty_state,
    processed_logits,
    record_tokens,
    reset_row,
    sample,
    seed_key,
    slot_params,
)
from jaxarena.engine.types import MAX_LOGPROBS, SamplingParams

V = 24
ROWS = 16  # the small calls' batch; also the most cases the draw call holds
N_DRAWS = 3000
ALPHA = 1e-6
MIN_EXPECTED = 20
U = 2.0**-24

TRACES = {"sample": 0, "reset_row": 0}  # how often each jitted function was traced


def _counted(fn):
    def traced(*args, **kwargs):
        TRACES[fn.__name__] += 1
        return fn(*args, **kwargs)

    return traced


_sample = jax.jit(_counted(sample), static_argnames="num_top")
_processed = jax.jit(processed_logits)
_record = jax.jit(record_tokens)
_reset = jax.jit(_counted(reset_row))


# -- the reference --------------------------------------------------------------------------


def ref_penalized(x, prompt, counts, p: SamplingParams):
    x = np.asarray(x, np.float64).copy()
    seen = prompt | (counts > 0)
    x[seen] = np.where(x[seen] > 0, x[seen] / p.repetition_penalty,
                       x[seen] * p.repetition_penalty)  # fmt: skip
    return x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)


def ref_probs(x, prompt, counts, p: SamplingParams):
    """float64 probabilities of the next token, from the definitions (module docstring)."""
    z = ref_penalized(x, prompt, counts, p)
    if p.temperature == 0:
        out = np.zeros(len(z))
        out[np.argmax(z)] = 1.0
        return out
    z = z / p.temperature
    keep = np.ones(len(z), bool)
    if p.top_k > 0:
        keep &= z >= np.sort(z)[::-1][min(p.top_k, len(z)) - 1]
    prob = np.where(keep, np.exp(z - z.max()), 0.0)
    prob /= prob.sum()
    if p.top_p < 1:
        above = np.array([prob[prob > q].sum() for q in prob])
        keep &= above < p.top_p
        prob = np.where(keep, prob, 0.0) / prob[keep].sum()
    if p.min_p > 0:
        keep &= prob >= p.min_p * prob.max()
        prob = np.where(keep, prob, 0.0) / prob[keep].sum()
    return prob


def assert_well_posed(x, prompt, counts, p: SamplingParams):
    """The case's cut-offs are not within float32 noise of a boundary (exact ties aside), so
    the float32 sampler and the float64 reference must agree on the support."""
    z = ref_penalized(x, prompt, counts, p) / max(p.temperature, 1e-30)
    prob = np.exp(z - z.max())
    prob /= prob.sum()
    if p.top_p < 1:
        # the top-k step first, as in ref_probs
        if p.top_k > 0:
            kept = z >= np.sort(z)[::-1][min(p.top_k, len(z)) - 1]
            prob = np.where(kept, prob, 0.0) / prob[kept].sum()
        above = np.unique([prob[prob > q].sum() for q in prob])
        assert np.abs(above - p.top_p).min() > 1e-4, "a top-p boundary within float noise"
    if p.min_p > 0:
        r = ref_probs(x, prompt, counts, SamplingParams(**{**_fields(p), "min_p": 0.0}))
        r = r[r > 0] / r.max()
        assert np.abs(r - p.min_p).min() > 1e-4, "a min-p boundary within float noise"


def _fields(p: SamplingParams) -> dict:
    return {f: getattr(p, f) for f in ("temperature", "top_k", "top_p", "min_p",
                                       "repetition_penalty", "presence_penalty",
                                       "frequency_penalty")}  # fmt: skip


# -- the cases ------------------------------------------------------------------------------


def _logits(seed: int, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(V) * scale).astype(np.float32)


def _logits_bf16(seed: int) -> np.ndarray:
    """`_logits` rounded to bf16 (held as f32): the small tests' logits."""
    return np.asarray(jnp.asarray(_logits(seed), jnp.bfloat16), np.float32)


def _tied_top_p_logits() -> np.ndarray:
    """p = 0.2 (token 3), 0.1 x 3 (tokens 7, 11, 15, exactly tied), 0.025 x 20."""
    x = np.full(V, np.log(1.0), np.float32)
    x[3] = np.log(8.0)
    x[[7, 11, 15]] = np.float32(np.log(4.0))
    return x


def _tied_top_k_logits() -> np.ndarray:
    """Tokens 2, 9, 17 tied at the 4th largest value: top_k=4 keeps all three (6 tokens)."""
    x = _logits(7, 1.0) - 3.0
    x[[0, 5, 20]] = [3.0, 2.5, 2.0]
    x[[2, 9, 17]] = 1.5
    return x


def _history(seed: int):
    rng = np.random.default_rng(seed)
    prompt = np.zeros(V, bool)
    prompt[rng.choice(V, 6, replace=False)] = True
    counts = np.zeros(V, np.int32)
    counts[rng.choice(V, 7, replace=False)] = rng.integers(1, 4, 7)
    return prompt, counts


NO_HISTORY = (np.zeros(V, bool), np.zeros(V, np.int32))
CASES = {
    "temperature_1": (_logits(1), SamplingParams(temperature=1.0), NO_HISTORY),
    "temperature_0.5": (_logits(2), SamplingParams(temperature=0.5), NO_HISTORY),
    "temperature_2": (_logits(3), SamplingParams(temperature=2.0), NO_HISTORY),
    "top_k_5": (_logits(4), SamplingParams(top_k=5), NO_HISTORY),
    "top_k_tie": (_tied_top_k_logits(), SamplingParams(top_k=4), NO_HISTORY),
    "top_k_past_vocab": (_logits(5), SamplingParams(top_k=100), NO_HISTORY),
    "top_p_0.7": (_logits(6), SamplingParams(top_p=0.7), NO_HISTORY),
    "top_p_tie": (_tied_top_p_logits(), SamplingParams(top_p=0.25), NO_HISTORY),
    "min_p_0.1": (_logits(8), SamplingParams(min_p=0.1), NO_HISTORY),
    "repetition_1.5": (_logits(9), SamplingParams(repetition_penalty=1.5), _history(9)),
    "repetition_0.7": (_logits(10), SamplingParams(repetition_penalty=0.7), _history(10)),
    "presence_0.8": (_logits(11), SamplingParams(presence_penalty=0.8), _history(11)),
    "frequency_0.5": (_logits(12), SamplingParams(frequency_penalty=0.5), _history(12)),
    "negative_penalties": (
        _logits(13),
        SamplingParams(presence_penalty=-0.5, frequency_penalty=-0.3),
        _history(13),
    ),
    "k_p_minp": (
        _logits(14),
        SamplingParams(temperature=0.8, top_k=10, top_p=0.8, min_p=0.05),
        NO_HISTORY,
    ),
    "everything": (
        _logits(15),
        SamplingParams(
            temperature=1.3,
            top_k=12,
            top_p=0.9,
            min_p=0.02,
            repetition_penalty=1.3,
            presence_penalty=0.4,
            frequency_penalty=0.2,
        ),
        _history(15),
    ),
}
NAMES = list(CASES)
assert len(NAMES) <= ROWS


def _batch(rows_of: list[tuple], seeds, steps, dtype=jnp.float32):
    """(logits, SlotParams, PenaltyState) of rows given as (logits, params, (prompt, counts))."""
    logits = np.stack([r[0] for r in rows_of])
    assert (np.asarray(jnp.asarray(logits, dtype), np.float32) == logits).all()
    # Every row asks for the top logprobs (the sampler skips them when no row does).
    slots = slot_params(len(rows_of), {
        i: (dataclasses.replace(r[1], logprobs=MAX_LOGPROBS), int(s), int(t))
        for i, (r, s, t) in enumerate(zip(rows_of, seeds, steps, strict=True))
    })  # fmt: skip
    pen = PenaltyState(np.stack([r[2][0] for r in rows_of]), np.stack([r[2][1] for r in rows_of]))
    return (jnp.asarray(logits, dtype), jax.tree.map(jnp.asarray, slots),
            jax.tree.map(jnp.asarray, pen))  # fmt: skip


def _small(rows_of: list[tuple], seeds, steps):
    """`sample` on ROWS rows of bf16 logits: every small test runs the one executable (the
    draws run f32 logits), so the file compiles `sample` twice."""
    assert len(rows_of) == ROWS
    return [np.asarray(a) for a in _sample(*_batch(rows_of, seeds, steps, jnp.bfloat16))]


@pytest.fixture(scope="module")
def outputs():
    """`sample`'s four outputs for every case's N_DRAWS rows, all in one call (f32 logits)."""
    rows = [CASES[n] for n in NAMES for _ in range(N_DRAWS)]
    seeds = np.arange(len(rows)) * 7919 + 12345
    steps = np.arange(len(rows)) % 97
    return [np.asarray(a) for a in _sample(*_batch(rows, seeds, steps))]


@pytest.fixture(scope="module")
def draws(outputs):
    """{case: int[N_DRAWS] tokens}."""
    return {n: outputs[0][i * N_DRAWS : (i + 1) * N_DRAWS] for i, n in enumerate(NAMES)}


def chi_square(tokens: np.ndarray, prob: np.ndarray) -> tuple[float, float]:
    """(statistic, the ALPHA quantile) of tokens against prob, small bins pooled."""
    n = len(tokens)
    observed = np.bincount(tokens, minlength=len(prob)).astype(np.float64)
    expected = n * prob
    big = expected >= MIN_EXPECTED
    obs = list(observed[big])
    exp = list(expected[big])
    small = (~big) & (prob > 0)
    if small.any():
        obs.append(observed[small].sum())
        exp.append(expected[small].sum())
    obs, exp = np.array(obs), np.array(exp)
    if len(obs) < 2:
        return 0.0, 0.0
    return float(((obs - exp) ** 2 / exp).sum()), float(stats.chi2.isf(ALPHA, len(obs) - 1))


# -- the distribution ---------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_draws_follow_the_reference_distribution(name, draws):
    x, p, (prompt, counts) = CASES[name]
    assert_well_posed(x, prompt, counts, p)
    prob = ref_probs(x, prompt, counts, p)
    tokens = draws[name]
    outside = sorted(set(tokens[prob[tokens] == 0].tolist()))
    assert not outside, f"{name}: drew tokens {outside} outside the reference support"
    stat, bound = chi_square(tokens, prob)
    assert stat <= bound, f"{name}: chi-square {stat:.1f} > {bound:.1f} (alpha {ALPHA})"


def test_processed_logits_keep_exactly_the_reference_support():
    """Softmax of `processed_logits`: the reference's support, token for token, and its
    probabilities within the float32 bound (module docstring)."""
    rows = [CASES[n] for n in NAMES]
    z = np.asarray(_processed(*_batch(rows, range(len(rows)), [0] * len(rows))))
    for i, name in enumerate(NAMES):
        x, p, (prompt, counts) = CASES[name]
        prob = ref_probs(x, prompt, counts, p)
        got_support = np.flatnonzero(np.isfinite(z[i]))
        np.testing.assert_array_equal(got_support, np.flatnonzero(prob > 0), err_msg=name)
        zi = z[i][got_support].astype(np.float64)
        got = np.exp(zi - zi.max())
        got /= got.sum()
        rep = max(p.repetition_penalty, 1 / p.repetition_penalty)
        w = rep * np.abs(x) + abs(p.frequency_penalty) * counts + abs(p.presence_penalty)
        rtol = 16 * U * (w / p.temperature).max()
        np.testing.assert_allclose(got, prob[got_support], rtol=rtol, atol=0, err_msg=name)


def test_tie_cases_keep_the_whole_tie():
    """The two boundary-tie cases as the documented rule says, spelled out."""
    x, p, (prompt, counts) = CASES["top_p_tie"]
    assert np.flatnonzero(ref_probs(x, prompt, counts, p)).tolist() == [3, 7, 11, 15]
    x, p, (prompt, counts) = CASES["top_k_tie"]
    assert np.flatnonzero(ref_probs(x, prompt, counts, p)).tolist() == [0, 2, 5, 9, 17, 20]


def test_chi_square_has_power(draws):
    """The bound rejects draws at temperature 0.5 compared with temperature 1 (same logits),
    and top_p=0.7's draws compared with the untruncated distribution."""
    x, _, (prompt, counts) = CASES["temperature_0.5"]
    wrong = ref_probs(x, prompt, counts, SamplingParams(temperature=1.0))
    stat, bound = chi_square(draws["temperature_0.5"], wrong)
    assert stat > bound
    x, _, (prompt, counts) = CASES["top_p_0.7"]
    stat, bound = chi_square(draws["top_p_0.7"], ref_probs(x, prompt, counts, SamplingParams()))
    assert stat > bound


# -- greedy, batch independence, steps ----------------------------------------------------


def _random_rows(seed: int, n: int) -> list[tuple]:
    """n rows of varied requests: greedy, sampled, truncated, penalized."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = rng.integers(4)
        p = [
            SamplingParams(temperature=0.0),
            SamplingParams(temperature=float(rng.uniform(0.3, 2))),
            SamplingParams(top_k=int(rng.integers(1, V)), top_p=float(rng.uniform(0.3, 1))),
            SamplingParams(temperature=float(rng.uniform(0, 2)), min_p=0.1,
                           repetition_penalty=1.2, frequency_penalty=0.3),
        ][kind]  # fmt: skip
        out.append((_logits_bf16(1000 * seed + i), p, _history(1000 * seed + i)))
    return out


def test_greedy_is_the_argmax_of_the_penalized_logits():
    """Greedy rows: the raw argmax without penalties (the all-greedy fast path), the argmax of
    the penalized logits with them (the reference's, which differs for some rows)."""
    plain = [
        (_logits_bf16(50 + i), SamplingParams(temperature=0.0), NO_HISTORY) for i in range(ROWS)
    ]
    got = _small(plain, range(ROWS), [0] * ROWS)[0]
    np.testing.assert_array_equal(got, np.argmax(np.stack([r[0] for r in plain]), axis=-1))

    pen = SamplingParams(temperature=0.0, repetition_penalty=2.0, presence_penalty=1.0,
                         frequency_penalty=0.5)  # fmt: skip
    rows = [(_logits_bf16(70 + i), pen, _history(70 + i)) for i in range(ROWS)]
    got = _small(rows, range(ROWS), [0] * ROWS)[0]
    want = [np.argmax(ref_penalized(r[0], *r[2], pen)) for r in rows]
    np.testing.assert_array_equal(got, want)
    assert (np.array(want) != np.argmax(np.stack([r[0] for r in rows]), axis=-1)).any()


def test_a_request_does_not_depend_on_the_other_rows():
    """Four requests (one with top-k/top-p and a penalty, one plain temperature, one min-p
    with a penalty, one greedy), each with its seed and step, sit at random rows among other
    requests, in batches that take each `lax.cond` branch or skip it (all others idle greedy
    rows, varied others, no row with top-k/top-p, no penalty either, all greedy): their tokens
    and logprobs are the same bits in every batch, and no batch compiles `sample` again."""
    mine = [
        (
            _logits_bf16(90),
            SamplingParams(temperature=0.9, top_k=8, top_p=0.9, repetition_penalty=1.2),
            _history(90),
        ),
        (_logits_bf16(91), SamplingParams(temperature=1.0), NO_HISTORY),
        (_logits_bf16(92), SamplingParams(min_p=0.2, presence_penalty=0.5), _history(92)),
        (_logits_bf16(93), SamplingParams(temperature=0.0), NO_HISTORY),
    ]
    seeds, steps = [2**62 + 3, 5, 77, 9], [3, 0, 41, 2]
    idle = (_logits_bf16(99), SamplingParams(temperature=0.0), NO_HISTORY)
    trials = [  # (requests of `mine` in the batch, the other rows' requests)
        ([0, 1, 2, 3], [idle] * ROWS),
        ([0, 1, 2, 3], _random_rows(1, ROWS)),
        ([0, 1, 2, 3], _random_rows(2, ROWS)),
        ([1, 2, 3], [idle] * ROWS),  # no top-k/top-p: the sort is skipped
        ([1, 3], [idle] * ROWS),  # no penalty either
        ([3], [idle] * ROWS),  # all greedy, no penalties: logprobs and argmax only
    ]
    rng = np.random.default_rng(0)
    first: dict[int, tuple] = {}
    compiled = None
    for picked, others in trials:
        at = rng.permutation(ROWS)[: len(picked)]
        rows = list(others)
        row_seeds = list(rng.integers(0, 2**62, ROWS))
        row_steps = list(rng.integers(0, 500, ROWS))
        for j, r in zip(picked, at, strict=True):
            rows[r], row_seeds[r], row_steps[r] = mine[j], seeds[j], steps[j]
        out = _small(rows, row_seeds, row_steps)
        compiled = compiled or TRACES["sample"]
        assert TRACES["sample"] == compiled
        for j, r in zip(picked, at, strict=True):
            got = tuple(a[r] for a in out)
            for a, b in zip(got, first.setdefault(j, got), strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"request {j}, batch {picked}")


def test_seed_and_step_choose_the_draw():
    """One request (uniform logits) at 16 steps: the same (seed, step) gives the same token,
    the steps give varied tokens (P[all 16 equal] = 24^-15), and another seed other tokens."""
    row = (np.zeros(V, np.float32), SamplingParams(), NO_HISTORY)
    steps = list(range(ROWS))
    a = _small([row] * ROWS, [42] * ROWS, steps)[0]
    b = _small([row] * ROWS, [42] * ROWS, steps[::-1])[0]
    c = _small([row] * ROWS, [43] * ROWS, steps)[0]
    np.testing.assert_array_equal(a, b[::-1])
    assert len(set(a.tolist())) > 1
    assert (a != c).any()  # P[equal at all 16 steps] = 24^-16


# -- logprobs -----------------------------------------------------------------------------


def check_logprobs(logits, tokens, chosen, top_ids, top_lp):
    """chosen and top-MAX_LOGPROBS logprobs against NumPy's f64 log_softmax of `logits`
    (f32 values), within the bound of the module docstring; top ids in the reference's
    order, the lower id first on a tie."""
    x = np.asarray(logits, np.float64)
    m = x.max(-1, keepdims=True)
    ref = x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
    lse = m - ref[:, :1] + x[:, :1]
    spread = np.abs(x - m).max(-1, keepdims=True)
    bound = U * (spread + 2 * (V + 2) + np.log(V) + np.abs(lse) + np.abs(ref) + 1)
    r = np.arange(len(x))
    assert top_ids.shape == top_lp.shape == (len(x), MAX_LOGPROBS)
    np.testing.assert_array_less(np.abs(chosen - ref[r, tokens]), bound[r, tokens])
    want_ids = np.argsort(-ref, axis=-1, kind="stable")[:, :MAX_LOGPROBS]
    np.testing.assert_array_equal(top_ids, want_ids)
    np.testing.assert_array_less(
        np.abs(top_lp - np.take_along_axis(ref, want_ids, -1)),
        np.take_along_axis(bound, want_ids, -1),
    )


def test_logprobs_are_the_raw_log_softmax_f32(outputs):
    """Every case's rows (penalties, temperatures, cuts): the logprobs of the raw logits."""
    logits = np.stack([CASES[n][0] for n in NAMES for _ in range(N_DRAWS)])
    check_logprobs(logits, *outputs)


def test_logprobs_are_the_raw_log_softmax_bf16():
    """bf16 logits: the log_softmax of their (exact) f32 values; ties at the parts' seam."""
    rows = _random_rows(5, ROWS)
    # ties across the 16th/17th places (where the two top-k parts meet) and the 20th/21st
    x = rows[0][0].copy()
    order = np.argsort(-x, kind="stable")
    x[order[[16, 20]]] = x[order[[15, 19]]]
    rows[0] = (x, *rows[0][1:])
    check_logprobs(np.stack([r[0] for r in rows]), *_small(rows, range(ROWS), [1] * ROWS))


def test_top_logprobs_only_when_a_row_asks():
    """Without a row asking for top logprobs the top-k is skipped (zeros come back) while the
    tokens and the chosen logprobs are unchanged; one row asking brings every row's."""
    rows = _random_rows(6, ROWS)
    logits, slots, pen = _batch(rows, range(ROWS), [1] * ROWS, jnp.bfloat16)
    want = [np.asarray(a) for a in _sample(logits, slots, pen)]
    none = slots._replace(top_logprobs=jnp.zeros(ROWS, jnp.int32))
    got = [np.asarray(a) for a in _sample(logits, none, pen)]
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert not got[2].any() and want[2].any()
    one = slots._replace(top_logprobs=jnp.zeros(ROWS, jnp.int32).at[1].set(3))
    got = [np.asarray(a) for a in _sample(logits, one, pen)]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    s = slot_params(2, {0: (SamplingParams(logprobs=5), 0, 0), 1: (SamplingParams(), 0, 0)})
    assert s.top_logprobs.tolist() == [5, 0]


# -- the penalty state and the host helpers -----------------------------------------------


def test_record_tokens_adds_one_to_the_active_rows_cells():
    """Active rows (four of them drawing the same id) gain one at their token; every other
    cell, and the prompt mask, keeps its value."""
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 5, (ROWS, V)).astype(np.int32)
    mask = rng.random((ROWS, V)) < 0.3
    pen = PenaltyState(jnp.asarray(mask), jnp.asarray(counts))
    tokens = rng.integers(0, V, ROWS).astype(np.int32)
    tokens[:4] = 7  # several rows, one token id
    active = rng.random(ROWS) < 0.6
    out = _record(pen, jnp.asarray(active), jnp.asarray(tokens))
    want = counts.copy()
    want[np.flatnonzero(active), tokens[active]] += 1
    np.testing.assert_array_equal(np.asarray(out.output_counts), want)
    np.testing.assert_array_equal(np.asarray(out.prompt_mask), mask)


def test_reset_row_loads_one_row_with_one_executable():
    """Three rows loaded in turn: each time exactly that row's mask and counts change, and the
    row being a traced scalar, one trace serves all three."""
    rng = np.random.default_rng(4)
    pen = PenaltyState(jnp.asarray(rng.random((ROWS, V)) < 0.5),
                       jnp.asarray(rng.integers(0, 9, (ROWS, V)), jnp.int32))  # fmt: skip
    want_mask, want_counts = np.array(pen.prompt_mask), np.array(pen.output_counts)
    for row in (2, 11, 0):
        m = rng.random(V) < 0.2
        c = rng.integers(0, 4, V).astype(np.int32)
        pen = _reset(pen, jnp.int32(row), jnp.asarray(m), jnp.asarray(c))
        want_mask[row], want_counts[row] = m, c
        np.testing.assert_array_equal(np.asarray(pen.prompt_mask), want_mask)
        np.testing.assert_array_equal(np.asarray(pen.output_counts), want_counts)
    assert TRACES["reset_row"] == 1
    empty = empty_penalty_state(3, V)
    assert not np.asarray(empty.prompt_mask).any() and not np.asarray(empty.output_counts).any()


def test_slot_params_fills_rows_and_defaults():
    """The entry's row holds its settings (top_k -1 as 0, the seed's key, its step); the
    others are greedy without penalties; a row outside the batch or a negative step is
    refused by name."""
    s = slot_params(4, {2: (SamplingParams(temperature=0.7, top_k=-1, top_p=0.5, min_p=0.1,
                                           repetition_penalty=1.1, presence_penalty=0.2,
                                           frequency_penalty=-0.3), 2**40 + 5, 9)})  # fmt: skip
    assert s.temperature.tolist() == pytest.approx([0, 0, 0.7, 0])
    assert s.top_k.tolist() == [0, 0, 0, 0]
    assert s.top_p.tolist() == pytest.approx([1, 1, 0.5, 1])
    assert s.min_p.tolist() == pytest.approx([0, 0, 0.1, 0])
    assert s.repetition_penalty.tolist() == pytest.approx([1, 1, 1.1, 1])
    assert s.presence_penalty.tolist() == pytest.approx([0, 0, 0.2, 0])
    assert s.frequency_penalty.tolist() == pytest.approx([0, 0, -0.3, 0])
    assert s.key.tolist() == [[0, 0], [0, 0], [256, 5], [0, 0]]
    assert s.step.tolist() == [0, 0, 9, 0]
    assert s.key.dtype == np.uint32 and s.step.dtype == np.int32
    with pytest.raises(ValueError, match="row=4"):
        slot_params(4, {4: (SamplingParams(), 0, 0)})
    with pytest.raises(ValueError, match="step=-1"):
        slot_params(4, {0: (SamplingParams(), 0, -1)})


def test_sample_refuses_mismatched_shapes_by_name():
    """Shapes are checked before anything is traced: each message names the argument."""
    logits, slots, pen = _batch([CASES["temperature_1"]] * 2, [0, 1], [0, 0])
    with pytest.raises(ValueError, match="logits.shape"):
        sample(logits[0], slots, pen)
    with pytest.raises(ValueError, match="num_top=25"):
        sample(logits, slots, pen, num_top=V + 1)
    with pytest.raises(ValueError, match="slots"):
        sample(logits[:1], slots, pen)
    with pytest.raises(ValueError, match="pen"):
        sample(logits, slots, empty_penalty_state(2, V + 1))


def test_seed_key_is_the_64_bit_seed_split_in_two_words():
    """(high word, low word) of the seed; seeds outside [0, 2**63) and non-integers refused."""
    assert seed_key(0).tolist() == [0, 0]
    assert seed_key(2**63 - 1).tolist() == [2**31 - 1, 2**32 - 1]
    assert seed_key(0x123456789).tolist() == [0x1, 0x23456789]
    for bad in (-1, 2**63, 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            seed_key(bad)
