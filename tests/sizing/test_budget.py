"""The memory budget (issue 14): parameter counts, weight / KV / state bytes, `MemoryBudget`,
the unbounded `fit` search and memory strings.

Parameter counts of the presets transformers knows are checked against
`tests/fixtures/hf_param_counts.json` (made with transformers on the meta device, see
`tests/fixtures/make_hf_param_counts.py`); the families and byte figures it cannot give are
checked against counts derived by hand here, formula by formula from the HF modeling code.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxarena import (
    ArenaPlan,
    BufferSizes,
    ConfigError,
    Levers,
    MemoryBudget,
    ModelConfig,
    Target,
    parse_memory,
    presets,
)
from jaxarena._sizing import budget as B
from jaxarena._sizing import cache as C
from jaxarena._sizing import weights as W
from jaxarena._sizing.step_temp import estimate_step_temp

FIXTURE = Path(__file__).parent.parent / "fixtures" / "hf_param_counts.json"
HOPPER = Target.preset("hopper")
LEVERS = Levers()
GB = 10**9
GIB = 1 << 30


def budget(name: str | ModelConfig, memory: int | str = "141GB", **kw) -> MemoryBudget:
    config = ModelConfig.preset(name) if isinstance(name, str) else name
    kw.setdefault("target", HOPPER)
    kw.setdefault("levers", LEVERS)
    return MemoryBudget(config=config, memory_bytes=memory, **kw)


def fp8_matrix(out: int, inp: int) -> int:
    """e4m3 bytes plus the f32 128 x 128 block scales of one (out, in) matrix."""
    return out * inp + math.ceil(out / 128) * math.ceil(inp / 128) * 4


# -- parameter counts: transformers' table -----------------------------------------------------

TABLE = json.loads(FIXTURE.read_text())["presets"]
KNOWN = sorted(name for name, entry in TABLE.items() if entry.get("known"))
# The table's kinds, in our component names. Its "hyper_connections" and "ngram_embed" are
# part of our "other" (with the compressors and indexers it files under attention and norms),
# so families with an "other" part are compared in total only.
KIND = {
    "mlp_dense": "mlp",
    "moe_experts": "experts",
    "moe_shared_experts": "shared_experts",
    "moe_router": "router",
    "linear_attention": "ssm",
}


def test_the_table_covers_every_preset():
    assert sorted(TABLE) == sorted(presets())


@pytest.mark.parametrize("name", KNOWN)
def test_param_count_equals_transformers(name):
    entry = TABLE[name]
    config = ModelConfig.preset(name)
    parts = W.param_breakdown(config)
    # `total_used`: what the model's forward reads. It differs from `total` only for
    # LongCat-Flash, whose transformers class allocates gate/up rows for the 256 zero
    # (identity) experts too; released checkpoints do not hold them, and neither do we.
    assert W.param_count(config) == entry["total_used"]
    assert parts["vision"] == entry["vision_total"]
    assert (
        W.param_count(config) - parts["vision"] == entry["text_total"] - entry["unused_in_forward"]
    )
    if parts["other"] == 0:
        theirs: dict[str, int] = {}
        for kind, count in entry["by_kind"].items():
            theirs[KIND.get(kind, kind)] = theirs.get(KIND.get(kind, kind), 0) + count
        if entry["unused_in_forward"]:  # LongCat's never-read rows are expert weights
            theirs["experts"] -= entry["unused_in_forward"]
        assert {k: v for k, v in parts.items() if v} == theirs
    # Kimi K2 declares `num_nextn_predict_layers: 0`: a key saying there are none.
    assert (W.mtp_param_count(config) > 0) == any(entry["mtp_config"].values())


def test_longcat_zero_experts_are_not_weights():
    entry = TABLE["longcat-flash"]
    # 28 layers x 256 zero experts x (2 x 2048) x 6144 gate/up rows that forward never reads.
    assert entry["total"] - entry["total_used"] == 28 * 256 * 2 * 2048 * 6144
    assert W.exactness(ModelConfig.preset("longcat-flash")) is None


def test_unknown_layouts_are_flagged():
    # LongCat-Flash-Lite's n-gram embedding tables have no published layout (and transformers
    # has no class for it): its count covers the LongCat-Flash parts only, and says so.
    config = ModelConfig.preset("longcat-flash-lite-fixture")
    assert "n-gram" in W.exactness(config)
    h, v, layers = 3072, 131072, 14
    mla = h * 1536 + 1536 + 1536 * 32 * 192 + h * 576 + 512 + 512 * 32 * 256 + 32 * 128 * h
    sub = mla + 3 * h * 6144 + 2 * h
    moe = (256 + 128) * h + 256 * 3 * h * 1024
    assert W.param_count(config) == 2 * v * h + layers * (2 * sub + moe) + h


# -- parameter counts: hand-derived ----------------------------------------------------------


def test_llama_count_by_hand():
    # LlamaForCausalLM: embed + untied lm_head; per layer q/k/v/o (no bias), gate/up/down,
    # two RMSNorms; a final norm.
    h, inter, layers, heads, kv, hd, vocab = 4096, 14336, 32, 32, 8, 128, 128256
    per_layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter + 2 * h
    expected = 2 * vocab * h + layers * per_layer + h
    assert W.param_count(ModelConfig.preset("llama3.1-8b")) == expected == 8_030_261_248


def test_mla_moe_count_by_hand():
    # DeepSeek-V3: MLA (q_a, q_a_norm, q_b, kv_a_with_mqa, kv_a_norm, kv_b, o), 3 dense layers,
    # 58 MoE layers (router 256 x h, 256 experts, one shared expert of 2048).
    h, vocab, heads = 7168, 129280, 128
    ql, kl, rope, nope, v = 1536, 512, 64, 128, 128
    attn = h * ql + ql + ql * heads * (nope + rope) + h * (kl + rope) + kl
    attn += kl * heads * (nope + v) + heads * v * h
    dense = 3 * h * 18432
    moe = 256 * h + 256 * 3 * h * 2048 + 3 * h * 2048
    expected = 2 * vocab * h + 61 * (attn + 2 * h) + 3 * dense + 58 * moe + h
    config = ModelConfig.preset("deepseek-v3")
    assert W.param_count(config) == expected
    # One MTP layer: the same MLA + MoE layer, enorm/hnorm, eh_proj, the shared head's norm,
    # and the embedding and head the checkpoint repeats.
    mtp = attn + 2 * h + moe + 2 * h + 2 * h * h + h + 2 * vocab * h
    assert W.mtp_param_count(config) == mtp
    assert W.param_count(config) + mtp == 684_489_830_400  # the published "685B"


def test_mamba2_count_by_hand():
    # Mamba2ForCausalLM 2.7B: tied embeddings; per layer a norm, in_proj (no bias), conv1d with
    # bias, dt_bias/A_log/D per head, a gated norm over d_inner, out_proj; norm_f.
    h, vocab, layers, heads, hd, state, groups, k = 2560, 50288, 64, 80, 64, 128, 1, 4
    d_inner = heads * hd
    conv = d_inner + 2 * groups * state
    per_layer = h + h * (d_inner + conv + heads) + conv * k + conv + 3 * heads + d_inner
    per_layer += d_inner * h
    expected = vocab * h + layers * per_layer + h
    assert W.param_count(ModelConfig.preset("mamba2-2.7b")) == expected


def test_gdn_hybrid_count_by_hand():
    # Qwen3-Next-80B-A3B: 36 gated-delta-net layers, 12 gated full-attention layers with q/k
    # norms, every layer a 512-expert MoE with a shared expert and its sigmoid gate.
    h, vocab = 2048, 151936
    nk, dk, nv, dv = 16, 128, 32, 128
    conv = 2 * nk * dk + nv * dv
    gdn = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + conv * 4 + 2 * nv + dv + nv * dv * h
    attn = h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h + 2 * 256
    moe = 512 * h + 512 * 3 * h * 512 + 3 * h * 512 + h
    expected = 2 * vocab * h + 36 * gdn + 12 * attn + 48 * (moe + 2 * h) + h
    assert W.param_count(ModelConfig.preset("qwen3-next-80b-a3b")) == expected


def test_puzzle_latent_moe_by_hand():
    # Nemotron-H Puzzle (transformers has no class for it): Nemotron-H blocks, LatentMoE blocks
    # of per-block width (1280 and 2688), 512 experts on a 1024-wide latent, relu2 experts
    # (up/down only), a non-gated shared expert of 5376, one norm per block.
    h, vocab, latent = 4096, 131072, 1024
    d_inner, conv, heads = 128 * 64, 128 * 64 + 2 * 8 * 96, 128
    mamba = h * (d_inner + conv + heads) + conv * 4 + conv + 3 * heads + d_inner + d_inner * h
    attn = h * 32 * 128 + 2 * h * 2 * 128 + 32 * 128 * h

    def moe(width: int) -> int:
        return 512 * h + 512 * 2 * latent * width + 2 * h * latent + 2 * h * 5376

    expected = 2 * vocab * h + mamba + attn + moe(1280) + moe(2688) + 4 * h + h
    config = ModelConfig.preset("nemotron-h-puzzle-latentmoe-fixture")
    assert W.param_count(config) == expected
    assert W.exactness(config) is None


@pytest.mark.parametrize(
    ("hf", "expected"),
    [
        # Each count below is derived from the config by the formula in the comment; the same
        # numbers come out of transformers 5.24 on the meta device (checked when written).
        (  # Gemma: tied; per layer q/k/v/o, gate/up/down, 2 norms (head_dim 32, not h/heads).
            dict(model_type="gemma", hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=300),
            300 * 64 + 3 * (64 * 128 + 2 * 64 * 64 + 128 * 64 + 3 * 64 * 96 + 2 * 64) + 64,
        ),
        (  # Gemma-2: + pre/post feed-forward norms (4 per layer).
            dict(model_type="gemma2", hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=300),
            300 * 64 + 4 * (64 * 128 + 2 * 64 * 64 + 128 * 64 + 3 * 64 * 96 + 4 * 64) + 64,
        ),
        (  # Gemma-3: + q/k norms of head_dim.
            dict(model_type="gemma3_text", hidden_size=64, intermediate_size=96,
                 num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 vocab_size=300),
            300 * 64 + 7 * (64 * 128 + 2 * 64 * 64 + 128 * 64 + 3 * 64 * 96 + 4 * 64 + 64) + 64,
        ),
        (  # Qwen2: q/k/v biases (no o bias) whatever attention_bias says.
            dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                 tie_word_embeddings=False),
            2 * 300 * 64 + 3 * (2 * 64 * 64 + 2 * 64 * 32 + 64 + 2 * 32 + 3 * 64 * 96 + 2 * 64)
            + 64,
        ),
        (  # Llama with attention and MLP biases, tied.
            dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                 attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
            300 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + (64 + 2 * 32 + 64) + 3 * 64 * 96
                            + (2 * 96 + 64) + 2 * 64) + 64,
        ),
        (  # Mamba-1: tied; in_proj 2*d_inner, conv+bias, x_proj (dt_rank + 2 state), dt_proj
            # + bias, A_log (d_inner x state), D, out_proj; dt_rank auto = ceil(64 / 16).
            dict(model_type="mamba", hidden_size=64, num_hidden_layers=3, vocab_size=300,
                 state_size=8, expand=2, conv_kernel=4),
            300 * 64 + 3 * (64 + 64 * 256 + 128 * 4 + 128 + 128 * (4 + 16) + 4 * 128 + 128
                            + 128 * 8 + 128 + 128 * 64) + 64,
        ),
        (  # Jamba: layer 2 and 6 attention, Mamba-1 elsewhere with dt/b/c norms; odd layers
            # MoE (4 experts), even ones dense; two norms per layer; untied.
            dict(model_type="jamba", hidden_size=64, intermediate_size=96, num_hidden_layers=8,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=300, num_experts=4,
                 num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
                 mamba_dt_rank=8, attn_layer_period=4, attn_layer_offset=2,
                 expert_layer_period=2, expert_layer_offset=1),
            2 * 300 * 64
            + 2 * (2 * 64 * 64 + 2 * 64 * 32)
            + 6 * (64 * 256 + 128 * 4 + 128 + 128 * 24 + 8 * 128 + 128 + 128 * 8 + 128
                   + 128 * 64 + 8 + 2 * 8)
            + 4 * 3 * 64 * 96 + 4 * (4 * 64 + 4 * 3 * 64 * 96)
            + 8 * 2 * 64 + 64,
        ),
    ],
    ids=["gemma", "gemma2", "gemma3", "qwen2", "llama-bias", "mamba1", "jamba"],
)  # fmt: skip
def test_small_family_counts_by_hand(hf, expected):
    assert W.param_count(ModelConfig.from_hf(hf)) == expected


def test_breakdown_sums_and_tied_embeddings():
    config = ModelConfig.preset("mamba2-2.7b")
    parts = W.param_breakdown(config)
    assert tuple(parts) == W.COMPONENTS
    assert sum(parts.values()) == W.param_count(config)
    assert parts["lm_head"] == 0 and parts["embed"] == 50288 * 2560  # tied: counted once
    untied = config.replace(tie_word_embeddings=False)
    assert W.param_count(untied) - W.param_count(config) == 50288 * 2560


# -- weight bytes -----------------------------------------------------------------------------


def test_fp8_bytes_by_hand():
    # Llama-3.1-8B in FP8: the seven linear weights per layer in e4m3 with their block scales,
    # embeddings, LM head and norms in bf16.
    h, inter, layers, vocab = 4096, 14336, 32, 128256
    linear = (
        2 * fp8_matrix(4096, h) + 2 * fp8_matrix(1024, h) + 2 * fp8_matrix(inter, h)
        + fp8_matrix(h, inter)
    )  # fmt: skip
    expected = layers * linear + 2 * (2 * vocab * h + layers * 2 * h + h)
    config = ModelConfig.preset("llama3.1-8b")
    assert W.weight_bytes(config, "fp8") == expected
    assert W.weight_bytes(config, "bf16") == 2 * W.param_count(config)


def test_fp8_scales_round_up_per_matrix():
    # A 129 x 200 matrix needs 2 x 2 blocks.
    t = W.WeightTensor("mlp", "w", (129, 200), 3, fp8=True)
    assert t.nbytes("fp8") == 3 * (129 * 200 + 2 * 2 * 4)
    assert t.nbytes("bf16") == 3 * 2 * 129 * 200


def test_router_correction_bias_is_bytes_not_params():
    config = ModelConfig.preset("deepseek-v3")
    buffers = [t for t in W.weight_tensors(config) if t.buffer]
    assert [(t.shape, t.count, t.itemsize) for t in buffers] == [((256,), 58, 4)]
    assert W.weight_bytes(config) == 2 * W.param_count(config) + 58 * 256 * 4


def test_tp_splits_everything_but_the_replicated_parts():
    # Llama-3.1-8B over 8 devices: heads, KV heads (8), FFN and vocabulary (128256 = 8 x
    # 16032) split exactly; only the 65 RMSNorm vectors are replicated.
    config = ModelConfig.preset("llama3.1-8b")
    norms = (2 * 32 + 1) * 4096
    whole = W.param_count(config)
    assert W.weight_bytes(config, tp=8) == 2 * ((whole - norms) // 8 + norms)


def test_replicated_kv_heads_and_ep_experts():
    # Qwen3-30B-A3B, 4 KV heads over tp=8: each device keeps one KV head (k/v_proj 128 rows).
    config = ModelConfig.preset("qwen3-30b-a3b")
    k = [t for t in W.weight_tensors(config, tp=8) if t.name == "self_attn.k_proj.weight"]
    assert k[0].shape == (128, 2048)
    # ep=8: 16 whole experts per device (width 768 unsplit); with ep=1 all 128 at width 96.
    ep = [t for t in W.weight_tensors(config, tp=8, ep=8) if t.component == "experts"]
    assert {(t.shape, t.count) for t in ep} == {((768, 2048), 48 * 16), ((2048, 768), 48 * 16)}
    tp = [t for t in W.weight_tensors(config, tp=8) if t.component == "experts"]
    assert {(t.shape, t.count) for t in tp} == {((96, 2048), 48 * 128), ((2048, 96), 48 * 128)}


def test_weight_bytes_rejects_unknown_format():
    with pytest.raises(ValueError, match="weights='int4'"):
        W.weight_bytes(ModelConfig.preset("qwen3-8b"), "int4")
    with pytest.raises(ConfigError, match="tp=3"):
        W.weight_bytes(ModelConfig.preset("qwen3-8b"), tp=3)


# -- KV cache and state, one model per cache kind ---------------------------------------------


def test_kv_full_attention_and_kv_head_replication():
    llama = ModelConfig.preset("llama3.1-8b")  # 32 layers x 2 x 8 heads x 128 x 2 B
    assert C.kv_bytes_per_token(llama) == 32 * 2 * 8 * 128 * 2
    assert C.kv_bytes_per_token(llama, "fp8") == 32 * 2 * 8 * 128
    assert C.kv_bytes_per_token(llama, tp=8) == 32 * 2 * 1 * 128 * 2
    qnext = ModelConfig.preset("qwen3-next-80b-a3b")  # 12 attention layers, 2 KV heads of 256
    assert C.kv_bytes_per_token(qnext) == 12 * 2 * 2 * 256 * 2
    # tp=8 > 2 KV heads: one replicated head per device, so it stops shrinking at tp=2.
    assert C.kv_bytes_per_token(qnext, tp=8) == C.kv_bytes_per_token(qnext, tp=2)
    assert C.kv_bytes_per_token(qnext, tp=8) == 12 * 2 * 1 * 256 * 2


def test_kv_mla_latent_is_replicated():
    ds = ModelConfig.preset("deepseek-v3")  # 61 layers x (512 + 64) x 2 B, on every device
    assert C.kv_bytes_per_token(ds) == 61 * (512 + 64) * 2
    assert C.kv_bytes_per_token(ds, tp=8) == C.kv_bytes_per_token(ds)


def test_sliding_window_is_per_sequence_state():
    # gpt-oss-20b: 12 full layers grow with the context; 12 sliding layers (window 128) hold
    # at most 128 tokens, paged in 16-token blocks: a 128-token window can touch 9 blocks.
    oss = ModelConfig.preset("gpt-oss-20b")
    per_layer_token = 2 * 8 * 64 * 2
    assert C.kv_bytes_per_token(oss) == 12 * per_layer_token
    assert C.sliding_tokens(128, 32768, 16) == 9 * 16
    assert C.sliding_tokens(128, 32768, 0) == 128
    assert C.sliding_tokens(128, 50, 16) == 4 * 16  # capped by the sequence's own blocks
    state = C.state_bytes_per_sequence(oss, max_seq_len=32768, kv_block_size=16)
    assert state == 12 * 144 * per_layer_token


def test_mamba2_and_gdn_states():
    m2 = ModelConfig.preset("mamba2-2.7b")  # conv (4-1) x 5376 bf16 + 80 x 64 x 128 f32
    per_layer = 3 * 5376 * 2 + 80 * 64 * 128 * 4
    assert C.state_bytes_per_sequence(m2, max_seq_len=4096) == 64 * per_layer
    assert C.kv_bytes_per_token(m2) == 0
    qnext = ModelConfig.preset("qwen3-next-80b-a3b")  # 36 GDN layers
    conv = 2 * 16 * 128 + 32 * 128
    per_layer = 3 * conv * 2 + 32 * 128 * 128 * 4
    assert C.state_bytes_per_sequence(qnext, max_seq_len=4096) == 36 * per_layer
    assert C.state_bytes_per_sequence(qnext, max_seq_len=4096, tp=4) == 36 * per_layer // 4


# -- MemoryBudget -----------------------------------------------------------------------------


def test_budget_parts_add_up():
    b = budget("qwen3-8b", "141GB", tp=2)
    sizes = BufferSizes.from_config(
        ModelConfig.preset("qwen3-8b").shard(tp=2), 8192, 32768, 16, 64,
        levers=LEVERS, target=HOPPER,
    )  # fmt: skip
    assert b.arena_bytes == ArenaPlan.sequential(sizes).total_bytes
    # No compile: 1 GiB for the runtime + the steps' XLA temp as estimated for one device.
    temp = estimate_step_temp(ModelConfig.preset("qwen3-8b").shard(tp=2), 8192, 64)
    assert (b.reserve_bytes, b.reserve_source) == (GIB + temp, "estimated")
    assert b.free_bytes == 141 * GB - b.weight_bytes - b.arena_bytes - b.reserve_bytes
    seq = 32768 * b.kv_bytes_per_token + b.state_bytes_per_sequence
    assert b.sequence_bytes == seq
    assert b.max_sequences * seq <= b.free_bytes < (b.max_sequences + 1) * seq
    tokens = b.max_kv_tokens
    assert tokens % 16 == 0 and b.max_kv_blocks == tokens // 16
    room = b.free_bytes - 64 * b.state_bytes_per_sequence
    assert tokens * b.kv_bytes_per_token <= room < (tokens + 16) * b.kv_bytes_per_token
    assert tuple(b.as_dict()) == B.BUDGET_KEYS
    json.dumps(b.as_dict(), allow_nan=False)


def test_packed_arena_is_no_larger():
    seq, packed = budget("tiny-hybrid"), budget("tiny-hybrid", arena="packed")
    assert packed.arena_bytes <= seq.arena_bytes
    assert packed.free_bytes - seq.free_bytes == seq.arena_bytes - packed.arena_bytes


def test_not_fitting_says_by_how_much_and_what_fits():
    b = budget("qwen3-next-80b-a3b", "141GB")
    assert not b.fits
    assert b.shortfall_bytes == b.required_bytes(1) - 141 * GB > 0
    assert b.max_sequences == 0 and b.max_kv_tokens == 0
    options = b.alternatives()
    assert "FP8 weights (--weights fp8)" in options
    assert any(o.startswith("tp=2") for o in options)
    assert budget("qwen3-next-80b-a3b", "141GB", weights="fp8").fits
    assert budget("qwen3-next-80b-a3b", "141GB", tp=2).fits
    assert "short by" in b.message() and "--weights fp8" in b.message()


def test_limits_alternative_is_the_largest_that_fits():
    # Qwen3-8B (16.4 GB of bf16 weights) on 24 GB: a 32k sequence does not fit, shorter ones do
    # (at 2048 prefill tokens: at 8192 the prefill's XLA temp alone, ~19 GB, leaves no room).
    b = budget("qwen3-8b", "24GB", max_batch_tokens=2048, max_seq_len=1 << 20)
    assert not b.fits
    lines = [o for o in b.alternatives() if o.startswith("max_seq_len <= ")]
    assert lines
    n = int(lines[0].removeprefix("max_seq_len <= ").replace(",", ""))
    assert b.replace(max_seq_len=n).fits and not b.replace(max_seq_len=n + 1).fits


SMALL = dict(target=HOPPER, levers=LEVERS)


@settings(max_examples=25, deadline=None)
@given(
    memory=st.integers(20 * GB, 400 * GB),
    extra=st.integers(0, 100 * GB),
    tokens=st.integers(1, 1 << 14),
    seq=st.integers(1, 1 << 17),
    slots=st.integers(1, 256),
)
def test_max_kv_tokens_monotone_in_memory_antitone_in_limits(memory, extra, tokens, seq, slots):
    config = ModelConfig.preset("qwen3-next-80b-a3b")
    kw = dict(weights="fp8", kv_block_size=16, **SMALL)
    base = MemoryBudget(
        config=config, memory_bytes=memory, max_batch_tokens=tokens, max_seq_len=seq,
        max_batch_size=slots, **kw,
    )  # fmt: skip
    assert base.replace(memory_bytes=memory + extra).max_kv_tokens >= base.max_kv_tokens
    for field, value in (("max_batch_tokens", tokens), ("max_seq_len", seq),
                         ("max_batch_size", slots)):  # fmt: skip
        bigger = base.replace(**{field: value * 2})
        assert bigger.max_kv_tokens <= base.max_kv_tokens, field


# -- fit ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "memory", "sequences", "kw"),
    [
        ("qwen3-8b", "80GB", 8, {}),
        ("qwen3-next-80b-a3b", "141GB", 16, {"weights": "fp8"}),
        ("deepseek-v3", "141GB", 4, {"tp": 8, "ep": 8, "weights": "fp8"}),
        ("tiny-hybrid", "2GiB", 100, {"max_seq_len": 4096}),
    ],
)
def test_fit_is_the_largest_that_fits(name, memory, sequences, kw):
    b = budget(name, memory, **kw)
    m = B.fit_max_batch_tokens(b, sequences)
    assert m is not None and m >= 1

    def total(tokens: int) -> int:
        return b.replace(max_batch_tokens=tokens).required_bytes(sequences)

    assert total(m) <= b.memory_bytes < total(m + 1)


def test_fit_is_unbounded_above():
    # Issue 17 item 7: the old search stopped at 2**25 - 1; a petabyte holds far more.
    # A fixed reserve: the estimated prefill temp grows with max_batch_tokens.
    b = budget("tiny-hybrid", "1000TiB", max_seq_len=4096, reserve=1 << 30)
    m = B.fit_max_batch_tokens(b, 1)
    assert m > 1 << 25
    assert b.replace(max_batch_tokens=m).required_bytes(1) <= b.memory_bytes
    assert b.replace(max_batch_tokens=m + 1).required_bytes(1) > b.memory_bytes


def test_fit_none_when_nothing_fits():
    assert B.fit_max_batch_tokens(budget("qwen3-32b", "24GB"), 1) is None
    with pytest.raises(ValueError, match="sequences=-1"):
        B.fit_max_batch_tokens(budget("qwen3-8b"), -1)


# -- memory strings and bad input ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("141GB", 141 * 10**9),
        ("24GiB", 24 * 2**30),
        ("24 gib", 24 * 2**30),
        ("80e9", 80 * 10**9),
        ("1.5TiB", 3 * 2**39),
        ("512MiB", 512 * 2**20),
        ("1000000", 10**6),
        ("1.5", 1),
        (4096, 4096),
    ],
)
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "not a size"),
        ("abc", "not a size"),
        ("24 parsecs", "not a size"),
        ("5XB", "not a size"),
        ("1" + "0" * 400, "not a size"),
        ("-5GB", "must be positive"),
        ("0", "must be positive"),
        ("0GiB", "must be positive"),
        ("0.1", "must be positive"),
        (-1, "must be positive"),
        ("2EB", "over 1 EB"),
        (10**400, "over 1 EB"),
        (True, "not a size"),
        (1.5e9, "must be a str"),
    ],
)
def test_parse_memory_refuses(text, match):
    with pytest.raises(ValueError, match=match) as info:
        parse_memory(text)
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"memory_bytes": "lots"}, "not a size"),
        ({"memory_bytes": 0}, "must be positive"),
        ({"tp": 3}, "not divisible by tp=3"),
        ({"tp": 0}, "tp=0 must be >= 1"),
        ({"ep": 2}, "ep=2 needs a model with routed experts"),
        ({"weights": "int4"}, "weights='int4'"),
        ({"kv_dtype": "f16"}, "kv_dtype='f16'"),
        ({"arena": "tight"}, "arena='tight'"),
        ({"reserve": -1}, "reserve=-1"),
        ({"max_seq_len": 0}, "max_seq_len=0 must be >= 1"),
    ],
)
def test_budget_refuses_bad_input(kw, match):
    kw = {"memory_bytes": "141GB", **kw}
    with pytest.raises(ValueError, match=match):
        MemoryBudget(config=ModelConfig.preset("qwen3-8b"), **kw, **SMALL)


def test_every_preset_has_a_budget():
    for name in presets():
        b = budget(name, "141GB", weights="fp8", max_seq_len=4096, max_batch_tokens=2048)
        assert b.weight_bytes > 0 and b.arena_bytes > 0
        assert b.kv_bytes_per_token + b.state_bytes_per_sequence > 0, name
        json.dumps(b.as_dict(), allow_nan=False)


# -- the weight-only config fields ---------------------------------------------------------------


def test_weight_field_defaults_match_the_dataclass():
    import dataclasses

    from jaxarena._config.hf_weights import WEIGHT_DEFAULTS

    fields = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    assert {k: fields[k] for k in WEIGHT_DEFAULTS} == WEIGHT_DEFAULTS


@pytest.mark.parametrize(
    ("hf", "match"),
    [
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings='yes' must be true or false"),
        ({"mlp_only_layers": ["a"]}, r"mlp_only_layers\[0\]='a' must be a layer index"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step=0 must be >= 1"),
        ({"sliding_window": -1}, "sliding_window=-1 must be >= 0"),
        ({"v_head_dim": 1.5}, "v_head_dim=1.5 must be a non-negative integer"),
    ],
)
def test_bad_weight_keys_are_config_errors(hf, match):
    base = dict(model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=32, num_attention_heads=4)  # fmt: skip
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_hf({**base, **hf})


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"ffn_layer_types": ("dense", "big")}, "ffn_layer_types="),
        ({"ffn_layer_types": ("dense",)}, r"len\(ffn_layer_types\)=1 != num_hidden_layers=2"),
        ({"moe_layer_widths": (0,)}, "moe_layer_widths=.* must be a tuple of positive ints"),
        ({"conv_kernel": -1}, "conv_kernel=-1 must be >= 0"),
        ({"attention_bias": 1}, "attention_bias=1 must be a bool"),
    ],
)
def test_bad_weight_fields_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(hidden_size=64, num_hidden_layers=2, **kw)


def test_shard_splits_mamba1_channels_and_per_block_widths():
    jamba = ModelConfig.from_hf(
        dict(model_type="jamba", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, num_experts=4, mamba_expand=2,
             attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
             expert_layer_offset=1, vocab_size=300)
    )  # fmt: skip
    assert jamba.mamba1_d_inner == 128 and jamba.shard(tp=2).mamba1_d_inner == 64
    in_proj = [t for t in W.weight_tensors(jamba, tp=2) if t.name == "mixer.in_proj.weight"]
    assert in_proj[0].shape == (2 * 64, 64)
    puzzle = ModelConfig.preset("nemotron-h-puzzle-latentmoe-fixture")
    assert puzzle.moe_layer_widths == (1280, 2688)
    assert puzzle.shard(tp=2).moe_layer_widths == (640, 1344)
    assert puzzle.shard(tp=2, ep=2).moe_layer_widths == (1280, 2688)  # EP keeps experts whole
    widths = ModelConfig(
        hidden_size=64, num_hidden_layers=2, num_experts=4, moe_intermediate_size=64,
        moe_layer_widths=(64, 48),
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"moe_layer_widths \[48\] are not divisible by tp=32"):
        widths.shard(tp=32)


def test_mamba1_and_sliding_gemma_caches_by_hand():
    # Jamba: 6 Mamba-1 layers (conv (4-1) x 128 bf16 + SSM 128 x 8 f32) and 2 attention layers
    # of 2 KV heads x 16.
    jamba = ModelConfig.from_hf(
        dict(model_type="jamba", hidden_size=64, intermediate_size=96, num_hidden_layers=8,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=300, num_experts=4,
             mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, attn_layer_period=4,
             attn_layer_offset=2)
    )  # fmt: skip
    assert C.state_bytes_per_sequence(jamba, max_seq_len=100) == 6 * (3 * 128 * 2 + 128 * 8 * 4)
    assert C.kv_bytes_per_token(jamba) == 2 * 2 * 2 * 16 * 2
    # Gemma-3: 5 of every 6 layers slide over 4096 tokens (the class default window).
    gemma = ModelConfig.from_hf(
        dict(model_type="gemma3_text", hidden_size=64, intermediate_size=96,
             num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             vocab_size=300)
    )  # fmt: skip
    per_token = 2 * 2 * 32 * 2
    assert C.kv_bytes_per_token(gemma) == 2 * per_token
    assert C.state_bytes_per_sequence(gemma, max_seq_len=32768, kv_block_size=0) == (
        10 * 4096 * per_token
    )
    assert C.state_bytes_per_sequence(gemma, max_seq_len=1000, kv_block_size=0) == (
        10 * 1000 * per_token
    )


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=40), st.integers(-(10**20), 10**20), st.floats(), st.none()))
def test_parse_memory_returns_bytes_or_a_value_error(text):
    try:
        value = parse_memory(text)
    except ValueError as e:
        assert "\n" not in str(e)
    else:
        assert isinstance(value, int) and 1 <= value <= 10**18


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(["qwen3-8b", "qwen3-30b-a3b", "tiny-hybrid", "gpt-oss-20b"]),
    tp=st.sampled_from([0, 1, 2, 3, 4, 8, 64]),
    ep=st.sampled_from([1, 2, 4, 5]),
    tokens=st.integers(-2, 1 << 20),
    seq=st.integers(-2, 1 << 22),
    block=st.sampled_from([-1, 0, 1, 16, 256]),
    weights=st.sampled_from(["bf16", "fp8", "fp4"]),
)
def test_any_budget_works_or_raises_a_value_error(name, tp, ep, tokens, seq, block, weights):
    try:
        b = MemoryBudget(
            config=ModelConfig.preset(name), memory_bytes="80GB", tp=tp, ep=ep,
            max_batch_tokens=tokens, max_seq_len=seq, kv_block_size=block, weights=weights,
            **SMALL,
        )  # fmt: skip
        d = b.as_dict()
    except ValueError:
        return
    assert d["weight_bytes"] + d["arena_bytes"] + d["reserve_bytes"] + d["free_bytes"] == 80 * GB
    json.dumps(d, allow_nan=False)
