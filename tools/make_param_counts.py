"""Count the parameters of every bundled preset with HuggingFace transformers.

Writes ``tests/fixtures/hf_param_counts.json``: for each ``jaxarena/presets/*.json`` (each
is a HuggingFace ``config.json``), the model transformers builds from it, on the meta
device (no memory, no weights), counted parameter by parameter.  The tests compare
jaxarena's own parameter counts with this table without importing torch.

Run it from the repository root in a separate virtual environment (see tools/README.md)::

    pip install torch==2.13.0 && pip install transformers safetensors numpy
    python tools/make_param_counts.py                 # every preset
    python tools/make_param_counts.py deepseek-v3.2   # only these, merged into the table

Per preset the table holds:

* ``known``: whether transformers built a model from the config (else ``error`` says why);
* ``class``: the model class (the config's ``architectures[0]`` where transformers has it,
  else ``AutoModelForCausalLM``'s choice);
* ``total``: ``sum(p.numel())`` over ``model.parameters()``, each parameter once, so tied
  embeddings count once;
* ``tied_embeddings``: whether the output embedding is the same tensor as the input one in
  the model transformers built; ``tie_word_embeddings_in_file``: what the file says (top
  level, else ``text_config``; null when absent);
* ``by_kind``: the total split into kinds by parameter name (see ``kind_of``): ``embed``,
  ``lm_head``, ``attention``, ``linear_attention`` (Gated DeltaNet), ``ssm`` (Mamba mixers
  without their norm), ``mlp_dense``, ``moe_experts``, ``moe_shared_experts``, ``moe_router``,
  ``norms`` (every norm scale/bias, including Mamba's gated norm and q/k norms),
  ``ngram_embed`` (per-layer n-gram embedding modules, ``ple``), ``hyper_connections``
  (DeepSeek-V4 / Qwen4-exp hyper-connection mixers), ``vision`` and ``other``;
* ``text_total`` / ``vision_total``: for vision-language models, the parameters outside and
  inside the vision tower (``visual``/``vision`` in the name);
* ``unused_in_forward`` / ``total_used``: parameters transformers allocates but its forward
  never reads (see ``_unused_parameters``; ``notes`` says which), and ``total`` without them;
* ``by_name``: the count per parameter name with layer and expert indices replaced by ``N``
  (summed over layers), for finding where a mismatch comes from;
* ``mtp_config``: multi-token-prediction settings the config declares (keys with ``mtp``
  or ``nextn``) and ``mtp_params_in_model``, the parameters transformers built for them
  (names containing ``mtp``); transformers usually does not build them, and they are not
  part of ``total`` unless built.

The output is deterministic (sorted keys, no timestamps).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "jaxarena" / "presets"
OUT = ROOT / "tests" / "fixtures" / "hf_param_counts.json"

_ATTN_LEAVES = re.compile(
    r"\.(q_proj|k_proj|v_proj|o_proj|qkv_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|"
    r"wq|wk|wv|wo|sinks)\."
)
_SSM_LEAVES = re.compile(r"\.(A_log|D|dt_bias|conv1d|in_proj|out_proj|x_proj|dt_proj)(\.|$)")


def kind_of(name: str) -> str:
    """The kind a parameter belongs to, from its dotted name alone."""
    if "visual" in name or "vision" in name:
        return "vision"
    if name.startswith("lm_head") or ".lm_head" in name:
        return "lm_head"
    if re.search(r"(embed_tokens|\.embeddings|\.wte)\.", name) or name.startswith("embed"):
        return "embed"
    leaf_module = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else name
    if "norm" in leaf_module or "layernorm" in name.lower():
        return "norms"
    if ".ple." in name or "ngram_embedding" in name:
        return "ngram_embed"
    if "hyper_connection" in name or re.search(r"\.(attn_hc|ffn_hc|hc_head)\.", name):
        return "hyper_connections"
    if "linear_attn" in name:
        return "linear_attention"
    if "shared_expert" in name:
        return "moe_shared_experts"
    if ".experts." in name or name.endswith(".experts"):
        return "moe_experts"
    if (
        re.search(r"\.(router|gate)\.(weight|bias|e_score_correction_bias)$", name)
        or ".router." in name
        or name.endswith(".e_score_correction_bias")
    ):
        return "moe_router"
    if (
        "self_attn" in name
        or ".attn." in name
        or ".attention." in name
        or _ATTN_LEAVES.search(name)
    ):
        return "attention"
    if _SSM_LEAVES.search(name):
        return "ssm"
    if ".mlp." in name or ".ffn." in name or re.search(r"\.(gate_proj|up_proj|down_proj)\.", name):
        return "mlp_dense"
    return "other"


def _pattern(name: str) -> str:
    return re.sub(r"\.\d+\.", ".N.", re.sub(r"\.\d+\.", ".N.", name))


def _mtp_keys(cfg: dict, prefix: str = "") -> dict:
    found = {}
    for key, value in cfg.items():
        if isinstance(value, dict):
            found.update(_mtp_keys(value, f"{prefix}{key}."))
        elif "mtp" in key.lower() or "nextn" in key.lower():
            found[prefix + key] = value
    return found


def _model_class(config, raw: dict):
    for arch in raw.get("architectures") or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return None


def _unused_parameters(model: torch.nn.Module) -> tuple[int, list[str]]:
    """Parameters transformers allocates that its forward never reads, with a note each.

    Known case (transformers 5.24): LongCat-Flash's experts module sizes ``gate_up_proj``
    for routed + zero ("identity") experts, but zero experts never touch it and released
    checkpoints hold no weights for them.
    """
    unused, notes = 0, []
    for name, module in model.named_modules():
        zero = getattr(module, "zero_expert_num", 0) or 0
        gate_up = getattr(module, "gate_up_proj", None)
        routed = getattr(module, "num_routed_experts", None)
        if zero and isinstance(gate_up, torch.nn.Parameter) and routed is not None:
            if gate_up.shape[0] == routed + zero:
                unused += zero * gate_up[0].numel()
                notes.append(name)
    if notes:
        first = notes[0]
        notes = [
            f"{len(notes)} experts modules (e.g. {first}) allocate gate_up_proj rows for "
            f"zero_expert_num identity experts that forward never reads: {unused:,} "
            "parameters, counted in total but not in total_used (released checkpoints "
            "do not hold them)"
        ]
    return unused, notes


def _config(path: Path, raw: dict, entry: dict):
    """transformers' config of a preset. A `model_type` transformers does not know (Kimi K2's
    `kimi_k2`, whose remote code is a copy of DeepSeek-V3's) is read by the config class of
    the model class its `architectures` names, as that architecture; `entry["read_as"]` says so.
    """
    if raw.get("model_type") not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        cls = _model_class(None, raw)
        if cls is not None:
            entry["read_as"] = cls.config_class.model_type
            fields = {k: v for k, v in raw.items() if k not in ("model_type", "auto_map")}
            return cls.config_class(**fields)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(path.read_text())
        return AutoConfig.from_pretrained(tmp)


def count_preset(path: Path) -> dict:
    """The table entry for one preset (see the module docstring)."""
    raw = json.loads(path.read_text())
    entry: dict = {"model_type": raw.get("model_type"), "mtp_config": _mtp_keys(raw)}
    try:
        config = _config(path, raw, entry)
        cls = _model_class(config, raw)
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            if cls is not None:
                model = cls._from_config(config)
            else:
                model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # record why transformers cannot build it
        entry.update(known=False, error=f"{type(exc).__name__}: {exc}".splitlines()[0][:400])
        return entry

    by_kind: dict[str, int] = {}
    by_name: dict[str, int] = {}
    mtp = 0
    for name, param in model.named_parameters():  # shared (tied) tensors are listed once
        n = param.numel()
        kind = kind_of(name)
        by_kind[kind] = by_kind.get(kind, 0) + n
        key = _pattern(name)
        by_name[key] = by_name.get(key, 0) + n
        if "mtp" in name:
            mtp += n
    total = sum(by_kind.values())
    unused, notes = _unused_parameters(model)
    assert total == sum(p.numel() for p in model.parameters())
    inp, outp = model.get_input_embeddings(), model.get_output_embeddings()
    tied = outp is not None and inp is not None and outp.weight is inp.weight
    vision = by_kind.get("vision", 0)
    entry.update(
        known=True,
        **{"class": type(model).__name__},
        total=total,
        tied_embeddings=tied,
        tie_word_embeddings_in_file=raw.get(
            "tie_word_embeddings", (raw.get("text_config") or {}).get("tie_word_embeddings")
        ),
        by_kind=dict(sorted(by_kind.items())),
        text_total=total - vision,
        vision_total=vision,
        mtp_params_in_model=mtp,
        unused_in_forward=unused,
        total_used=total - unused,
        notes=notes,
        by_name=dict(sorted(by_name.items())),
    )
    return entry


def main(only: list[str]) -> None:
    """Counts every preset, or with preset names given, only those (merged into the table)."""
    torch.set_num_threads(1)
    paths = sorted(PRESETS.glob("*.json"))
    counted = {p.stem: count_preset(p) for p in paths if not only or p.stem in only}
    missing = sorted(set(only) - set(counted))
    if missing:
        raise SystemExit(f"no such preset(s): {missing}")
    kept = json.loads(OUT.read_text())["presets"] if only and OUT.exists() else {}
    table = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "generated_by": "tools/make_param_counts.py",
        "presets": dict(sorted({**kept, **counted}.items())),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    for name, entry in counted.items():
        if entry["known"]:
            kinds = ", ".join(f"{k} {v:,}" for k, v in entry["by_kind"].items())
            print(f"{name}: {entry['total']:,} ({entry['class']}; {kinds})")
            for note in entry["notes"]:
                print(f"  note: {note}")
        else:
            print(f"{name}: unknown to transformers: {entry['error']}")


if __name__ == "__main__":
    main(sys.argv[1:])
