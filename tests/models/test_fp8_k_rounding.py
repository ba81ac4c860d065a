"""The FP8 K-rounding decision (issue 16): the sizing follows the seed's floor(K / 128) for the
dense-FFN k-major scales; the quantizer writes ceil(K / 128) columns; a model whose FFN K is
not a multiple of 128 keeps that projection's activations in bf16 instead of using the seed's
FFN FP8 regions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.hybrid_plain import PlainHybrid
from _helpers.tolerances import tol

from jaxarena import ArenaError, ArenaPlan, BufferSizes, Levers, ModelConfig, Target, workspaces
from jaxarena.models.reference.hybrid import (
    HybridModel,
    default_block_tables,
    init_caches,
    init_params,
)
from pallas_kernels import fp8_block_quant_into

INTER = 200  # not a multiple of 128: floor(200 / 128) = 1 column, ceil = 2
M = 16


def _cfg(inter: int = INTER) -> ModelConfig:
    return ModelConfig.preset("tiny-hybrid").replace(intermediate_size=inter)


def test_sizing_follows_the_seed_floor():
    cfg = _cfg()
    s = BufferSizes.from_config(cfg, M, 64, 16, 2, levers=Levers(), target=Target.preset("gb10"))
    kmax = max(cfg.hidden_size, INTER)  # 200
    # Hand-derived: ceil16(16) = 16 rows x floor(200 / 128) = 1 column x 4 bytes.
    assert s.ffn_act_scale_kmajor == 16 * 1 * 4
    assert workspaces.fp8_scale_cols(kmax, rounding="floor") == 1
    assert workspaces.fp8_scale_cols(kmax) == 2
    # fp8_act's scales use the quantizer's ceil: max_proj_k = max(hidden 128, q width 4 * 64,
    # Mamba d_inner 8 * 32) = 256 -> 2 columns.
    assert s.fp8_act_scale == s.fp8_act_scale_kmajor == 16 * 2 * 4


def test_the_seed_ffn_regions_refuse_a_k_that_is_not_a_multiple_of_128():
    cfg = _cfg()
    sizes = BufferSizes.from_config(cfg, M, 64, 16, 2, levers=Levers(),
                                    target=Target.preset("gb10"))  # fmt: skip
    plan = ArenaPlan.sequential(sizes)
    x = jnp.zeros((M, INTER), jnp.bfloat16)
    regions = ("ffn_act_a", "ffn_act_scale", "ffn_act_scale_kmajor")
    with pytest.raises(ArenaError, match=r"'ffn_act_scale_kmajor' holds 64 bytes .* needs 128"):
        fp8_block_quant_into(plan.allocate(), plan, x, regions=regions)
    assert not workspaces.ffn_fp8_uses_seed_regions(INTER)
    assert workspaces.ffn_fp8_uses_seed_regions(256)


def test_model_with_k_200_keeps_bf16_and_matches_the_plain_model():
    """The reference model runs (it used to be refused: "holds 192 bytes ... needs 384") and its
    prefill logits match the plain NumPy model, which skips the FP8 round trip for K = 200.
    One MLP layer (the layer under test) keeps the compile and the interpreter small."""
    cfg = _cfg().replace(num_hidden_layers=1, layer_types=("mlp",))
    lens = (5, 11)
    model = HybridModel.create(cfg, max_batch_tokens=M, max_seq_len=64, kv_block_size=16,
                               max_batch_size=len(lens))  # fmt: skip
    params = init_params(cfg, seed=1)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, cfg.vocab_size, n).astype(np.int32) for n in lens]
    caches = init_caches(cfg, num_blocks=len(lens) * 4, block_size=16, max_batch_size=len(lens))
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    prefill = jax.jit(model.prefill, donate_argnums=(1, 2))
    _, _, logits = prefill(params, model.plan.allocate(), caches,
                           jnp.asarray(np.concatenate(prompts)), cu,
                           jnp.asarray(default_block_tables(len(lens), 4)))  # fmt: skip
    plain = PlainHybrid(cfg, params, 64)
    st = plain.init_state(len(lens))
    want = np.stack([plain.forward(st, p, b, 0) for b, p in enumerate(prompts)])
    np.testing.assert_allclose(np.asarray(logits), want, **tol("model", "bfloat16"))
