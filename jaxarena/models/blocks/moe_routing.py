"""Mixture-of-experts routing exactly as transformers 5.x computes it, and the dropless
sort / permute / unpermute around a grouped GEMM.

Each router reproduces one transformers module (v5.24.0, `transformers/models/...`):

- `qwen3_moe_route`: `qwen3_moe/modeling_qwen3_moe.py::Qwen3MoeTopKRouter.forward`;
- `mixtral_route`: `mixtral/modeling_mixtral.py::MixtralTopKRouter.forward`;
- `gpt_oss_route`: `gpt_oss/modeling_gpt_oss.py::GptOssTopKRouter.forward`;
- `sigmoid_group_route`: `deepseek_v3/modeling_deepseek_v3.py::DeepseekV3TopkRouter.forward`,
  which `nemotron_h/modeling_nemotron_h.py::NemotronHTopkRouter.forward` repeats line for line;
- `softmax_group_route`: `deepseek_v2/modeling_deepseek_v2.py::DeepseekV2TopkRouter.forward`.

Every router takes the router LOGITS (`x @ W.T`, plus the router bias for gpt-oss; transformers
computes them in the activation dtype for Qwen3-MoE, Mixtral and gpt-oss and in f32 for the
sigmoid routers) and returns `(weights [T, k], ids int32 [T, k])`. Expert order within a row
follows `jax.lax.top_k` (descending score, lower index first on ties); DeepSeek's
`topk(sorted=False)` leaves the order unspecified, so only the set of a row is meaningful there.

The helpers (MaxText's dropless `sparse_matmul` layout): `sort_by_expert` argsorts the flattened
top-k ids (stable), counts rows per expert with `bincount` and gives each sorted row its token
(`order // k`); `combine` gathers each token's k expert rows back (through the inverse
permutation) and sums them weighted, in f32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "combine",
    "gpt_oss_route",
    "is_qwen3_moe_layer",
    "mixtral_route",
    "qwen3_moe_route",
    "sigmoid_group_route",
    "softmax_group_route",
    "sort_by_expert",
]
DEEPSEEK_V2_TOPK_METHODS = ("greedy", "group_limited_greedy")


def _check_k(logits: jax.Array, top_k: int) -> int:
    if logits.ndim != 2:
        raise ValueError(f"logits must be 2-D [T, E], got logits.shape={tuple(logits.shape)}")
    e = logits.shape[1]
    if not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise ValueError(f"top_k={top_k!r} must be an int in [1, {e}] (the number of experts)")
    return e


def qwen3_moe_route(logits: jax.Array, top_k: int, norm_topk_prob: bool):
    """Qwen3-MoE: f32 softmax over the experts, top-k, renormalised when `norm_topk_prob`,
    cast back to the logits' dtype (`Qwen3MoeTopKRouter.forward`).

    Args:
      logits: `[T, E]` router logits (the activation dtype).
      top_k: `num_experts_per_tok`.
      norm_topk_prob: the config's `norm_topk_prob`.

    Returns:
      `(weights [T, k] logits.dtype, ids int32 [T, k])`.
    """
    _check_k(logits, top_k)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, ids = jax.lax.top_k(probs, top_k)
    if norm_topk_prob:
        top = top / jnp.sum(top, axis=-1, keepdims=True)
    return top.astype(logits.dtype), ids.astype(jnp.int32)


def is_qwen3_moe_layer(index: int, mlp_only_layers, decoder_sparse_step: int) -> bool:
    """Whether decoder layer `index` of Qwen3-MoE is sparse: not in `mlp_only_layers` and
    `(index + 1) % decoder_sparse_step == 0` (`Qwen3MoeDecoderLayer.__init__`)."""
    if decoder_sparse_step < 1:
        raise ValueError(f"decoder_sparse_step={decoder_sparse_step} must be >= 1")
    return index not in set(mlp_only_layers) and (index + 1) % decoder_sparse_step == 0


def mixtral_route(logits: jax.Array, top_k: int):
    """Mixtral: softmax over the experts in f32, top-k, always renormalised; the weights stay
    f32 (`MixtralTopKRouter.forward` does not cast back).

    Returns:
      `(weights f32 [T, k], ids int32 [T, k])`.
    """
    _check_k(logits, top_k)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, ids = jax.lax.top_k(probs, top_k)
    return top / jnp.sum(top, axis=-1, keepdims=True), ids.astype(jnp.int32)


def gpt_oss_route(logits: jax.Array, top_k: int):
    """gpt-oss: top-k on the logits (router bias included), then a softmax over the k chosen,
    in the logits' dtype (`GptOssTopKRouter.forward`).

    Args:
      logits: `[T, E]` = `x @ W.T + b` (the router has a bias).

    Returns:
      `(weights [T, k] logits.dtype, ids int32 [T, k])`.
    """
    _check_k(logits, top_k)
    top, ids = jax.lax.top_k(logits, top_k)
    return jax.nn.softmax(top, axis=-1).astype(logits.dtype), ids.astype(jnp.int32)


def sigmoid_group_route(
    logits: jax.Array,
    correction_bias: jax.Array,
    *,
    top_k: int,
    n_group: int,
    topk_group: int,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
):
    """DeepSeek-V3 / Nemotron-H: sigmoid scores, group-limited choice on the biased scores,
    weights from the unbiased ones (`DeepseekV3TopkRouter.forward`,
    `NemotronHTopkRouter.forward`).

    `s = sigmoid(logits)` (f32); the choice uses `s + e_score_correction_bias`: each of the
    `n_group` groups of `E / n_group` experts scores the sum of its top 2, the `topk_group` best
    groups stay and the other experts are masked to `-inf` (transformers 5.x; older releases
    filled 0.0), then the top-k of what is left. The weights are the UNbiased `s` of the chosen
    experts, divided by `sum + 1e-20` when `norm_topk_prob`, times `routed_scaling_factor`.

    Args:
      logits: `[T, E]` router logits, computed in f32 as transformers does.
      correction_bias: `f32[E]` `e_score_correction_bias`.

    Returns:
      `(weights f32 [T, k], ids int32 [T, k])`.
    """
    e = _check_k(logits, top_k)
    if n_group < 1 or e % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(
            f"n_group={n_group}, topk_group={topk_group}: n_group must divide the {e} experts "
            "and 1 <= topk_group <= n_group"
        )
    if e // n_group < 2:
        raise ValueError(f"n_group={n_group} leaves fewer than 2 experts per group (E={e})")
    t = logits.shape[0]
    scores = jax.nn.sigmoid(logits.astype(jnp.float32))
    choice = scores + correction_bias.astype(jnp.float32)
    grouped = choice.reshape(t, n_group, e // n_group)
    group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)
    _, keep = jax.lax.top_k(group_scores, topk_group)
    group_mask = jnp.zeros((t, n_group), bool).at[jnp.arange(t)[:, None], keep].set(True)
    mask = jnp.repeat(group_mask, e // n_group, axis=1)
    _, ids = jax.lax.top_k(jnp.where(mask, choice, -jnp.inf), top_k)
    weights = jnp.take_along_axis(scores, ids, axis=1)
    if norm_topk_prob:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return weights * routed_scaling_factor, ids.astype(jnp.int32)


def softmax_group_route(
    logits: jax.Array,
    *,
    top_k: int,
    topk_method: str,
    n_group: int,
    topk_group: int,
    routed_scaling_factor: float,
):
    """DeepSeek-V2: f32 softmax over the experts, `greedy` or `group_limited_greedy` top-k,
    weights times `routed_scaling_factor` and never renormalised
    (`DeepseekV2TopkRouter.forward`, which reads no `norm_topk_prob`).

    `group_limited_greedy`: each of the `n_group` groups of `E / n_group` experts scores the
    MAX of its softmax scores, the `topk_group` best groups stay and the other experts' scores
    become 0.0 (transformers' `masked_fill(..., 0.0)`), then the top-k of all the scores. When
    the kept groups hold fewer than `top_k` experts, the extra picks are masked experts of
    weight 0, which add nothing to the output (which of them is unspecified in transformers).

    Args:
      logits: `[T, E]` router logits (f32, as transformers computes them).
      topk_method: `"greedy"` or `"group_limited_greedy"`.
      n_group, topk_group: the groups (read only by `group_limited_greedy`).
      routed_scaling_factor: the weights' factor.

    Returns:
      `(weights f32 [T, k], ids int32 [T, k])`.
    """
    e = _check_k(logits, top_k)
    if topk_method not in DEEPSEEK_V2_TOPK_METHODS:
        raise ValueError(f"topk_method={topk_method!r} must be one of {DEEPSEEK_V2_TOPK_METHODS}")
    scores = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    if topk_method == "group_limited_greedy":
        if n_group < 1 or e % n_group or not 1 <= topk_group <= n_group:
            raise ValueError(
                f"n_group={n_group}, topk_group={topk_group}: n_group must divide the {e} "
                "experts and 1 <= topk_group <= n_group"
            )
        t = logits.shape[0]
        group_scores = jnp.max(scores.reshape(t, n_group, e // n_group), axis=-1)
        _, keep = jax.lax.top_k(group_scores, topk_group)
        group_mask = jnp.zeros((t, n_group), bool).at[jnp.arange(t)[:, None], keep].set(True)
        scores = jnp.where(jnp.repeat(group_mask, e // n_group, axis=1), scores, 0.0)
    weights, ids = jax.lax.top_k(scores, top_k)
    return weights * routed_scaling_factor, ids.astype(jnp.int32)


def sort_by_expert(ids: jax.Array, num_experts: int):
    """The dropless layout of `ids [T, k]`: `(order int32[T*k], group_sizes int32[E],
    token int32[T*k])`.

    Sorted row `r` is the flattened (token, slot) pair `order[r]` (a stable argsort of the
    flattened ids: rows of one expert keep token order), it belongs to the token
    `token[r] = order[r] // k`, and expert `e` owns `group_sizes[e]` consecutive sorted rows.
    Feed `x[token]` (or `row_ids=token`) and `group_sizes` to the grouped GEMM.
    """
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return order, sizes, order // k


def combine(y_sorted: jax.Array, order: jax.Array, weights: jax.Array, out_dtype=None):
    """Unpermute and combine: `out[t] = sum_j weights[t, j] * y[row of (t, j)]` in f32.

    Args:
      y_sorted: `[T*k, D]` expert outputs in sorted order.
      order: `sort_by_expert`'s order.
      weights: `[T, k]` routing weights.
      out_dtype: default `y_sorted.dtype`.

    Returns:
      `[T, D]`.
    """
    t, k = weights.shape
    # A gather through the inverse permutation (a scatter of T*k indices), which XLA fuses
    # with the weighted sum: no `[T*k, D]` buffer. (Scattering the rows into a zeroed
    # `[T*k, D]` buffer instead kept one such buffer per layer alive in a GPU prefill.)
    n = order.shape[0]
    inv = jnp.zeros((n,), order.dtype).at[order].set(jnp.arange(n, dtype=order.dtype))
    y = y_sorted.astype(jnp.float32)[inv].reshape(t, k, -1)
    out = jnp.sum(y * weights.astype(jnp.float32)[:, :, None], axis=1)
    return out.astype(y_sorted.dtype if out_dtype is None else out_dtype)
