"""Build the tiny HuggingFace checkpoint fixtures and transformers' reference outputs.

The tests under ``tests/`` read the files this script writes with numpy and safetensors only;
neither torch nor transformers is needed to run them.  This script needs both, in a
separate virtual environment (never the project's own ``.venv``)::

    python3 -m venv /tmp/venv-torch && . /tmp/venv-torch/bin/activate
    pip install torch==2.13.0          # a CPU build; on these machines it installs from local disk
    pip install transformers safetensors numpy
    pip install accelerate             # optional: cross-checks the FP8 format with transformers
    python tools/make_fixtures.py      # from the repository root; writes tests/fixtures/checkpoints/

Options: ``--out DIR`` writes somewhere else (the default is ``tests/fixtures/checkpoints``
next to this file's parent), ``--only NAME`` rebuilds one fixture.

What it writes, per fixture ``tests/fixtures/checkpoints/<name>/``:

* ``config.json`` and ``model.safetensors`` (``llama_sharded`` instead has
  ``model-0000K-of-0000N.safetensors`` plus ``model.safetensors.index.json``), written by
  ``save_pretrained(..., safe_serialization=True)`` in bfloat16, as released checkpoints are.
  Weights are random from a fixed seed with ``initializer_range=0.2`` so the logits are far
  from uniform.  Then every norm scale and Mamba ``D`` become ``1 + 0.2 * N(0, 1)``,
  ``A_log`` gets ``+ 0.1 * N(0, 1)``, conv biases ``0.1 * N(0, 1)`` and ``dt_bias`` the
  inverse softplus of a log-uniform dt in [0.01, 0.1], so that a loader that swaps or
  skips one of them gives different logits.  Config files are rewritten in the spelling of
  released checkpoints (see ``_real_world_config``).
* ``reference.npz`` (numpy only, ``np.load(path)`` without pickle):

  - ``prompt_ids`` int32 ``[P, max_len]`` (zero padded) and ``prompt_lengths`` int32 ``[P]``;
  - ``prefill_logits_<i>`` float32 ``[len_i, vocab]``: transformers' logits for prompt ``i``
    alone (batch 1, no padding), the saved bf16 weights loaded with ``dtype=float32`` and
    ``attn_implementation="eager"``;
  - ``greedy_tokens`` int32 ``[P, 8]``: ``generate(do_sample=False, use_cache=True)``;
  - ``greedy_logits_<i>`` float32 ``[8, vocab]``: the logits each generated token was chosen
    from, and ``greedy_top2_gap`` float32 ``[P, 8]``: top-1 minus top-2 logit at each
    generated position, so tests can leave out near-ties;
  - ``transformers_version`` and ``torch_version`` (0-d unicode arrays).

* ``qwen3_fp8`` is a Qwen3 checkpoint whose q/k/v/o/gate/up/down projection weights are
  ``float8_e4m3fn`` with one float32 ``weight_scale_inv`` per 128x128 block (shape
  ``[ceil(out/128), ceil(in/128)]``, ``scale_inv = max(amax/448, tiny)``), in the format of
  Qwen3-*-FP8 and DeepSeek-V3 (``quantization_config = {"quant_method": "fp8",
  "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}``).
  Embeddings, norms and ``lm_head`` stay bf16.  Its reference outputs come from a plain
  float32 Qwen3 model holding the dequantized weights (``fp8 * scale_inv`` per block).

The script is deterministic: one CPU thread, fixed seeds, and ``reference.npz`` written with
fixed zip timestamps, so running it twice gives byte-identical files (compare with
``sha256sum tests/fixtures/checkpoints/*/*``).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Mamba2Config,
    Mamba2ForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

SEED = 20261130
PROMPT_LENGTHS = (1, 5, 11, 16)
MAX_NEW_TOKENS = 8
INIT_RANGE = 0.2
FP8_BLOCK = 128
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_QUANT_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
}
# No special tokens: generation must never stop early on an "eos" the random model emits.
NO_SPECIAL = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def _llama_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=INIT_RANGE,
        **NO_SPECIAL,
    )


def _qwen3_config(
    hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, tied: bool
) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        initializer_range=INIT_RANGE,
        **NO_SPECIAL,
    )


def _mamba2_config() -> Mamba2Config:
    return Mamba2Config(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_heads=8,
        head_dim=16,
        expand=2,
        state_size=16,
        n_groups=2,
        conv_kernel=4,
        chunk_size=8,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=False,
        initializer_range=INIT_RANGE,
        **NO_SPECIAL,
    )


def _nemotron_h_config() -> NemotronHConfig:
    return NemotronHConfig(
        vocab_size=256,
        hidden_size=64,
        hybrid_override_pattern="M*-M",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        mlp_hidden_act="relu2",
        mamba_num_heads=8,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=2,
        expand=2,
        conv_kernel=4,
        chunk_size=8,
        # transformers clamps softplus(dt) at `time_step_min` in its chunked prefill but not in
        # its one-token decode step; a tiny minimum (and dt_bias set in `_perturb`) keeps that
        # clamp from ever binding, so both paths and any implementation agree (checked below).
        time_step_min=1e-6,
        max_position_embeddings=128,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=False,
        initializer_range=INIT_RANGE,
        **NO_SPECIAL,
    )


# name -> (model class, config factory, extra save options)
FAMILIES = {
    "llama": (LlamaForCausalLM, _llama_config),
    "qwen3": (Qwen3ForCausalLM, lambda: _qwen3_config(64, 128, 4, 2, 16, tied=True)),
    "mamba2": (Mamba2ForCausalLM, _mamba2_config),
    "nemotron_h": (NemotronHForCausalLM, _nemotron_h_config),
    # hidden 128, q 4x64 = 256, kv 2x64 = 128, intermediate 256: all multiples of 128.
    "qwen3_fp8": (Qwen3ForCausalLM, lambda: _qwen3_config(128, 256, 4, 2, 64, tied=False)),
}
SHARDED_COPY_OF = "llama"  # written a second time as `llama_sharded`, in 100 kB shards


def _seed(offset: int) -> torch.Generator:
    torch.manual_seed(SEED + offset)
    return torch.Generator().manual_seed(SEED + 1000 + offset)


def _perturb(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Moves the parameters that init leaves at constants away from them (see module doc)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if (
                name.endswith("norm.weight")
                or name.endswith("norm_f.weight")
                or name.endswith("_norm.weight")
            ):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".D"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".dt_bias"):
                # inverse softplus of dt drawn log-uniform in [0.01, 0.1]
                u = torch.rand(p.shape, generator=gen)
                dt = torch.exp(math.log(0.01) + u * (math.log(0.1) - math.log(0.01)))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif name.endswith(".A_log"):
                p.add_(0.1 * noise)
            elif name.endswith("conv1d.bias"):
                p.copy_(0.1 * noise)


def _real_world_config(path: Path) -> None:
    """Rewrites config.json in the form released checkpoints use.

    transformers 5 writes infinities as ``{"__float__": "Infinity"}``, Nemotron-H's layer
    pattern as ``layers_block_type``, ``dtype`` and ``rope_parameters``; released checkpoints
    have a bare ``Infinity``, ``hybrid_override_pattern``, ``torch_dtype`` and a top-level
    ``rope_theta``.  Both spellings of dtype and rope theta are written (same values) so a
    loader written for either generation reads them; transformers reads the result back to
    the same model (the references are computed from the rewritten files).
    """
    cfg = json.loads((path / "config.json").read_text())

    def fix(v):
        if isinstance(v, dict) and set(v) == {"__float__"}:
            return float(v["__float__"])
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        return v

    cfg = fix(cfg)
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg["dtype"]
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("rope_type") == "default" and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]
    if cfg.get("model_type") == "nemotron_h":
        if "layers_block_type" in cfg:
            letter = {
                "linear_attention": "M",
                "mamba": "M",
                "full_attention": "*",
                "attention": "*",
                "mlp": "-",
                "moe": "E",
            }
            pattern = "".join(letter[t] for t in cfg.pop("layers_block_type"))
            cfg["hybrid_override_pattern"] = pattern
            cfg["num_hidden_layers"] = len(pattern)
        if "E" not in cfg["hybrid_override_pattern"]:
            # transformers writes its MoE / MTP defaults into every Nemotron-H config; dense
            # releases (Nemotron-H-8B) carry none of them, and this fixture has no MoE layer.
            for key in (
                "n_routed_experts",
                "n_shared_experts",
                "moe_intermediate_size",
                "moe_shared_expert_intermediate_size",
                "moe_latent_size",
                "moe_shared_expert_overlap",
                "num_experts_per_tok",
                "routed_scaling_factor",
                "n_group",
                "topk_group",
                "norm_topk_prob",
                "num_nextn_predict_layers",
                "mtp_layers_block_type",
                "output_router_logits",
            ):
                cfg.pop(key, None)
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _prompts(vocab: int, offset: int) -> list[list[int]]:
    rng = np.random.default_rng(SEED + 2000 + offset)
    return [rng.integers(0, vocab, size=n).tolist() for n in PROMPT_LENGTHS]


@torch.no_grad()
def _reference(model: torch.nn.Module, prompts: list[list[int]]) -> dict[str, np.ndarray]:
    """transformers' float32 prefill logits and greedy continuation for each prompt."""
    model.eval()
    vocab = model.config.vocab_size
    dt_min = _watch_dt(model)
    out: dict[str, np.ndarray] = {}
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), np.int32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
    out["prompt_ids"] = ids
    out["prompt_lengths"] = np.array([len(p) for p in prompts], np.int32)
    tokens = np.zeros((len(prompts), MAX_NEW_TOKENS), np.int32)
    gaps = np.zeros((len(prompts), MAX_NEW_TOKENS), np.float32)
    for i, p in enumerate(prompts):
        x = torch.tensor([p], dtype=torch.long)
        logits = model(input_ids=x, use_cache=False).logits[0].float().numpy()
        assert logits.shape == (len(p), vocab) and np.isfinite(logits).all()
        out[f"prefill_logits_{i}"] = logits
        gen = model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=MAX_NEW_TOKENS,
            min_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            use_cache=True,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
        new = gen.sequences[0, len(p) :].numpy()
        assert new.shape == (MAX_NEW_TOKENS,), new.shape
        step_logits = torch.stack(gen.logits, 1)[0].float().numpy()  # [8, vocab]
        assert (step_logits.argmax(-1) == new).all()
        top2 = np.sort(step_logits, axis=-1)[:, -2:]
        tokens[i] = new
        gaps[i] = top2[:, 1] - top2[:, 0]
        out[f"greedy_logits_{i}"] = step_logits
        # The cached decode must agree with recomputing the whole sequence (teacher forcing).
        full = torch.tensor([p + new.tolist()], dtype=torch.long)
        recomputed = model(input_ids=full, use_cache=False).logits[0, len(p) - 1 : -1].numpy()
        err = np.abs(recomputed - step_logits).max()
        assert err < 1e-4, f"transformers' cached decode disagrees with recompute by {err}"
    if dt_min:
        # Only Nemotron-H clamps (at time_step_min, prefill only); Mamba-2's limit is (0, inf).
        floor = model.config.time_step_min if model.config.model_type == "nemotron_h" else 0.0
        assert min(dt_min) > 10 * floor, f"softplus(dt) reached {min(dt_min)} (clamp {floor})"
        print(f"  smallest softplus(dt) seen: {min(dt_min):.3g} (transformers' clamp: {floor})")
    out["greedy_tokens"] = tokens
    out["greedy_top2_gap"] = gaps
    out["transformers_version"] = np.array(transformers.__version__)
    out["torch_version"] = np.array(torch.__version__)
    return out


