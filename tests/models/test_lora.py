"""LoRA adapters on a loaded checkpoint (`load_pretrained(..., max_lora_rank, max_loras)`,
`CausalLM.load_lora`) against transformers + peft (tests/fixtures/lora, made by
tools/make_lora_fixtures.py), a batch mixing three adapters and the base model, the arena's
`lora_*` buffers, and bad adapters.

Tolerance: test_pretrained.py's derivation (`atol = 4 u sqrt(n / 3) max|z|`) with the LoRA
path's roundings added to n: per adapted module the shrink output (`lora_xa`) and the expand
output (`lora_delta`), and per adapted projection output the sum with the base output (the
fused q/k/v output once). The `all` adapter (every module, 2 layers) adds 2 (7 * 2 + 5) = 38.
Greedy tokens are compared where transformers' top-2 gap exceeds 2 atol and the earlier
tokens agree, as there.
"""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
from lm_runs import CHECKPOINTS, FAST_CPU_COMPILE, LIMITS, NEW_TOKENS, reference
from test_pretrained import U_BF16, decided_and_same_context, max_abs_logit

from jaxarena import ArenaPlan, BufferSizes, ModelConfig
from jaxarena.models import load_pretrained
from jaxarena.models.lora import LoraError, read_adapter

LORA = CHECKPOINTS.parent / "lora"
ADAPTERS = ("all", "attn", "mlp")  # slots 0, 1, 2
MAX_RANK = 16
BASE_N = 25  # test_pretrained.py's count for qwen3 (2 layers of attention and SwiGLU)


def lora_roundings(name: str, cfg: dict, layers: int) -> int:
    mods = cfg["target_modules"]
    mods = mods if isinstance(mods, list) else [mods]
    outputs = len({"qkv" if m in ("q_proj", "k_proj", "v_proj") else m for m in mods})
    return layers * (2 * len(mods) + outputs)


def atol_for(name: str, ref) -> float:
    n = BASE_N
    if name != "base":
        cfg = json.loads((LORA / "qwen3" / name / "adapter_config.json").read_text())
        n += lora_roundings(name, cfg, 2)
    return 4 * U_BF16 * np.sqrt(n / 3) * max_abs_logit(ref)


def lora_reference(name: str):
    if name == "base":
        return reference("qwen3")
    with np.load(LORA / "qwen3" / name / "reference.npz") as r:
        ref = {k: r[k] for k in r.files}
    n = len(ref["prompt_lengths"])
    ref["prefill"] = [ref[f"prefill_logits_{i}"] for i in range(n)]
    ref["greedy_logits"] = np.stack([ref[f"greedy_logits_{i}"] for i in range(n)])
    return ref


@pytest.fixture(scope="module")
def lm():
    lm = load_pretrained(CHECKPOINTS / "qwen3", **LIMITS, compiler_options=FAST_CPU_COMPILE,
                         max_lora_rank=MAX_RANK, max_loras=3)  # fmt: skip
    for slot, name in enumerate(ADAPTERS):
        lm.load_lora(slot, LORA / "qwen3" / name)
    return lm


@pytest.fixture(scope="module")
def mixed(lm):
    """Prompt i (lengths 1, 5, 11, 16) with adapter i, the last with the base model, in one
    batch: packed prefill, then decode."""
    prompts = reference("qwen3")["prompts"]
    slots = [0, 1, 2, -1]
    tokens, logits = lm.generate(prompts, NEW_TOKENS, return_logits=True, lora_slots=slots)
    return prompts, slots, np.asarray(tokens), logits


