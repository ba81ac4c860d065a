"""Build PEFT LoRA adapters for two tiny fixture checkpoints and transformers + peft's
reference outputs with each adapter.

Environment: a separate venv (never the project's `.venv`)::

    python3 -m venv /tmp/lora-ref
    /tmp/lora-ref/bin/pip install torch==2.13.0 "transformers==5.24.*" safetensors peft
    /tmp/lora-ref/bin/python tools/make_lora_fixtures.py   # from the repository root

Writes `tests/fixtures/lora/<checkpoint>/<adapter>/` for the checkpoints `qwen3` (dense) and
`qwen3_moe` (MoE; its adapters keep only the attention modules, see `_moe_targets`): each adapter is
`adapter_config.json` + `adapter_model.safetensors` as `PeftModel.save_pretrained` writes
them, and `reference.npz` holds the float32 outputs of transformers' model (the bf16
checkpoint loaded as float32, eager attention) with the adapter applied by peft, on the
checkpoint's own reference prompts (`tests/fixtures/checkpoints/<checkpoint>/reference.npz`),
with the keys of `tools/make_fixtures.py`'s references (and `router_margin_<i>` for the MoE
checkpoint, as `tools/make_moe_fixtures.py` writes them).

Adapters (`get_peft_model`, then A and B drawn at random, B non-zero, both rounded to bf16
values so the checkpoint's bf16 tables hold them exactly):

* `all`: every supported module (q/k/v/o_proj, gate/up/down_proj), r=8, lora_alpha=16;
* `attn`: q/v/o_proj, r=4, use_rslora (scale alpha / sqrt(r)), `rank_pattern` o_proj: 2,
  `alpha_pattern` o_proj: 4;
* `mlp`: k_proj and gate/up/down_proj, r=16 (the tests' max_lora_rank), lora_alpha=8.

On the MoE checkpoint B is drawn smaller, and an adapter is drawn again until at least
`QUIET_PROMPTS` prompts have router margins of `MOE_MARGIN` or more at every position and
MoE layer (a near-tie routes bf16 and float32 differently); `router_margin_<i>` tells the
tests which prompts those are.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402
import make_moe_fixtures as mm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {
    "all": dict(r=8, lora_alpha=16, target_modules=ALL),
    "attn": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj", "o_proj"],
                 rank_pattern={"o_proj": 2}, alpha_pattern={"o_proj": 4}),
    "mlp": dict(r=16, lora_alpha=8, target_modules=["k_proj", "gate_proj", "up_proj", "down_proj"]),
}  # fmt: skip
CHECKPOINTS = {"qwen3": Qwen3ForCausalLM, "qwen3_moe": Qwen3MoeForCausalLM}
# The B draws: deltas of the order of the base projections' outputs (dense); on the MoE
# checkpoint smaller ones, which move the routers' logits less, and a lower margin floor
# than make_moe_fixtures.py's prompts have (bf16 and float32 router logits differ by ~0.01).
B_STD = {"qwen3": 0.25, "qwen3_moe": 0.1}
MOE_MARGIN = 0.1
QUIET_PROMPTS = 2  # prompts whose every position clears MOE_MARGIN (the tests use those)


def _moe_targets(mods: list[str]) -> list[str]:
    """The attention modules of `mods`: on this MoE checkpoint peft 0.21 turns `gate_proj` /
    `up_proj` / `down_proj` targets (names or a regex) into LoRA on the routed experts' fused
    `gate_up_proj` / `down_proj` parameters (`target_parameters`), which jaxarena does not
    load, and adapts no module of the dense layer 1 MLP; so these adapters are attention
    only (the dense MLP's LoRA is checked on qwen3)."""
    return [m for m in mods if m in ALL[:4]]


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def _adapt(cls, path: Path, spec: dict, seed: int, b_std: float):
    model = mf._load_f32(cls, path).eval()
    peft_model = get_peft_model(model, LoraConfig(lora_dropout=0.0, **spec))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name:
                p.copy_(_bf16(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5))
            elif "lora_B" in name:
                p.copy_(_bf16(torch.randn(p.shape, generator=gen) * b_std))
    return peft_model.eval()


def build() -> None:
    only = sys.argv[1:] or list(CHECKPOINTS)
    for ckpt, cls in CHECKPOINTS.items():
        if ckpt not in only:
            continue
        path = ROOT / "checkpoints" / ckpt
        with np.load(path / "reference.npz") as r:
            ids, lens = r["prompt_ids"], r["prompt_lengths"]
        prompts = [ids[i, :n].tolist() for i, n in enumerate(lens)]
        for k, (name, spec) in enumerate(ADAPTERS.items()):
            out = ROOT / "lora" / ckpt / name
            if ckpt == "qwen3_moe":
                spec = {**spec, "target_modules": _moe_targets(spec["target_modules"])}
            for attempt in range(50):
                model = _adapt(cls, path, spec, mf.SEED + 5000 + 100 * k + attempt, B_STD[ckpt])
                if ckpt != "qwen3_moe":
                    break
                routers = mm._Routers(model)
                worst = [float(routers.margins(model, p)[0].min()) for p in prompts]
                print(f"{ckpt}/{name} draw {attempt}: smallest router margins {worst}")
                if sorted(worst)[-QUIET_PROMPTS] >= MOE_MARGIN:
                    break
            else:
                raise RuntimeError(f"{ckpt}/{name}: no draw without router near-ties")
            result = mf._reference(model, prompts)
            if ckpt == "qwen3_moe":
                result |= mm._router_margins(model, routers, result)
            if out.exists():
                shutil.rmtree(out)
            model.save_pretrained(out, safe_serialization=True)
            (out / "README.md").unlink(missing_ok=True)
            cfg = json.loads((out / "adapter_config.json").read_text())
            cfg["base_model_name_or_path"] = f"tests/fixtures/checkpoints/{ckpt}"
            if isinstance(cfg["target_modules"], list):  # peft writes a set's order
                cfg["target_modules"] = sorted(cfg["target_modules"])
            (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
            mf._write_npz(out / "reference.npz", result)
            print(f"{ckpt}/{name}: {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
    build()
