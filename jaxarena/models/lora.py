"""PEFT LoRA adapters in a loaded model's device slots.

An adapter directory as `peft` saves it: `adapter_config.json` (`r`, `lora_alpha`,
`use_rslora`, `target_modules`, `rank_pattern`, `alpha_pattern`) and
`adapter_model.safetensors` (`base_model.model.<module>.lora_A.weight` `[r, in]` and
`...lora_B.weight` `[out, r]` per adapted module). Supported modules: `q_proj`, `k_proj`,
`v_proj`, `o_proj` of GQA attention blocks (not gated attention) and `gate_proj`, `up_proj`,
`down_proj` of dense MLP blocks (an MoE family's dense layers included; routed and shared
experts are not).

A model loaded with `max_lora_rank=R, max_loras=L` holds, in every such block's parameters,
`params["lora"][module] = {"a": bf16[L, R, in], "b": bf16[L, out, R], "scale": f32[L]}`
(`lora_tables`): adapter `i` lives in slot `i`, its A rows and B columns past its rank are
zero (exact), its scale is `lora_alpha / r` (`/ sqrt(r)` with `use_rslora`) per module, and a
module it does not adapt has scale 0 and zero weights. `read_adapter` checks an adapter
against the model; `set_slot` writes it into a slot with one jitted update whose slot is data
(no recompile of the steps: the tables keep their shapes).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.checkpoint import Checkpoint, CheckpointError, _File

__all__ = ["LoraError", "LoraLayout", "adapter_rank", "lora_layout", "read_adapter", "set_slot"]

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
_PEFT_PREFIX = "base_model.model."


class LoraError(ValueError):
    """An adapter the model cannot load: a missing or unreadable file, a rank past
    `max_lora_rank`, a module the model does not have, a tensor of the wrong shape, or a
    PEFT option this implementation does not run. The message names the file and tensor."""


@dataclasses.dataclass(frozen=True)
class LoraLayout:
    """Where adapters go in a model: `modules[i] = (block index, HF module prefix,
    {module: (in, out)})` for every block with LoRA tables; `max_loras` slots of rank
    `max_rank`."""

    modules: tuple[tuple[int, str, tuple[tuple[str, tuple[int, int]], ...]], ...]
    max_loras: int
    max_rank: int

    def module_names(self) -> dict[str, tuple[int, str, tuple[int, int]]]:
        """`{"<prefix>.<module>": (block index, module, (in, out))}`."""
        return {f"{prefix}.{m}": (i, m, dims) for i, prefix, mods in self.modules
                for m, dims in mods}  # fmt: skip


def _block_modules(block: Any, config: Any) -> dict[str, tuple[int, int]]:
    h, hd = config.hidden_size, config.head_dim
    if isinstance(block, Attention) and not block.gated:
        q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    if isinstance(block, MLP):
        inter = config.intermediate_size
        mods = {"up_proj": (h, inter), "down_proj": (inter, h)}
        if block.act != "relu2":
            mods["gate_proj"] = (h, inter)
        return mods
    return {}


def lora_layout(arch: Any, config: Any, prefixes: list[str], *, max_loras: int,
                max_rank: int) -> LoraLayout:  # fmt: skip
    """The LoRA layout of a model: its blocks (`arch.blocks`) with HF prefixes `prefixes`."""
    for name, v in (("max_loras", max_loras), ("max_lora_rank", max_rank)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be an int >= 1")
    mods = []
    for i, (block, prefix) in enumerate(zip(arch.blocks, prefixes, strict=True)):
        m = _block_modules(block, config)
        if m:
            mods.append((i, prefix, tuple(sorted(m.items()))))
    if not mods:
        raise NotImplementedError("this model has no block LoRA adapters can target "
                                  "(GQA attention or a dense MLP)")  # fmt: skip
    return LoraLayout(modules=tuple(mods), max_loras=max_loras, max_rank=max_rank)


def lora_tables(layout: LoraLayout) -> dict[int, dict[str, dict[str, np.ndarray]]]:
    """Zeroed host tables per block index (every slot empty: the base model)."""
    out = {}
    bf16 = jnp.bfloat16
    n, r = layout.max_loras, layout.max_rank
    for i, _, mods in layout.modules:
        out[i] = {m: {"a": np.zeros((n, r, k), bf16), "b": np.zeros((n, o, r), bf16),
                      "scale": np.zeros((n,), np.float32)} for m, (k, o) in mods}  # fmt: skip
    return out


def _pattern(patterns: dict[str, Any], name: str, default: Any) -> Any:
    """peft's per-module override: the first key matching the end of the module name."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def _read_config(root: Path) -> dict[str, Any]:
    cfg_path = root / "adapter_config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LoraError(f"{cfg_path}: cannot read the adapter config ({e})") from e
    if not isinstance(cfg, dict):
        raise LoraError(f"{cfg_path}: not a JSON object")
    return cfg


def adapter_rank(path: str | Path) -> int:
    """The largest rank of the PEFT adapter at `path` (`r` and `rank_pattern`'s values), from
    its `adapter_config.json` alone: what `max_lora_rank` must be at least.

    Raises:
      LoraError: the config is missing, unreadable, or has no positive integer rank.
    """
    cfg_path = Path(path) / "adapter_config.json"
    cfg = _read_config(Path(path))
    ranks = [cfg.get("r", 8), *(cfg.get("rank_pattern") or {}).values()]
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ranks):
        raise LoraError(f"{cfg_path}: ranks {ranks} must be integers >= 1")
    return max(ranks)


