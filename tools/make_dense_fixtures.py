"""Build the dense-variant fixtures (issue #25) and transformers' RoPE reference values.

Same format and conventions as ``tools/make_fixtures.py`` (whose helpers it reuses; run it
the same way, in the torch virtual environment, from the repository root)::

    python tools/make_dense_fixtures.py [--only NAME]

Fixtures under ``tests/fixtures/checkpoints/<name>/``:

* ``llama3``: Llama with ``rope_type="llama3"`` (factor 8, low/high frequency factors 1/4,
  ``original_max_position_embeddings=16`` so all three frequency bands occur);
* ``qwen2``: Qwen2 with q/k/v biases (set to ``0.2 * N(0, 1)`` so skipping them shows);
* ``mistral_window``: Mistral with ``sliding_window=4`` (shorter than the 5-16 token prompts);
* ``gemma2``: two layers (sliding, global), window 4, attention soft-cap 1.5 and final
  soft-cap 5 (both bind on these logits), ``query_pre_attn_scalar=24`` (not head_dim);
* ``gemma3_text``: two layers (sliding, global), window 4, q/k norms, global RoPE linear x8 at
  theta 1e6 and local RoPE at 1e4, written in the released configs' spelling
  (``rope_scaling``, ``rope_theta``, ``rope_local_base_freq``).

Every norm weight is perturbed as in ``make_fixtures`` (Gemma's ``1 + w`` norms around 0.2 N).

``tests/fixtures/rope_reference.npz``: transformers' ``ROPE_INIT_FUNCTIONS`` outputs
(``<case>_inv_freq`` float32 and ``<case>_scaling``) for the cases in ``ROPE_CASES`` and the
cases' parameters as JSON (``cases``), for tests/models/test_rope_params.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=128, tie_word_embeddings=False,
             initializer_range=mf.INIT_RANGE, **mf.NO_SPECIAL)  # fmt: skip


def _llama3() -> LlamaConfig:
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
    return LlamaConfig(rms_norm_eps=1e-5, rope_parameters=rope, **SMALL)


def _qwen2() -> Qwen2Config:
    return Qwen2Config(rms_norm_eps=1e-6, **SMALL)


def _mistral() -> MistralConfig:
    return MistralConfig(rms_norm_eps=1e-5, sliding_window=4, **SMALL)


def _gemma2() -> Gemma2Config:
    return Gemma2Config(rms_norm_eps=1e-6, sliding_window=4, query_pre_attn_scalar=24,
                        attn_logit_softcapping=1.5, final_logit_softcapping=5.0,
                        layer_types=["sliding_attention", "full_attention"],
                        hidden_activation="gelu_pytorch_tanh", **SMALL)  # fmt: skip


def _gemma3() -> Gemma3TextConfig:
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    return Gemma3TextConfig(rms_norm_eps=1e-6, sliding_window=4, query_pre_attn_scalar=16,
                            layer_types=["sliding_attention", "full_attention"],
                            rope_parameters=rope, **SMALL)  # fmt: skip


FIXTURES = {
    "llama3": (LlamaForCausalLM, _llama3),
    "qwen2": (Qwen2ForCausalLM, _qwen2),
    "mistral_window": (MistralForCausalLM, _mistral),
    "gemma2": (Gemma2ForCausalLM, _gemma2),
    "gemma3_text": (Gemma3ForCausalLM, _gemma3),
}
OFFSET = 100  # seeds apart from make_fixtures' fixtures


def _released_spelling(path: Path) -> None:
    """Gemma 3's released configs: top-level `rope_theta`, `rope_local_base_freq` and the
    global layers' `rope_scaling` instead of per-layer-type `rope_parameters`."""
    cfg = json.loads((path / "config.json").read_text())
    rp = cfg.pop("rope_parameters")
    full, local = rp["full_attention"], rp["sliding_attention"]
    cfg["rope_theta"] = full["rope_theta"]
    cfg["rope_local_base_freq"] = local["rope_theta"]
    cfg["rope_scaling"] = {"rope_type": full["rope_type"], "factor": full["factor"]}
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build_fixture(name: str, offset: int) -> None:
    cls, make = FIXTURES[name]
    gen = mf._seed(OFFSET + offset)
    model = cls(make())
    mf._perturb(model, gen)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.startswith("gemma") and key.endswith("norm.weight"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))  # scale 1 + w
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    out = ROOT / "checkpoints" / name
    mf._save(model, out)
    if name == "gemma3_text":
        _released_spelling(out)
    loaded = mf._load_f32(cls, out)
    ref = mf._reference(loaded, mf._prompts(loaded.config.vocab_size, OFFSET + offset))
    mf._write_npz(out / "reference.npz", ref)
    top = max(np.abs(ref[f"prefill_logits_{i}"]).max() for i in range(4))
    print(f"{name}: max|logit| {top:.3f}, median top-2 gap "
          f"{np.median(ref['greedy_top2_gap']):.3f}, min {ref['greedy_top2_gap'].min():.4f}")  # fmt: skip


