"""Build the tiny DeepSeek (multi-head latent attention) checkpoint fixtures.

Same environment, conventions and outputs as ``tools/make_fixtures.py`` (whose helpers this
script uses: seeds, parameter perturbation, reference outputs, reproducible npz)::

    python tools/make_mla_fixtures.py      # from the repository root

Fixtures (``tests/fixtures/checkpoints/<name>/``):

* ``deepseek_v2``: DeepSeek-V2-Lite-style MLA: a plain ``q_proj`` (``q_lora_rank: null``),
  default RoPE on the interleaved pairs (V2's complex rotation).
* ``deepseek_v3``: DeepSeek-V3-style MLA: q LoRA, YaRN (``factor`` 4 over an original context
  of 16 tokens, so the 16 + 8 token runs reach past it, ``mscale = mscale_all_dim = 1`` as
  DeepSeek-V3 ships), ``rope_interleave: true``.

Both have ``first_k_dense_replace = num_hidden_layers``: every layer's MLP is dense (the
routed-expert block is not part of this change), while the MoE fields stay in the config as
in the released files. ``config.json`` is rewritten in the released spelling: top-level
``rope_theta`` and, for YaRN, ``rope_scaling`` (both spellings are kept).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from make_fixtures import (
    INIT_RANGE,
    NO_SPECIAL,
    _load_f32,
    _perturb,
    _prompts,
    _reference,
    _save,
    _seed,
    _write_npz,
)
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
)

OFFSET = 100  # seed offsets of these fixtures (make_fixtures.py uses 0..5)

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    first_k_dense_replace=2,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    initializer_range=INIT_RANGE,
    **NO_SPECIAL,
)


def _v2() -> DeepseekV2Config:
    return DeepseekV2Config(**COMMON, q_lora_rank=None, rope_theta=10000.0)


def _v3() -> DeepseekV3Config:
    yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1.0,
                mscale=1.0, mscale_all_dim=1.0)  # fmt: skip
    return DeepseekV3Config(**COMMON, q_lora_rank=48, rope_parameters=yarn, rope_interleave=True,
                            n_group=2, topk_group=1)  # fmt: skip


FIXTURES = {
    "deepseek_v2": (DeepseekV2ForCausalLM, _v2),
    "deepseek_v3": (DeepseekV3ForCausalLM, _v3),
}


def _released_rope(path: Path) -> None:
    """Adds the released spelling of the RoPE settings (top-level `rope_theta`, YaRN in
    `rope_scaling`) next to transformers 5's `rope_parameters`."""
    cfg = json.loads((path / "config.json").read_text())
    rp = cfg.get("rope_parameters") or {}
    if "rope_theta" in rp:
        cfg["rope_theta"] = rp["rope_theta"]
    if rp.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build(out: Path, only: str | None = None) -> None:
    """Writes every fixture (or only `only`) under `out`."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for i, (name, (cls, make_config)) in enumerate(FIXTURES.items()):
        if only and name != only:
            continue
        gen = _seed(OFFSET + i)
        model = cls(make_config())
        _perturb(model, gen)
        model = model.to(torch.bfloat16)
        model.config.dtype = "bfloat16"
        _save(model, out / name)
        _released_rope(out / name)
        loaded = _load_f32(cls, out / name)
        ref = _reference(loaded, _prompts(loaded.config.vocab_size, OFFSET + i))
        _write_npz(out / name / "reference.npz", ref)
        print(
            f"{name}: max|logit| "
            f"{max(np.abs(ref[f'prefill_logits_{j}']).max() for j in range(4)):.3f}, "
            f"median top-2 gap {np.median(ref['greedy_top2_gap']):.3f}, "
            f"min gap {ref['greedy_top2_gap'].min():.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "checkpoints"
    parser.add_argument("--out", type=Path, default=default)
    parser.add_argument("--only", choices=list(FIXTURES))
    args = parser.parse_args()
    build(args.out, args.only)


if __name__ == "__main__":
    main()
