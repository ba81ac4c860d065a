"""BufferSizes against the spec's test vectors, the seed repo's golden values, and hand-derived
values; the levers and split-K spellings; property tests."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxarena import BufferSizes, ConfigError, Levers, ModelConfig, ServeLimits, Target
from jaxarena.workspaces import SplitKPolicy, parse_policy, resolve_policy, workspace_slots

# fmt: off
# Spec §16.3 (SIZING_SPEC.md), computed by the spec's author with q12 variant B.
# field: (V1, V2, V3, V4, V5); 'total_bytes' is the seed's total (without o_latent and
# norm_unit_w).
SPEC_VECTORS = {
    'hidden_states': (4096, 33554432, 8912896, 4194304, 18432000),
    'residual': (4096, 33554432, 8912896, 4194304, 18432000),
    'norm_output': (4096, 33554432, 8912896, 4194304, 36864000),
    'qkv_output': (294912, 150994944, 40108032, 10485760, 36962304),
    'attn_output': (8192, 67108864, 17825792, 4194304, 82944000),
    'gate_logits': (1024, 8388608, 2228224, 256, 576000),
    'gate_logits_f32': (2048, 16777216, 4456448, 256, 1152000),
    'moe_router_in_f32': (8192, 67108864, 17825792, 256, 36864000),
    'moe_output': (65536, 33554432, 8912896, 4194304, 18481152),
    'logits': (303872, 77791232, 77791232, 65667072, 51200000),
    'ssm_qkvz': (393216, 201326592, 53477376, 2097152, 86592000),
    'ssm_ba': (8192, 1048576, 1048576, 2097152, 9216000),
    'ssm_deinterleaved': (393216, 201326592, 53477376, 4194304, 82944000),
    'ssm_gates': (4096, 2097152, 557056, 1048576, 786432),
    'ssm_conv_out_f32': (49152, 402653184, 106954752, 256, 73728000),
    'scratch': (302080, 852232, 226568, 564224, 264680),
    'expert_gate_out': (163840, 83886080, 22282240, 14680064, 49283072),
    'expert_up_out': (163840, 83886080, 22282240, 14680064, 49283072),
    'expert_down_out': (655360, 335544320, 89128960, 4194304, 55443456),
    'splitk_workspace': (49536, 49536, 33816576, 24960, 4469760),
    'gdn_fla_scratch': (44703744, 378667008, 131481600, 0, 82833408),
    'ssd_scratch': (0, 0, 0, 0, 8650752),
    'o_latent': (256, 256, 256, 256, 49152000),
    'norm_unit_w': (4096, 4096, 4096, 8192, 12288),
    'hc_streams': (256, 256, 256, 256, 147456000),
    'hc_post': (256, 256, 256, 256, 48000),
    'hc_comb': (256, 256, 256, 256, 192000),
    'hc_lowrank_scratch': (256, 256, 256, 256, 100810752),
    'qsa_select_scratch': (256, 256, 256, 256, 50364416),
    'token_ids': (256, 32768, 8704, 2048, 12000),
    'ffn_act_q8': (0, 0, 0, 30408704, 0),
    'ffn_act_a': (0, 0, 0, 7340032, 0),
    'ffn_act_scale': (0, 0, 0, 917504, 0),
    'ffn_act_scale_kmajor': (0, 0, 0, 229376, 0),
    'ffn_gate_up_fused': (0, 0, 0, 917504, 0),
    'fp8_act': (65536, 33554432, 8912896, 2097152, 18481152),
    'moe_fp8_scratch': (136964, 43548932, 11664132, 0, 19087108),
    'fp8_act_scale': (2048, 1048576, 278528, 65536, 577536),
    'fp8_act_scale_kmajor': (2048, 1048576, 278528, 65536, 577536),
    'lora_xa': (0, 0, 0, 0, 384000),
    'lora_delta': (0, 0, 0, 0, 49152000),
    'lora_hact': (0, 0, 0, 0, 49152000),
    'lora_seq_slot': (0, 0, 0, 0, 12000),
    'q2_dequant_scratch': (0, 0, 0, 0, 88670208),
    'q2_act_q8': (0, 0, 0, 0, 99352576),
    'ssm_rowwise_w_bf16': (0, 0, 0, 0, 301989888),
    'total_bytes': (47790468, 2292959372, 731764492, 182750848, 1731721260),
}
# fmt: on

GB10 = Target.preset("gb10")
HOPPER = Target.preset("hopper")
NO_LEVERS = Levers()

# Spec §16.2 fixture P: the qwen3_next_80b_nvfp4 preset of the seed's config crate.
P = ModelConfig(
    hidden_size=2048, num_hidden_layers=48, intermediate_size=5120, vocab_size=151936,
    num_attention_heads=16, num_key_value_heads=2, head_dim=256,
    linear_num_key_heads=16, linear_key_head_dim=128,
    linear_num_value_heads=32, linear_value_head_dim=128,
    num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    layer_types=tuple(
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48)
    ),
    full_attention_interval=4, attn_gated=True,
)  # fmt: skip
# Fixture D: a Llama-like dense config as the seed's default arm parses it (gated).
D = ModelConfig(
    hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, vocab_size=128256,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, attn_gated=True,
)  # fmt: skip
# Fixture K: synthetic, exercises every branch.
K = ModelConfig(
    hidden_size=3072, num_hidden_layers=8,
    layer_types=("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3
    + ("full_attention",),
    intermediate_size=8192, vocab_size=100000, num_attention_heads=24, num_key_value_heads=4,
    head_dim=192, attn_gated=False, mrope_interleaved=True,
    linear_num_key_heads=8, linear_key_head_dim=128,
    linear_num_value_heads=16, linear_value_head_dim=128,
    num_experts=64, zero_expert_num=32, num_experts_per_tok=6, moe_intermediate_size=1024,
    shared_expert_intermediate_size=2048, moe_latent_size=1536,
    mamba_num_heads=96, mamba_head_dim=64, ssm_state_size=128, n_groups=8,
    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, o_groups=8, o_lora_rank=1024,
    hc_mult=4, hc_lowrank=32, index_n_heads=16, index_head_dim=128, index_topk=2048,
    index_compress_ratio=4, adapter_max_rank=64,
)  # fmt: skip

ALL_LEVERS_V5 = Levers(
    gguf_native_q2=True, gguf_native_q2_mmq=True, fp8_rowwise=True, attn_decode_splitk="5"
)
CASES = {
    "V1": (P, (1, 4096, 16, 32), GB10, NO_LEVERS),
    "V2": (P, (8192, 4096, 16, 32), GB10, NO_LEVERS),
    "V3": (P, (2176, 2048, 16, 128), HOPPER, NO_LEVERS),
    "V4": (D, (512, 8192, 16, 64), GB10, NO_LEVERS),
    "V5": (K, (3000, 10000, 64, 48), GB10, ALL_LEVERS_V5),
}


def sizes_for(case: str, **kw) -> BufferSizes:
    cfg, limits, target, levers = CASES[case]
    return BufferSizes.from_config(cfg, *limits, levers=levers, target=target, **kw)


@pytest.mark.parametrize("case_index,case", list(enumerate(CASES)))
def test_spec_vectors_field_by_field(case_index, case):
    got = sizes_for(case).as_dict()
    expected = {k: v[case_index] for k, v in SPEC_VECTORS.items() if k != "total_bytes"}
    assert list(got) == list(expected), "field order must be the seed's"
    wrong = {k: (got[k], expected[k]) for k in expected if got[k] != expected[k]}
    assert not wrong, f"{case}: (got, spec) {wrong}"


@pytest.mark.parametrize("case_index,case", list(enumerate(CASES)))
def test_spec_totals(case_index, case):
    s = sizes_for(case)
    assert s.seed_total_bytes() == SPEC_VECTORS["total_bytes"][case_index]
    # Our total is every allocated buffer: the seed's plus o_latent and norm_unit_w.
    assert s.total_bytes() == s.seed_total_bytes() + s.o_latent + s.norm_unit_w


# Spec §16.3: with q12 variant A only `scratch` and the totals change.
VARIANT_A = {
    "V1": (302080, 47790468),
    "V2": (885512, 2292992652),
    "V3": (235784, 731773708),
    "V4": (564224, 182750848),
    "V5": (252776, 1731709356),
}


@pytest.mark.parametrize("case", list(CASES))
def test_q12_variant_a(case):
    a, b = sizes_for(case, q12_variant="A"), sizes_for(case)
    assert (a.scratch, a.seed_total_bytes()) == VARIANT_A[case]
    diff = {k for k, v in a.as_dict().items() if v != b.as_dict()[k]}
    assert diff <= {"scratch"}


def test_v3_on_gb10_has_legacy_workspace():
    cfg, limits, _, levers = CASES["V3"]
    s = BufferSizes.from_config(cfg, *limits, levers=levers, target=GB10)
    assert s.splitk_workspace == 48 * (256 + 2) * 4 == 49536


def test_repo_golden_values():
    """Spec §16.1: the seed repository's own test assertions."""
    s = BufferSizes.from_config(P, 128, 4096, 16, 32, levers=NO_LEVERS, target=GB10)
    assert s.logits == 128 * 151936 * 2
    assert s.hidden_states == 4096 * 128
    totals = {
        bs: BufferSizes.from_config(P, 8192, 4096, 16, bs, levers=NO_LEVERS, target=GB10)
        for bs in (1, 31, 32, 33, 64, 128, 160, 255)
    }
    assert len({s.seed_total_bytes() for s in totals.values()}) == 1
    for bs, rows in ((32, 256), (256, 257), (320, 321)):
        s = BufferSizes.from_config(P, 8192, 4096, 16, bs, levers=NO_LEVERS, target=GB10)
        assert s.logits == rows * 151936 * 2
    s = BufferSizes.from_config(P, 8192, 4096, 16, 320, levers=NO_LEVERS, target=GB10)
    assert s.scratch >= 32768 + 24 * 320 + 320 * 257 * 4
    for m in (2176, 8192):
        s = BufferSizes.from_config(P, m, 4096, 16, 128, levers=NO_LEVERS, target=GB10)
        assert s.ssm_ba >= 128 * 2 * 2048 * 2
        assert s.ssm_gates >= 128 * 2048 * 2


