"""Build the tiny mixture-of-experts checkpoint fixtures and transformers' reference outputs.

Same environment, conventions and `reference.npz` contents as `tools/make_fixtures.py` (whose
helpers this script reuses), run the same way::

    /work/venv-torch/bin/python tools/make_moe_fixtures.py [--only NAME]

Fixtures (under ``tests/fixtures/checkpoints/``):

* ``qwen3_moe``: Qwen3MoeForCausalLM, 3 layers, 8 experts of width 32, top-2, renormalised;
  ``mlp_only_layers=[1]`` makes layer 1 a dense SwiGLU MLP.
* ``mixtral``: MixtralForCausalLM, 2 layers, 4 experts of width 64, top-2.
* ``nemotron_h_moe``: NemotronHForCausalLM, pattern ``ME*E``: 8 relu^2 experts of width 32
  on a 32-wide latent (``moe_latent_size``, hidden 64), a shared expert of width 64, sigmoid
  routing over 4 groups keeping 2, ``routed_scaling_factor=2.5``, and a random
  ``e_score_correction_bias`` (0.05 N(0, 1)).
* ``qwen3_moe_fp8``: a one-layer Qwen3-MoE (4 experts of width 128, hidden 128) whose attention projections and expert weights are
  block-FP8 (e4m3 + one float32 ``weight_scale_inv`` per 128 x 128 block, as
  Qwen3-30B-A3B-FP8 ships); the router (``mlp.gate``), embeddings, norms and LM head stay
  bf16.  Its references come from the float32 model holding the dequantized weights.

Besides the keys `make_fixtures.py` writes, ``reference.npz`` holds the routing margins
transformers' float32 router had, so tests can leave near-ties out:
``router_margin_<i>`` float32 ``[n_moe_layers, len_i + 8]``: for each MoE layer and each
position of prompt ``i`` followed by its 8 greedy tokens (one teacher-forced pass), the
router logit of the k-th chosen expert minus that of the best expert left out (softmax is
monotone, so this decides the choice); and ``router_logit_absmax``, the largest router logit
magnitude seen.  The prompts (lengths 1, 5, 11, 16) are random, built token by token from
draws whose position has margins of at least ``QUIET_MARGIN`` in every MoE layer, so the strict
comparison keeps every prompt position (a flipped choice at one position reaches the later
ones through attention, so the tests leave out everything from a sequence's first near-tie
on; without this choice few positions would remain).  For the sigmoid group router (Nemotron-H) the margins are of the choice
scores, converted to logit units (``_sigmoid_margin``): the smaller of the expert choice's
and the group choice's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402

EXPERT_LINEARS = ("gate_proj", "up_proj", "down_proj")
# Prompts are drawn until the router has no near-tie on them (margin in logit units at least
# this at every prompt position and MoE layer): the tests leave out every position from a
# sequence's first near-tie on, and derive thresholds below this (they check it).
QUIET_MARGIN = 0.3


def _qwen3_moe_config(hidden=64, heads=4, head_dim=16, inter=128, moe_inter=32, experts=8,
                      layers=3, mlp_only=(1,)) -> Qwen3MoeConfig:  # fmt: skip
    return Qwen3MoeConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=inter,
        moe_intermediate_size=moe_inter,
        num_experts=experts,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=list(mlp_only),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=mf.INIT_RANGE,
        **mf.NO_SPECIAL,
    )


def _mixtral_config() -> MixtralConfig:
    return MixtralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        sliding_window=None,
        tie_word_embeddings=False,
        initializer_range=mf.INIT_RANGE,
        **mf.NO_SPECIAL,
    )


def _nemotron_h_moe_config() -> NemotronHConfig:
    base = mf._nemotron_h_config().to_dict()
    for key in ("hybrid_override_pattern", "layers_block_type", "num_hidden_layers"):
        base.pop(key, None)
    return NemotronHConfig(**{
        **base,
        "hybrid_override_pattern": "ME*E",
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 64,
        "moe_latent_size": 32,
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "num_nextn_predict_layers": 0,
    })  # fmt: skip


FAMILIES = {
    "qwen3_moe": (Qwen3MoeForCausalLM, _qwen3_moe_config),
    "mixtral": (MixtralForCausalLM, _mixtral_config),
    # LatentMoE (latent 32 of hidden 64), shared expert, 4 groups of 2 experts, 2 groups kept.
    "nemotron_h_moe": (NemotronHForCausalLM, _nemotron_h_moe_config),
    # hidden 128, q 4 x 64, kv 2 x 64, expert width 128: every K and N a multiple of 128.
    "qwen3_moe_fp8": (
        Qwen3MoeForCausalLM,
        lambda: _qwen3_moe_config(128, 4, 64, 256, 128, 4, layers=1, mlp_only=()),
    ),
}
OFFSET = 10  # seeds apart from make_fixtures.py's fixtures


def _build(cls, make_config, offset: int) -> torch.nn.Module:
    gen = mf._seed(offset)
    model = cls(make_config())
    mf._perturb(model, gen)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # zeros at init: make it matter
                buf.copy_(0.05 * torch.randn(buf.shape, generator=gen))
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    return model


class _Routers:
    """Records each MoE router's logits (`[T, E]`) during a forward pass."""

    def __init__(self, model) -> None:
        self.k = model.config.num_experts_per_tok
        self.routers = [m for name, m in model.named_modules()
                        if name.endswith(("mlp.gate", "mixer.gate"))]  # fmt: skip
        assert self.routers, "no router modules found"
        self.seen: list[torch.Tensor] = []
        for m in self.routers:
            m.register_forward_hook(lambda _m, _i, out: self.seen.append(out[0].float()))

    @torch.no_grad()
    def margins(self, model, seq: list[int]) -> tuple[np.ndarray, float]:
        """`[n_moe_layers, len(seq)]` margins (logit units) and the largest |router logit|."""
        self.seen.clear()
        model(input_ids=torch.tensor([seq], dtype=torch.long), use_cache=False)
        out = []
        for logits, router in zip(self.seen, self.routers, strict=True):
            if hasattr(router, "e_score_correction_bias"):
                out.append(_sigmoid_margin(router, logits, self.k))
            elif getattr(router, "topk_method", "") == "group_limited_greedy":
                out.append(_group_max_margin(router, logits, self.k))
            else:
                top = torch.sort(logits, dim=-1, descending=True).values
                out.append((top[:, self.k - 1] - top[:, self.k]).numpy())
        return np.stack(out).astype(np.float32), max(float(x.abs().max()) for x in self.seen)


