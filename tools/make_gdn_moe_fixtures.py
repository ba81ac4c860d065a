"""Build the tiny Gated DeltaNet + MoE checkpoint fixtures and transformers' references.

Same environment and ``reference.npz`` contents as ``tools/make_moe_fixtures.py`` (the GDN
weights as ``tools/make_gdn_fixtures.py`` draws them, the prompts built without router
near-ties and the router margins as the MoE script records them); run from the repository
root::

    /work/venv-torch/bin/python tools/make_gdn_moe_fixtures.py [--only NAME]

Fixtures (under ``tests/fixtures/checkpoints/``):

* ``qwen3_next_moe``: ``Qwen3NextForCausalLM``, layers ``[linear_attention,
  full_attention]``; ``mlp_only_layers=[1]`` makes layer 0 a ``Qwen3NextSparseMoeBlock`` (8
  experts of width 32, top-2, ``norm_topk_prob=False``: the weights are the top-2
  softmax probabilities as they are; a shared expert of width 64 behind its sigmoid gate)
  and layer 1 a dense SwiGLU MLP. The GDN has one key head and two value heads of 128 (its
  fused projections interleaved per key-head group). Per-expert tensor names, as
  ``save_pretrained`` writes them.
* ``qwen3_5_moe``: ``Qwen3_5MoeForCausalLM`` (``model_type = "qwen3_5_moe_text"``), same
  layers, both followed by the sparse MoE block (every Qwen3.5-MoE layer is; the router
  always renormalises). Its experts are rewritten FUSED after saving
  (``mlp.experts.gate_up_proj [E, 2 * 32, 64]``, ``mlp.experts.down_proj [E, 64, 32]``, the
  layout of the modules' own parameters), and the references come from transformers
  loading that fused checkpoint; the script checks it computes what the per-expert one did.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402
import make_moe_fixtures as mm  # noqa: E402
from make_gdn_fixtures import _perturb_gdn  # noqa: E402

OFFSET = 120  # seeds apart from the other fixture scripts
_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    layer_types=["linear_attention", "full_attention"],
    full_attention_interval=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=1,
    linear_key_head_dim=128,
    linear_num_value_heads=2,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=64,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    initializer_range=mf.INIT_RANGE,
    **mf.NO_SPECIAL,
)


def _qwen3_next_moe_config() -> Qwen3NextConfig:
    return Qwen3NextConfig(
        **_COMMON,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=False,
        partial_rotary_factor=0.25,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def _qwen3_5_moe_config() -> Qwen3_5MoeTextConfig:
    return Qwen3_5MoeTextConfig(
        **_COMMON,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },  # fmt: skip
    )


FAMILIES = {
    "qwen3_next_moe": (Qwen3NextForCausalLM, _qwen3_next_moe_config),
    "qwen3_5_moe": (Qwen3_5MoeForCausalLM, _qwen3_5_moe_config),
}
FUSED = ("qwen3_5_moe",)


def _fuse_experts(path: Path, num_experts: int) -> None:
    """Rewrites `model.safetensors` with each layer's experts as `experts.gate_up_proj`
    (gate rows, then up rows) and `experts.down_proj`, stacked over the experts."""
    file = path / "model.safetensors"
    with safe_open(str(file), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    out, moes = {}, set()
    for key, value in state.items():
        if ".experts." in key:
            moes.add(key.split(".experts.")[0])
        else:
            out[key] = value.contiguous()
    for moe in sorted(moes):
        gate, up, down = (
            torch.stack([state[f"{moe}.experts.{j}.{name}.weight"] for j in range(num_experts)])
            for name in ("gate_proj", "up_proj", "down_proj")
        )
        out[f"{moe}.experts.gate_up_proj"] = torch.cat([gate, up], 1)
        out[f"{moe}.experts.down_proj"] = down
    save_file(out, str(file), metadata={"format": "pt"})


@torch.no_grad()
def _quiet_run(model, routers: mm._Routers, seq: list[int]) -> int:
    """How many of the greedy steps after `seq` (teacher-forced float32 argmax) come before
    the first router margin below `QUIET_MARGIN` at the last prompt position or later."""
    full = list(seq)
    for _ in range(mf.MAX_NEW_TOKENS - 1):
        logits = model(input_ids=torch.tensor([full]), use_cache=False).logits[0, -1]
        full.append(int(logits.argmax()))
    quiet = routers.margins(model, full)[0].min(0)[len(seq) - 1 :] >= mm.QUIET_MARGIN
    return int(np.cumprod(quiet).sum())


def _quiet_prompts(model, routers: mm._Routers, offset: int, draws: int = 64) -> list[list[int]]:
    """`make_moe_fixtures._quiet_prompts` with a longer quiet stretch: every token but the
    last is its first draw without a near-tie, as there; the last is, of up to `draws` such
    draws, the one whose greedy continuation stays quiet longest (stopping at a fully quiet
    one), so that the greedy comparison keeps most decode steps."""
    rng = np.random.default_rng(mf.SEED + 2000 + offset)
    vocab, prompts = model.config.vocab_size, []
    for n in mf.PROMPT_LENGTHS:
        p: list[int] = []
        while len(p) < n:
            best, best_run, tries = None, -1, 0
            while tries < (draws if len(p) == n - 1 else 1):
                for _ in range(1000):
                    tok = int(rng.integers(0, vocab))
                    if routers.margins(model, p + [tok])[0][:, -1].min() >= mm.QUIET_MARGIN:
                        break
                else:
                    raise RuntimeError(f"no token continues {p} without a router near-tie")
                tries += 1
                run = _quiet_run(model, routers, p + [tok]) if len(p) == n - 1 else 0
                if run > best_run:
                    best, best_run = tok, run
                if best_run == mf.MAX_NEW_TOKENS:
                    break
            p.append(best)
        prompts.append(p)
    return prompts


def _make(name: str, offset: int, out: Path) -> dict[str, np.ndarray]:
    cls, make_config = FAMILIES[name]
    gen = mf._seed(offset)
    model = cls(make_config())
    _perturb_gdn(model, gen)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    path = out / name
    mf._save(model, path)
    if name in FUSED:
        per_expert = mf._load_f32(cls, path).eval()
        _fuse_experts(path, model.config.num_experts)
        fused = mf._load_f32(cls, path).eval()
        ids = torch.arange(16)[None] * 7 % model.config.vocab_size
        with torch.no_grad():
            a, b = per_expert(input_ids=ids).logits, fused(input_ids=ids).logits
        assert torch.equal(a, b), f"fused experts change the logits by {(a - b).abs().max()}"
    model = mf._load_f32(cls, path).eval()
    routers = mm._Routers(model)
    result = mf._reference(model, _quiet_prompts(model, routers, offset))
    return result | mm._router_margins(model, routers, result)


def build(out: Path, only: str | None = None) -> None:
    """Writes every GDN + MoE fixture (or only `only`) under `out`."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for offset, name in enumerate(FAMILIES, start=OFFSET):
        if only and name != only:
            continue
        ref = _make(name, offset, out)
        mf._write_npz(out / name / "reference.npz", ref)
        margins = np.concatenate([ref[k].ravel() for k in ref if k.startswith("router_margin")])
        cfg = json.loads((out / name / "config.json").read_text())
        print(f"{name} ({cfg['model_type']}): max|logit| "
              f"{max(np.abs(ref[f'prefill_logits_{i}']).max() for i in range(4)):.3f}, "
              f"min top-2 gap {ref['greedy_top2_gap'].min():.4f}, router |logit| max "
              f"{float(ref['router_logit_absmax']):.3f}, smallest router margins "
              f"{np.sort(margins)[:4]}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent.parent / "tests" / "fixtures"
                        / "checkpoints")  # fmt: skip
    parser.add_argument("--only", choices=sorted(FAMILIES))
    args = parser.parse_args()
    build(args.out, args.only)


if __name__ == "__main__":
    main()
