"""Build the tiny gpt-oss checkpoint fixture and transformers' reference outputs.

Same environment and `reference.npz` contents as `tools/make_moe_fixtures.py` (router margins
included; its helpers are reused), run the same way::

    /work/venv-torch/bin/python tools/make_gpt_oss_fixture.py

Fixture ``tests/fixtures/checkpoints/gpt_oss``: GptOssForCausalLM as transformers 5.x saves
it (fused ``mlp.experts.gate_up_proj [E, hidden, 2 * inter]`` with gate and up interleaved,
``gate_up_proj_bias``, ``down_proj``, ``down_proj_bias``, ``mlp.router.weight`` / ``.bias``),
bf16 weights:

* 2 layers, ``layer_types`` sliding (window 4) then full; attention with q/k/v/o biases and
  sinks; YaRN RoPE (factor 4 over 32 original positions, ``truncate=false`` as gpt-oss ships);
* 4 experts of width 32, top-2, router with a bias;
* ``swiglu_limit=2.0`` instead of the released 7.0, so the clamps of the gate (above) and of
  up (both sides) bind on a good share of the rows (at width 64 and init 0.2 the gate / up
  values have a standard deviation near 1.6: a limit of 7 would never bind);
* every bias (attention, router, experts) drawn 0.2 N(0, 1) and the sinks N(0, 1), so none
  of them is the zero transformers initialises some of them to.

The prompts are built without router near-ties (margin ``QUIET_MARGIN`` in logit units at
every prompt position and layer), as for the other MoE fixtures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import GptOssConfig, GptOssForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402
import make_moe_fixtures as mm  # noqa: E402

NAME = "gpt_oss"
OFFSET = 40  # seeds apart from the other fixture scripts


def _config() -> GptOssConfig:
    return GptOssConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=128,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 32,
        },  # fmt: skip
        swiglu_limit=2.0,
        rms_norm_eps=1e-5,
        attention_bias=True,
        tie_word_embeddings=False,
        initializer_range=mf.INIT_RANGE,
        **mf.NO_SPECIAL,
    )


def _build() -> torch.nn.Module:
    gen = mf._seed(OFFSET)
    model = GptOssForCausalLM(_config())
    mf._perturb(model, gen)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("bias"):
                p.copy_(0.2 * noise)
            elif name.endswith(".sinks"):
                p.copy_(noise)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    return model


class _Routers(mm._Routers):
    """`make_moe_fixtures._Routers` on gpt-oss's routers (`mlp.router`, whose forward returns
    `(logits [T, E], scores, indices)`; the logits include the router bias)."""

    def __init__(self, model) -> None:
        self.k = model.config.num_experts_per_tok
        self.routers = [m for name, m in model.named_modules() if name.endswith("mlp.router")]
        assert self.routers, "no router modules found"
        self.seen: list[torch.Tensor] = []
        for m in self.routers:
            m.register_forward_hook(lambda _m, _i, out: self.seen.append(out[0].float()))


def _clamp_share(model, prompts: list[list[int]]) -> float:
    """The share of the experts' gate and up values the clamp changes on the prompts."""
    limit, changed, total = model.config.swiglu_limit, [0], [0]
    for m in model.modules():
        if hasattr(m, "_apply_gate"):
            orig = m._apply_gate

            def counted(gate_up, _orig=orig):
                gate, up = gate_up[..., ::2], gate_up[..., 1::2]
                changed[0] += int((gate > limit).sum() + (up.abs() > limit).sum())
                total[0] += gate_up.numel()
                return _orig(gate_up)

            m._apply_gate = counted
    with torch.no_grad():
        for p in prompts:
            model(input_ids=torch.tensor([p]), use_cache=False)
    return changed[0] / max(total[0], 1)


def build(out: Path) -> dict[str, np.ndarray]:
    """Writes the fixture under `out / NAME` and returns its references."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    path = out / NAME
    mf._save(_build(), path)
    model = mf._load_f32(GptOssForCausalLM, path).eval()
    routers = _Routers(model)
    prompts = mm._quiet_prompts(model, routers, OFFSET)
    result = mf._reference(model, prompts)
    ref = result | mm._router_margins(model, routers, result)
    mf._write_npz(path / "reference.npz", ref)
    margins = np.concatenate([ref[k].ravel() for k in ref if k.startswith("router_margin")])
    print(f"{NAME}: max|logit| "
          f"{max(np.abs(ref[f'prefill_logits_{i}']).max() for i in range(4)):.3f}, "
          f"min top-2 gap {ref['greedy_top2_gap'].min():.4f}, router |logit| max "
          f"{float(ref['router_logit_absmax']):.3f}, smallest router margins "
          f"{np.sort(margins)[:4]}, clamped share of gate/up values "
          f"{_clamp_share(model, prompts):.3f}")  # fmt: skip
    return ref


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent.parent / "tests" / "fixtures"
                        / "checkpoints")  # fmt: skip
    build(parser.parse_args().out)


if __name__ == "__main__":
    main()