# RoPE cases: (rope type, parameters, head_dim, max_position_embeddings, partial factor)
ROPE_CASES = {
    "default": ("default", {"rope_theta": 10000.0}, 128, 4096, 1.0),
    "partial": ("default", {"rope_theta": 10000.0}, 128, 4096, 0.25),
    "linear": ("linear", {"rope_theta": 1e6, "factor": 8.0}, 256, 131072, 1.0),
    "llama3": (
        "llama3",
        {
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        128,
        131072,
        1.0,
    ),  # fmt: skip
    "yarn": (
        "yarn",
        {"rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768},
        128,
        131072,
        1.0,
    ),  # fmt: skip
    "yarn_mscale": (
        "yarn",
        {
            "rope_theta": 10000.0,
            "factor": 40.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "original_max_position_embeddings": 4096,
        },
        64,
        163840,
        1.0,
    ),  # fmt: skip
    "yarn_partial": (
        "yarn",
        {
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "original_max_position_embeddings": 4096,
            "truncate": False,
        },
        64,
        131072,
        0.5,
    ),  # fmt: skip
    "dynamic": ("dynamic", {"rope_theta": 10000.0, "factor": 2.0}, 128, 4096, 1.0),
    "longrope": (
        "longrope",
        {
            "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.05 * i for i in range(48)],
            "long_factor": [2.0 + 0.1 * i for i in range(48)],
            "original_max_position_embeddings": 4096,
        },
        96,
        131072,
        1.0,
    ),  # fmt: skip
}


def build_rope() -> None:
    arrays: dict[str, np.ndarray] = {}
    cases = {}
    for case, (kind, params, hd, maxpos, prf) in ROPE_CASES.items():
        rp = {"rope_type": kind, **params}
        if prf != 1.0:
            rp["partial_rotary_factor"] = prf
        cfg = LlamaConfig(hidden_size=hd * 4, num_attention_heads=4, head_dim=hd,
                          max_position_embeddings=maxpos, rope_parameters=dict(rp))  # fmt: skip
        inv, scale = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu") if kind != "default" else (
            1.0 / (params["rope_theta"] ** (torch.arange(0, int(hd * prf), 2).float() / int(hd * prf))),
            1.0,
        )  # fmt: skip
        arrays[f"{case}_inv_freq"] = inv.float().numpy()
        arrays[f"{case}_scaling"] = np.float64(scale)
        cases[case] = {"params": rp, "head_dim": hd, "max_position_embeddings": maxpos}
    arrays["cases"] = np.array(json.dumps(cases, sort_keys=True))
    mf._write_npz(ROOT / "rope_reference.npz", arrays)
    print("rope_reference.npz:", ", ".join(cases))


def write_readme() -> None:
    """`tests/fixtures/checkpoints/README_dense.md`: the table of these fixtures."""
    lines = ["# Dense-variant fixtures (tools/make_dense_fixtures.py; do not edit by hand)", "",
             "| fixture | class | config | files (bytes) | max abs logit | top-2 gap median / min |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name in FIXTURES:
        d = ROOT / "checkpoints" / name
        cfg = json.loads((d / "config.json").read_text())
        with np.load(d / "reference.npz") as ref:
            top = max(float(np.abs(ref[f"prefill_logits_{i}"]).max()) for i in range(4))
            gaps = ref["greedy_top2_gap"]
        extra = {k: cfg[k] for k in ("sliding_window", "layer_types", "rope_scaling",
                                      "rope_parameters", "attn_logit_softcapping",
                                      "final_logit_softcapping", "query_pre_attn_scalar")
                 if cfg.get(k) is not None}  # fmt: skip
        files = ", ".join(f"`{f.name}` {f.stat().st_size:,}" for f in sorted(d.iterdir()))
        lines.append(f"| `{name}` | {cfg['architectures'][0]} | {mf._summary(cfg)}, "
                     f"{json.dumps(extra, sort_keys=True)} | {files} | {top:.2f} | "
                     f"{float(np.median(gaps)):.3f} / {float(gaps.min()):.4f} |")  # fmt: skip
    lines += ["", "Same prompts and format as README.md's fixtures; every bias is 0.2 N(0, 1) "
              "and every Gemma norm weight w (scale 1 + w) is 0.2 N(0, 1).", ""]  # fmt: skip
    (ROOT / "checkpoints" / "README_dense.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=[*FIXTURES, "rope"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if args.only in (None, "rope"):
        build_rope()
    for offset, name in enumerate(FIXTURES):
        if args.only in (None, name):
            build_fixture(name, offset)
    if args.only is None:
        write_readme()


if __name__ == "__main__":
    main()
