"""Sampling on the device: the engine's compiled step turns the model's `[rows, vocab]` logits
into one token per row (and its logprobs) without the logits leaving the device.

A pure function of arrays, jitted inside the engine's step; the per-row settings are data
(`SlotParams`), so any mix of greedy and sampled requests runs the same executable.

The order is vLLM's (its V0 sampler, which the V1 one keeps but for min-p, see below):

1. repetition penalty on the tokens of the prompt or the output so far: a positive logit is
   divided by it, a negative one multiplied;
2. presence and frequency penalties: `logit -= presence * (count > 0) + frequency * count`
   on the output's tokens;
3. temperature: 0 is greedy, the argmax of the *penalized* logits (the first on a tie); else
   the logits are divided by it (floored at `MIN_TEMPERATURE`);
4. top-k: keep the tokens whose logit is at least the k-th largest (a tie at the k-th value
   keeps every tied token, as vLLM's threshold does);
5. top-p, on the top-k distribution renormalised: keep token i when the probability of the
   tokens *strictly* more likely than i is below top_p. That is the smallest set of most
   likely tokens whose probability reaches top_p, widened to every token tied with its least
   likely member, so the set does not depend on how a sort orders equal values;
6. min-p: drop tokens whose probability is below `min_p` times the largest. The test is
   scale-free, so renormalising after steps 4-5 does not change it; it is done in log space
   (`logit >= max_logit + log(min_p)`). vLLM V1 applies min-p before top-k/top-p; the two
   orders differ only when min_p and top_p are both set (top-p then sees a smaller set);
7. the draw: Gumbel-max, `argmax(logit + g)` with `g` standard Gumbel noise from the row's own
   key (`seed_key(seed)`) folded with the index of the token being drawn (`SlotParams.step`).
   A request's token depends only on (seed, step, its logits, its settings), never on the
   other rows of the batch (a test shuffles them). The noise comes from float32 uniforms in
   [tiny, 1 - 2^-23] (`jax.random.gumbel`'s mode "low"), so it lies in [-4.5, 15.9]: a token
   more than 20.4 below the largest processed logit (a probability under 1.4e-9) is never
   drawn. Mode "high" would reach ~32 for twice the random bits.

Logprobs (the chosen token's and the `num_top` most likely) are of the model's raw
distribution, `log_softmax(logits)` before any of the steps above (vLLM's default
`logprobs_mode`).

Cost. Always: a logsumexp, an argmax and the top `num_top` over the vocabulary (for the
logprobs, in parts of `TOP_K_PART`, XLA's own GPU top-k kernel). The rest sits behind
`lax.cond`s whose predicates are data, so nothing recompiles when the mix changes: the
penalties (one fused elementwise pass over `[rows, vocab]`) only when some row has one; the
temperature, min-p and the noise (`rows x vocab` Threefry draws) only when some row samples;
and a sort of each row's vocabulary (values only, no index payload: `rows x V log V`) only
when some row sets top-k or top-p. Unless XLA puts a conditional in a CUDA graph, a GPU
`lax.cond` copies its predicate to the host and waits for it.

Measured (deviceless H200 compile, jax 0.10.2, R=64, V=151936, bf16 logits): `sample` 68
launches per call with every branch taken, 153 MiB temp, 35 s to compile; its parts: the
always part (greedy rows without penalties) 11 launches, 18.6 MiB (the masked bf16 copy
the second top-k part reads; the top-20 logprobs have since become a branch of their own,
run only when a row asks: XLA:CPU's top-k took 370 ms a step for 4 rows of this vocabulary); penalties 1 launch, 0 temp; temperature + min-p 5 launches, 0
temp; Gumbel noise + argmax 3 launches; the top-k/top-p sort 42 launches, 78.8 MiB. A
deviceless compile has no CUB scratch sizes, so XLA sorts with its fallback (bitonic) kernels
there; on a present GPU it uses CUB's radix sort (fewer launches). `lax.top_k(logprobs, 20)`
in one piece would be a whole-row sort too: 31 launches and 74 MiB, against 6 and 37 MiB
(f32) in two parts.

The penalty state (`PenaltyState`: a prompt mask and output counts, `rows x vocab` each) lives
on the device and is donated through the engine's step: `record_tokens` adds a step's tokens,
`reset_row` loads a row when a request enters a slot or resumes after preemption.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxarena.engine.types import MAX_LOGPROBS, SamplingParams

__all__ = [
    "MIN_TEMPERATURE",
    "PenaltyState",
    "SlotParams",
    "TOP_K_PART",
    "empty_penalty_state",
    "processed_logits",
    "record_tokens",
    "reset_row",
    "sample",
    "seed_key",
    "slot_params",
]

MIN_TEMPERATURE = 1e-6
"""A temperature in (0, MIN_TEMPERATURE) divides by MIN_TEMPERATURE instead: logits over ~1e32
divided by a smaller one overflow float32 to inf (and inf - inf is NaN in the softmax); at
1e-6 the draw is already the argmax but for logits within ~1e-5 of the largest."""


class SlotParams(NamedTuple):
    """The sampling settings of each row (engine slot), a pytree of per-row arrays (R rows).

    Attributes:
      temperature: f32[R]; 0 is greedy.
      top_k: i32[R]; 0 keeps every token.
      top_p: f32[R] in (0, 1]; 1 keeps every token.
      min_p: f32[R] in [0, 1]; 0 keeps every token.
      repetition_penalty: f32[R] > 0; 1 is off.
      presence_penalty, frequency_penalty: f32[R]; 0 is off.
      key: uint32[R, 2], Threefry key data (`seed_key` of the request's seed).
      step: i32[R], the index of the output token being drawn (0 for the first new token);
        folded into the key, so a preempted and resumed request draws the same stream.
      top_logprobs: i32[R], how many top logprobs the row's request asks for (0: none).
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    repetition_penalty: jax.Array
    presence_penalty: jax.Array
    frequency_penalty: jax.Array
    key: jax.Array
    step: jax.Array
    top_logprobs: jax.Array


class PenaltyState(NamedTuple):
    """What the penalties need to know of each row's request, kept on the device.

    Attributes:
      prompt_mask: bool[R, V], the tokens of the request's prompt (the repetition penalty's
        other half).
      output_counts: i32[R, V], how often each token occurs in the request's output so far.

    At R=64 and V=151936 this is 9.7 MB + 38.9 MB. The engine donates it through its step.
    """

    prompt_mask: jax.Array
    output_counts: jax.Array


def empty_penalty_state(rows: int, vocab_size: int) -> PenaltyState:
    """A `PenaltyState` of `rows` empty rows (no prompt tokens, no output)."""
    return PenaltyState(
        prompt_mask=jnp.zeros((rows, vocab_size), jnp.bool_),
        output_counts=jnp.zeros((rows, vocab_size), jnp.int32),
    )


# -- host side ----------------------------------------------------------------------------------


def seed_key(seed: int) -> np.ndarray:
    """The Threefry key data of a request's seed: uint32[2] = (high 32 bits, low 32 bits).

    A seed in [0, 2**63) (`SamplingParams.seed`) fills both words, as
    `jax.random.PRNGKey(seed)` does for a 64-bit seed under `jax_enable_x64`; computed here in
    NumPy so that it does not depend on JAX's integer width.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"seed={seed!r} must be an integer in [0, 2**63)")
    seed = int(seed)
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed={seed} must be in [0, 2**63)")
    return np.array([seed >> 32, seed & 0xFFFFFFFF], dtype=np.uint32)


def slot_params(rows: int, entries: Mapping[int, tuple[SamplingParams, int, int]]) -> SlotParams:
    """Builds the `SlotParams` of a step on the host (NumPy arrays).

    Args:
      rows: R, the number of rows (the engine's slots).
      entries: `{row: (params, seed, step)}`: the request in that row, its seed (drawn by the
        engine when `params.seed` is None) and the index of the token it draws next.
        Rows not in `entries` are greedy without penalties (their draws are ignored).

    Raises:
      ValueError: `rows` < 1, a row outside [0, rows), a step < 0 or a bad seed.
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows={rows!r} must be an integer >= 1")
    out = dict(
        temperature=np.zeros(rows, np.float32),
        top_k=np.zeros(rows, np.int32),
        top_p=np.ones(rows, np.float32),
        min_p=np.zeros(rows, np.float32),
        repetition_penalty=np.ones(rows, np.float32),
        presence_penalty=np.zeros(rows, np.float32),
        frequency_penalty=np.zeros(rows, np.float32),
        key=np.zeros((rows, 2), np.uint32),
        step=np.zeros(rows, np.int32),
        top_logprobs=np.zeros(rows, np.int32),
    )
    for row, (params, seed, step) in entries.items():
        if not 0 <= row < rows:
            raise ValueError(f"entries has row={row}, outside the {rows} rows [0, {rows})")
        if not 0 <= step < 2**31:
            raise ValueError(f"entries[{row}] has step={step}; it must be in [0, 2**31)")
        out["temperature"][row] = params.temperature
        out["top_k"][row] = min(max(params.top_k, 0), 2**31 - 1)  # -1 and 0: every token
        out["top_p"][row] = params.top_p
        out["min_p"][row] = params.min_p
        out["repetition_penalty"][row] = params.repetition_penalty
        out["presence_penalty"][row] = params.presence_penalty
        out["frequency_penalty"][row] = params.frequency_penalty
        out["key"][row] = seed_key(seed)
        out["step"][row] = step
        out["top_logprobs"][row] = params.logprobs or 0
    return SlotParams(**out)


# -- device side --------------------------------------------------------------------------------


def _penalize(x: jax.Array, slots: SlotParams, pen: PenaltyState) -> jax.Array:
    counts = pen.output_counts
    in_output = counts > 0
    rep = jnp.where(pen.prompt_mask | in_output, slots.repetition_penalty[:, None], 1.0)
    x = jnp.where(x > 0, x / rep, x * rep)
    return (
        x
        - slots.frequency_penalty[:, None] * counts.astype(jnp.float32)
        - slots.presence_penalty[:, None] * in_output.astype(jnp.float32)
    )


def _top_k_top_p_threshold(x: jax.Array, slots: SlotParams) -> jax.Array:
    """f32[R]: the smallest scaled logit a row keeps under top-k then top-p (-inf: all)."""
    vocab = x.shape[-1]
    desc = -jnp.sort(-x, axis=-1)  # values only: no index payload to carry through the sort
    k = jnp.clip(slots.top_k, 0, vocab)
    kth = jnp.take_along_axis(desc, jnp.maximum(k - 1, 0)[:, None], axis=-1)[:, 0]
    thr_k = jnp.where(k > 0, kth, -jnp.inf)
    # top-p on the top-k distribution: `desc` masked by thr_k stays sorted, so the probability
    # strictly above position j is the exclusive cumulative sum. Tied values share one
    # threshold, so a tie with the last kept token keeps the whole tie.
    kept = jnp.where(desc >= thr_k[:, None], desc, -jnp.inf)
    probs = jax.nn.softmax(kept, axis=-1)
    above = jnp.cumsum(probs, axis=-1) - probs
    count = jnp.sum(above < slots.top_p[:, None], axis=-1)  # >= 1: above[0] = 0 < top_p
    thr_p = jnp.take_along_axis(kept, (count - 1)[:, None], axis=-1)[:, 0]
    # top_p = 1 keeps all: the float32 sum may reach 1 before the tail and drop it.
    thr_p = jnp.where(slots.top_p < 1, thr_p, -jnp.inf)
    return jnp.maximum(thr_k, thr_p)


def _scale_and_truncate(x: jax.Array, slots: SlotParams, *, truncate) -> jax.Array:
    """Temperature, top-k, top-p, min-p on penalized logits: masked tokens become -inf.
    `truncate(x, slots)` gives the top-k/top-p threshold per row."""
    temp = jnp.maximum(slots.temperature, MIN_TEMPERATURE)
    x = x / temp[:, None]
    x = jnp.where(x >= truncate(x, slots)[:, None], x, -jnp.inf)
    row_max = jnp.max(x, axis=-1, keepdims=True)
    min_p = slots.min_p[:, None]
    # log(0) = -inf keeps every token for min_p = 0.
    return jnp.where(x >= row_max + jnp.log(min_p), x, -jnp.inf)


def processed_logits(logits: jax.Array, slots: SlotParams, pen: PenaltyState) -> jax.Array:
    """f32[R, V]: the logits a sampled row draws from, `softmax` of which is its distribution:
    penalized, divided by the temperature, tokens cut by top-k/top-p/min-p at -inf.

    Every step runs (no `lax.cond`); for rows with temperature 0 the values are those of
    temperature `MIN_TEMPERATURE` and are not what they draw (the argmax of the penalized
    logits). For tests and diagnostics; `sample` draws from the same values.
    """
    x = _penalize(logits.astype(jnp.float32), slots, pen)
    return _scale_and_truncate(x, slots, truncate=_top_k_top_p_threshold)


def _gumbel(key_data: jax.Array, step: jax.Array, vocab: int) -> jax.Array:
    def one(kd, s):
        key = jax.random.fold_in(jax.random.wrap_key_data(kd, impl="threefry2x32"), s)
        # mode named: the default follows a config flag, which would change the stream
        return jax.random.gumbel(key, (vocab,), jnp.float32, mode="low")

    return jax.vmap(one)(key_data, step)


def _draw(x: jax.Array, slots: SlotParams, greedy_tokens: jax.Array) -> jax.Array:
    def truncate(x, slots):
        need = jnp.any((slots.top_k > 0) | (slots.top_p < 1))
        none = lambda x, slots: jnp.full(x.shape[:1], -jnp.inf, x.dtype)  # noqa: E731
        return lax.cond(need, _top_k_top_p_threshold, none, x, slots)

    z = _scale_and_truncate(x, slots, truncate=truncate)
    drawn = jnp.argmax(z + _gumbel(slots.key, slots.step, x.shape[-1]), axis=-1)
    return jnp.where(slots.temperature > 0, drawn.astype(jnp.int32), greedy_tokens)


TOP_K_PART = 16
"""`lax.top_k` of at most this many runs as XLA's own GPU kernel (`__gpu$TopK`: one launch, no
temp at [64, 151936]); a larger k becomes a sort of the whole row (31 launches and 74 MiB of
temp there, deviceless H200). So `num_top` = 20 is taken as 16, then 4 of the rest."""


def _top_k_in_parts(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`lax.top_k(x, k)` (most likely first, the lower id first on a tie) in parts of at most
    TOP_K_PART: each part's ids are set to -inf before the next part is taken."""
    rows = jnp.arange(x.shape[0])[:, None]
    values, ids = [], []
    while k > 0:
        part = min(k, TOP_K_PART)
        v, i = lax.top_k(x, part)
        values.append(v)
        ids.append(i)
        k -= part
        if k:
            x = x.at[rows, i].set(-jnp.inf)
    if not values:
        return jnp.zeros((x.shape[0], 0), x.dtype), jnp.zeros((x.shape[0], 0), jnp.int32)
    return jnp.concatenate(values, axis=-1), jnp.concatenate(ids, axis=-1).astype(jnp.int32)


def sample(
    logits: jax.Array,
    slots: SlotParams,
    pen: PenaltyState,
    *,
    num_top: int = MAX_LOGPROBS,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One token per row, drawn on the device (see the module docstring for the order).

    Args:
      logits: [R, V] bf16 or f32, the model's logits of each row's last position.
      slots: the rows' settings (`slot_params`, put on the device).
      pen: the rows' penalty state (read only here; `record_tokens` updates it).
      num_top: how many most likely tokens to return logprobs of (static).

    Returns:
      tokens: i32[R]; chosen_logprob: f32[R], the logprob of `tokens` under
      `log_softmax(logits)`; top_ids: i32[R, num_top], the most likely tokens, most likely
      first (the lower id first on a tie); top_logprobs: f32[R, num_top], theirs. Both are
      computed only when a row's `slots.top_logprobs` > 0 (else zeros: nobody reads them).
    """
    if logits.ndim != 2:
        raise ValueError(f"logits.shape={logits.shape} must be [rows, vocab]")
    rows, vocab = logits.shape
    if not 0 <= num_top <= vocab:
        raise ValueError(f"num_top={num_top} must be in [0, vocab={vocab}]")
    if slots.temperature.shape != (rows,) or slots.key.shape != (rows, 2):
        raise ValueError(
            f"slots are for {slots.temperature.shape} rows (key {slots.key.shape}); the "
            f"logits have {rows}"
        )
    if pen.output_counts.shape != (rows, vocab) or pen.prompt_mask.shape != (rows, vocab):
        raise ValueError(
            f"pen has output_counts {pen.output_counts.shape}, prompt_mask "
            f"{pen.prompt_mask.shape}; the logits are {(rows, vocab)}"
        )
    x = logits.astype(jnp.float32)
    # log_softmax(x) = x - logsumexp(x), never materialised at [R, V]: the top ids are the
    # logits' own (in their dtype: a bf16 copy is what the second top-k part masks). The top
    # ids only when a row asks for them: XLA:CPU's top-k over a 151,936-token vocabulary takes
    # ~370 ms for 4 rows, most of a 28-layer 0.6B model's decode step (measured).
    lse = jax.nn.logsumexp(x, axis=-1)

    def no_top(lg):
        return (jnp.zeros((rows, num_top), lg.dtype), jnp.zeros((rows, num_top), jnp.int32))

    top_raw, top_ids = lax.cond(jnp.any(slots.top_logprobs > 0),
                                lambda lg: _top_k_in_parts(lg, num_top), no_top, logits)  # fmt: skip
    top_logprobs = top_raw.astype(jnp.float32) - lse[:, None]

    penalized = jnp.any(
        (slots.repetition_penalty != 1)
        | (slots.presence_penalty != 0)
        | (slots.frequency_penalty != 0)
    )
    x = lax.cond(penalized, _penalize, lambda x, slots, pen: x, x, slots, pen)
    greedy_tokens = jnp.argmax(x, axis=-1).astype(jnp.int32)
    sampled = jnp.any(slots.temperature > 0)
    tokens = lax.cond(sampled, _draw, lambda x, slots, g: g, x, slots, greedy_tokens)
    chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0].astype(jnp.float32) - lse
    return tokens, chosen, top_ids, top_logprobs


def record_tokens(pen: PenaltyState, rows_active: jax.Array, tokens: jax.Array) -> PenaltyState:
    """Adds one step's tokens to the output counts: `output_counts[r, tokens[r]] += 1` for each
    row `r` where `rows_active[r]` (bool[R]); other cells unchanged. Jittable; donate `pen`."""
    rows = pen.output_counts.shape[0]
    counts = pen.output_counts.at[jnp.arange(rows), tokens].add(
        rows_active.astype(jnp.int32), mode="drop"
    )
    return pen._replace(output_counts=counts)


def reset_row(
    pen: PenaltyState, row: jax.Array, prompt_ids_mask: jax.Array, output_counts: jax.Array
) -> PenaltyState:
    """Loads one row: a request entering slot `row` (i32 scalar, traced: one executable for
    every row), with its prompt's tokens (`prompt_ids_mask`, bool[V]) and the counts of its
    output so far (`output_counts`, i32[V]; zeros for a new request, the tokens generated
    before a preemption for a resumed one). Other rows unchanged. Jittable; donate `pen`.
    `row` must be in [0, R): being traced, it cannot be checked here, and XLA clamps an index
    outside the array to its first or last row."""
    row = jnp.asarray(row, jnp.int32)
    return PenaltyState(
        prompt_mask=lax.dynamic_update_index_in_dim(
            pen.prompt_mask, prompt_ids_mask.astype(jnp.bool_), row, 0
        ),
        output_counts=lax.dynamic_update_index_in_dim(
            pen.output_counts, output_counts.astype(jnp.int32), row, 0
        ),
    )
