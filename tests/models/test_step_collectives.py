"""The collectives of a compiled step (issue 42 item 3, `jaxarena.step_collectives`) from HLO
text and a thunk tree, no compile: counted per step (a while body times its trip count, the
`...Done` halves not again), bytes = the operands on one device, the minimum and the link time.
The compiled paths are in tests/gpu/test_step_report_tp_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest

from jaxarena.gpu_dump import Thunk
from jaxarena.step_collectives import collective_minimum, collectives, link_seconds

_HLO = """HloModule m

%body (p: (s32[], f32[4,64])) -> (s32[], f32[4,64]) {
  %p = (s32[], f32[4,64]{1,0}) parameter(0)
  %x = f32[4,64]{1,0} get-tuple-element(%p), index=1
  %all-reduce-start.1 = f32[4,64]{1,0} all-reduce-start(%x), channel_id=2, to_apply=%add
  %all-reduce-done.1 = f32[4,64]{1,0} all-reduce-done(%all-reduce-start.1)
}

ENTRY %main (a: bf16[4,64], b: bf16[4,64], l: bf16[4,32]) -> bf16[4,128] {
  %a = bf16[4,64]{1,0} parameter(0)
  %b = bf16[4,64]{1,0} parameter(1)
  %l = bf16[4,32]{1,0} parameter(2)
  %all-reduce-start = (bf16[4,64]{1,0}, bf16[4,64]{1,0}) all-reduce-start(%a, %b), channel_id=1
  %all-gather-start = bf16[4,128]{1,0} all-gather-start(%l), channel_id=3, dimensions={1}
  ROOT %all-gather-done = bf16[4,128]{1,0} all-gather-done(%all-gather-start)
}
"""
_NAMES = {1: "all-reduce-start", 2: "all-reduce-start.1", 3: "all-gather-start",
          4: "all-gather-done", 5: "fusion"}  # fmt: skip


def _thunks(trip_count):
    loop = Thunk(10, "kWhile", sections={"condition": [], "body": [
        Thunk(2, "kAllReduceStart"), Thunk(6, "kAllReduceDone")]}, trip_count=trip_count)  # fmt: skip
    return [Thunk(1, "kAllReduce"), Thunk(5, "kKernel", "fusion"), loop,
            Thunk(3, "kNcclAllGatherStart"), Thunk(4, "kNcclAllGatherDone")]  # fmt: skip


def test_counted_per_step_with_operand_bytes():
    c = collectives(_HLO, _thunks(3), _NAMES)
    # entry: one all-reduce of two bf16[4,64] operands; the loop: 3 x f32[4,64]
    assert c["by_kind"] == {"all-gather": {"count": 1, "bytes": 4 * 32 * 2},
                            "all-reduce": {"count": 4, "bytes": 2 * 4 * 64 * 2 + 3 * 4 * 64 * 4}}  # fmt: skip
    assert (c["count"], c["bytes"], c["unknown"]) == (5, 256 + 4 * 64 * 4 * 4, 0)
    # A loop of unknown trip count: counted once, and said so.
    c = collectives(_HLO, _thunks(None), _NAMES)
    assert c["by_kind"]["all-reduce"]["count"] == 2 and c["unknown"] == 1
    # A thunk whose instruction is not in the HLO: counted, no bytes, said so.
    c = collectives(_HLO, _thunks(3), {**_NAMES, 3: "gone"})
    assert c["by_kind"]["all-gather"] == {"count": 1, "bytes": 0} and c["unknown"] == 1


def test_link_seconds_and_minimum():
    c = collectives(_HLO, _thunks(3), _NAMES)
    ar, ag = c["by_kind"]["all-reduce"]["bytes"], c["by_kind"]["all-gather"]["bytes"]
    # a ring all-reduce sends 2 (tp-1)/tp of its bytes, an all-gather (tp-1) x its piece
    assert link_seconds(c, 4, "h200") == pytest.approx((1.5 * ar + 3 * ag) / 450e9)
    assert link_seconds(c, 1, "h200") == 0.0

    @dataclasses.dataclass
    class Cfg:
        hidden_size: int = 64
        vocab_size: int = 32  # one device's share

    @dataclasses.dataclass
    class Arch:
        blocks: tuple = (0, 1, 2, 3)

    @dataclasses.dataclass
    class LM:
        config: Cfg = dataclasses.field(default_factory=Cfg)
        arch: Arch = dataclasses.field(default_factory=Arch)
        max_batch_size: int = 4
        max_batch_tokens: int = 16

    got = collective_minimum(LM(), "decode", 4)
    assert got == {"min_count": 4, "min_bytes": 4 * 4 * 64 * 2, "design_count": 6,
                   "design_bytes": 4 * 4 * 64 * 2 + 4 * 64 * 2 + 4 * 32 * 2}  # fmt: skip
    pre = collective_minimum(LM(), "prefill", 4)
    assert pre["min_bytes"] == 4 * 16 * 64 * 2 and pre["design_bytes"] == (
        4 * 16 * 64 * 2 + 16 * 64 * 2 + 5 * 32 * 2)  # fmt: skip
    assert set(collective_minimum(LM(), "decode", 1).values()) == {0}

    @dataclasses.dataclass
    class Mixer:
        kind: str = "mamba"

    # Mamba-2 with 2 groups over 4 devices: each mixer adds its norm's [rows, 2] f32 psum.
    mamba = LM(arch=Arch(blocks=(Mixer(), Mixer())))
    mamba.tp_groups = 2
    got = collective_minimum(mamba, "decode", 4)
    assert got["design_count"] == 2 + 2 + 2 and got["min_count"] == 2
    assert got["design_bytes"] == 2 * 4 * 64 * 2 + 4 * 64 * 2 + 4 * 32 * 2 + 2 * 4 * 2 * 4
    assert collective_minimum(mamba, "decode", 2)["design_count"] == 4  # groups on one device
