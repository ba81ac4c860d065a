"""Build the tiny Gated DeltaNet checkpoint fixtures (Qwen3.5) and transformers' references.

Same environment, outputs and `reference.npz` contents as ``tools/make_fixtures.py`` (whose
helpers this script reuses); run from the repository root::

    /work/venv-torch/bin/python tools/make_gdn_fixtures.py [name]  # tests/fixtures/checkpoints/

Fixtures:

* ``qwen3_5_text``: ``Qwen3_5ForCausalLM`` (``model_type = "qwen3_5_text"``), two decoder
  layers, ``layer_types = [linear_attention, full_attention]``: a Gated DeltaNet mixer with
  one 128-wide key head and two 128-wide value heads (GVA; the arena's GDN scratch is sized for
  128 x 128 heads), then gated attention (4 query heads of 64, 2 KV heads, partial RoPE
  0.25, q/k norms), each followed by a SwiGLU MLP.

Weights (bfloat16) are random from a fixed seed with ``initializer_range=0.2``; then the
zero-centred ``(1 + w)`` norms get ``w = 0.2 * N(0, 1)``, the GDN's gated norm
``1 + 0.2 * N(0, 1)``, ``dt_bias`` the inverse softplus of a log-uniform dt in [0.01, 0.1]
and ``A = exp(A_log)`` uniform in [0.1, 1] (a per-token decay between about 0.5 and 1, so
the recurrent state carries information across the prompt). The GDN conv weights are
``N(0, 1)``: with the default init the delta rule's output at a sequence's first token is
about 3e-4, below the gated RMSNorm's ``sqrt(eps) = 1e-3``, where the norm's output is
proportional to its input and so inherits the cancellation in ``q . k`` (a 13% change from
one bf16 rounding of the projection on one prompt): an ill-conditioned fixture, not a model
property. With ``N(0, 1)`` taps the norm sees inputs well above its eps.

* ``qwen3_next``: ``Qwen3NextForCausalLM`` without experts (``num_experts = 0``: dense MLPs),
  same layer pattern; the GDN has two key heads of 128 and four value heads of 128, so its
  fused ``in_proj_qkvz`` / ``in_proj_ba`` outputs are interleaved per key-head group with two
  value heads each; attention has 8 query heads of 64 (the GDN value width 512 fits the
  ``attn_output`` region the attention width sizes).

* ``qwen3_next_tp4``: ``qwen3_next`` with four key heads and four value heads of 128 (one
  key-head group per device at tensor parallelism 4; tests/models/test_tensor_parallel.py).

* ``qwen3_next_wide``: ``qwen3_next``'s layout with one key head and two value heads of 128
  in the GDN (value width 256) but attention of 2 query heads of 64 (width 128): the GDN's
  gated-norm output is wider than ``attn_output`` (the step rule keeps it an XLA value).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import (
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import (  # noqa: E402
    INIT_RANGE,
    NO_SPECIAL,
    _load_f32,
    _prompts,
    _reference,
    _save,
    _seed,
    _write_npz,
)

OFFSET = 100  # seed offset, away from make_fixtures' families


def _qwen3_5_text_config() -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
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
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },  # fmt: skip
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=INIT_RANGE,
        **NO_SPECIAL,
    )


def _qwen3_next_config() -> Qwen3NextConfig:
    return Qwen3NextConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        full_attention_interval=2,
        num_experts=0,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_key_head_dim=128,
        linear_num_value_heads=4,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        partial_rotary_factor=0.25,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=INIT_RANGE,
        **NO_SPECIAL,
    )


def _qwen3_next_tp4_config() -> Qwen3NextConfig:
    """`qwen3_next` with 4 key heads of 128 (and 4 value heads): 4 ways to split the GDN."""
    c = _qwen3_next_config()
    c.linear_num_key_heads = 4
    return c


def _qwen3_next_wide_config() -> Qwen3NextConfig:
    """Qwen3-Next whose GDN value width (2 heads of 128 = 256) exceeds the attention width
    (2 heads of 64 = 128), which transformers builds and runs."""
    return Qwen3NextConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        full_attention_interval=2,
        num_experts=0,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        linear_num_key_heads=1,
        linear_key_head_dim=128,
        linear_num_value_heads=2,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        partial_rotary_factor=0.25,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=INIT_RANGE,
        **NO_SPECIAL,
    )


def _perturb_gdn(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Moves the parameters that init leaves at constants away from them (module doc)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("norm.weight"):
                p.copy_(0.2 * noise)
            elif name.endswith(".dt_bias"):
                u = torch.rand(p.shape, generator=gen)
                dt = torch.exp(math.log(0.01) + u * (math.log(0.1) - math.log(0.01)))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif name.endswith(".A_log"):
                p.copy_(torch.log(0.1 + 0.9 * torch.rand(p.shape, generator=gen)))
            elif name.endswith("linear_attn.conv1d.weight"):
                p.copy_(noise)


FAMILIES = {
    "qwen3_5_text": (Qwen3_5ForCausalLM, _qwen3_5_text_config),
    "qwen3_next": (Qwen3NextForCausalLM, _qwen3_next_config),
    "qwen3_next_wide": (Qwen3NextForCausalLM, _qwen3_next_wide_config),
    "qwen3_next_tp4": (Qwen3NextForCausalLM, _qwen3_next_tp4_config),
}

# Seed offset per fixture (default: its index). qwen3_next_wide's index, 2, draws a prompt
# whose first token has q . k = 0.0036 in the GDN (unit q, k: 1 / 0.0036 = 280 times the
# relative error of the bf16-rounded q and k, and the gated norm's input below its sqrt(eps),
# so the output keeps that error: the module docstring's ill-conditioned case); offset 3 is
# the next seed: every prompt's first-token |q . k| is 0.07 or more (0.19, 0.19, 0.08, 0.07).
SEED_OFFSETS = {"qwen3_next_wide": 3}


def build(out: Path, only: str | None = None) -> None:
    """Writes every GDN fixture under `out` (only fixture `only` when given)."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for i, (name, (cls, make_config)) in enumerate(FAMILIES.items()):
        if only is not None and name != only:
            continue
        seed = OFFSET + SEED_OFFSETS.get(name, i)
        gen = _seed(seed)
        model = cls(make_config())
        _perturb_gdn(model, gen)
        model = model.to(torch.bfloat16)
        model.config.dtype = "bfloat16"
        _save(model, out / name)
        loaded = _load_f32(cls, out / name)
        ref = _reference(loaded, _prompts(loaded.config.vocab_size, seed))
        _write_npz(out / name / "reference.npz", ref)
        top = max(np.abs(ref[f"prefill_logits_{j}"]).max() for j in range(4))
        gaps = ref["greedy_top2_gap"]
        print(f"{name}: max|logit| {top:.3f}, median top-2 gap {np.median(gaps):.3f}, "
              f"min gap {gaps.min():.4f}")  # fmt: skip


if __name__ == "__main__":
    build(Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "checkpoints",
          sys.argv[1] if len(sys.argv) > 1 else None)  # fmt: skip
