"""Per-device sizing under tensor/expert parallelism (`ModelConfig.shard`, `scaling_table`).

The tensor-parallel attention block over a sharded arena is tested in
`tests/models/test_tp_attention.py`."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxarena
from jaxarena import BufferSizes, ConfigError, Levers, ModelConfig, Target
from jaxarena._config.shard import experts_per_device
from jaxarena._sizing.scaling import BufferScaling, format_scaling_table, scaling_table

# Serve limits of the sizing tests: M = 100 tokens is not a multiple of 16 (so ceil16 shows).
M, SEQ, KV_BLOCK, BATCH = 100, 4096, 16, 8
LEVERS, TARGET = Levers(), Target.preset("gb10")
TPS = (1, 2, 4, 8)


def _sizes(cfg: ModelConfig, m: int = M) -> BufferSizes:
    return BufferSizes.from_config(cfg, m, SEQ, KV_BLOCK, BATCH, levers=LEVERS, target=TARGET)


def _ceil16(x: int) -> int:
    return -(-x // 16) * 16


def _splits(cfg: ModelConfig, tp: int) -> bool:
    """Whether `cfg` splits over `tp` devices (ep=1), by the written rules of the issue."""
    even = (
        cfg.num_attention_heads,
        cfg.intermediate_size,
        cfg.shared_expert_intermediate_size,
        cfg.moe_intermediate_size,
        cfg.linear_num_key_heads,
        cfg.linear_num_value_heads,
        cfg.mamba_num_heads,
    )
    if any(v % tp for v in even):
        return False
    for v in (cfg.num_key_value_heads, cfg.n_groups):  # split, or one replicated copy
        if v and (v % tp if v >= tp else tp % v):
            return False
    return True


def _per_device_heads(total: int, tp: int) -> int:
    return total // tp if total >= tp else min(total, 1)


# -- ModelConfig.shard on the presets --------------------------------------------------------------


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("name", jaxarena.presets())
def test_preset_per_device_sizes_match_hand_formulas(name, tp):
    cfg = ModelConfig.preset(name)
    if not _splits(cfg, tp):
        with pytest.raises(ConfigError, match=f"tp={tp}"):
            cfg.shard(tp=tp)
        return
    dev = _sizes(cfg.shard(tp=tp))
    full = _sizes(cfg)
    h, hd = cfg.hidden_size, cfg.head_dim
    hq = cfg.num_attention_heads // tp
    kv = _per_device_heads(cfg.num_key_value_heads, tp)
    q_mul = 2 if cfg.attn_gated else 1
    mh = cfg.mamba_num_heads // tp
    mla = cfg.kv_lora_rank > 0
    # Replicated activations (hidden is never split).
    assert dev.hidden_states == full.hidden_states == M * h * 2
    assert dev.moe_router_in_f32 == full.moe_router_in_f32
    # Column-parallel QKV: this device's query heads and its (possibly replicated) KV heads.
    assert dev.qkv_output == _ceil16(M) * (hq * q_mul + 2 * kv) * hd * 2
    assert dev.attn_output == max(
        M * hq * hd * 2,
        M * mh * cfg.mamba_head_dim * 2,
        M * hq * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2 if mla else 0,
    )
    assert dev.norm_output == M * max(h, mh * cfg.mamba_head_dim) * 2
    # Vocab-parallel LM head, rows capped at max(256, decode rows + 1).
    rows = min(M, max(256, max(BATCH, 32) + 1))
    assert dev.logits == rows * math.ceil(cfg.vocab_size / tp) * 2
    # The router scores every (global) expert on every device.
    assert dev.gate_logits == full.gate_logits
    assert dev.gate_logits_f32 == full.gate_logits_f32
    k_max = _ceil16(max(M, 3))
    if cfg.num_experts:
        inter = max(
            cfg.num_experts_per_tok * cfg.moe_intermediate_size // tp, cfg.intermediate_size // tp
        )
    else:
        inter = cfg.intermediate_size // tp
    assert dev.expert_gate_out == dev.expert_up_out == k_max * inter * 2
    if cfg.linear_num_value_heads and cfg.linear_key_head_dim == cfg.linear_value_head_dim == 128:
        nt, nv = math.ceil(M / 64) + 16, cfg.linear_num_value_heads // tp
        per_tile = 3 * 64 * 128 * 2 + 128 * 128 * 2 + 64 * 4  # W, U, uc; state; gate cumsum
        assert dev.gdn_fla_scratch == nt * nv * per_tile
    # Nothing grows by being split.
    for field, nbytes in dev.as_dict().items():
        assert nbytes <= getattr(full, field), field


@pytest.mark.parametrize("name", jaxarena.presets())
def test_tp1_is_the_identity(name):
    cfg = ModelConfig.preset(name)
    assert cfg.shard() == cfg
    assert _sizes(cfg.shard(tp=1, ep=1)) == _sizes(cfg)


def test_kv_heads_and_groups_replicate_below_tp():
    cfg = ModelConfig.preset("nemotron-3-nano-30b-a3b")  # 2 KV heads, 8 Mamba groups
    assert cfg.num_key_value_heads == 2 and cfg.n_groups == 8
    local = cfg.shard(tp=8)
    assert (local.num_key_value_heads, local.n_groups, local.mamba_num_heads) == (1, 1, 8)
    mamba = ModelConfig.preset("mamba2-2.7b")  # one group, replicated on every device
    assert mamba.n_groups == 1
    for tp in (2, 4, 8, 16):
        assert mamba.shard(tp=tp).n_groups == 1


# -- errors --------------------------------------------------------------------------------------


def _small(**kw) -> ModelConfig:
    base = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                intermediate_size=128, vocab_size=96)  # fmt: skip
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "cfg, tp, field",
    [
        (ModelConfig.preset("qwen3-8b"), 3, "num_attention_heads=32"),
        (_small(intermediate_size=100), 8, "intermediate_size=100"),
        (_small(num_attention_heads=24, num_key_value_heads=3), 4, "num_key_value_heads=3"),
        (_small(num_attention_heads=12, num_key_value_heads=6), 4, "num_key_value_heads=6"),
        (
            _small(shared_expert_intermediate_size=36, num_experts=4, moe_intermediate_size=32),
            8,
            "shared_expert_intermediate_size=36",
        ),
        (_small(num_experts=4, moe_intermediate_size=20), 8, "moe_intermediate_size=20"),
        (
            _small(
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=8,
                linear_value_head_dim=8,
            ),
            4,
            "linear_num_key_heads=2",
        ),
        (
            _small(mamba_num_heads=6, mamba_head_dim=8, ssm_state_size=8, n_groups=3),
            2,
            "n_groups=3",
        ),
        (
            _small(mamba_num_heads=12, mamba_head_dim=8, ssm_state_size=8, n_groups=3),
            4,
            "n_groups=3",
        ),
        (
            _small(mamba_num_heads=6, mamba_head_dim=8, ssm_state_size=8, n_groups=1),
            4,
            "mamba_num_heads=6",
        ),
    ],
)
def test_uneven_split_is_a_config_error_naming_the_field(cfg, tp, field):
    with pytest.raises(ConfigError) as e:
        cfg.shard(tp=tp)
    assert field in str(e.value) and f"tp={tp}" in str(e.value)


def test_every_uneven_field_is_reported_at_once():
    cfg = _small(num_attention_heads=12, num_key_value_heads=12, intermediate_size=100)
    with pytest.raises(ConfigError) as e:
        cfg.shard(tp=8)
    msg = str(e.value)
    for field in ("num_attention_heads=12", "num_key_value_heads=12", "intermediate_size=100"):
        assert field in msg


def test_error_names_the_preset_file():
    with pytest.raises(ConfigError, match=r"qwen3-8b\.json"):
        ModelConfig.preset("qwen3-8b").shard(tp=3)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2", None])
@pytest.mark.parametrize("arg", ["tp", "ep", "vocab_multiple"])
def test_parallel_degrees_must_be_positive_ints(arg, bad):
    with pytest.raises(ConfigError, match=f"{arg}="):
        _small(num_experts=4, moe_intermediate_size=32).shard(**{arg: bad})


# -- expert parallelism ---------------------------------------------------------------------------


def test_ep_keeps_experts_whole_and_the_router_global():
    cfg = ModelConfig.preset("qwen3-30b-a3b")  # 128 experts, top-8, moe_intermediate 768
    local = cfg.shard(tp=4, ep=4)
    # EP replaces TP for the expert weights; the router still scores all 128 experts.
    assert local.moe_intermediate_size == cfg.moe_intermediate_size
    assert local.num_experts == cfg.num_experts
    assert local.num_experts_per_tok == cfg.num_experts_per_tok
    assert local.intermediate_size == cfg.intermediate_size // 4
    assert local.num_attention_heads == cfg.num_attention_heads // 4
    assert experts_per_device(cfg, ep=4) == cfg.num_experts // 4
    dev, full = _sizes(local), _sizes(cfg)
    assert dev.gate_logits == full.gate_logits == M * cfg.num_experts * 2
    k_max = _ceil16(max(M, 3))
    top_k, moe_i = cfg.num_experts_per_tok, cfg.moe_intermediate_size
    assert dev.expert_gate_out == k_max * max(top_k * moe_i, cfg.intermediate_size // 4) * 2
    assert dev.expert_down_out == full.expert_down_out
    # With ep == 1 the experts are TP-split instead.
    assert cfg.shard(tp=4).moe_intermediate_size == moe_i // 4
    # EP allows expert widths that TP could not split.
    odd = _small(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=20)
    assert odd.shard(tp=8, ep=8).moe_intermediate_size == 20


@pytest.mark.parametrize(
    "cfg, ep, needle",
    [
        (ModelConfig.preset("qwen3-30b-a3b"), 3, "num_experts=128 is not divisible by ep=3"),
        (ModelConfig.preset("qwen3-8b"), 2, "ep=2 needs a model with routed experts"),
    ],
)
def test_ep_errors(cfg, ep, needle):
    with pytest.raises(ConfigError, match=needle):
        cfg.shard(ep=ep)
    with pytest.raises(ConfigError, match=needle):
        experts_per_device(cfg, ep=ep)


def test_experts_per_device_of_a_dense_model_is_zero():
    assert experts_per_device(ModelConfig.preset("qwen3-8b")) == 0


# -- vocabulary padding ---------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(
    vocab=st.integers(0, 300_000),
    tp=st.sampled_from([1, 2, 3, 4, 8, 16]),
    multiple=st.sampled_from([1, 64, 128]),
)
def test_vocab_is_padded_to_a_multiple_then_split(vocab, tp, multiple):
    cfg = ModelConfig(hidden_size=64, vocab_size=vocab)  # nothing else to split
    per_dev = cfg.shard(tp=tp, vocab_multiple=multiple).vocab_size
    padded = per_dev * tp
    assert padded >= vocab and padded % (multiple * tp) == 0
    assert padded - vocab < multiple * tp  # the least such padding


def test_vocab_padding_examples():
    assert _small(vocab_size=32001).shard(tp=4).vocab_size == 8001
    assert _small(vocab_size=32001).shard(tp=8, vocab_multiple=128).vocab_size == 4096
    assert _small(vocab_size=32000).shard(tp=8).vocab_size == 4000


# -- property: split or error, by the written rules ------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(
    kv=st.integers(1, 16),
    group=st.integers(1, 4),
    hd=st.sampled_from([8, 64, 128]),
    inter=st.integers(1, 64).map(lambda i: 16 * i),
    gated=st.booleans(),
    tp=st.sampled_from([1, 2, 3, 4, 6, 8]),
    m=st.integers(1, 40),
)
def test_attention_split_property(kv, group, hd, inter, gated, tp, m):
    cfg = _small(num_attention_heads=kv * group, num_key_value_heads=kv, head_dim=hd,
                 intermediate_size=inter, attn_gated=gated)  # fmt: skip
    if not _splits(cfg, tp):
        with pytest.raises(ConfigError):
            cfg.shard(tp=tp)
        return
    local = cfg.shard(tp=tp)
    assert local.num_attention_heads * tp == cfg.num_attention_heads
    assert local.num_key_value_heads == _per_device_heads(kv, tp)
    # Every device's query heads read KV heads it holds.
    assert local.num_attention_heads % local.num_key_value_heads == 0
    q_mul = 2 if gated else 1
    dev = _sizes(local, m)
    assert (
        dev.qkv_output
        == _ceil16(m) * ((kv * group // tp) * q_mul + 2 * _per_device_heads(kv, tp)) * hd * 2
    )
    assert dev.attn_output == m * (kv * group // tp) * hd * 2


# -- scaling table -------------------------------------------------------------------------------


def _table(cfg, tp, ep=1):
    return scaling_table(cfg, tp=tp, ep=ep, max_batch_tokens=M, max_seq_len=SEQ,
                         kv_block_size=KV_BLOCK, max_batch_size=BATCH, levers=LEVERS,
                         target=TARGET)  # fmt: skip


def test_scaling_table_columns_come_from_buffer_sizes():
    cfg = ModelConfig.preset("qwen3-8b")
    rows = _table(cfg, 8)
    full, dev = _sizes(cfg).as_dict(), _sizes(cfg.shard(tp=8)).as_dict()
    assert [r.name for r in rows] == list(full)
    assert {r.name: r.global_bytes for r in rows} == full
    assert {r.name: r.device_bytes for r in rows} == dev
    kinds = {r.name: r.kind for r in rows}
    # 8 KV heads over 8 devices: QKV, attention output, dense FFN and logits all scale 1/tp.
    for name in ("qkv_output", "attn_output", "expert_gate_out", "logits", "ffn_gate_up_fused"):
        assert kinds[name] == "1/tp", name
    for name in ("hidden_states", "residual", "norm_output", "moe_output", "scratch"):
        assert kinds[name] == "replicated", name
    assert kinds["ssd_scratch"] == "absent"
    by_name = {r.name: r for r in rows}
    assert by_name["qkv_output"].ratio == pytest.approx(1 / 8)
    assert by_name["hidden_states"].ratio == 1.0


def test_scaling_table_replicated_kv_heads_scale_partially():
    rows = {r.name: r for r in _table(ModelConfig.preset("qwen3-next-80b-a3b"), 8)}
    # 2 KV heads over 8 devices: each keeps one, so QKV shrinks by less than 8x.
    assert rows["qkv_output"].kind == "partial"
    assert 1 / 8 < rows["qkv_output"].ratio < 1
    assert rows["gdn_fla_scratch"].kind == "1/tp"
    assert rows["gate_logits"].kind == "replicated"


def test_format_scaling_table():
    rows = _table(ModelConfig.preset("qwen3-8b"), 4)
    text = format_scaling_table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["buffer", "global", "per", "device", "ratio", "scales"]
    assert lines[-1].startswith("total")
    listed = {line.split()[0] for line in lines[2:-1]}
    assert listed == {r.name for r in rows if r.kind != "absent"}


def test_buffer_scaling_kinds():
    assert BufferScaling("a", 0, 0, 4).kind == "absent"
    assert BufferScaling("a", 0, 0, 4).ratio == 1.0
    assert BufferScaling("a", 800, 200, 4).kind == "1/tp"
    assert BufferScaling("a", 800, 300, 4).kind == "partial"
    assert BufferScaling("a", 800, 800, 4).kind == "replicated"


def test_public_names_have_docstrings():
    from jaxarena._config import shard
    from jaxarena._sizing import scaling

    for module in (shard, scaling):
        for name in module.__all__:
            assert (getattr(module, name).__doc__ or "").strip(), f"{module.__name__}.{name}"
    assert dataclasses.is_dataclass(BufferScaling)