def test_mixed_batch_matches_peft(lm, mixed):
    prompts, slots, tokens, logits = mixed
    decided = 0
    for i, slot in enumerate(slots):
        name = ADAPTERS[slot] if slot >= 0 else "base"
        ref = lora_reference(name)
        atol = atol_for(name, ref)
        assert atol < 0.3, (name, atol)  # the bound stays well below the logits' spread
        want = ref["greedy_tokens"][i : i + 1]
        same = decided_and_same_context(np.inf, tokens[i : i + 1], want, -np.inf)
        np.testing.assert_allclose(logits[i : i + 1][same], ref["greedy_logits"][i : i + 1][same],
                                   atol=atol, rtol=0, err_msg=name)  # fmt: skip
        mask = decided_and_same_context(ref["greedy_top2_gap"][i : i + 1], tokens[i : i + 1],
                                        want, 2 * atol)  # fmt: skip
        np.testing.assert_array_equal(tokens[i : i + 1][mask], want[mask], err_msg=name)
        decided += mask.sum()
        # The adapter matters: its logits are far from the base model's.
        if name != "base":
            base = reference("qwen3")["greedy_logits"][i]
            assert np.abs(ref["greedy_logits"][i] - base).max() > 4 * atol, name
    assert decided >= 0.5 * tokens.size, f"only {decided} of {tokens.size} choices decided"


@pytest.mark.parametrize("slot", [0, 1, 2, -1])
def test_prefill_logits_match_peft(lm, slot):
    name = ADAPTERS[slot] if slot >= 0 else "base"
    ref = lora_reference(name)
    atol = atol_for(name, ref)
    for i, p in enumerate(reference("qwen3")["prompts"][1:3], start=1):
        got = lm.prefill_logits(p, lora_slot=slot)
        np.testing.assert_allclose(got, ref["prefill"][i], atol=atol, rtol=0, err_msg=name)


def test_each_sequence_alone_gives_what_the_mixed_batch_gives(lm, mixed):
    """The kernels compute every row from its own slot: a sequence alone (the other rows
    padding) gives the tokens and logits it got in the mixed batch."""
    prompts, slots, tokens, logits = mixed
    for i, slot in enumerate(slots):
        alone, alone_logits = lm.generate([prompts[i]], NEW_TOKENS, return_logits=True,
                                          lora_slots=[slot])  # fmt: skip
        np.testing.assert_array_equal(alone[0], tokens[i])
        np.testing.assert_allclose(alone_logits[0], logits[i], atol=0, rtol=0)


def test_arena_holds_the_seeds_lora_buffers(lm):
    """The plan holds `lora_*` at the seed's sizes for adapter_max_rank = max_lora_rank; the
    same limits without LoRA give the same regions less those."""
    cfg = ModelConfig.from_hf(CHECKPOINTS / "qwen3" / "config.json")
    limits = (LIMITS["max_batch_tokens"], LIMITS["max_seq_len"], LIMITS["kv_block_size"],
              LIMITS["max_batch_size"])  # fmt: skip
    kw = dict(levers=lm.model.levers, target=lm.model.target)
    with_lora = BufferSizes.from_config(lm.config, *limits, **kw)
    assert lm.config.adapter_max_rank == MAX_RANK
    regions = lm.model.plan.regions
    m = LIMITS["max_batch_tokens"]
    assert regions["lora_xa"].nbytes == with_lora.lora_xa == m * MAX_RANK * 2
    assert regions["lora_delta"].nbytes == with_lora.lora_delta > 0
    assert regions["lora_hact"].nbytes == with_lora.lora_hact > 0
    assert regions["lora_seq_slot"].nbytes == with_lora.lora_seq_slot == m * 4
    plain = ArenaPlan.sequential(BufferSizes.from_config(cfg, *limits, **kw)).regions
    assert not any(k.startswith("lora_") for k in plain)
    assert {k: r.nbytes for k, r in regions.items() if not k.startswith("lora_")} == {
        k: r.nbytes for k, r in plain.items()
    }