def test_scratch_v5_worked_pieces():
    """Spec §16.3's worked pieces of V5's scratch, recomputed from first principles."""
    from jaxarena import _units as U
    from jaxarena._sizing import composite as L

    m, top_k = 3000, 6
    max_blocks = 10000 // 64 + 1
    assert max_blocks == 157
    prefill = 2 * m * top_k * 4 + (3 * m * 4 + m * 8 + max_blocks * 4 + 4)
    assert prefill == 204632
    bt_meta = 32768 + max(256 * 24 + 256 * 157 * 4, L.DecodeMetaLayout(48).meta_bytes(157))
    assert bt_meta == 199680
    chunk = 375
    per_stream = U.round_up(U.round_up(chunk * 4 * 3, 8) + chunk * 8, 64)
    assert per_stream == 7552
    q12 = 144000 + 8 * per_stream + (3 * 12000 + 24000 + 128 + 40 + 32) + 64
    assert sizes_for("V5").scratch == max(65536, prefill, bt_meta, q12) == q12 == 264680


def test_hand_derived_llama_8b():
    """Llama-3.1-8B (not gated, head_dim 128) at M=256, 8192 context, 16-token blocks, 64 seqs,
    on gb10 without levers: every size derived by hand from the architecture."""
    cfg = ModelConfig(
        hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, vocab_size=128256,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    )  # fmt: skip
    s = BufferSizes.from_config(cfg, 256, 8192, 16, 64, levers=NO_LEVERS, target=GB10)
    m, h = 256, 4096
    assert s.hidden_states == s.residual == s.norm_output == m * h * 2
    assert s.qkv_output == m * (32 + 2 * 8) * 128 * 2  # q, k, v heads x 128, bf16
    assert s.attn_output == m * 32 * 128 * 2
    assert s.gate_logits == s.gate_logits_f32 == s.moe_router_in_f32 == 256  # dense
    assert s.logits == 256 * 128256 * 2  # min(M, max(256, 64 + 1)) = 256 rows
    assert s.expert_gate_out == s.expert_up_out == 256 * 14336 * 2
    assert s.expert_down_out == 256 * 4096 * 2
    assert s.splitk_workspace == 48 * 130 * 4
    assert s.ssd_scratch == s.gdn_fla_scratch == 0
    assert s.fp8_act == 256 * 4096
    assert s.fp8_act_scale == s.fp8_act_scale_kmajor == 256 * 32 * 4
    assert s.ffn_act_a == 256 * 14336
    assert s.ffn_act_scale == 256 * (14336 // 32) * 4
    assert s.ffn_act_scale_kmajor == 256 * (14336 // 128) * 4
    assert s.ffn_act_q8 == 256 * 14336 * 4 + (1 << 20)  # 14336 is a multiple of 256
    assert s.ffn_gate_up_fused == 16 * 2 * 14336 * 2
    assert s.moe_fp8_scratch == 0
    assert s.ssm_qkvz == (256 + 256) * 8 * 128 * 2  # prefill K then V
    assert s.ssm_ba == 128 * 2 * 4096 * 2  # MTP propose concat, 128 rows
    assert s.ssm_deinterleaved == 256 * 32 * 128 * 2
    assert s.ssm_gates == 128 * 4096 * 2
    assert s.ssm_conv_out_f32 == 256
    # Block table: 8192 / 16 + 1 = 513 entries; verify envelope 256 rows dominates.
    assert s.scratch == 32768 + 256 * 24 + 256 * 513 * 4
    assert all(getattr(s, f) == 0 for f in ("lora_xa", "lora_delta", "q2_act_q8"))


def test_hand_derived_mamba2():
    """A pure Mamba-2 model (no attention heads, no experts): SSD scratch and widths."""
    cfg = ModelConfig(
        hidden_size=2560, num_hidden_layers=64, vocab_size=50288, mamba_num_heads=80,
        mamba_head_dim=64, ssm_state_size=128, n_groups=1, layer_types=("mamba",) * 64,
    )  # fmt: skip
    s = BufferSizes.from_config(cfg, 100, 4096, 16, 8, levers=NO_LEVERS, target=GB10)
    d_inner = 80 * 64  # 5120 > hidden
    nc = -(-100 // 64) + 1  # 3 chunks
    assert s.ssd_scratch == 2 * (80 * nc * 64 * 4) + nc * 1 * 64 * 64 * 4
    assert s.norm_output == 100 * d_inner * 2
    assert s.attn_output == 100 * d_inner * 2
    assert s.norm_unit_w == d_inner * 2
    # in_proj: z (5120) + xBC (5120 + 2*1*128) + dt (80)
    assert s.ssm_qkvz == 100 * (5120 + 5376 + 80) * 2
    assert s.ssm_deinterleaved == 100 * 5376 * 2
    assert s.fp8_act == 112 * 5120
    assert s.splitk_workspace == 48 * 2 * 4  # head_dim 0: m and l only
    assert s.qkv_output == 0


# -- levers ------------------------------------------------------------------------------------

LEVER_BUFFERS = {
    "gguf_native_q2": {"q2_dequant_scratch"},
    "gguf_native_q2_mmq": {"q2_act_q8"},
    "fp8_rowwise": {"ssm_rowwise_w_bf16"},
}


@pytest.mark.parametrize("lever", list(LEVER_BUFFERS))
def test_each_lever_changes_exactly_its_buffer(lever):
    base = BufferSizes.from_config(K, 300, 4096, 16, 8, levers=NO_LEVERS, target=GB10)
    on = BufferSizes.from_config(K, 300, 4096, 16, 8, levers=Levers(**{lever: True}), target=GB10)
    changed = {k for k, v in on.as_dict().items() if v != base.as_dict()[k]}
    assert changed == LEVER_BUFFERS[lever]
    assert all(base.as_dict()[k] == 0 for k in changed)


def test_lever_values_by_hand():
    h, inter, qkvz = 3072, 8192, 2 * 8 * 128 + 2 * 16 * 128
    in_proj = 96 * 64 + (96 * 64 + 2 * 8 * 128) + 96
    s = BufferSizes.from_config(K, 300, 4096, 16, 8, levers=ALL_LEVERS_V5, target=GB10)
    max_n = max(inter, qkvz, in_proj, 24 * 1 * 192, 2 * 4 * 192)
    assert s.q2_dequant_scratch == max_n * h * 2
    assert s.q2_act_q8 == 300 * 8192 * 4 + (1 << 20)  # K = max(3072, 8192, 24*192=4608)
    assert s.ssm_rowwise_w_bf16 == 6 * (qkvz * h * 2 + h * 16 * 128 * 2)


@pytest.mark.parametrize(
    "environ,expected",
    [
        ({}, Levers()),
        ({"JAXARENA_GGUF_NATIVE_Q2": "1"}, Levers(gguf_native_q2=True)),
        ({"JAXARENA_GGUF_NATIVE_Q2": "true"}, Levers()),
        ({"JAXARENA_GGUF_NATIVE_Q2": " 1"}, Levers()),
        ({"JAXARENA_GGUF_NATIVE_Q2_MMQ": "1"}, Levers(gguf_native_q2_mmq=True)),
        ({"JAXARENA_FP8_ROWWISE": "1"}, Levers(fp8_rowwise=True)),
        ({"JAXARENA_FP8_ROWWISE": "01"}, Levers()),
        ({"JAXARENA_ATTN_DECODE_SPLITK": " Auto "}, Levers(attn_decode_splitk=" Auto ")),
        ({"METRALE_GGUF_NATIVE_Q2": "1"}, Levers()),  # the seed's names are not ours
    ],
)
def test_levers_from_env(environ, expected):
    assert Levers.from_env(environ) == expected


def test_levers_from_env_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("JAXARENA_FP8_ROWWISE", "1")
    monkeypatch.delenv("JAXARENA_GGUF_NATIVE_Q2", raising=False)
    assert Levers.from_env() == Levers(fp8_rowwise=True)


# -- split-K spellings (spec §7.2) -------------------------------------------------------------

PINNED = lambda n: SplitKPolicy("pinned", n)  # noqa: E731

SPELLINGS = [
    ("legacy", SplitKPolicy("legacy")),
    ("LEGACY", SplitKPolicy("legacy")),
    ("auto", SplitKPolicy("auto")),
    ("\t Auto\n", SplitKPolicy("auto")),
    ("\u3000auto\u00a0", SplitKPolicy("auto")),
    ("0", PINNED(1)),
    ("off", PINNED(1)),
    ("OFF", PINNED(1)),
    ("false", PINNED(1)),
    ("no", PINNED(1)),
    ("1", PINNED(1)),
    ("5", PINNED(5)),
    ("+5", PINNED(5)),
    ("007", PINNED(7)),
    ("16", PINNED(16)),
    ("17", PINNED(16)),
    ("4294967295", PINNED(16)),
    ("4294967296", None),
    ("", None),
    ("   ", None),
    ("-0", None),
    ("-3", None),
    ("1_6", None),
    ("\u0664", None),  # ARABIC-INDIC DIGIT FOUR: Python's int() accepts it, Rust does not
    ("\x1c4", None),  # U+001C is not Rust whitespace (Python's bare strip() would drop it)
    ("on", None),
    ("true", None),
    ("++4", None),
    ("4 4", None),
    ("Ａuto", None),  # fullwidth letter is not lower-cased
]


@pytest.mark.parametrize("spelling,expected", SPELLINGS)
def test_parse_policy(spelling, expected):
    assert parse_policy(spelling) == expected


@pytest.mark.parametrize("spelling,expected", SPELLINGS)
def test_splitk_spelling_changes_only_the_workspace(spelling, expected):
    """On a hopper target (declared auto): a parsing spelling wins, anything else falls back to
    auto; only `splitk_workspace` may change."""
    base = BufferSizes.from_config(P, 64, 4096, 16, 32, levers=NO_LEVERS, target=HOPPER)
    s = BufferSizes.from_config(
        P, 64, 4096, 16, 32, levers=Levers(attn_decode_splitk=spelling), target=HOPPER
    )
    policy = expected or SplitKPolicy("auto")
    rows, heads = 32, 16
    slots = {
        "legacy": 132,
        "auto": rows * heads * min(16, -(-2 * 132 // heads)),
        "pinned": rows * heads * policy.splits,
    }[policy.kind]
    assert s.splitk_workspace == slots * (256 + 2) * 4
    changed = {k for k, v in s.as_dict().items() if v != base.as_dict()[k]}
    assert changed <= {"splitk_workspace"}


def test_splitk_off_does_not_shrink():
    """Spec §7.5: `off` pins one split, which sizes rows * heads slots, more than legacy."""
    s = BufferSizes.from_config(
        P, 64, 4096, 16, 32, levers=Levers(attn_decode_splitk="off"), target=GB10
    )
    assert s.splitk_workspace == 32 * 16 * 258 * 4 > 48 * 258 * 4


def test_resolve_policy_falls_back_to_declared_then_legacy():
    assert resolve_policy("auto", "garbage") == SplitKPolicy("auto")
    assert resolve_policy("nonsense", None) == SplitKPolicy("legacy")
    assert resolve_policy("legacy", "3") == PINNED(3)


def test_workspace_slots_saturate_at_u32():
    assert workspace_slots(PINNED(16), 132, 2**20, 2**20, 1) == 2**32 - 1


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "limits,needle",
    [
        ((0, 4096, 16, 32), "max_batch_tokens=0"),
        ((8, 0, 16, 32), "max_seq_len=0"),
        ((8, 4096, -1, 32), "kv_block_size=-1"),
        ((8, 4096, 16, 0), "max_batch_size=0"),
        ((8.0, 4096, 16, 32), "max_batch_tokens=8.0"),
        ((True, 4096, 16, 32), "max_batch_tokens=True"),
    ],
)
def test_invalid_limits(limits, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        BufferSizes.from_config(D, *limits, levers=NO_LEVERS, target=GB10)


def test_kv_block_size_zero_keeps_seed_meaning():
    s = BufferSizes.from_config(D, 1, 4096, 0, 1, levers=NO_LEVERS, target=GB10)
    assert s.scratch == 32768 + 256 * 24 + 256 * 256 * 4  # 256 entries, no +1


def test_seed_edge_configs_are_sized():
    """Configs the seed's parser produces: zero experts with top-k 8 and head_dim 0
    (default-arm DeepSeek-V3), and attention-free models."""
    v3_like = ModelConfig(hidden_size=7168, num_experts=0, num_experts_per_tok=8,
                          num_attention_heads=128, num_key_value_heads=128, head_dim=0,
                          kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64)  # fmt: skip
    s = BufferSizes.from_config(v3_like, 16, 4096, 16, 8, levers=NO_LEVERS, target=GB10)
    assert s.splitk_workspace == 48 * 2 * 4
    assert s.scratch >= 2 * 16 * 8 * 4  # scratch still reads top-k
    no_attn = ModelConfig(hidden_size=64)
    s = BufferSizes.from_config(no_attn, 1, 1, 1, 1, levers=NO_LEVERS, target=GB10)
    assert all(v >= 0 for v in s.as_dict().values())


# -- properties ------------------------------------------------------------------------------

small = st.integers(min_value=0, max_value=64)
configs = st.builds(
    lambda h, q, kvd, hd, e, k, mi, lin, mh, gated, mla, hc, lora: ModelConfig(
        hidden_size=h * 64,
        num_attention_heads=q * kvd,
        num_key_value_heads=q,
        head_dim=hd * 16,
        num_experts=e,
        num_experts_per_tok=min(k, e) if e else k,
        moe_intermediate_size=mi * 64,
        intermediate_size=h * 128,
        vocab_size=1000,
        linear_num_key_heads=lin,
        linear_key_head_dim=128 if lin else 0,
        linear_num_value_heads=2 * lin,
        linear_value_head_dim=128 if lin else 0,
        mamba_num_heads=mh,
        mamba_head_dim=64 if mh else 0,
        ssm_state_size=16 if mh else 0,
        n_groups=1 if mh else 0,
        attn_gated=gated,
        kv_lora_rank=512 if mla else 0,
        qk_rope_head_dim=64 if mla else 0,
        q_lora_rank=mla * 768,
        hc_mult=hc,
        hc_lowrank=8 * hc,
        adapter_max_rank=lora,
    ),
    st.integers(1, 64), st.integers(0, 8), st.integers(1, 4), st.integers(0, 16),
    st.integers(0, 64), st.integers(1, 8), small, st.integers(0, 4), st.integers(0, 8),
    st.booleans(), st.booleans(), st.integers(0, 4), st.integers(0, 64),
)  # fmt: skip
limits = st.tuples(
    st.integers(1, 5000), st.integers(1, 70000), st.integers(0, 256), st.integers(1, 300)
)
splitk = st.sampled_from([None, "legacy", "auto", "off", "4", "junk"])


@settings(max_examples=150, deadline=None)
@given(configs, limits, splitk, st.sampled_from(["gb10", "hopper", "b200"]), st.data())
def test_sizes_are_monotone_non_negative_ints(cfg, lim, spelling, target_name, data):
    target = Target.preset(target_name)
    levers = Levers(attn_decode_splitk=spelling, gguf_native_q2_mmq=True, fp8_rowwise=True)
    base = BufferSizes.from_config(cfg, *lim, levers=levers, target=target)
    for v in base.as_dict().values():
        assert isinstance(v, int) and not isinstance(v, bool) and v >= 0
    which = data.draw(st.sampled_from([0, 1, 3]))  # tokens, seq len, batch size
    grow = data.draw(st.integers(1, 5000))
    bigger = list(lim)
    bigger[which] += grow
    grown = BufferSizes.from_config(cfg, *bigger, levers=levers, target=target)
    shrunk = {k: (v, grown.as_dict()[k]) for k, v in base.as_dict().items()
              if grown.as_dict()[k] < v}  # fmt: skip
    assert not shrunk, f"growing limit {which} by {grow} shrank {shrunk}"


def test_buffer_sizes_is_frozen_and_fields_are_the_seeds():
    s = sizes_for("V1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.logits = 0  # type: ignore[misc]
    assert len(s.as_dict()) == 46


def test_from_config_takes_serve_limits_and_the_loose_ints_alike():
    limits = ServeLimits(max_batch_tokens=300, max_seq_len=4096, kv_block_size=16,
                         max_batch_size=8)  # fmt: skip
    a = BufferSizes.from_config(P, limits, levers=NO_LEVERS, target=GB10)
    b = BufferSizes.from_config(P, 300, 4096, 16, 8, levers=NO_LEVERS, target=GB10)
    c = BufferSizes.from_config(P, max_batch_tokens=300, max_seq_len=4096, kv_block_size=16,
                                max_batch_size=8, levers=NO_LEVERS, target=GB10)  # fmt: skip
    assert a == b == c
    with pytest.raises(ConfigError, match=r"do not also pass \['max_seq_len'\]"):
        BufferSizes.from_config(P, limits, 4096, levers=NO_LEVERS, target=GB10)
    with pytest.raises(ConfigError, match=r"serve limits missing: \['max_batch_size'\]"):
        BufferSizes.from_config(P, 300, 4096, 16, levers=NO_LEVERS, target=GB10)
    with pytest.raises(ConfigError, match="max_batch_tokens given twice"):
        BufferSizes.from_config(P, 300, 4096, 16, 8, max_batch_tokens=3, target=GB10)
