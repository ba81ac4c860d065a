"""MoE routing against transformers' own router modules (fixtures written by
`tools/make_moe_routing_fixtures.py` with transformers 5.x; numpy only here), and the dropless
sort / combine helpers against a per-token loop."""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from jaxarena.models.blocks.moe_routing import (
    combine,
    gpt_oss_route,
    is_qwen3_moe_layer,
    mixtral_route,
    qwen3_moe_route,
    sigmoid_group_route,
    softmax_group_route,
    sort_by_expert,
)

FIXTURE = pathlib.Path(__file__).parents[1] / "fixtures/moe_routing/routers.npz"
FIXTURE_V2 = FIXTURE.with_name("deepseek_v2_routers.npz")
# The routers take transformers' f32 logits, so the only differences are f32 roundings of the
# softmax / sigmoid / sums (a few ulps of values <= routed_scaling_factor): 1e-6 relative with
# a 1e-6 absolute floor covers 8 f32 ulps of 2.5.
RTOL = ATOL = 1e-6


@pytest.fixture(scope="module")
def fx():
    with np.load(FIXTURE) as z:
        return {k: z[k] for k in z.files}


def _case(fx, name):
    cfg = json.loads(str(fx[f"{name}_config"]))
    return cfg, jnp.asarray(fx[f"{name}_logits"]), fx[f"{name}_scores"], fx[f"{name}_indices"]


def _same_sets(w, ids, ref_w, ref_ids):
    """Rows compared as sets (sorted by expert id): DeepSeek's topk(sorted=False)."""
    w, ids = np.asarray(w), np.asarray(ids)
    o, ro = np.argsort(ids, 1), np.argsort(ref_ids, 1)
    np.testing.assert_array_equal(np.take_along_axis(ids, o, 1), np.take_along_axis(ref_ids, ro, 1))
    np.testing.assert_allclose(np.take_along_axis(w, o, 1), np.take_along_axis(ref_w, ro, 1),
                               rtol=RTOL, atol=ATOL)  # fmt: skip