def _quiet_prompts(model, routers: _Routers, offset: int) -> list[list[int]]:
    """Random prompts (fixed seed) on which transformers' router margins are at least
    `QUIET_MARGIN` at every position and MoE layer, built token by token (the model is causal:
    appending a token leaves the earlier positions' margins as they were): each next token is
    the first random draw whose position has no near-tie. The greedy continuation may still
    have near-ties."""
    rng = np.random.default_rng(mf.SEED + 2000 + offset)
    vocab, prompts = model.config.vocab_size, []
    for n in mf.PROMPT_LENGTHS:
        p: list[int] = []
        while len(p) < n:
            for _ in range(1000):
                tok = int(rng.integers(0, vocab))
                if routers.margins(model, p + [tok])[0][:, -1].min() >= QUIET_MARGIN:
                    p.append(tok)
                    break
            else:
                raise RuntimeError(f"no token continues {p} without a router near-tie")
        prompts.append(p)
    return prompts


def _router_margins(model, routers: _Routers, result) -> dict[str, np.ndarray]:
    """Per prompt + its greedy tokens, the margins of every MoE layer and position."""
    out, absmax = {}, 0.0
    for i, n in enumerate(result["prompt_lengths"]):
        seq = list(result["prompt_ids"][i, :n]) + list(result["greedy_tokens"][i])
        out[f"router_margin_{i}"], top = routers.margins(model, seq)
        absmax = max(absmax, top)
    out["router_logit_absmax"] = np.array(absmax, np.float32)
    return out


