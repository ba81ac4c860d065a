"""The gated MLP's gate and up projections are ONE weight, `w_gate_up` (issue 39: one GEMM
for both, a decode launch fewer per layer), and so are a MoE block's shared expert's,
`s_gate_up` (one GEMM where XLA's dot merger does not join them: DeepSeek-V3 widths'
prefill): its output columns are the checkpoint's `gate_proj` then `up_proj`, bit for bit,
for bf16 weights and for FP8 ones (the e4m3 rows and the 128 x 128 block scales stacked),
on one device and on each device of a tensor-parallel split (each device's gate slice then
its up slice). Where the two cannot be one weight (`fuse_outputs`: FP8 with an output width
off the 128 block, FP8 next to float) they stay the pair `linear` runs as two GEMMs. Host
reads only: nothing is compiled.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from lm_runs import CHECKPOINTS

from jaxarena import ModelConfig
from jaxarena.models.checkpoint import fp8_spec, open_checkpoint
from jaxarena.models.core.arena import fuse_outputs, is_fp8
from jaxarena.models.families.registry import family_for
from jaxarena.models.tensor_parallel import device_slices


def _device_params(name: str, tp: int, rank: int, kind: str = "mlp"):
    """Device `rank`'s host weights of fixture `name` over `tp` devices (tp 1: the model's):
    `(checkpoint, config, [(params, prefix, block)])` of its `kind` blocks."""
    ckpt = open_checkpoint(CHECKPOINTS / name)
    raw = ckpt.config
    family = family_for(raw["model_type"], ckpt.path)
    cfg = ModelConfig.from_hf(ckpt.path / "config.json")
    arch = family.arch(raw["model_type"], raw, cfg, ckpt.path, 32)
    host, _ = device_slices(family, ckpt, fp8_spec(raw, ckpt.path), cfg, arch, tp, rank)
    names = family.tensor_names(cfg, arch)
    blocks = [(p, prefix, b) for b, p, (prefix, _) in
              zip(arch.blocks, host["layers"], names.blocks, strict=True) if b.kind == kind]  # fmt: skip
    return ckpt, cfg, blocks


def _assert_gate_then_up(w, ckpt, prefix: str, hidden: int, inter: int, cols: slice) -> None:
    """`w` (a joined bf16 weight `[hidden, 2 inter]`) is the checkpoint's `{prefix}.gate_proj`
    columns `cols` then its `up_proj` columns `cols`, bit for bit."""
    assert isinstance(w, np.ndarray) and w.shape == (hidden, 2 * inter)
    for half, proj in ((w[:, :inter], "gate_proj"), (w[:, inter:], "up_proj")):
        want = np.asarray(ckpt[f"{prefix}.{proj}.weight"])[cols].T  # [out, in] stored
        np.testing.assert_array_equal(half.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("name, tp", [("llama", 1), ("qwen3", 2), ("gemma2", 1)])
def test_w_gate_up_is_the_checkpoints_gate_then_up(name, tp):
    for rank in range(tp):
        ckpt, cfg, mlps = _device_params(name, tp, rank)
        inter = cfg.intermediate_size // tp  # this device's columns of each
        cols = slice(rank * inter, (rank + 1) * inter)
        assert mlps and all("w_gate" not in p and "w_up" not in p for p, _, _ in mlps)
        for p, prefix, _ in mlps:
            _assert_gate_then_up(p["w_gate_up"], ckpt, prefix, cfg.hidden_size, inter, cols)


def test_fp8_w_gate_up_stacks_the_rows_and_the_block_scales():
    ckpt, cfg, mlps = _device_params("qwen3_fp8", 1, 0)
    inter = cfg.intermediate_size
    assert inter % 128 == 0 and mlps
    for p, prefix, _ in mlps:
        _assert_fp8_gate_then_up(p["w_gate_up"], ckpt, prefix, cfg.hidden_size, inter)


def _assert_fp8_gate_then_up(w, ckpt, prefix: str, hidden: int, inter: int) -> None:
    """`w` (a joined FP8 weight) stacks `{prefix}.gate_proj`'s e4m3 rows and 128 x 128 scale
    blocks, then `up_proj`'s, bit for bit."""
    assert is_fp8(w) and w["w"].shape == (2 * inter, hidden)
    for k, rows in (("w", inter), ("scale_inv", inter // 128)):
        suffix = "" if k == "w" else "_" + k
        gate = np.asarray(ckpt[f"{prefix}.gate_proj.weight{suffix}"])
        up = np.asarray(ckpt[f"{prefix}.up_proj.weight{suffix}"])
        assert w[k].shape[0] == 2 * rows and w[k].dtype == gate.dtype
        np.testing.assert_array_equal(w[k][:rows].view(np.uint8), gate.view(np.uint8))
        np.testing.assert_array_equal(w[k][rows:].view(np.uint8), up.view(np.uint8))


def _fp8(out: int, inp: int, fill: int = 0) -> dict[str, np.ndarray]:
    return {"w": np.full((out, inp), fill, np.uint8).view(np.dtype("float8_e4m3fn")),
            "scale_inv": np.ones((-(-out // 128), -(-inp // 128)), np.float32)}  # fmt: skip


def test_fuse_outputs_keeps_a_pair_where_one_weight_would_be_wrong():
    # FP8 with 192 gate rows: a 128-row scale block would span the gate's last 64 rows and
    # the up's first 64, which have separate scales.
    a, b = _fp8(192, 256), _fp8(192, 256)
    pair = fuse_outputs(a, b)
    assert isinstance(pair, tuple) and pair[0] is a and pair[1] is b
    f = np.zeros((256, 192), np.float32)
    assert fuse_outputs(_fp8(128, 256), f)[1] is f  # FP8 next to float
    assert isinstance(fuse_outputs(f, f.astype(np.float16)), tuple)  # two float dtypes
    # The shapes-only reader's leaves (step-report): the joined shapes, dtypes kept.
    s = jax.ShapeDtypeStruct
    got = fuse_outputs({"w": s((256, 64), np.uint8), "scale_inv": s((2, 1), np.float32)},
                       {"w": s((256, 64), np.uint8), "scale_inv": s((2, 1), np.float32)})  # fmt: skip
    assert got == {"w": s((512, 64), np.uint8), "scale_inv": s((4, 1), np.float32)}
    assert fuse_outputs(s((64, 128), np.float16), s((64, 128), np.float16)) == s((64, 256),
                                                                                np.float16)  # fmt: skip


# DeepSeek-V2 (two shared experts: 64 = 2 x 32 wide), Qwen3-Next (`shared_expert`, with the
# sigmoid gate `s_scale` kept apart) and DeepSeek-V2 split over 2 devices.
@pytest.mark.parametrize("name, tp", [("deepseek_v2", 1), ("qwen3_next_moe", 1),
                                      ("deepseek_v2", 2)])  # fmt: skip
def test_shared_expert_s_gate_up_is_the_checkpoints_gate_then_up(name, tp):
    for rank in range(tp):
        ckpt, cfg, moes = _device_params(name, tp, rank, kind="moe")
        si = cfg.shared_expert_intermediate_size // tp  # this device's columns of each
        cols = slice(rank * si, (rank + 1) * si)
        assert moes and all("s_gate" not in p and "s_up" not in p for p, _, _ in moes)
        for p, prefix, block in moes:
            assert ("s_scale" in p) == (name == "qwen3_next_moe")
            _assert_gate_then_up(p["s_gate_up"], ckpt, f"{prefix}.{block.shared}",
                                 cfg.hidden_size, si, cols)  # fmt: skip


def test_fp8_shared_expert_stacks_the_rows_and_the_block_scales():
    ckpt, cfg, moes = _device_params("deepseek_v3_fp8", 1, 0, kind="moe")
    si = cfg.shared_expert_intermediate_size
    assert si % 128 == 0 and moes
    for p, prefix, block in moes:
        _assert_fp8_gate_then_up(p["s_gate_up"], ckpt, f"{prefix}.{block.shared}",
                                 cfg.hidden_size, si)  # fmt: skip
