"""Write `tests/fixtures/moe_routing/routers.npz`: transformers' own router modules on random
inputs, for `tests/models/test_moe_routing.py` (which needs numpy only).

Run with a torch + transformers environment (never the project's .venv), from the repo root:

    /work/venv-torch/bin/python tools/make_moe_routing_fixtures.py

Per family `<f>` in (qwen3_moe, qwen3_moe_nonorm, mixtral, gpt_oss, deepseek_v3, nemotron_h):
`<f>_x` f32 [T, H] hidden states, `<f>_weight` (and `<f>_bias`, `<f>_correction_bias`), and the
module's outputs `<f>_logits`, `<f>_scores`, `<f>_indices`, plus `<f>_config` (json text).

DeepSeek-V2's router (`DeepseekV2TopkRouter`, cases `deepseek_v2_greedy` and
`deepseek_v2_group`) goes to its own file, `tests/fixtures/moe_routing/deepseek_v2_routers.npz`,
in the same layout (a separate file: its cases were added later, and `routers.npz` stays as it
was written).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import torch
import transformers
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHTopkRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

T, H = 24, 32
OUT = pathlib.Path(__file__).resolve().parents[1] / "tests/fixtures/moe_routing/routers.npz"
OUT_V2 = OUT.with_name("deepseek_v2_routers.npz")


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
# 16 experts in 4 groups of 4; group_limited_greedy keeps 2 groups (8 experts) for a top-6.
_V2 = dict(num_experts=16, num_experts_per_tok=6, n_group=4, topk_group=2)
CASES_V2 = {
    "deepseek_v2_greedy": (
        DeepseekV2TopkRouter,
        dict(_V2, topk_method="greedy", routed_scaling_factor=1.0),
    ),
    "deepseek_v2_group": (
        DeepseekV2TopkRouter,
        dict(_V2, topk_method="group_limited_greedy", routed_scaling_factor=16.0),
    ),
}


def _write(cases: dict, path: pathlib.Path, seed: int) -> None:
    torch.manual_seed(seed)
    out = {"transformers_version": np.array(transformers.__version__)}
    for name, (cls, kw) in cases.items():
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
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **out)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main() -> None:
    _write(CASES, OUT, 0)
    _write(CASES_V2, OUT_V2, 1)


if __name__ == "__main__":
    main()
