"""DeepSeek-V3 as released: block-FP8 weights (fixture `deepseek_v3_fp8`, built by
tools/make_mla_fixtures.py: every linear weight e4m3 with 128 x 128 `weight_scale_inv` blocks,
router / norms / embeddings / LM head bf16; layer 0 MLA + dense MLP, layer 1 MLA + MoE with
a shared expert, every one of its 4 experts chosen) against transformers' float32 model of
the dequantized weights.

Bound. As test_pretrained.py's FP8 derivation (qwen3_fp8): both sides hold the same weight
values (e4m3 x block scale); the difference is the 1 x 128 e4m3 quantization of each
quantized projection's input, a relative error of RMS sigma8 = 2^-4 / sqrt(6) of the
projection's output, carried to a logit with gain <= 1, and stores before the attention
logits count twice (test_pretrained_mla.py's rule). Quantized inputs n8 on the path to a
logit:
  - MLA with a q LoRA: the pre-norm rows (`q_a_proj` and `kv_a_proj_with_mqa` quantize the
    same rows to the same values: one error, reaching q and k: 2), the normed q latent
    (`q_b_proj`: 2), the attention output (`o_proj`: 1): 5;
  - dense MLP: the gate/up input and the down input: 2;
  - MoE: its input (the routed and the shared gate/up quantize the same rows: 1), the
    routed and the shared down inputs (2): 3.
  Here n8 = 5 + 2 + 5 + 3 = 15, and 12 before layer 1's router.
Routing weights: the router (bf16 weights, float32 logits of the unquantized pre-norm) sees
the FP8 error of the 12 inputs before it, sigma_z = sigma8 sqrt(12) max|router logit|, and
test_moe_models.py's routing term (a relative error of at most sigma_z sqrt(1 - 1/k) of the
MoE output) applies; no choice can flip (all experts chosen), so no position is left out.
  sigma = max|z| sqrt(sigma8^2 n8 + (1 - 1/k) sigma_z^2),  max|dz| <= 4 sigma + atol_bf16,
  RMS |dz| <= sigma,
with atol_bf16 test_pretrained_mla.py's bound plus `kv_b_proj`'s bf16 rounding at load
(each weight element relative <= 2^-9 as a stored value's: on the key path before the
logits, 2, and the value path, 1; so MLA counts 3 more).
Measured at the time of writing: max|z| 4.88, max|router logit| 0.97: sigma 0.60, bound
2.61; prefill max 0.62, RMS 0.12; decode where the context equals transformers' (27 of 32
steps) 0.61; decode against the prefill recomputation 0.32 (bound 2 x bound: both paths
carry their own quantization noise, see test_pretrained.py); 78% of the greedy tokens equal.
The fixture's widths keep this first-order: with `initializer_range` 0.2 and router
logits up to 4 (the bf16 fixtures'), the attention logits were large enough that the FP8
error of q and k moved single logits by up to 5.9 (the softmax's nonlinear response), and
the routing term alone exceeded the logits.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from lm_runs import CHECKPOINTS
from test_moe_models import max_abs_logit
from test_pretrained import decided_and_same_context
from test_pretrained_mla import atol_of

from jaxarena import ModelConfig, workspaces
from jaxarena._sizing.weights import weight_bytes
from jaxarena.models.blocks.mla import MLA
from jaxarena.models.blocks.mlp import FFN_QUANT_REGIONS, ffn_down_regions
from jaxarena.models.checkpoint import open_checkpoint
from jaxarena.models.core.arena import fp8_regions, is_fp8

NAME = "deepseek_v3_fp8"
SIGMA8 = 2.0**-4 / math.sqrt(6)
U_BF16 = 2.0**-9
KV_B_ROUNDINGS = 3  # kv_b_proj rounded to bf16 at load (module docstring)
N8 = {"mla": 5, "mlp": 2, "moe": 3}  # quantized inputs per block (module docstring)


def fp8_sigma(lm, ref) -> float:
    """`sigma` of the module docstring."""
    blocks = lm.model.arch.blocks
    n8 = sum(N8[b.kind] for b in blocks)
    first_moe = [b.kind for b in blocks].index("moe")
    sigma_z = (
        SIGMA8
        * math.sqrt(sum(N8[b.kind] for b in blocks[:first_moe]))
        * float(ref["router_logit_absmax"])
    )
    k = lm.config.num_experts_per_tok
    return max_abs_logit(ref) * math.sqrt(SIGMA8**2 * n8 + (1 - 1 / k) * sigma_z**2)


def bf16_bound(lm, ref) -> float:
    """test_pretrained_mla's bound `4 max|z| sqrt(u^2 n / 3 + routing)` with kv_b's load
    rounding added to every MLA block's n."""
    z = max_abs_logit(ref)
    extra = KV_B_ROUNDINGS * sum(isinstance(b, MLA) for b in lm.model.arch.blocks)
    return 4 * z * math.sqrt((atol_of(lm, ref) / (4 * z)) ** 2 + U_BF16**2 * extra / 3)