def _write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}  # fmt: skip
        offset += len(b)
        blobs.append(b)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def test_bad_adapters_are_named(lm, tmp_path):
    layout = lm.lora
    small = type(layout)(modules=layout.modules, max_loras=3, max_rank=4)
    with pytest.raises(LoraError, match=r"rank 8 > max_lora_rank=4; load the model with max_"):
        read_adapter(LORA / "qwen3" / "all", small)
    pre = "base_model.model.model.layers.0"
    good = {f"{pre}.self_attn.q_proj.lora_A.weight": np.ones((2, 64)),
            f"{pre}.self_attn.q_proj.lora_B.weight": np.ones((64, 2))}  # fmt: skip
    cases = {
        "adapts module 'model.layers.0.mlp.experts', which this model does not have": {
            f"{pre}.mlp.experts.lora_A.weight": np.ones((2, 64)),
            f"{pre}.mlp.experts.lora_B.weight": np.ones((64, 2))},
        r"must be \[r, 64\] / \[64, r\] for model.layers.0.self_attn.q_proj": {
            **good, f"{pre}.self_attn.q_proj.lora_B.weight": np.ones((32, 2))},
        "has only lora_A": {f"{pre}.self_attn.q_proj.lora_A.weight": np.ones((2, 64))},
    }  # fmt: skip
    for i, (msg, tensors) in enumerate(cases.items()):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4}))
        _write_safetensors(d / "adapter_model.safetensors", tensors)
        with pytest.raises(LoraError, match=msg):
            read_adapter(d, layout)
    d = tmp_path / "dora"
    shutil.copytree(LORA / "qwen3" / "attn", d)
    cfg = json.loads((d / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(LoraError, match="use_dora=True is not supported"):
        read_adapter(d, layout)
    with pytest.raises(ValueError, match=r"slot=3 must be an int in \[0, max_loras=3\)"):
        lm.load_lora(3, LORA / "qwen3" / "attn")


MOE_MARGIN = 0.1  # tools/make_lora_fixtures.py's router-margin floor


def test_moe_checkpoint_prefill_matches_peft():
    """qwen3_moe (layers 0 and 2 MoE, layer 1 a dense SwiGLU MLP), adapters on the attention
    of every layer (tools/make_lora_fixtures.py: peft puts gate/up/down targets on the fused
    experts here, which are not loaded); the model still gives the dense MLP its tables.
    Prefill logits of the prompts whose router margins under
    the adapter clear the fixture's floor at every position (elsewhere bf16 may route
    another expert), within the bound: qwen3_moe's roundings as test_moe_models.py counts
    them for attention and the dense MLP, plus the LoRA path's."""
    lm = load_pretrained(CHECKPOINTS / "qwen3_moe", **LIMITS, compiler_options=FAST_CPU_COMPILE,
                         max_lora_rank=MAX_RANK, max_loras=3)  # fmt: skip
    assert {i for i, _, _ in lm.lora.modules} == {0, 2, 3, 4}  # attention x3, dense MLP
    prompts = reference("qwen3_moe")["prompts"]
    checked = 0
    for slot, name in enumerate(ADAPTERS):
        path = LORA / "qwen3_moe" / name
        lm.load_lora(slot, path)
        with np.load(path / "reference.npz") as r:
            ref = {k: r[k] for k in r.files}
        # The logits store, 3 attention blocks (2 + 4, test_pretrained.py), 2 MoE blocks
        # (2 + 5, test_moe_models.py), the dense SwiGLU MLP (2 + 4), + the LoRA path's for
        # every module the adapter holds (per block: as `lora_roundings`).
        n = 1 + 3 * 6 + 2 * 7 + 6
        for mods in read_adapter(path, lm.lora).values():
            n += lora_roundings(name, {"target_modules": sorted(mods)}, 1)
        zmax = max(np.abs(ref[f"prefill_logits_{i}"]).max() for i in range(len(prompts)))
        atol = 4 * U_BF16 * np.sqrt(n / 3) * zmax
        moved = 0.0  # how far the adapter moves the logits (k_proj alone: not on one token)
        for i, p in enumerate(prompts):
            n_p = len(p)
            if ref[f"router_margin_{i}"][:, :n_p].min() < MOE_MARGIN:
                continue
            base = reference("qwen3_moe")["prefill"][i]
            moved = max(moved, np.abs(ref[f"prefill_logits_{i}"] - base).max())
            got = lm.prefill_logits(p, lora_slot=slot)
            np.testing.assert_allclose(got, ref[f"prefill_logits_{i}"], atol=atol, rtol=0,
                                       err_msg=f"{name} prompt {i}")  # fmt: skip
            checked += 1
        assert moved > 2 * atol, (name, moved, atol)
    assert checked >= 2 * len(ADAPTERS)
