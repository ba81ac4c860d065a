"""What one prefill and one decode step cost on a target, compiled from the config alone.

`step_report(model, target=...)` builds the model as `jaxarena.models.load_pretrained` does
(family -> blocks, `BufferSizes.from_config` -> arena plan, `ArenaLM`), but with every array
abstract: weights, arena and caches are `jax.ShapeDtypeStruct`s, so nothing is allocated and
no weight is read. A 70B model reports on a laptop.

- The weights' dtypes come from the safetensors headers of a checkpoint directory (no tensor
  bytes are read), else from the config: `torch_dtype` for float weights, FP8 block-scaled
  linear weights when `quantization_config` says `fp8` (the layout `load_pretrained` keeps).
- The prefill step is compiled at `max_batch_tokens` tokens packed into `max_batch_size + 1`
  sequences (the fixed shape `CausalLM.generate` pads to), the decode step at
  `max_batch_size` sequences; both jitted with the arena and the caches donated, through the
  model's public `prefill` / `decode_step`.
- GPU targets (`h200`, `b200`) compile deviceless (`jaxarena.gpu_aot.compile_for_gpu`, CUDA
  plugin needed, no GPU): XLA's memory analysis, launches per call (kernels and copies, from
  the thunk sequence) and register spills per kernel (`ptxas -v`). The compile runs with the
  no-spill switch off so a spilling kernel is counted, not fatal.
- `cpu` compiles for this machine's CPU (Pallas kernels in interpret mode): memory analysis
  only; launches, copies and spills are None.
- `tp=N` (`ep` 1 or N): one device's model (`ModelConfig.shard`, `tp_axis` set) compiled as
  `tensor_parallel.shard_step` over N compile-only devices of the target (a `1x1xN`
  topology, `gpu_aot.gpu_mesh`): every figure is one device's, and each step reports its
  collectives (count and bytes per step against the minimum, `jaxarena.step_collectives`).

The dict `step_report` returns is what `jaxarena step-report --json` prints.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target, presets
from jaxarena._errors import ConfigError
from jaxarena._units import format_bytes, plural
from jaxarena.models.checkpoint import DTYPES, Reader, fp8_spec, open_checkpoint
from jaxarena.models.families.registry import family_for
from jaxarena.models.stack import ArenaLM
from jaxarena.models.tensor_parallel import (
    AXIS,
    check_degrees,
    check_tensor_parallel,
    shard_step,
    tp_mesh,
)
from jaxarena.step_collectives import (
    collective_minimum,
    collectives,
    format_collectives,
    link_seconds,
)
from jaxarena.step_model import COST_KEYS, format_model, model_step
from pallas_kernels._cost import new_session

__all__ = ["STEP_KEYS", "TARGETS", "ModelSource", "abstract_model", "check_parallelism",
           "compile_step", "step_args", "step_report", "step_report_details"]  # fmt: skip

TARGETS = ("h200", "b200", "cpu")
# The sizing `Target` each compile target's plan is built for (the split-K workspace and
# policy depend on it): an H200 is a Hopper part; the CPU takes the baseline build, as
# `load_pretrained` does.
SIZING_TARGETS = {"h200": "hopper", "b200": "b200", "cpu": "gb10"}
# The keys of each step's entry, in order (`decode` has "batch" where `prefill` has "tokens").
STEP_KEYS = ("temp_bytes", "alias_bytes", "launches", "copies", "spills", "collectives",
             "compile_seconds", *COST_KEYS)  # fmt: skip
# Thunk kinds that move bytes rather than compute (`jaxarena.gpu_dump` counts them as launches).
COPY_KINDS = frozenset({"kCopy", "kDeviceToDeviceCopy", "kCopyDone"})
# As `load_pretrained` builds its plan (guard bytes between regions).
GUARD_BYTES = 64

S = jax.ShapeDtypeStruct
I32 = jnp.int32


# -- where the model comes from ---------------------------------------------------------------


class ModelSource:
    """A model named on the command line: a preset, a `config.json` or a checkpoint directory.

    Attributes:
      name: as given.
      raw: the parsed `config.json` (for the family's block choices).
      config: `ModelConfig` of it.
      path: the folder errors name (the preset folder for a preset).
      checkpoint: the opened checkpoint (headers only) of a directory with safetensors, else None.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.checkpoint = None
        if name in presets():
            from importlib import resources

            text = (resources.files("jaxarena") / "presets" / f"{name}.json").read_text()
            self.raw = json.loads(text)
            self.config = ModelConfig.preset(name)
            self.path = Path("jaxarena/presets") / name
            return
        path = Path(name)
        try:
            exists = path.exists()
        except OSError:  # a name past the file system's limits (ENAMETOOLONG)
            exists = False
        if not exists:
            raise ConfigError(f"no preset, config.json or checkpoint directory named {name!r}; "
                              f"presets: {', '.join(presets())}")  # fmt: skip
        if path.is_dir() and ((path / "model.safetensors").is_file()
                              or (path / "model.safetensors.index.json").is_file()):  # fmt: skip
            self.checkpoint = open_checkpoint(path)  # reads the headers, maps the files
            self.raw, self.path = self.checkpoint.config, path
        else:
            file = path / "config.json" if path.is_dir() else path
            try:
                self.raw = json.loads(file.read_text())
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ConfigError(f"{file}: not valid JSON ({e})") from None
            self.path = file.parent
        self.config = ModelConfig.from_hf(path)


def _float_dtype(raw: dict[str, Any]) -> np.dtype:
    """The float weights' dtype a checkpoint of this config stores (`torch_dtype`/`dtype`)."""
    name = str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16").removeprefix("torch.")
    return {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}.get(
        name, np.dtype(ml_dtypes.bfloat16)
    )


class _ShapeReader(Reader):
    """A `Reader` that hands out shapes instead of tensors.

    With a checkpoint, every name, shape and dtype is checked against the safetensors headers
    exactly as `Reader` checks them (the returned views over the mapped files are never
    touched, so no tensor byte is read); without one, float tensors take `float_dtype` and FP8
    linear weights `float8_e4m3fn` with `float32` block scales. Matrices and vectors come back
    as `ShapeDtypeStruct`s; `raw` returns a zero-strided array (the Mamba conv kernel reshapes
    it; it is small).
    """

    def __init__(self, ckpt: Any, fp8: Any, float_dtype: np.dtype, *, tp: int = 1,
                 ep: int = 1) -> None:  # fmt: skip
        super().__init__(ckpt, fp8)
        self.float_dtype = float_dtype
        self.tp, self.ep = tp, ep

    def expert_ids(self, num_experts: int) -> range:
        """One device's routed experts: all with `ep == 1`, else the first device's
        `num_experts / ep` (every device holds as many; `tensor_parallel.ShardReader`)."""
        return range(num_experts if self.ep == 1 else num_experts // self.ep)

    def raw(self, name: str, shape: tuple[int, ...], dtypes: Any) -> np.ndarray:
        if self.ckpt is not None:
            shape = tuple(shape)
            if self.tp > 1 and name in self.ckpt and self.ckpt.shape(name) != shape:
                # One device's slice (`tensor_parallel.ShardReader` cuts it): the name and the
                # dtype are checked against the header, the shape is the per-device one.
                view = super().raw(name, self.ckpt.shape(name), dtypes)
                return np.broadcast_to(np.zeros((), view.dtype), shape)
            view = super().raw(name, shape, dtypes)
            return np.broadcast_to(np.zeros((), view.dtype), view.shape)
        self.used.add(name)
        first = dtypes[0]
        dt = self.float_dtype if first in ("BF16", "F16", "F32") and len(dtypes) > 1 else \
            DTYPES[first]  # fmt: skip
        return np.broadcast_to(np.zeros((), dt), tuple(shape))

    def _sds(self, name: str, shape: tuple[int, ...], dtypes: Any) -> S:
        a = self.raw(name, shape, dtypes)
        return S(a.shape, a.dtype)

    def vector(self, name: str, n: int) -> S:
        return self._sds(name, (n,), ("BF16", "F16", "F32"))

    def matrix(self, name: str, rows: int, cols: int) -> S:
        return self._sds(name, (rows, cols), ("BF16", "F16", "F32"))

    def linear(self, module: str, out: int, inp: int) -> Any:
        name = module + ".weight"
        if self.fp8 is not None and self.fp8.quantized(module):
            bo, bi = self.fp8.block
            return {"w": self._sds(name, (out, inp), ("F8_E4M3",)),
                    "scale_inv": self._sds(module + ".weight_scale_inv",
                                           (-(-out // bo), -(-inp // bi)), ("F32",))}  # fmt: skip
        w = self._sds(name, (out, inp), ("BF16", "F16", "F32"))
        return S((inp, out), w.dtype)

    def qkv(self, prefix: str, cfg: Any) -> Any:
        h, hd = cfg.hidden_size, cfg.head_dim
        parts = [self.linear(f"{prefix}.{n}_proj", heads * hd, h) for n, heads in
                 (("q", cfg.num_attention_heads), ("k", cfg.num_key_value_heads),
                  ("v", cfg.num_key_value_heads))]  # fmt: skip
        if all(isinstance(p, S) for p in parts) and len({p.dtype for p in parts}) == 1:
            return S((h, sum(p.shape[1] for p in parts)), parts[0].dtype)
        return tuple(parts)


def _abstract_params(source: ModelSource, arch: Any, raw: dict[str, Any], *,
                     headers: bool = True, local: ModelConfig | None = None, tp: int = 1,
                     ep: int = 1) -> dict[str, Any]:  # fmt: skip
    """The weights `load_pretrained` would place, as `ShapeDtypeStruct`s (the same tree as
    `Family.read_params`: `{"embed", "layers", "final_norm"[, "lm_head"]}`); `headers`: check
    them against the checkpoint's safetensors headers (when there is a checkpoint). `local`:
    one device's config over `tp` / `ep` (`ModelConfig.shard`): one device's weights."""
    family = family_for(raw.get("model_type"), source.path)
    names = family.tensor_names(source.config, arch)
    cfg = source.config if local is None else local
    ckpt = source.checkpoint if headers else None
    reader = _ShapeReader(ckpt, fp8_spec(raw, source.path), _float_dtype(raw), tp=tp, ep=ep)
    h, v = cfg.hidden_size, cfg.vocab_size
    layers = [block.read_params(reader, cfg, prefix, norm)
              for block, (prefix, norm) in zip(arch.blocks, names.blocks, strict=True)]  # fmt: skip
    params: dict[str, Any] = {"embed": reader.matrix(names.embed, v, h), "layers": layers,
                              "final_norm": reader.vector(names.final_norm, h)}  # fmt: skip
    if not arch.tie_embeddings:
        head = reader.matrix(names.lm_head, v, h)
        params["lm_head"] = S((h, v), head.dtype)
    return jax.tree.map(lambda a: S(a.shape, a.dtype) if isinstance(a, np.ndarray) else a, params)


def abstract_model(
    model: str | ModelSource,
    *,
    target: str = "h200",
    max_batch_tokens: int = 8192,
    max_seq_len: int = 32768,
    kv_block_size: int = 16,
    max_batch_size: int = 64,
    weights: str | None = None,
    tp: int = 1,
    ep: int = 1,
) -> tuple[ArenaLM, Any, Any]:
    """The `ArenaLM` of `model` at these limits with abstract weights and caches.

    Args:
      model: a preset name, a `config.json` path, a directory (checkpoint or config), or a
        `ModelSource`.
      target: "h200", "b200" or "cpu" (which `Target` sizes the plan; Pallas interpret mode off
        for the GPU targets).
      weights: None: as the checkpoint / config stores them; "fp8": FP8 block-scaled linear
        weights even when the config is float (as `--weights fp8` budgets them); "bf16": float
        (`torch_dtype`). Given, a checkpoint's headers are not consulted.
      tp, ep: tensor / expert parallelism (`jaxarena.models.tensor_parallel`; `ep` 1 or `tp`):
        > 1, the model is ONE device's (`ModelConfig.shard(tp=, ep=)`, `tp_axis` set, the
        whole vocabulary in `tp_vocab`), its plan, weights and caches one device's, with no
        device axis (`compile_step` adds it). A checkpoint's headers are checked for names
        and dtypes; the shapes are the per-device ones.

    Returns:
      `(model, params, caches)`; params and caches are trees of `ShapeDtypeStruct`s.

    Raises:
      ConfigError: bad limits, an unreadable config, a dimension that does not split over
      `tp`; ValueError: `ep` other than 1 or `tp`; NotImplementedError: a family or feature
      the models do not run (or do not split); CheckpointError: headers that do not fit.
    """
    target = _check_target(target)
    check_parallelism(tp, ep)
    source = model if isinstance(model, ModelSource) else ModelSource(model)
    raw = dict(source.raw)
    if weights == "fp8" and "quantization_config" not in raw:
        raw["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    elif weights == "bf16":
        raw.pop("quantization_config", None)
    elif weights not in (None, "fp8"):
        raise ValueError(f"weights={weights!r} must be None, 'bf16' or 'fp8'")
    cfg = source.config
    try:
        family = family_for(raw.get("model_type"), source.path)
        arch = family.arch(raw.get("model_type"), raw, cfg, source.path, max_seq_len)
        fp8_spec(raw, source.path)  # here, so an unsupported quantization names the right file
    except NotImplementedError as e:
        if source.checkpoint is not None or not cfg.source:
            raise
        # The families name `<folder>/config.json`; a preset or a config file has its own name.
        raise NotImplementedError(str(e).replace(str(source.path / "config.json"),
                                                 cfg.source)) from None  # fmt: skip
    whole = cfg
    if tp > 1:
        cfg = check_tensor_parallel(arch, whole, tp, ep)
    sizing = Target.preset(SIZING_TARGETS[target])
    levers = Levers()
    sizes = BufferSizes.from_config(cfg, max_batch_tokens, max_seq_len, kv_block_size,
                                    max_batch_size, levers=levers, target=sizing)  # fmt: skip
    if kv_block_size < 1:
        raise NotImplementedError("kv_block_size=0 (an unpaged KV cache): the models run a "
                                  "paged cache only")  # fmt: skip
    plan = ArenaPlan.sequential(sizes, guard_bytes=GUARD_BYTES)
    lm = ArenaLM(config=cfg, arch=arch, plan=plan, max_batch_tokens=max_batch_tokens,
                 max_seq_len=max_seq_len, kv_block_size=kv_block_size,
                 max_batch_size=max_batch_size, target=sizing, levers=levers,
                 interpret=None if target == "cpu" else False)  # fmt: skip
    if tp > 1:
        lm = dataclasses.replace(
            lm, tp_axis=AXIS, tp_vocab=whole.vocab_size, tp_groups=whole.n_groups or None
        )
    # A weight format other than the checkpoint's: shapes from the config, dtypes from `weights`.
    params = _abstract_params(source, arch, raw, headers=weights is None,
                              local=cfg if tp > 1 else None, tp=tp, ep=ep)  # fmt: skip
    rows = max_batch_size + 1  # as load_pretrained: + the padding sequence of a prefill
    # The KV page pool: one longest sequence's pages. A step's cost does not depend on the
    # pool's size (the pages are indexed in place), and a pool of every slot at full length
    # (load_pretrained's test sizing) can exceed the device, which makes XLA's scheduler and
    # rematerialization work against a memory limit the serve would never have.
    pool = lm.pages_per_seq
    caches = jax.eval_shape(lambda: lm.init_caches(num_blocks=pool, rows=rows))
    return lm, params, caches


def check_parallelism(tp: Any, ep: Any, target: str | None = None) -> None:
    """`ValueError` unless `tp` is a positive int and `ep` is 1 or `tp` (the mesh splits the
    experts over the tensor-parallel devices themselves, `tensor_parallel`), and, for the
    "cpu" target, this process has `tp` CPU devices."""
    check_degrees(tp, ep)
    if target == "cpu" and tp > 1 and jax.device_count() < tp:
        raise ValueError(f"tp={tp} on the cpu target needs {tp} CPU devices; this process has "
                         f"{jax.device_count()} (start it with XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={tp})")  # fmt: skip


def _check_target(target: Any) -> str:
    if not isinstance(target, str) or target.lower() not in TARGETS:
        raise ConfigError(f"target={target!r} is not one of {', '.join(TARGETS)}")
    return target.lower()


# -- compiling -----------------------------------------------------------------------------------


def step_args(lm: ArenaLM, kind: str) -> tuple[Callable, tuple[Any, ...]]:
    """The step function and its extra abstract arguments (after params, arena, caches)."""
    per_seq = lm.pages_per_seq
    if kind == "prefill":
        s = lm.max_batch_size + 1
        return lm.prefill, (S((lm.max_batch_tokens,), I32), S((s + 1,), I32),
                            S((s, per_seq), I32))  # fmt: skip
    b = lm.max_batch_size
    return lm.decode_step, (S((b,), I32), S((b,), I32), S((b, per_seq), I32), S((b,), I32))


def _count(thunks: Any, kinds: frozenset[str]) -> int | None:
    """Launches per call of the thunks of `kinds` only (while bodies times their trip counts)."""
    from jaxarena.gpu_dump import count_launches

    def keep(ts: list) -> list:
        out = []
        for t in ts:
            if t.sections:
                out.append(dataclasses.replace(
                    t, sections={k: keep(v) for k, v in t.sections.items()}))  # fmt: skip
            elif t.kind in kinds:
                out.append(t)
        return out

    return count_launches(keep(thunks), per_call=True)


def compile_step(lm: ArenaLM, params: Any, caches: Any, kind: str, target: str, *,
                 context: int | None = None, tp: int = 1) -> dict[str, Any]:  # fmt: skip
    """Compiles one step (`"prefill"` or `"decode"`) of `abstract_model`'s result for `target`
    and returns `{"temp_bytes", "alias_bytes", "argument_bytes", "launches", "copies",
    "spills", "collectives", "compile_seconds", *COST_KEYS}` (`spills`: kernels that spill
    registers; launches, copies, spills, collectives and the cost model's keys
    (`jaxarena.step_model`, for a workload of `context` tokens per sequence, default
    `default_context`) None on "cpu").

    `tp > 1` (the model `abstract_model(..., tp=tp)` built): the step runs as
    `tensor_parallel.shard_step` over `tp` compile-only devices (`gpu_aot.gpu_mesh`; on "cpu"
    this process' first `tp` devices); params and caches get the leading device axis, the
    arena is the sharded global arena. Every figure is one device's; `collectives` counts the
    collectives per step and the bytes each device hands them (`jaxarena.step_collectives`).

    Raises:
      GpuUnavailable: a GPU target without the CUDA plugin (`jaxarena.gpu_aot.gpu_device`).
    """
    fn, extra = step_args(lm, kind)
    arena = S(lm.plan.arena_shape, jnp.uint8)
    mesh = None
    if tp > 1:
        if target == "cpu":
            mesh = tp_mesh(tp)
        else:
            from jaxarena.gpu_aot import gpu_mesh

            mesh = gpu_mesh(tp, target, AXIS)
        fn = shard_step(fn, mesh)
        params, caches, arena = _on_mesh(params, mesh), _on_mesh(caches, mesh), S(
            (tp * arena.shape[0], arena.shape[1]), arena.dtype,
            sharding=lm.plan.sharding(mesh, AXIS))  # fmt: skip
    step = jax.jit(fn, donate_argnums=(1, 2))
    new_session()  # the Pallas kernels' cost declarations from here on are this step's
    if target == "cpu":
        if mesh is not None:
            extra = tuple(S(a.shape, a.dtype, sharding=jax.sharding.NamedSharding(
                mesh, jax.sharding.PartitionSpec())) for a in extra)  # fmt: skip
        t0 = time.perf_counter()
        compiled = step.trace(params, arena, caches, *extra).lower().compile()
        seconds = time.perf_counter() - t0
        m = compiled.memory_analysis()
        return {"temp_bytes": int(m.temp_size_in_bytes), "alias_bytes": int(m.alias_size_in_bytes),
                "argument_bytes": int(m.argument_size_in_bytes), "launches": None,
                "copies": None, "spills": None, "collectives": None,
                "compile_seconds": seconds, **dict.fromkeys(COST_KEYS)}  # fmt: skip
    from jaxarena.gpu_aot import compile_for_gpu

    res = compile_for_gpu(step, params, arena, caches, *extra, target=target, no_spills=False,
                          dump_dir=True, mesh=mesh)  # fmt: skip
    if mesh is not None:  # the cost model reads one device's weights and caches
        params, caches = _local(params), _local(caches)
    coll = collectives(res.dump_hlo_text or res.hlo_text, res.thunks, res.thunk_names)
    coll.update(collective_minimum(lm, kind, tp))
    coll["link_seconds"] = link_seconds(coll, tp, target)
    return {"temp_bytes": res.temp_bytes, "alias_bytes": res.alias_bytes,
            "argument_bytes": res.argument_bytes, "launches": res.launches,
            "copies": _count(res.thunks, COPY_KINDS),
            "spills": sum(1 for k in res.kernels if k.spill_store_bytes or k.spill_load_bytes),
            "collectives": coll, "compile_seconds": res.compile_seconds,
            **model_step(res, lm, params, caches, kind, context=context)}  # fmt: skip


def _on_mesh(tree: Any, mesh: Any) -> Any:
    """One device's abstract arrays as `[tp, ...]` arrays sharded over the mesh's axis."""
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS))
    tp = mesh.devices.size
    return jax.tree.map(lambda a: S((tp, *a.shape), a.dtype, sharding=sharding), tree)


def _local(tree: Any) -> Any:
    return jax.tree.map(lambda a: S(a.shape[1:], a.dtype), tree)


def _nbytes(tree: Any) -> int:
    return sum(int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize
               for a in jax.tree.leaves(tree))  # fmt: skip


def step_report(
    model: str | ModelSource,
    *,
    target: str = "h200",
    max_batch_tokens: int = 8192,
    max_seq_len: int = 32768,
    kv_block_size: int = 16,
    max_batch_size: int = 64,
    weights: str | None = None,
    steps: tuple[str, ...] = ("prefill", "decode"),
    progress: Callable[[str], None] | None = None,
    context: int | None = None,
    tp: int = 1,
    ep: int = 1,
) -> dict[str, Any]:
    """Compiles the prefill and decode steps of `model` for `target` (see the module docstring).

    Args:
      model, target, limits, weights, tp, ep: as for `abstract_model` (tp > 1: one device's
        step over `tp` compile-only devices, every figure one device's; `compile_step`).
      steps: which steps to compile (both by default).
      context: the workload the time is modeled for: tokens each decode sequence attends,
        tokens of each prompt a prefill step's tokens are cut into
        (`jaxarena.step_model.default_context` when None).
      progress: called with a line before each compile ("compiling decode for h200 ...").

    Returns:
      `{"target", "tp", "ep", "arena_bytes", "weight_bytes", "steps": {"prefill": {"tokens", *STEP_KEYS},
      "decode": {"batch", *STEP_KEYS}}}` (only the steps asked for), plus nothing else; the
      caches' and arguments' bytes and the layer count are in `step_details` of the
      `details=` ... see `step_report_details`.

    Raises:
      as `abstract_model` and `compile_step`.
    """
    return step_report_details(model, target=target, max_batch_tokens=max_batch_tokens,
                               max_seq_len=max_seq_len, kv_block_size=kv_block_size,
                               max_batch_size=max_batch_size, weights=weights, steps=steps,
                               progress=progress, context=context, tp=tp,
                               ep=ep)["report"]  # fmt: skip


def step_report_details(model: Any, *, target: str = "h200", steps: tuple[str, ...] = (
        "prefill", "decode"), progress: Callable[[str], None] | None = None,
        context: int | None = None, tp: int = 1, ep: int = 1,
        **limits: Any) -> dict[str, Any]:  # fmt: skip
    """`{"report": step_report's dict, "argument_bytes": {step: bytes}, "cache_bytes",
    "layers", "model_type"}`: the report and what the text output prints beside it."""
    target = _check_target(target)
    bad = [s for s in steps if s not in ("prefill", "decode")]
    if bad or not steps:
        raise ValueError(f"steps={steps!r} must name 'prefill' and/or 'decode'")
    check_parallelism(tp, ep, target)
    if target != "cpu":
        from jaxarena import gpu_aot

        # GpuUnavailable before any work or progress line
        gpu_aot.gpu_device(target) if tp == 1 else gpu_aot.gpu_devices(target, tp)
    lm, params, caches = abstract_model(model, target=target, tp=tp, ep=ep, **limits)
    report: dict[str, Any] = {"target": target, "tp": tp, "ep": ep,
                              "arena_bytes": lm.plan.total_bytes,
                              "weight_bytes": _nbytes(params), "steps": {}}  # fmt: skip
    arguments = {}
    for kind in steps:
        if progress is not None:
            where = target if tp == 1 else f"{tp} x {target} (tp={tp}, ep={ep})"
            progress(f"compiling {kind} for {where} ...")
        got = compile_step(lm, params, caches, kind, target, context=context, tp=tp)
        arguments[kind] = got.pop("argument_bytes")
        first = ("tokens", lm.max_batch_tokens) if kind == "prefill" else \
            ("batch", lm.max_batch_size)  # fmt: skip
        report["steps"][kind] = {first[0]: first[1], **got}
    return {
        "report": report,
        "argument_bytes": arguments,
        "cache_bytes": _nbytes(caches),
        "layers": lm.config.num_hidden_layers,
        "model_type": lm.config.model_type,
    }


def _row(kind: str, step: dict[str, Any], arguments: int, layers: int) -> list[str]:
    rows = f"{step['tokens']:,} tokens" if kind == "prefill" else f"{step['batch']:,} seqs"
    launches, copies = step["launches"], step["copies"]
    per_layer = "n/a" if launches is None else f"{launches / layers:.1f}"
    return [kind, rows, format_bytes(step["temp_bytes"]), format_bytes(step["alias_bytes"]),
            format_bytes(arguments), "n/a" if launches is None else f"{launches:,}",
            "n/a" if copies is None else f"{copies:,}", per_layer,
            "n/a" if step["spills"] is None else str(step["spills"]),
            f"{step['compile_seconds']:.1f} s"]  # fmt: skip


def format_report(details: dict[str, Any], name: str, limits: dict[str, int]) -> str:
    """The text `jaxarena step-report` prints for `step_report_details`' result."""
    r = details["report"]
    how = "this CPU, memory analysis only" if r["target"] == "cpu" else "deviceless compile"
    where = r["target"]
    if r.get("tp", 1) > 1:
        where = f"{r['tp']} x {where} (tp={r['tp']}, ep={r['ep']}; figures per device)"
    lines = [
        f"{name} [{details['model_type']}] on {where} ({how}), "
        + ", ".join(f"{k}={v}" for k, v in limits.items()),
        f"arena {format_bytes(r['arena_bytes'])} ({r['arena_bytes']:,} B), weights "
        f"{format_bytes(r['weight_bytes'])}, KV/state caches {format_bytes(details['cache_bytes'])}"
        f", {plural(details['layers'], 'layer')}",
    ]
    head = ["step", "rows", "temp", "alias", "arguments", "launches", "copies", "per layer",
            "spills", "compile"]  # fmt: skip
    table = [head] + [_row(k, s, details["argument_bytes"][k], details["layers"])
                      for k, s in r["steps"].items()]  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in
                 enumerate(zip(row, widths, strict=True))]  # fmt: skip
        lines.append("  " + "  ".join(cells))
    lines.append("temp: XLA's buffers outside the arguments (beyond the arena); alias: outputs "
                 "written into the donated arena and caches; launches: kernels + copies + "
                 "memsets per call")  # fmt: skip
    return "\n".join(lines + format_collectives(r["steps"]) + format_model(r["steps"]))