def _watch_dt(model: torch.nn.Module) -> list[float]:
    """Records the smallest softplus(dt + dt_bias) each Mamba mixer computes."""
    seen: list[float] = []
    for module in model.modules():
        if hasattr(module, "dt_bias") and hasattr(module, "in_proj"):

            def hook(_mod, _inp, out, mixer=module):
                raw = out[..., -mixer.num_heads :] + mixer.dt_bias
                seen.append(float(torch.nn.functional.softplus(raw).min()))

            module.in_proj.register_forward_hook(hook)
    return seen


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez with fixed timestamps and order, so the bytes are reproducible."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def _build_bf16(name: str, offset: int) -> torch.nn.Module:
    cls, make_config = FAMILIES[name]
    gen = _seed(offset)
    config = make_config()
    model = cls(config)  # float32 init from the global seed
    _perturb(model, gen)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    return model


def _load_f32(cls, path: Path) -> torch.nn.Module:
    return cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")


def _save(model: torch.nn.Module, path: Path, **kw) -> None:
    if path.exists():
        shutil.rmtree(path)
    model.save_pretrained(path, safe_serialization=True, **kw)
    (path / "generation_config.json").unlink(missing_ok=True)
    _real_world_config(path)


def _quantize_block_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (fp8 weight, scale_inv [ceil(out/128), ceil(in/128)], float32 dequantized)."""
    out_dim, in_dim = w.shape
    rows, cols = math.ceil(out_dim / FP8_BLOCK), math.ceil(in_dim / FP8_BLOCK)
    w32 = w.float()
    padded = torch.zeros(rows * FP8_BLOCK, cols * FP8_BLOCK)
    padded[:out_dim, :in_dim] = w32
    blocks = padded.view(rows, FP8_BLOCK, cols, FP8_BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale_inv = torch.clamp(amax / FP8_MAX, min=torch.finfo(torch.float32).tiny)
    scaled = blocks / scale_inv[:, None, :, None]
    q = torch.clamp(scaled, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    deq = (q.float() * scale_inv[:, None, :, None]).view(rows * FP8_BLOCK, cols * FP8_BLOCK)
    q = q.view(rows * FP8_BLOCK, cols * FP8_BLOCK)[:out_dim, :in_dim].contiguous()
    return q, scale_inv.contiguous(), deq[:out_dim, :in_dim].contiguous()


def _make_fp8(name: str, offset: int, out: Path) -> dict[str, np.ndarray]:
    cls, make_config = FAMILIES[name]
    model = _build_bf16(name, offset)
    path = out / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    dequant: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        module = key.rsplit(".", 2)
        if key.endswith(".weight") and module[-2] in FP8_LINEARS:
            q, scale_inv, deq = _quantize_block_fp8(value)
            tensors[key] = q
            tensors[key + "_scale_inv"] = scale_inv
            dequant[key] = deq
        else:
            tensors[key] = value.contiguous()
            dequant[key] = value.float()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = dict(FP8_QUANT_CONFIG)
    cfg["architectures"] = [cls.__name__]
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    _real_world_config(path)
    # Reference: the same architecture in float32 holding the dequantized weights.
    ref = cls(make_config()).float()
    ref.config._attn_implementation = "eager"
    missing, unexpected = ref.load_state_dict(dequant, strict=True)
    assert not missing and not unexpected
    result = _reference(ref, _prompts(ref.config.vocab_size, offset))
    _check_fp8_with_transformers(cls, path, result)
    return result


@torch.no_grad()
def _check_fp8_with_transformers(cls, path: Path, result: dict[str, np.ndarray]) -> None:
    """Cross-checks the FP8 format: transformers' own FP8 loader must read the checkpoint.

    Needs `accelerate` (transformers' FP8 quantizer requires it); skipped with a message
    when it is missing.  With ``dequantize=True`` transformers expands each block itself, so
    its logits must equal the reference computed from our dequantized weights.
    """
    try:
        import accelerate  # noqa: F401
        from transformers import FineGrainedFP8Config
    except ImportError:
        print("  (accelerate not installed: FP8 format not cross-checked with transformers)")
        return
    model = cls.from_pretrained(
        path,
        quantization_config=FineGrainedFP8Config(dequantize=True),
        dtype=torch.float32,
        attn_implementation="eager",
    ).eval()
    worst = 0.0
    for i, n in enumerate(result["prompt_lengths"]):
        ids = torch.tensor(result["prompt_ids"][i : i + 1, :n], dtype=torch.long)
        logits = model(input_ids=ids, use_cache=False).logits[0].numpy()
        worst = max(worst, float(np.abs(logits - result[f"prefill_logits_{i}"]).max()))
    assert worst < 1e-4, f"transformers' FP8 loader disagrees with our dequantization: {worst}"
    print(f"  transformers' FP8 loader (dequantize=True) matches the reference to {worst:.2g}")


def build(out: Path, only: str | None = None) -> None:
    """Writes every fixture (or only `only`) under `out`."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    stats: dict[str, dict[str, np.ndarray]] = {}
    for offset, name in enumerate(FAMILIES):
        if only and name != only and not (only == "llama_sharded" and name == "llama"):
            continue
        if name == "qwen3_fp8":
            ref = _make_fp8(name, offset, out)
        else:
            cls = FAMILIES[name][0]
            model = _build_bf16(name, offset)
            _save(model, out / name)
            if name == SHARDED_COPY_OF:
                _save(model, out / f"{name}_sharded", max_shard_size="100KB")
            loaded = _load_f32(cls, out / name)
            ref = _reference(loaded, _prompts(loaded.config.vocab_size, offset))
            if name == SHARDED_COPY_OF:
                sharded = _load_f32(cls, out / f"{name}_sharded")
                for (k, a), (k2, b) in zip(
                    loaded.state_dict().items(), sharded.state_dict().items(), strict=True
                ):
                    assert k == k2 and torch.equal(a, b), k
                _write_npz(out / f"{name}_sharded" / "reference.npz", ref)
        _write_npz(out / name / "reference.npz", ref)
        stats[name] = ref
        if name == SHARDED_COPY_OF:
            stats[f"{name}_sharded"] = ref
        print(
            f"{name}: max|logit| "
            f"{max(np.abs(ref[f'prefill_logits_{i}']).max() for i in range(4)):.3f}, "
            f"median top-2 gap {np.median(ref['greedy_top2_gap']):.3f}, "
            f"min gap {ref['greedy_top2_gap'].min():.4f}"
        )
    if not only:
        _write_readme(out, stats)


def _summary(cfg: dict) -> str:
    keys = (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "num_heads",
        "state_size",
        "ssm_state_size",
        "mamba_num_heads",
        "mamba_head_dim",
        "n_groups",
        "chunk_size",
        "hybrid_override_pattern",
        "vocab_size",
        "tie_word_embeddings",
    )
    parts = [f"{k}={cfg[k]}" for k in keys if k in cfg]
    if "quantization_config" in cfg:
        parts.append("fp8 e4m3, 128x128 block scales")
    return ", ".join(parts)


def _write_readme(out: Path, stats: dict[str, dict[str, np.ndarray]]) -> None:
    """Lists every fixture under `out` with its files and reference statistics."""
    lines = [
        "# Tiny HuggingFace checkpoints and transformers' reference outputs",
        "",
        "Written by `tools/make_fixtures.py` (see its docstring for how to run it and what",
        "`reference.npz` holds); do not edit by hand.  Weights are bfloat16 (FP8 + float32",
        "block scales for the projections of `qwen3_fp8`); references are transformers'",
        f"float32 outputs (transformers {transformers.__version__}, torch {torch.__version__}).",
        "",
        "| fixture | class | config | files (bytes) | max abs logit | top-2 gap median / min |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(stats):
        ref = stats[name]
        cfg = json.loads((out / name / "config.json").read_text())
        files = ", ".join(
            f"`{f.name}` {f.stat().st_size:,}"
            for f in sorted((out / name).iterdir())
            if f.name != "README.md"
        )
        count = len(ref["prompt_lengths"])
        top = max(float(np.abs(ref[f"prefill_logits_{i}"]).max()) for i in range(count))
        gaps = ref["greedy_top2_gap"]
        lines.append(
            f"| `{name}` | {cfg['architectures'][0]} | {_summary(cfg)} | {files} | {top:.2f} | "
            f"{float(np.median(gaps)):.3f} / {float(gaps.min()):.4f} |"
        )
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and f.name != "README.md")
    lines += [
        "",
        f"Total: {total:,} bytes.  Prompts: lengths {list(PROMPT_LENGTHS)}, "
        f"{MAX_NEW_TOKENS} greedy tokens each.",
        "`llama_sharded` holds the same weights and references as `llama`, split into",
        "100 kB shards with `model.safetensors.index.json`.",
        "",
        "Notes:",
        "",
        "- transformers' Nemotron-H clamps softplus(dt) at `time_step_min` in its chunked",
        "  prefill but not in its one-token decode step.  The `nemotron_h` fixture sets",
        "  `time_step_min=1e-6` and the script asserts the clamp never binds, so the",
        "  references hold for an implementation with or without that clamp.",
        "- The script asserts, for every fixture, that transformers' cached greedy decode",
        "  equals recomputing the whole sequence (teacher forcing) to 1e-4.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "checkpoints"
    parser.add_argument("--out", type=Path, default=default)
    parser.add_argument("--only", choices=[*FAMILIES, f"{SHARDED_COPY_OF}_sharded"])
    args = parser.parse_args()
    build(args.out, args.only)


if __name__ == "__main__":
    main()