def test_fp8_deepseek_keeps_fp8_weights_and_a_bf16_kv_b(runs):
    lm = runs.lm(NAME)
    c = lm.config
    assert lm.fp8
    blocks, layers = lm.model.arch.blocks, lm.params["layers"]
    assert [b.kind for b in blocks] == ["mla", "mlp", "mla", "moe"]
    fp8_keys = {"mla": ("wq_a", "wq_b", "wkv_a", "wo"), "mlp": ("w_gate_up", "w_down"),
                "moe": ("w_gate_up", "w_down", "s_gate_up", "s_down")}  # fmt: skip
    for b, p in zip(blocks, layers, strict=True):
        for key in fp8_keys[b.kind]:
            w = p[key]
            assert is_fp8(w) and w["w"].dtype == jnp.float8_e4m3fn, key
            *_, n, k = w["w"].shape
            assert w["scale_inv"].shape[-2:] == (-(-n // 128), -(-k // 128)), key
    # kv_a's 128 + 32 outputs end in a partial block, as DeepSeek-V3's 512 + 64 do.
    assert layers[0]["wkv_a"]["scale_inv"].shape == (2, 1)
    assert layers[3]["router"].dtype == jnp.bfloat16
    # kv_b: bf16 [kv_lora, H (nope + v)], each element the checkpoint's e4m3 value times its
    # block's scale, rounded to bf16 (computed here by block, not by a repeated scale grid).
    ck = open_checkpoint(CHECKPOINTS / NAME)
    for i in (0, 2):
        got = np.asarray(layers[i]["wkv_b"])
        assert got.dtype == jnp.bfloat16
        name = f"model.layers.{i // 2}.self_attn.kv_b_proj.weight"
        q, s = np.asarray(ck[name]).astype(np.float64), np.asarray(ck[name + "_scale_inv"])
        want = np.empty_like(q)
        for bi in range(s.shape[0]):
            for bj in range(s.shape[1]):
                blk = np.s_[bi * 128 : (bi + 1) * 128, bj * 128 : (bj + 1) * 128]
                want[blk] = q[blk] * float(s[bi, bj])
        want = want.T.astype(np.float32).astype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    # On-device bytes = the memory budget's FP8 figure (kv_b counted bf16 there too).
    assert lm.weight_bytes == weight_bytes(c, "fp8")
    # The q latent and the down projections of an MoE model's dense MLP and shared expert
    # quantize into `fp8_act` (the seed sizes no dense-FFN buffers for an MoE model).
    plan, t = lm.model.plan, lm.model.max_batch_tokens
    act = workspaces.FP8_ACT_REGIONS
    assert fp8_regions(plan, t, c.intermediate_size, FFN_QUANT_REGIONS) is None
    assert fp8_regions(plan, t, c.q_lora_rank, act) == act
    for k in (c.intermediate_size, c.shared_expert_intermediate_size):
        assert ffn_down_regions(plan, t, k) == act


def test_fp8_deepseek_logits_within_the_e4m3_bound(runs):
    r = runs.run(NAME)
    lm, ref = runs.lm(NAME), r["ref"]
    sigma = fp8_sigma(lm, ref)
    bound = 4 * sigma + bf16_bound(lm, ref)
    assert bound < 0.6 * max_abs_logit(ref)  # not vacuous
    diffs = np.concatenate([(g - w).ravel() for g, w in zip(r["prefill"], ref["prefill"],
                                                              strict=True)])  # fmt: skip
    assert np.abs(diffs).max() <= bound
    assert np.sqrt(np.mean(diffs**2)) <= sigma
    # Decode logits where the greedy context still equals transformers'.
    want = ref["greedy_tokens"]
    same = decided_and_same_context(np.full(want.shape, np.inf), r["tokens"], want, 0.0)
    assert np.abs(r["logits"] - ref["greedy_logits"])[same].max() <= bound
    np.testing.assert_allclose(r["logits"], r["forced"], atol=2 * bound, rtol=0)
    assert lm.decode_counter.count == 1
    assert lm.model.plan.check_guards(lm.arena) == []


def test_shapes_only_reader_matches_the_loaded_weights(runs):
    """`step-report`'s abstract weights: from the fixture's headers, the loaded tree's shapes
    and dtypes; from the deepseek-v3 preset (its `quantization_config`), FP8 projections, a
    bf16 kv_b, and the budget's FP8 weight bytes."""
    from jaxarena.step_report import abstract_model

    lm = runs.lm(NAME)
    _, params, _ = abstract_model(str(CHECKPOINTS / NAME), target="cpu", max_batch_tokens=64,
                                  max_seq_len=32, max_batch_size=4)  # fmt: skip

    def sig(tree):
        return jax.tree.map(lambda a: (tuple(a.shape), jnp.dtype(a.dtype)), tree)

    assert sig(params) == sig(lm.params)
    cfg = ModelConfig.preset("deepseek-v3")
    _, params, _ = abstract_model("deepseek-v3", target="cpu", max_batch_tokens=64,
                                  max_seq_len=64, max_batch_size=2)  # fmt: skip
    mla = params["layers"][0]
    assert mla["wkv_b"].shape == (512, 128 * 256) and mla["wkv_b"].dtype == jnp.bfloat16
    assert mla["wkv_a"]["w"].dtype == jnp.float8_e4m3fn
    assert mla["wkv_a"]["scale_inv"].shape == (5, 56)  # 576 outputs: 4.5 blocks
    nbytes = sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize
                 for a in jax.tree.leaves(params))  # fmt: skip
    assert nbytes == weight_bytes(cfg, "fp8")