def read_adapter(path: str | Path, layout: LoraLayout) -> dict[int, dict[str, dict[str, Any]]]:
    """One adapter's host tables (`lora_tables`' structure with one slot: `a [R, in]`,
    `b [out, R]`, `scale` scalar), checked against `layout`.

    Raises:
      LoraError: see the class; NotImplementedError-like options (DoRA, `modules_to_save`,
        biases) are LoraErrors too, naming the key of `adapter_config.json`.
    """
    root = Path(path)
    cfg_path, st_path = root / "adapter_config.json", root / "adapter_model.safetensors"
    cfg = _read_config(root)
    if not st_path.is_file():
        raise LoraError(f"{st_path}: missing (an adapter is adapter_config.json plus "
                        "adapter_model.safetensors, as peft's save_pretrained writes)")  # fmt: skip
    for key, ok in (("use_dora", False), ("modules_to_save", None), ("bias", "none")):
        if cfg.get(key, ok) not in (ok, [], False):
            raise LoraError(f"{cfg_path}: {key}={cfg[key]!r} is not supported (plain LoRA "
                            f"only: {key}={ok!r})")  # fmt: skip
    alpha, use_rs = float(cfg.get("lora_alpha", 8)), bool(cfg.get("use_rslora", False))
    alpha_pat = cfg.get("alpha_pattern") or {}
    try:
        ckpt = Checkpoint(root, cfg, [_File(st_path)])
    except CheckpointError as e:
        raise LoraError(str(e)) from e
    known = layout.module_names()
    pairs: dict[str, dict[str, str]] = {}
    for name in ckpt:
        m = re.fullmatch(r"(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", name)
        if not m or not m.group(1).startswith(_PEFT_PREFIX):
            raise LoraError(f"{st_path}: tensor {name!r} is not a LoRA A/B weight "
                            f"('{_PEFT_PREFIX}<module>.lora_A.weight')")  # fmt: skip
        mod = m.group(1)[len(_PEFT_PREFIX):]
        if mod not in known:
            supported = sorted({k.rsplit(".", 1)[1] for k in known})
            raise LoraError(f"{st_path}: tensor {name!r} adapts module {mod!r}, which this "
                            f"model does not have as a LoRA target (supported: {supported} "
                            "of its attention and dense MLP blocks)")  # fmt: skip
        pairs.setdefault(mod, {})[m.group(2)] = name
    out: dict[int, dict[str, dict[str, Any]]] = {}
    big_r = layout.max_rank
    for mod, ab in sorted(pairs.items()):
        i, short, (k, o) = known[mod]
        if set(ab) != {"A", "B"}:
            raise LoraError(f"{st_path}: module {mod!r} has only lora_{''.join(ab)}")
        a, b = ckpt[ab["A"]], ckpt[ab["B"]]
        r = a.shape[0] if a.ndim == 2 else -1
        if a.shape != (r, k) or b.shape != (o, r):
            raise LoraError(f"{st_path}: {ab['A']} {a.shape} / {ab['B']} {b.shape} must be "
                            f"[r, {k}] / [{o}, r] for {mod} (in {k}, out {o})")  # fmt: skip
        if r > big_r:
            raise LoraError(f"{st_path}: module {mod!r} has rank {r} > max_lora_rank={big_r}; "
                            f"load the model with max_lora_rank >= {r}")  # fmt: skip
        mod_alpha = float(_pattern(alpha_pat, mod, alpha))
        scale = mod_alpha / (math.sqrt(r) if use_rs else r)
        pa = np.zeros((big_r, k), jnp.bfloat16)
        pb = np.zeros((o, big_r), jnp.bfloat16)
        pa[:r] = np.asarray(a, np.float32).astype(jnp.bfloat16)
        pb[:, :r] = np.asarray(b, np.float32).astype(jnp.bfloat16)
        out.setdefault(i, {})[short] = {"a": pa, "b": pb, "scale": np.float32(scale)}
    if not out:
        raise LoraError(f"{st_path}: no LoRA weights")
    return out


def _fill(layout: LoraLayout, adapter: dict[int, dict[str, dict[str, Any]]]):
    """The adapter as a full single-slot tree (zeros and scale 0 where it adapts nothing)."""
    bf16 = jnp.bfloat16
    r = layout.max_rank
    full = {}
    for i, _, mods in layout.modules:
        full[i] = {m: adapter.get(i, {}).get(m) or {
            "a": np.zeros((r, k), bf16), "b": np.zeros((o, r), bf16),
            "scale": np.float32(0)} for m, (k, o) in mods}  # fmt: skip
    return full


@jax.jit
def _write(tables, slot, one):
    return jax.tree.map(lambda t, v: t.at[slot].set(v.astype(t.dtype)), tables, one)


_write_donated = jax.jit(_write.__wrapped__, donate_argnums=0)


def set_slot(params: dict[str, Any], layout: LoraLayout, slot: int,
             adapter: dict[int, dict[str, dict[str, Any]]] | None) -> dict[str, Any]:  # fmt: skip
    """`params` with `adapter` (`read_adapter`; None: clear the slot) in slot `slot`: one
    jitted, donated update of the LoRA tables with the slot as data (compiled once per
    model). The other parameters are the same arrays."""
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < layout.max_loras:
        raise ValueError(f"slot={slot!r} must be an int in [0, max_loras={layout.max_loras})")
    layers = list(params["layers"])
    tables = {i: layers[i]["lora"] for i, _, _ in layout.modules}
    one = _fill(layout, adapter or {})
    new = _write_donated(tables, jnp.int32(slot), one)
    for i, t in new.items():
        layers[i] = {**layers[i], "lora": t}
    return {**params, "layers": layers}