def _sigmoid_margin(router, logits: torch.Tensor, k: int) -> np.ndarray:
    """The sigmoid group router's margins in logit units: a logit moved by d moves its score
    (sigmoid' <= 1/4) by at most d / 4 and a group score (a sum of two) by d / 2, so the
    score margin of the expert choice counts x4 and that of the group choice x2."""
    scores = logits.sigmoid()
    choice = scores + router.e_score_correction_bias.float()
    t, e = choice.shape
    g, kg = router.num_group, router.topk_group
    group = choice.view(t, g, e // g).topk(2, dim=-1)[0].sum(-1)
    gs = torch.sort(group, dim=-1, descending=True).values
    group_margin = gs[:, kg - 1] - gs[:, kg] if kg < g else torch.full((t,), torch.inf)
    keep = torch.zeros_like(group).scatter_(1, group.topk(kg, dim=-1)[1], 1.0)
    masked = choice.masked_fill(~keep.repeat_interleave(e // g, 1).bool(), -torch.inf)
    cs = torch.sort(masked, dim=-1, descending=True).values
    choice_margin = cs[:, k - 1] - cs[:, k]
    return torch.minimum(4 * choice_margin, 2 * group_margin).numpy()


def _group_max_margin(router, logits: torch.Tensor, k: int) -> np.ndarray:
    """DeepSeek-V2's `group_limited_greedy` margins in logit units: softmax keeps the order of
    the logits, so a group's score (its largest softmax score) ranks as its largest logit; the
    smaller of the group choice's margin and the expert choice's within the kept groups."""
    t, e = logits.shape
    g, kg = router.num_group, router.topk_group
    group = logits.view(t, g, e // g).max(dim=-1).values
    gs = torch.sort(group, dim=-1, descending=True).values
    group_margin = gs[:, kg - 1] - gs[:, kg] if kg < g else torch.full((t,), torch.inf)
    keep = torch.zeros_like(group).scatter_(1, group.topk(kg, dim=-1)[1], 1.0)
    masked = logits.masked_fill(~keep.repeat_interleave(e // g, 1).bool(), -torch.inf)
    cs = torch.sort(masked, dim=-1, descending=True).values
    return torch.minimum(cs[:, k - 1] - cs[:, k], group_margin).numpy()


def _reference_of(cls, path: Path, offset: int) -> dict[str, np.ndarray]:
    model = mf._load_f32(cls, path).eval()
    routers = _Routers(model)
    prompts = _quiet_prompts(model, routers, offset)
    result = mf._reference(model, prompts)
    return result | _router_margins(model, routers, result)


def _make_bf16(name: str, offset: int, out: Path) -> dict[str, np.ndarray]:
    cls, make_config = FAMILIES[name]
    mf._save(_build(cls, make_config, offset), out / name)
    return _reference_of(cls, out / name, offset)


def _make_fp8(name: str, offset: int, out: Path) -> dict[str, np.ndarray]:
    """Saves the bf16 model (per-expert tensor names), quantizes its linears block-FP8, and
    computes the references from a float32 checkpoint of the dequantized weights."""
    cls, make_config = FAMILIES[name]
    path = out / name
    with tempfile.TemporaryDirectory() as tmp:
        bf16 = Path(tmp) / "bf16"
        mf._save(_build(cls, make_config, offset), bf16)
        with safe_open(str(bf16 / "model.safetensors"), "pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        tensors, dequant = {}, {}
        for key, value in state.items():
            module = key.rsplit(".", 2)
            if key.endswith(".weight") and module[-2] in mf.FP8_LINEARS + EXPERT_LINEARS:
                q, scale_inv, deq = mf._quantize_block_fp8(value)
                tensors[key], tensors[key + "_scale_inv"] = q, scale_inv
                dequant[key] = deq
            else:
                tensors[key] = value.contiguous()
                dequant[key] = value.float()
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((bf16 / "config.json").read_text())
        cfg["quantization_config"] = dict(mf.FP8_QUANT_CONFIG)
        (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        f32 = Path(tmp) / "f32"
        f32.mkdir()
        save_file(dequant, str(f32 / "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(bf16 / "config.json", f32 / "config.json")
        result = _reference_of(cls, f32, offset)
    try:
        mf._check_fp8_with_transformers(cls, path, result)
    except Exception as err:  # noqa: BLE001 - the cross-check is optional
        print(f"  (transformers' FP8 loader could not cross-check this MoE checkpoint: {err})")
    return result


def build(out: Path, only: str | None = None) -> None:
    """Writes every MoE fixture (or only `only`) under `out`."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    for offset, name in enumerate(FAMILIES, start=OFFSET):
        if only and name != only:
            continue
        make = _make_fp8 if name.endswith("_fp8") else _make_bf16
        ref = make(name, offset, out)
        mf._write_npz(out / name / "reference.npz", ref)
        margins = np.concatenate([ref[k].ravel() for k in ref if k.startswith("router_margin")])
        print(f"{name}: max|logit| "
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
