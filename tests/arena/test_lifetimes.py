"""Lifetimes: the value type, lower bounds, merging, the standard table and recording from a
traced step."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

import jaxarena
from jaxarena import (
    ArenaError,
    ArenaPlan,
    BufferSizes,
    ConfigError,
    Interval,
    Levers,
    Lifetimes,
    ModelConfig,
    Target,
    record_lifetimes,
)
from jaxarena._arena.schedule import LAYER_PHASES, MODES, standard_schedule

FIELDS = [f.name for f in dataclasses.fields(BufferSizes)]
GB10 = Target.preset("gb10")


def iv(mode, start, end):
    return Interval(mode, start, end)


# -- the value type ----------------------------------------------------------------------------


def test_intervals_are_sorted_merged_and_the_value_is_hashable():
    a = Lifetimes(
        {"x": [("m", 6, 7), ("m", 2, 4), ("m", 0, 2), ("n", 1, 2)], "never": []},
        num_steps={"m": 8, "n": 3},
    )
    # [0, 2) and [2, 4) touch: one interval [0, 4). Modes sort by name.
    assert a.live["x"] == (iv("m", 0, 4), iv("m", 6, 7), iv("n", 1, 2))
    assert a.live["never"] == ()
    same = Lifetimes(
        {"never": (), "x": [("n", 1, 2), ("m", 0, 4), ("m", 6, 7), ("m", 1, 3)]},
        num_steps={"n": 3, "m": 8},
    )
    assert a == same and hash(a) == hash(same)
    assert a != Lifetimes({"x": [("m", 0, 4)]}, num_steps={"m": 8, "n": 3})
    assert a.modes == ("m", "n") and dict(a.num_steps) == {"m": 8, "n": 3}
    assert "x" in a and "never" in a and "other" not in a


def test_num_steps_defaults_to_the_last_end_of_each_mode():
    lt = Lifetimes({"a": [("decode", 0, 3)], "b": [("prefill", 2, 9), ("decode", 1, 5)]})
    assert dict(lt.num_steps) == {"decode": 5, "prefill": 9}


def test_invalid_lifetimes_report_every_problem_at_once():
    with pytest.raises(ArenaError) as err:
        Lifetimes(
            {
                "": [("m", 0, 1)],
                "back": [("m", 3, 3)],
                "neg": [("m", -1, 2)],
                "shape": [("m", 0)],
                "late": [("m", 0, 99)],
                "ghost": [("other", 0, 1)],
            },
            num_steps={"m": 10},
        )
    msg = str(err.value)
    for needle in ("''", "back", "neg", "shape", "late", "ghost", "ends past", "not in num_steps"):
        assert needle in msg, needle
    with pytest.raises(ArenaError, match="at least one mode"):
        Lifetimes({})
    with pytest.raises(ArenaError, match="must be an int >= 1"):
        Lifetimes({}, num_steps={"m": 0})
    with pytest.raises(ArenaError, match="labels"):
        Lifetimes({}, num_steps={"m": 2}, step_labels={"m": ["one"]})
    with pytest.raises(ArenaError, match="mapping"):
        Lifetimes([("a", 0, 1)])


def test_conflicts_are_half_open_per_mode_and_unknown_means_always_live():
    lt = Lifetimes(
        {
            "a": [("m", 0, 2)],
            "b": [("m", 2, 4)],
            "c": [("m", 1, 3)],
            "d": [("n", 0, 5)],
            "never": [],
        },
        num_steps={"m": 4, "n": 5},
    )
    assert not lt.conflicts("a", "b")  # a ends at 2, b starts at 2
    assert lt.conflicts("a", "c") and lt.conflicts("b", "c")
    assert not lt.conflicts("a", "d")  # different modes never run together
    assert lt.common_step("a", "c") == iv("m", 1, 2)
    # An unknown buffer is live at every step of every mode.
    assert lt.intervals("unknown") == (iv("m", 0, 4), iv("n", 0, 5))
    assert all(lt.conflicts("unknown", n) for n in "abcd")
    assert not lt.conflicts("unknown", "never")


# -- lower bound -------------------------------------------------------------------------------


def test_lower_bound_by_hand():
    #   step:     0    1    2    3
    #   a 1000  [=========)              -> 1024 at align 256
    #   b  300       [=========)         -> 512
    #   c 2000                 [====)    -> 2048
    #   d  100  (never live)
    # step 0: 1024, step 1: 1536, step 2: 512, step 3: 2048 -> peak 2048 at step 3.
    lt = Lifetimes(
        {"a": [("m", 0, 2)], "b": [("m", 1, 3)], "c": [("m", 3, 4)], "d": []},
        num_steps={"m": 4},
        step_labels={"m": ["s0", "s1", "s2", "s3"]},
    )
    sizes = {"a": 1000, "b": 300, "c": 2000, "d": 100, "zero": 0}
    peak = lt.peak(sizes)
    assert (peak.bytes, peak.mode, peak.step, peak.names) == (2048, "m", 3, ("c",))
    assert lt.label("m", 3) == "s3"
    assert lt.lower_bound_bytes(sizes, align_bytes=1) == 2000
    # Guard band 100, align 1: a 1100, b 400, c 2100: step 1 holds 1500, step 3 holds 2100.
    assert lt.lower_bound_bytes(sizes, align_bytes=1, guard_bytes=100) == 2100
    # Unknown buffers ("e") are live at every step.
    assert lt.lower_bound_bytes({**sizes, "e": 256}) == 2048 + 256
    with pytest.raises(ArenaError, match="power of two"):
        lt.lower_bound_bytes(sizes, align_bytes=3)


def test_lower_bound_is_the_max_over_modes():
    lt = Lifetimes({"p": [("prefill", 0, 1)], "d": [("decode", 0, 1)], "h": [("prefill", 0, 1),
                   ("decode", 0, 1)]})  # fmt: skip
    sizes = {"p": 4096, "d": 1024, "h": 256}
    peak = lt.peak(sizes)
    assert (peak.bytes, peak.mode) == (4096 + 256, "prefill")
    assert set(peak.names) == {"p", "h"}


# -- merging -----------------------------------------------------------------------------------


def test_merge_unites_modes_and_refuses_different_step_counts():
    dec = Lifetimes({"a": [("decode", 0, 2)], "b": [("decode", 1, 3)]})
    pre = Lifetimes({"a": [("prefill", 0, 5)], "c": [("prefill", 2, 4)]})
    both = dec | pre
    assert both.modes == ("decode", "prefill")
    assert both.live["a"] == (iv("decode", 0, 2), iv("prefill", 0, 5))
    # b is known (decode only): dead in prefill, so it never conflicts with c.
    assert not both.conflicts("b", "c") and both.conflicts("a", "c")
    more = dec | Lifetimes({"a": [("decode", 2, 3)]})
    assert more.live["a"] == (iv("decode", 0, 3),)
    with pytest.raises(ArenaError, match="num_steps"):
        dec | Lifetimes({"a": [("decode", 0, 7)]})


# -- recording ---------------------------------------------------------------------------------


def test_from_events_rules_by_hand():
    events = [
        ("view", "in"),  # 0: an input: live from 0
        ("write", "h"),  # 1
        ("view", "h"),  # 2
        ("write", "h"),  # 3: h's first value died after step 2
        ("view", "in"),  # 4
        ("write", "w"),  # 5: two writes, no view between: one interval
        ("write", "w"),  # 6
        ("view", "w"),  # 7
        ("view", "h"),  # 8
        ("write", "out"),  # 9: never viewed: live to the end
        ("write", "keep"),  # 10
        ("view", "keep"),  # 11: viewed, but the caller reads it (live_out)
    ]
    lt = Lifetimes.from_events(events, mode="decode", live_out=["keep"])
    assert dict(lt.num_steps) == {"decode": 12}
    assert dict(lt.live) == {
        "in": (iv("decode", 0, 5),),
        "h": (iv("decode", 1, 9),),  # [1, 3) then [3, 9): they touch, so they merge
        "w": (iv("decode", 5, 8),),
        "out": (iv("decode", 9, 12),),
        "keep": (iv("decode", 10, 12),),
    }
    assert lt.label("decode", 3) == "write h"
    with pytest.raises(ArenaError, match="kind"):
        Lifetimes.from_events([("read", "x")], mode="decode")


def test_from_events_leaves_a_gap_between_values():
    # h's first value is read last at step 1; its next value is written at step 3: step 2 is
    # free for another buffer.
    events = [("write", "h"), ("view", "h"), ("write", "t"), ("write", "h"), ("view", "h"),
              ("view", "t")]  # fmt: skip
    lt = Lifetimes.from_events(events, mode="m")
    assert lt.live["h"] == (iv("m", 0, 2), iv("m", 3, 5))
    assert lt.live["t"] == (iv("m", 2, 6),)


SIZES = {"x": 1024, "h": 1024, "tmp": 1024, "out": 1024, "untouched": 256}


def _step(plan, arena):
    x = plan.view(arena, "x", (256,), jnp.float32)  # 0: input
    arena = plan.write(arena, "h", x * 2)  # 1
    h = plan.view(arena, "h", (256,), jnp.float32)  # 2
    arena = plan.write(arena, "tmp", h + 1)  # 3
    t = plan.view(arena, "tmp", (256,), jnp.float32)  # 4
    arena = plan.write(arena, "out", t * h)  # 5: the caller reads it
    return arena


EXPECTED = {
    "x": (iv("decode", 0, 1),),
    "h": (iv("decode", 1, 3),),
    "tmp": (iv("decode", 3, 5),),
    "out": (iv("decode", 5, 6),),
}


def test_record_lifetimes_from_a_small_traced_step():
    plan = ArenaPlan.sequential(SIZES)
    arena = jax.ShapeDtypeStruct(plan.arena_shape, jnp.uint8)
    lt = record_lifetimes(functools.partial(_step, plan), arena, mode="decode")
    assert dict(lt.live) == EXPECTED  # "untouched" is not named: live always
    assert dict(lt.num_steps) == {"decode": 6}
    assert [lt.label("decode", i) for i in range(6)] == [
        "view x", "write h", "view h", "write tmp", "view tmp", "write out"
    ]  # fmt: skip


def test_record_lifetimes_retraces_cached_and_nested_jits():
    plan = ArenaPlan.sequential(SIZES)
    arena = plan.allocate()
    jitted = jax.jit(functools.partial(_step, plan))
    jitted(arena)  # now in JAX's trace cache: a plain trace would emit no events
    assert dict(record_lifetimes(jitted, arena, mode="decode").live) == EXPECTED

    inner = jax.jit(functools.partial(_step, plan))
    inner(arena)

    def outer(a):
        return inner(a)

    assert dict(record_lifetimes(outer, arena, mode="decode").live) == EXPECTED


def test_record_lifetimes_unrolls_loops():
    plan = ArenaPlan.sequential({"h": 1024, "t": 1024})

    def layer(_, arena):
        h = plan.view(arena, "h", (256,), jnp.float32)
        arena = plan.write(arena, "t", h + 1)
        return plan.write(arena, "h", plan.view(arena, "t", (256,), jnp.float32))

    lt = record_lifetimes(lambda a: jax.lax.fori_loop(0, 3, layer, a), plan.allocate(), mode="m")
    # 4 events per layer, 3 layers; t lives 2 steps in each layer.
    assert dict(lt.num_steps) == {"m": 12}
    assert lt.live["t"] == (iv("m", 1, 3), iv("m", 5, 7), iv("m", 9, 11))
    assert lt.live["h"] == (iv("m", 0, 1), iv("m", 3, 5), iv("m", 7, 9), iv("m", 11, 12))


# -- the standard table ------------------------------------------------------------------------


@pytest.mark.parametrize("name", jaxarena.presets())
def test_standard_table_names_every_buffer_in_every_mode(name):
    cfg = ModelConfig.preset(name)
    lt = Lifetimes.standard(cfg)
    phases = standard_schedule(cfg)
    assert set(lt.live) == set(FIELDS)
    assert lt.modes == tuple(sorted(MODES))
    assert all(lt.num_steps[m] == len(phases) for m in MODES)
    assert [lt.label("decode", i) for i in range(len(phases))] == list(phases)
    whole = tuple(iv(m, 0, len(phases)) for m in sorted(MODES))
    for persistent in ("hidden_states", "residual", "scratch", "norm_unit_w", "token_ids"):
        assert lt.live[persistent] == whole, persistent
    for transient in ("attn_output", "expert_gate_out", "logits", "norm_output", "ssm_ba"):
        assert lt.live[transient] and lt.live[transient] != whole, transient


def test_standard_modes_separate_prefill_and_decode_scratch():
    cfg = ModelConfig.preset("qwen3-next-80b-a3b")  # attention + GDN + MoE
    lt = Lifetimes.standard(cfg)
    modes = {n: {i.mode for i in lt.live[n]} for n in FIELDS}
    for prefill_only in ("gdn_fla_scratch", "ssd_scratch", "qsa_select_scratch", "fp8_act",
                         "moe_fp8_scratch", "ffn_act_q8"):  # fmt: skip
        assert modes[prefill_only] == {"prefill", "verify"}, prefill_only
    for decode_only in ("splitk_workspace", "ffn_gate_up_fused"):
        assert modes[decode_only] == {"decode", "verify"}, decode_only
    assert not lt.conflicts("gdn_fla_scratch", "splitk_workspace")
    assert not lt.conflicts("expert_gate_out", "qkv_output")
    assert lt.conflicts("expert_gate_out", "expert_up_out")


def test_standard_intervals_by_hand():
    # qwen3-8b: attention layers only, so one block: upload, embed, attn.<14 phases>, epilogue.
    cfg = ModelConfig.preset("qwen3-8b")
    phases = standard_schedule(cfg)
    assert phases == ("upload", "embed", *(f"attn.{p}" for p in LAYER_PHASES),
                      "final_norm", "lm_head", "mtp_propose")  # fmt: skip
    lt = Lifetimes.standard(cfg)
    # proj_in is step 4, mix step 6; quant_in 3, o_proj 8; final_norm 16, lm_head 17.
    assert lt.live["qkv_output"] == tuple(iv(m, 4, 7) for m in sorted(MODES))
    assert lt.live["fp8_act"] == tuple(
        iv(m, s, e) for m in ("prefill", "verify") for s, e in ((3, 5), (6, 9), (16, 18))
    )
    assert lt.live["logits"] == tuple(iv(m, 17, 19) for m in sorted(MODES))

    # A hybrid gets an attention block then an SSM block; a pure SSM model only the latter.
    hybrid = standard_schedule(ModelConfig.preset("qwen3-next-80b-a3b"))
    assert hybrid[2] == "attn.pre_norm" and hybrid[2 + len(LAYER_PHASES)] == "ssm.pre_norm"
    mamba = standard_schedule(ModelConfig.preset("mamba2-2.7b"))
    assert not any(p.startswith("attn.") for p in mamba)
    ssd = Lifetimes.standard(ModelConfig.preset("mamba2-2.7b")).live["ssd_scratch"]
    mix = mamba.index("ssm.mix")
    assert ssd == (iv("prefill", mix, mix + 1), iv("verify", mix, mix + 1))
    with pytest.raises(ConfigError, match="config must be a ModelConfig"):
        Lifetimes.standard("qwen3-8b")


def test_standard_lower_bound_is_below_the_sequential_total():
    cfg = ModelConfig.preset("qwen3-30b-a3b")
    sizes = BufferSizes.from_config(cfg, 2048, 131072, 16, 64, levers=Levers(), target=GB10)
    lt = Lifetimes.standard(cfg)
    seq = ArenaPlan.sequential(sizes)
    lower = lt.lower_bound_bytes(sizes)
    assert 0 < lower < seq.total_bytes
    # No lifetimes: every buffer is live always, and the bound is the sum of the footprints.
    assert seq.lower_bound_bytes == sum(-(-b // 256) * 256 for b in sizes.as_dict().values())