def test_fixture_logits_are_the_linear_router(fx):
    """The fixture's logits are x @ W.T (+ b): our routers take exactly that input."""
    for name in ("qwen3_moe", "mixtral", "gpt_oss", "deepseek_v3", "nemotron_h"):
        want = fx[f"{name}_x"] @ fx[f"{name}_weight"].T + fx.get(f"{name}_bias", 0.0)
        np.testing.assert_allclose(fx[f"{name}_logits"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_moe_nonorm"])
def test_qwen3_moe(fx, name):
    cfg, logits, ref_w, ref_ids = _case(fx, name)
    w, ids = qwen3_moe_route(logits, cfg["num_experts_per_tok"], cfg["norm_topk_prob"])
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(w, ref_w, rtol=RTOL, atol=ATOL)
    sums = np.asarray(w).sum(1)
    assert np.allclose(sums, 1.0, atol=1e-6) == cfg["norm_topk_prob"]


def test_mixtral(fx):
    cfg, logits, ref_w, ref_ids = _case(fx, "mixtral")
    w, ids = mixtral_route(logits, cfg["num_experts_per_tok"])
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(w, ref_w, rtol=RTOL, atol=ATOL)


def test_gpt_oss(fx):
    cfg, logits, ref_w, ref_ids = _case(fx, "gpt_oss")
    w, ids = gpt_oss_route(logits, cfg["num_experts_per_tok"])
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(w, ref_w, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["deepseek_v3", "nemotron_h"])
def test_sigmoid_group_routing(fx, name):
    cfg, logits, ref_w, ref_ids = _case(fx, name)
    w, ids = sigmoid_group_route(
        logits,
        jnp.asarray(fx[f"{name}_correction_bias"]),
        top_k=cfg["num_experts_per_tok"],
        n_group=cfg["n_group"],
        topk_group=cfg["topk_group"],
        norm_topk_prob=cfg["norm_topk_prob"],
        routed_scaling_factor=cfg["routed_scaling_factor"],
    )
    _same_sets(w, ids, ref_w, ref_ids)


def test_group_limit_changes_the_choice(fx):
    """The DeepSeek fixture exercises the group mask: routing it with every group allowed picks
    different experts for some token (else the test above could not tell)."""
    cfg, logits, _, ref_ids = _case(fx, "deepseek_v3")
    kw = dict(top_k=cfg["num_experts_per_tok"], norm_topk_prob=True, routed_scaling_factor=1.0)
    _, ids = sigmoid_group_route(logits, jnp.asarray(fx["deepseek_v3_correction_bias"]),
                                 n_group=4, topk_group=4, **kw)  # fmt: skip
    assert (np.sort(np.asarray(ids), 1) != np.sort(ref_ids, 1)).any()


@pytest.fixture(scope="module")
def fx_v2():
    with np.load(FIXTURE_V2) as z:
        return {k: z[k] for k in z.files}


def _route_v2(cfg, logits, **over):
    kw = {k: cfg[k] for k in ("topk_method", "n_group", "topk_group", "routed_scaling_factor")}
    return softmax_group_route(logits, top_k=cfg["num_experts_per_tok"], **{**kw, **over})


@pytest.mark.parametrize("name", ["deepseek_v2_greedy", "deepseek_v2_group"])
def test_deepseek_v2_routing(fx_v2, name):
    """Softmax, greedy / group-limited top-k, times routed_scaling_factor, no renormalising
    (a renormalised row would sum to routed_scaling_factor; some rows here sum to < 0.9 of
    it)."""
    np.testing.assert_allclose(fx_v2[f"{name}_logits"], fx_v2[f"{name}_x"] @ fx_v2[f"{name}_weight"].T,
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    cfg, logits, ref_w, ref_ids = _case(fx_v2, name)
    w, ids = _route_v2(cfg, logits)
    _same_sets(w, ids, ref_w, ref_ids)
    assert (np.asarray(w).sum(1) < 0.9 * cfg["routed_scaling_factor"]).any()


def test_deepseek_v2_group_limit_changes_the_choice(fx_v2):
    """Greedy routing of the group case's logits picks other experts for some token, so the
    test above checks the group mask."""
    cfg, logits, _, ref_ids = _case(fx_v2, "deepseek_v2_group")
    _, ids = _route_v2(cfg, logits, topk_method="greedy")
    assert (np.sort(np.asarray(ids), 1) != np.sort(ref_ids, 1)).any()


def test_sort_and_combine_match_a_token_loop():
    rng = np.random.default_rng(0)
    t, k, e, d = 9, 3, 5, 4
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    w = rng.random((t, k)).astype(np.float32)
    x = rng.standard_normal((t, d)).astype(np.float32)
    scale = rng.standard_normal(e).astype(np.float32)  # "expert e" multiplies by scale[e]
    order, sizes, token = map(np.asarray, sort_by_expert(jnp.asarray(ids), e))
    np.testing.assert_array_equal(sizes, np.bincount(ids.reshape(-1), minlength=e))
    expert_of_row = np.repeat(np.arange(e), sizes)
    assert (np.diff(expert_of_row) >= 0).all()
    np.testing.assert_array_equal(ids.reshape(-1)[order], expert_of_row)
    y_sorted = x[token] * scale[expert_of_row][:, None]
    out = np.asarray(combine(jnp.asarray(y_sorted), jnp.asarray(order), jnp.asarray(w)))
    want = np.stack([sum(w[i, j] * scale[ids[i, j]] * x[i] for j in range(k)) for i in range(t)])
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_qwen3_sparse_layers():
    got = [is_qwen3_moe_layer(i, [2], 2) for i in range(6)]
    assert got == [False, True, False, True, False, True]


@pytest.mark.parametrize(
    "fn,match",
    [
        (lambda: qwen3_moe_route(jnp.zeros((2, 4)), 5, True), "top_k=5"),
        (
            lambda: sigmoid_group_route(
                jnp.zeros((2, 8)),
                jnp.zeros(8),
                top_k=2,
                n_group=3,
                topk_group=1,
                norm_topk_prob=True,
                routed_scaling_factor=1.0,
            ),
            "n_group=3",
        ),  # fmt: skip
        (lambda: mixtral_route(jnp.zeros((4,)), 1), "must be 2-D"),
        (
            lambda: softmax_group_route(
                jnp.zeros((2, 8)),
                top_k=2,
                topk_method="noaux_tc",
                n_group=1,
                topk_group=1,
                routed_scaling_factor=1.0,
            ),
            "topk_method='noaux_tc'",
        ),
        (
            lambda: softmax_group_route(
                jnp.zeros((2, 8)),
                top_k=2,
                topk_method="group_limited_greedy",
                n_group=4,
                topk_group=5,
                routed_scaling_factor=1.0,
            ),
            "topk_group=5",
        ),
    ],
)
def test_bad_arguments(fn, match):
    with pytest.raises(ValueError, match=match):
        fn()
