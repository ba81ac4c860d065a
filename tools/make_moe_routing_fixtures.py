"""Write `tests/fixtures/moe_routing/routers.npz`: transformers' own router modules on random
inputs, for `tests/models/test_moe_routing.py` (which needs numpy only).

Run with a torch + transformers environment (never the project's .venv), from the repo root:

    /work/venv-torch/bin/python tools/make_moe_routing_fixtures.py

Per family `<f>` in (qwen3_moe, qwen3_moe_nonorm, mixtral, gpt_oss, deepseek_v3, nemotron_h):
`<f>_x` f32 [T, H] hidden states, `<f>_weight` (and `<f>_bias`, `<f>_correction_bias`), and the
module's outputs `<f>_logits`, `<f>_scores`, `<f>_indices`, plus `<f>_config` (json text).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import torch
import transformers
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHTopkRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

T, H = 24, 32
OUT = pathlib.Path(__file__).resolve().parents[1] / "tests/fixtures/moe_routing/routers.npz"


def _cfg(**kw):
    return type("Cfg", (), kw)()


CASES = {
    "qwen3_moe": (
        Qwen3MoeTopKRouter,
        dict(num_experts=16, num_experts_per_tok=4, norm_topk_prob=True),
    ),
    "qwen3_moe_nonorm": (
        Qwen3MoeTopKRouter,
        dict(num_experts=16, num_experts_per_tok=4, norm_topk_prob=False),
    ),
    "mixtral": (MixtralTopKRouter, dict(num_local_experts=8, num_experts_per_tok=2)),
    "gpt_oss": (GptOssTopKRouter, dict(num_local_experts=8, num_experts_per_tok=4)),
    "deepseek_v3": (
        DeepseekV3TopkRouter,
        dict(
            num_local_experts=32,
            num_experts_per_tok=6,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
        ),
    ),
    "nemotron_h": (
        NemotronHTopkRouter,
        dict(
            num_local_experts=16,
            num_experts_per_tok=4,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=1.5,
        ),
    ),
}


def main() -> None:
    torch.manual_seed(0)
    out = {"transformers_version": np.array(transformers.__version__)}
    for name, (cls, kw) in CASES.items():
        mod = cls(_cfg(hidden_size=H, **kw))
        with torch.no_grad():
            for p in mod.parameters():
                p.normal_(0.0, 0.5)
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.normal_(0.0, 0.2)
                out[f"{name}_correction_bias"] = mod.e_score_correction_bias.numpy().copy()
            x = torch.randn(T, H)
            logits, scores, idx = mod(x)
        out[f"{name}_x"] = x.numpy()
        out[f"{name}_weight"] = mod.weight.detach().numpy()
        if getattr(mod, "bias", None) is not None:
            out[f"{name}_bias"] = mod.bias.detach().numpy()
        out[f"{name}_logits"] = logits.float().numpy()
        out[f"{name}_scores"] = scores.float().numpy()
        out[f"{name}_indices"] = idx.numpy().astype(np.int32)
        out[f"{name}_config"] = np.array(json.dumps(kw))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
