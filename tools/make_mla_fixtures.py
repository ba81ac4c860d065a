"""Build the tiny DeepSeek (multi-head latent attention) checkpoint fixtures.

Same environment, conventions and outputs as ``tools/make_fixtures.py`` (whose helpers this
script uses: seeds, parameter perturbation, reference outputs, reproducible npz)::

    python tools/make_mla_fixtures.py      # from the repository root

Fixtures (``tests/fixtures/checkpoints/<name>/``), two layers each, layer 0 a dense SwiGLU MLP
(``first_k_dense_replace: 1``) and layer 1 a routed MoE (8 experts of width 32, top-2, a
shared expert):

* ``deepseek_v2``: DeepSeek-V2-Lite-style MLA: a plain ``q_proj`` (``q_lora_rank: null``),
  default RoPE on the interleaved pairs (V2's complex rotation); softmax routing with
  ``topk_method: group_limited_greedy`` over 4 groups keeping 2, ``routed_scaling_factor``
  1.5, two shared experts (width 64).
* ``deepseek_v3``: DeepSeek-V3-style MLA: q LoRA, YaRN (``factor`` 4 over an original context
  of 16 tokens, so the 16 + 8 token runs reach past it, ``mscale = mscale_all_dim = 1`` as
  DeepSeek-V3 ships), ``rope_interleave: true``; sigmoid routing with a random
  ``e_score_correction_bias`` (0.05 N(0, 1)), 4 groups keeping 2, ``norm_topk_prob``,
  ``routed_scaling_factor`` 2.5, one shared expert (width 32).
* ``deepseek_v3_fp8``: the ``deepseek_v3`` layout at widths the block-FP8 paths take (hidden
  128, 2 heads of nope 64 + rope 32, v 64, q LoRA 128, kv LoRA 128, dense width 128, 4
  experts of width 128, all chosen (top-4, see ``_v3_fp8``), one shared expert; weights
  drawn with ``initializer_range`` 0.1, the router's then scaled by ``FP8_ROUTER_SCALE``:
  smaller attention and router logits keep the FP8 noise's effect in the first-order range
  tests/models/test_mla_fp8.py derives its bound in), released the way
  DeepSeek-V3 ships (vocabulary 128): every linear weight (``q_a_proj``, ``q_b_proj``,
  ``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``, the dense and shared MLPs and the
  experts) e4m3 with one float32 ``weight_scale_inv`` per 128 x 128 block
  (``quantization_config``: fp8, ``weight_block_size`` [128, 128]); the router, norms,
  embeddings and LM head stay bf16. ``kv_a_proj_with_mqa``'s 160 outputs and ``q_b_proj``'s
  192 end in a partial block, as DeepSeek-V3's 576 do. Its references come from the float32
  model holding the dequantized weights (``tools/make_moe_fixtures.py``'s
  ``qwen3_moe_fp8`` recipe).

``reference.npz``'s router margins (none for ``deepseek_v3_fp8``, only
``router_logit_absmax``) (``router_margin_<i>``, ``router_logit_absmax``) are
``tools/make_moe_fixtures.py``'s (see its docstring). The prompts are quiet as there (no router
margin below ``QUIET_MARGIN`` at a prompt position) and so are their greedy continuations: a
prompt is redrawn until the positions that choose its 8 greedy tokens have no near-tie either
(half the continuation positions had one, which left 3 of 32 greedy choices to compare). ``config.json`` is rewritten in the released spelling: top-level ``rope_theta``
and, for YaRN, ``rope_scaling`` (both spellings are kept).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import make_moe_fixtures as moe_fx
import numpy as np
import torch
from make_fixtures import (
    FP8_LINEARS,
    FP8_QUANT_CONFIG,
    INIT_RANGE,
    MAX_NEW_TOKENS,
    NO_SPECIAL,
    PROMPT_LENGTHS,
    SEED,
    _load_f32,
    _perturb,
    _prompts,
    _quantize_block_fp8,
    _reference,
    _save,
    _seed,
    _write_npz,
)
from safetensors import safe_open
from safetensors.torch import save_file
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
    first_k_dense_replace=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    initializer_range=INIT_RANGE,
    **NO_SPECIAL,
)


def _v2() -> DeepseekV2Config:
    return DeepseekV2Config(**COMMON, q_lora_rank=None, rope_theta=10000.0, n_shared_experts=2,
                            topk_method="group_limited_greedy", n_group=4, topk_group=2,
                            routed_scaling_factor=1.5)  # fmt: skip


def _v3() -> DeepseekV3Config:
    yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1.0,
                mscale=1.0, mscale_all_dim=1.0)  # fmt: skip
    return DeepseekV3Config(**COMMON, q_lora_rank=48, rope_parameters=yarn, rope_interleave=True,
                            n_shared_experts=1, n_group=4, topk_group=2, norm_topk_prob=True,
                            routed_scaling_factor=2.5)  # fmt: skip


def _v3_fp8() -> DeepseekV3Config:
    """`_v3` at widths the FP8 paths take: every K a multiple of 128 (the FP8 experts need
    it of `moe_intermediate_size`), `kv_a_proj_with_mqa` 128 + 32 and `q_b_proj` 2 x 96
    outputs (partial last blocks, as DeepSeek-V3's 512 + 64). Every expert is chosen (top-4
    of 4 in 2 groups, both kept): the FP8 noise of the router's input moves its logits by
    far more than any margin a prompt could keep (tests/models/test_mla_fp8.py), and a
    flipped choice moves a logit by a whole expert's output, so only the routing weights
    may move."""
    cfg = _v3().to_dict()
    cfg.update(vocab_size=128, hidden_size=128, intermediate_size=128, num_attention_heads=2,
               num_key_value_heads=2, kv_lora_rank=128, q_lora_rank=128, qk_nope_head_dim=64,
               qk_rope_head_dim=32, v_head_dim=64, n_routed_experts=4,
               moe_intermediate_size=128, num_experts_per_tok=4, n_group=2, initializer_range=0.1,
               topk_group=2)  # fmt: skip
    for key in ("head_dim", "qk_head_dim", "transformers_version", "model_type"):
        cfg.pop(key, None)
    return DeepseekV3Config(**cfg)


# deepseek_v3_fp8's router weights are scaled by this (router logits up to ~1, not ~4): the
# routing weights' response to the FP8 noise of the router's input grows with the router
# logits, and at ~4 that term alone would make the test's derived bound exceed the logits.
FP8_ROUTER_SCALE = 0.25

# The modules DeepSeek-V3 stores block-FP8 (the router `mlp.gate` stays bf16).
MLA_FP8_LINEARS = (*FP8_LINEARS, "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")

FIXTURES = {
    "deepseek_v2": (DeepseekV2ForCausalLM, _v2),
    "deepseek_v3": (DeepseekV3ForCausalLM, _v3),
    "deepseek_v3_fp8": (DeepseekV3ForCausalLM, _v3_fp8),
}


def _quiet_token(model, routers, rng, p: list[int]) -> int | None:
    """The first of up to 1000 random draws that continues `p` without a router near-tie."""
    for _ in range(1000):
        tok = int(rng.integers(0, model.config.vocab_size))
        if routers.margins(model, p + [tok])[0][:, -1].min() >= moe_fx.QUIET_MARGIN:
            return tok
    return None


@torch.no_grad()
def _quiet_runs(model, routers, offset: int, attempts: int = 3000) -> list[list[int]]:
    """Quiet prompts whose greedy continuations are quiet too (module docstring): a quiet
    prefix of `n - 1` tokens built token by token as `make_moe_fixtures._quiet_prompts` builds
    them, then last tokens drawn until the prompt and its continuation are quiet (a new prefix
    after 1000 draws)."""
    rng = np.random.default_rng(SEED + 2000 + offset)
    prompts = []
    for n in PROMPT_LENGTHS:
        prefix: list[int] | None = None
        for attempt in range(attempts):
            if prefix is None or attempt % 1000 == 0:
                prefix = []
                while len(prefix) < n - 1:
                    tok = _quiet_token(model, routers, rng, prefix)
                    prefix = prefix + [tok] if tok is not None else []
            p = prefix + [int(rng.integers(0, model.config.vocab_size))]
            x = torch.tensor([p], dtype=torch.long)
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x),
                                 max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS,
                                 do_sample=False, use_cache=True)  # fmt: skip
            # positions 0 .. n + 6: the prompt and the positions choosing the 8 new tokens
            m = routers.margins(model, out[0].tolist())[0][:, : n + MAX_NEW_TOKENS - 1]
            if m.min() >= moe_fx.QUIET_MARGIN:
                print(f"  prompt of {n} tokens: quiet run after {attempt + 1} draws", flush=True)
                prompts.append(p)
                break
        else:
            raise RuntimeError(f"no quiet run of a {n}-token prompt in {attempts} draws")
    return prompts


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


@torch.no_grad()
def _router_absmax(model, routers, ref) -> np.ndarray:
    """The largest |router logit| over every prompt followed by its greedy tokens."""
    top = 0.0
    for i, n in enumerate(ref["prompt_lengths"]):
        seq = list(ref["prompt_ids"][i, :n]) + list(ref["greedy_tokens"][i])
        routers.seen.clear()
        model(input_ids=torch.tensor([seq], dtype=torch.long), use_cache=False)
        top = max(top, *(float(x.abs().max()) for x in routers.seen))
    return np.array(top, np.float32)


def _fp8_checkpoint(model, path: Path, cls) -> torch.nn.Module:
    """Writes `model` (bf16) to `path` with its `MLA_FP8_LINEARS` block-FP8 and returns the
    float32 model of the dequantized weights (the reference)."""
    with tempfile.TemporaryDirectory() as tmp:
        bf16, f32 = Path(tmp) / "bf16", Path(tmp) / "f32"
        _save(model, bf16)
        _released_rope(bf16)
        with safe_open(str(bf16 / "model.safetensors"), "pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        tensors, dequant = {}, {}
        for key, value in state.items():
            if key.endswith(".weight") and key.rsplit(".", 2)[-2] in MLA_FP8_LINEARS:
                q, scale_inv, deq = _quantize_block_fp8(value)
                tensors[key], tensors[key + "_scale_inv"] = q, scale_inv
                dequant[key] = deq
            else:
                tensors[key], dequant[key] = value.contiguous(), value.float()
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((bf16 / "config.json").read_text())
        cfg["quantization_config"] = dict(FP8_QUANT_CONFIG)
        (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        f32.mkdir()
        save_file(dequant, str(f32 / "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(bf16 / "config.json", f32 / "config.json")
        return _load_f32(cls, f32).eval()


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
        with torch.no_grad():
            for key, buf in model.named_buffers():
                if key.endswith("e_score_correction_bias"):  # zeros at init: make it matter
                    buf.copy_(0.05 * torch.randn(buf.shape, generator=gen))
            for key, param in model.named_parameters():
                if name.endswith("_fp8") and key.endswith("mlp.gate.weight"):
                    param.mul_(FP8_ROUTER_SCALE)
        model = model.to(torch.bfloat16)
        model.config.dtype = "bfloat16"
        if name.endswith("_fp8"):
            model = _fp8_checkpoint(model, out / name, cls)
        else:
            _save(model, out / name)
            _released_rope(out / name)
            model = _load_f32(cls, out / name).eval()
        routers = moe_fx._Routers(model)
        if name.endswith("_fp8"):  # every expert chosen: no choice, no margins
            # (the next seed's prompts: on this one's, transformers' cached decode differs
            # from its recomputation by 1.4e-4, above `_reference`'s 1e-4 check)
            ref = _reference(model, _prompts(model.config.vocab_size, OFFSET + i + 1))
            ref["router_logit_absmax"] = _router_absmax(model, routers, ref)
        else:
            ref = _reference(model, _quiet_runs(model, routers, OFFSET + i))
            ref |= moe_fx._router_margins(model, routers, ref)
        _write_npz(out / name / "reference.npz", ref)
        margins = np.concatenate([ref[k].ravel() for k in ref if k.startswith("router_margin")]
                                 or [np.full(1, np.inf)])  # fmt: skip
        print(
            f"{name}: max|logit| "
            f"{max(np.abs(ref[f'prefill_logits_{j}']).max() for j in range(4)):.3f}, "
            f"median top-2 gap {np.median(ref['greedy_top2_gap']):.3f}, "
            f"min gap {ref['greedy_top2_gap'].min():.4f}, router |logit| max "
            f"{float(ref['router_logit_absmax']):.3f}, smallest router margins "
            f"{np.sort(margins)[:4]}"
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
