"""HuggingFace checkpoints on the arena: `load_pretrained(path, ...) -> CausalLM`.

Families (`model_type` of `config.json`, `jaxarena.models.families.registry`): `llama`,
`mistral` (sliding window), `qwen2` (q/k/v biases), `qwen3` (q/k norms), `gemma2`,
`gemma3_text` and `gemma3` (its language model), `mamba2` and `nemotron_h` (Mamba-2, attention
and relu^2 MLP blocks), `qwen3_5` / `qwen3_5_text` and `qwen3_next` (Gated DeltaNet and gated
attention blocks).

Sliding windows: the KV cache is not capped at the window. Every attention layer writes its
keys through the one block table of the sequence (the paged layout shares it across layers),
so a sliding layer cannot recycle its pages on its own; split-K decode never reads the pages
before the window, and prefill masks them. Capping would need a per-layer-type block table
(ring of `ceil(window / kv_block_size) + 1` pages). Checkpoints may be
FP8 block-quantized (`quantization_config = {"quant_method": "fp8", "weight_block_size":
[128, 128]}`, the Qwen3-*-FP8 / DeepSeek-V3 format): their linear weights stay
`float8_e4m3fn` on the device with their f32 `weight_scale_inv` block scales, activations are
quantized 1 x 128 into the arena's FP8 regions, and the products are block-scaled; the modules
the config names in `modules_to_not_convert`, the norms, the embeddings and the LM head stay as
stored (bf16).

The arena is sized from the same `config.json` (`ModelConfig.from_hf` ->
`BufferSizes.from_config`); there is no second size computation. The model itself is
`jaxarena.models.stack.ArenaLM`, the one implementation the random-weight reference hybrid
also runs on.

Known differences from transformers: Nemotron-H's chunked prefill in transformers clamps
softplus(dt) at `time_step_min` while its one-token decode does not; here neither clamps (the
clamp changes nothing when `time_step_min` is below every softplus(dt)).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target
from jaxarena.models.arena_options import GUARD_BYTES, packed_plan, page_tables, with_kv_dtype
from jaxarena.models.blocks.attention import KV_DTYPES
from jaxarena.models.checkpoint import CheckpointError, Reader, fp8_spec, open_checkpoint
from jaxarena.models.core.kernels import resolve_kernels
from jaxarena.models.families.registry import SUPPORTED_FAMILIES, family_for
from jaxarena.models.lora import LoraLayout, lora_layout, lora_tables, read_adapter, set_slot
from jaxarena.models.stack import ArenaLM
from jaxarena.models.tensor_parallel import as_mesh, load_on_mesh, per_device_bytes, shard_step
from jaxarena.testing import count_traces

__all__ = ["CausalLM", "CheckpointError", "RequestError", "load_pretrained", "SUPPORTED_FAMILIES"]


class RequestError(ValueError):
    """A `prefill_logits` / `generate` request the model cannot serve as given: token ids that
    are empty, not integers or outside the vocabulary, more prompts than `max_batch_size`, a
    bad `max_new_tokens`, or a length past `max_batch_tokens` / `max_seq_len`. The message
    names the argument and the limit."""


# Compiled steps by (model, step signature, weight / arena / cache types), shared across
# CausalLM instances.
_EXECUTABLES: dict[Any, tuple[Any, Any]] = {}
_MAX_EXECUTABLES = 32


def _abstract(tree: Any) -> tuple[Any, tuple[Any, ...]]:
    """The abstract signature of a pytree of arrays: its structure and every leaf's type
    (shape, dtype, weak type; `jax.typeof`)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(jax.typeof(x) for x in leaves)


def _bytes(tree: Any, mesh: Any) -> int:
    """Bytes of `tree` on one device (a mesh's arrays carry a leading device axis)."""
    return per_device_bytes(tree) if mesh is not None else sum(
        x.nbytes for x in jax.tree.leaves(tree))  # fmt: skip


def _callable_key(fn: Any) -> Any:
    """A hashable key of a step function and the static arguments bound to it: a
    `functools.partial` by its function, arguments and keywords (two equal partials are one
    key), a bound method by its function and (equal) instance."""
    if isinstance(fn, functools.partial):
        return (_callable_key(fn.func), fn.args, tuple(sorted(fn.keywords.items())))
    if hasattr(fn, "__func__") and hasattr(fn, "__self__"):
        return (fn.__func__, fn.__self__)
    return fn


# -- the loaded model --------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class CausalLM:
    """A checkpoint loaded onto one device with its arena; runs prefill and greedy decoding.

    Holds the device state between calls: the weights (placed once), the arena (allocated
    once, donated to every step, so its device buffer never moves) and the KV / SSM caches.
    Not thread-safe.

    Attributes:
      model: the `ArenaLM` (config, architecture, arena plan, serve limits).
      params: the weights on the device (see `jaxarena.models.stack` and the blocks).
      path, model_type: where the checkpoint came from and its family.
      fp8: whether the checkpoint's linear weights are FP8 block-quantized.
      arena_pointer: the device address of the arena buffer at load time.
      compile_seconds: seconds spent compiling, by step (`"prefill"`, `"prefill_all"`,
        `"prefill_chunk"` (chunked prefill), `"decode"`); near zero when an equal model in the process compiled it already.
      decode_counter: counts the traces of the decode step (`jaxarena.testing`).
      last_stats: figures of the last `generate` call (tokens, seconds).
      serving_pool: the caches are a serving engine's page pool (`load_pretrained(...,
        kv_pages=...)`): `generate` and `prefill_logits` refuse to run.
      compiler_options: XLA options for every step's compile (`Lowered.compile`), e.g.
        `{"xla_backend_optimization_level": 0}` for quicker CPU compiles of small test
        models; None: XLA's defaults.
      mesh: None on one device; else the tensor-parallel mesh (`load_pretrained(mesh=...)`):
        params, arena and caches carry a leading device axis and every step runs under
        `shard_map` (`jaxarena.models.tensor_parallel`); the byte figures are per device.
    """

    model: ArenaLM
    params: Any
    path: str
    model_type: str
    fp8: bool
    arena: jax.Array = dataclasses.field(repr=False)
    caches: Any = dataclasses.field(repr=False)
    block_tables: jax.Array = dataclasses.field(repr=False)
    arena_pointer: int = 0
    compile_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    last_stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    compiler_options: dict[str, Any] | None = None
    serving_pool: bool = False
    lora: LoraLayout | None = None
    mesh: Any = None
    whole_config: ModelConfig | None = None

    def __post_init__(self) -> None:
        # Counts the traces of the decode step (shared with every CausalLM of an equal model).
        self.decode_counter = count_traces(self.model.decode_step)
        self._compiled: dict[Any, Any] = {}

    # -- figures ----------------------------------------------------------------------------------

    @property
    def config(self) -> ModelConfig:
        """The whole model's config (on a mesh `model.config` is one device's share)."""
        return self.whole_config or self.model.config

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights on the device (on EACH device of a mesh; FP8 weights count one
        byte per element)."""
        return _bytes(self.params, self.mesh)

    @property
    def arena_bytes(self) -> int:
        return self.model.plan.total_bytes

    @property
    def cache_bytes(self) -> int:
        return _bytes(self.caches, self.mesh)

    def step_memory(self, kind: str = "decode") -> dict[str, int]:
        """XLA's memory analysis of a compiled step (`"decode"`, `"prefill"`, `"prefill_all"`)
        in bytes: `argument`, `output`, `alias` (outputs written into donated inputs) and
        `temp`. A step that keeps the arena in place aliases the arena and the caches and
        needs far fewer temp bytes than the arena.

        Raises:
          KeyError: the step has not run (compiled) yet.
        """
        for key, (compiled, _) in self._compiled.items():
            if key[0] == kind:
                m = compiled.memory_analysis()
                return {"argument": m.argument_size_in_bytes, "output": m.output_size_in_bytes,
                        "alias": m.alias_size_in_bytes, "temp": m.temp_size_in_bytes}  # fmt: skip
        raise KeyError(f"step {kind!r} has not been compiled yet; run it first")

    # -- running ----------------------------------------------------------------------------------

    def _run(self, kind: str, fn: Any, *args: Any) -> Any:
        """Runs `fn(params, arena, caches, *args)` jitted with arena and caches donated,
        compiling once per abstract signature (`kind`, `fn` with its bound static arguments,
        and every argument's pytree structure, shape, dtype and weak type); keeps the returned
        arena and caches.

        Executables are shared by every `CausalLM` of an equal model with an equal signature
        (the weights' and caches' included) in the process (`_EXECUTABLES`), so loading the
        same checkpoint at the same limits again does not compile again."""
        key = (kind, _callable_key(fn), _abstract(args))
        if key not in self._compiled:
            t0 = time.perf_counter()
            options = tuple(sorted((self.compiler_options or {}).items()))
            shared = (self.model, key, _abstract((self.params, self.arena, self.caches)), options)
            if shared not in _EXECUTABLES:
                counter = count_traces(fn if self.mesh is None else shard_step(fn, self.mesh))
                jitted = jax.jit(counter, donate_argnums=(1, 2))
                lowered = jitted.lower(self.params, self.arena, self.caches, *args)
                compiled = lowered.compile(compiler_options=self.compiler_options)
                if len(_EXECUTABLES) >= _MAX_EXECUTABLES:
                    _EXECUTABLES.pop(next(iter(_EXECUTABLES)))
                _EXECUTABLES[shared] = (compiled, counter)
            self._compiled[key] = _EXECUTABLES[shared]
            self.compile_seconds[kind] = self.compile_seconds.get(kind, 0.0) + (
                time.perf_counter() - t0
            )
        compiled, counter = self._compiled[key]
        if kind == "decode":
            self.decode_counter = counter
        out = compiled(self.params, self.arena, self.caches, *args)
        self.arena, self.caches = out[0], out[1]
        return out[2:]

    def load_lora(self, slot: int, path: str | Path | None) -> None:
        """Loads the PEFT adapter at `path` into LoRA slot `slot` (None: empties it), in
        place and without recompiling any step (`jaxarena.models.lora`).

        Raises:
          RuntimeError: the model was loaded without `max_lora_rank`.
          LoraError: the adapter does not fit the model (named file, tensor and rule).
          ValueError: `slot` outside `[0, max_loras)`.
        """
        if self.lora is None:
            raise RuntimeError("this model has no LoRA slots: load_pretrained(..., "
                               "max_lora_rank=R, max_loras=N)")  # fmt: skip
        adapter = None if path is None else read_adapter(path, self.lora)
        self.params = set_slot(self.params, self.lora, slot, adapter)

    def _lora_args(self, slots: Sequence[int] | None, b: int, rows: int) -> tuple[Any, ...]:
        """The steps' `lora_slots` argument: each of the `b` sequences' slot padded with -1
        to `rows`; no argument (the base model's step, compiled without the LoRA path) when
        no sequence names an adapter or the model has no LoRA slots."""
        if self.lora is None:
            if slots is not None:
                raise RequestError("lora_slots given, but the model has no LoRA slots")
            return ()
        if slots is None:
            return ()
        a = np.asarray(slots)
        if a.shape != (b,) or ((a < -1) | (a >= self.lora.max_loras)).any():
            raise RequestError(f"lora_slots={list(slots)!r} must give each of the {b} "
                               f"prompts a slot in [-1, {self.lora.max_loras})")  # fmt: skip
        if (a < 0).all():
            return ()
        s = np.full(rows, -1, np.int32)
        s[:b] = a
        return (jnp.asarray(s),)

    def _check_ids(self, ids: Any, what: str) -> np.ndarray:
        if self.serving_pool:
            raise RuntimeError("this model was loaded with kv_pages= for a serving engine, "
                               "which owns its pages: use jaxarena.engine.Engine to run it")  # fmt: skip
        a = np.asarray(ids)
        if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
            raise RequestError(f"{what} must be a non-empty list of token ids, got {ids!r}")
        bad = a[(a < 0) | (a >= self.config.vocab_size)]
        if bad.size:
            raise RequestError(f"{what} has token ids {bad[:5].tolist()} outside "
                               f"[0, vocab_size={self.config.vocab_size})")  # fmt: skip
        return a.astype(np.int32)

    def _packed(self, prompts: list[np.ndarray]) -> tuple[jax.Array, jax.Array]:
        """Tokens and cu_seqlens padded to a fixed shape (`max_batch_tokens` tokens,
        `max_batch_size + 1` sequences) so one compiled prefill serves every call; padding
        sequences of one token each (the last takes the rest) run in cache rows nobody reads.
        Falls back to the exact shapes when the padding does not fit."""
        m = self.model
        lens = [len(p) for p in prompts]
        total, s_pad = sum(lens), m.max_batch_size + 1
        extra = s_pad - len(prompts)
        if total + extra <= m.max_batch_tokens:
            fill = m.max_batch_tokens - total
            lens = lens + [1] * (extra - 1) + [fill - (extra - 1)]
            prompts = prompts + [np.zeros(n, np.int32) for n in lens[len(prompts) :]]
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        return jnp.asarray(np.concatenate(prompts)), jnp.asarray(cu)

    def _chunked_prefill(self, ids: list[np.ndarray], lora: Any = None) -> jax.Array:
        """Prefills prompts that together exceed `max_batch_tokens` in chunks (the caller
        checked that the model runs chunks): each chunk takes the next tokens of the
        sequences in order, up to the token budget of one padded prefill, and attends to the
        earlier chunks through the KV cache (`ArenaLM.prefill`'s `cached_lens`). Returns
        `float32[b, vocab]`, the logits of each prompt's last token."""
        m = self.model
        b = len(ids)
        extra = m.max_batch_size + 1 - b
        budget = m.max_batch_tokens - extra if m.max_batch_tokens > extra else m.max_batch_tokens
        done = np.zeros(b, np.int64)
        last: list[Any] = [None] * b
        while any(done[s] < len(ids[s]) for s in range(b)):
            room, pieces = budget, []
            for s in range(b):
                n = min(len(ids[s]) - int(done[s]), room)
                pieces.append(ids[s][done[s] : done[s] + n])
                room -= n
            tokens, cu = self._packed(pieces)
            s_all = cu.shape[0] - 1
            cached = np.zeros(s_all, np.int32)
            cached[:b] = done
            (logits,) = self._run("prefill_chunk", m.prefill, tokens, cu,
                                  self.block_tables[:s_all], jnp.asarray(cached),
                                  *self._lora_args(lora, b, s_all))  # fmt: skip
            for s, piece in enumerate(pieces):
                done[s] += len(piece)
                if len(piece) and done[s] == len(ids[s]):
                    last[s] = logits[s]
        return jnp.stack(last)

    def prefill_logits(self, token_ids: Sequence[int], *, lora_slot: int = -1) -> np.ndarray:
        """The logits of every position of one sequence: `float32 [T, vocab]`.

        `T <= max_batch_tokens`. The values are those the arena's `logits` region holds
        (bf16). Uses cache row 0 (a later `generate` re-runs its own prefill).

        Raises:
          RequestError: an empty sequence, ids outside the vocabulary, or more tokens than
            `max_batch_tokens`.
        """
        ids = self._check_ids(token_ids, "token_ids")
        if ids.size > self.model.max_batch_tokens:
            raise RequestError(f"{ids.size} tokens exceed max_batch_tokens="
                               f"{self.model.max_batch_tokens}")  # fmt: skip
        tokens, cu = self._packed([ids])
        fn = functools.partial(self.model.prefill, all_logits=True)
        s_all = cu.shape[0] - 1
        lora = self._lora_args(None if lora_slot == -1 else [lora_slot], 1, s_all)
        lora = (None, *lora) if lora else ()
        (logits,) = self._run("prefill_all", fn, tokens, cu, self.block_tables[:s_all], *lora)
        return np.asarray(logits[: ids.size], np.float32)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                 return_logits: bool = False,
                 lora_slots: Sequence[int] | None = None) -> Any:  # fmt: skip
        """Greedy continuations of a batch of prompts.

        Prefill runs the prompts packed into one pass, or, when they hold more than
        `max_batch_tokens` tokens, in chunks that attend to the earlier chunks through the KV
        cache (chunked prefill; models whose blocks all have `chunked_prefill`); then a decode loop
        whose jitted step is compiled once (the batch is padded to `max_batch_size` rows) runs `max_new_tokens - 1`
        steps with the arena and caches donated.

        Args:
          prompts: 1..max_batch_size lists of token ids (together more than
            `max_batch_tokens` only for a model without Mamba blocks).
          max_new_tokens: >= 1; each `len(prompt) + max_new_tokens <= max_seq_len`.
          return_logits: also return the logits that chose each token.
          lora_slots: each prompt's LoRA adapter slot (`load_lora`; -1: the base model), for
            a model loaded with `max_lora_rank`; None: no adapter.

        Returns:
          `list[list[int]]`, `max_new_tokens` new tokens per prompt; with `return_logits`,
          `(tokens, float32[B, max_new_tokens, vocab])`. `last_stats` gets the timings.

        Raises:
          RequestError: a bad `max_new_tokens`, no prompt or more than `max_batch_size`, a
            prompt that is empty or has ids outside the vocabulary, a prompt plus
            `max_new_tokens` longer than `max_seq_len`.
          NotImplementedError: prompts longer than `max_batch_tokens` together, for a model
            whose blocks cannot prefill in chunks.
        """
        m = self.model
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 1:  # fmt: skip
            raise RequestError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
        if not 1 <= len(prompts) <= m.max_batch_size:
            raise RequestError(f"{len(prompts)} prompts; between 1 and max_batch_size="
                               f"{m.max_batch_size} are allowed")  # fmt: skip
        ids = [self._check_ids(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
        lens = np.array([len(p) for p in ids], np.int32)
        chunked = lens.sum() > m.max_batch_tokens
        if chunked and m.unchunked_kinds:
            raise NotImplementedError(
                f"the prompts hold {lens.sum()} tokens, more than max_batch_tokens="
                f"{m.max_batch_tokens}, and a chunked prefill of a model with "
                f"{list(m.unchunked_kinds)} blocks is not implemented (their state cannot "
                "continue from an earlier chunk yet): raise max_batch_tokens"
            )  # fmt: skip
        if lens.max() + max_new_tokens > m.max_seq_len:
            raise RequestError(f"a prompt of {lens.max()} tokens + max_new_tokens="
                               f"{max_new_tokens} exceeds max_seq_len={m.max_seq_len}")  # fmt: skip
        b, rows = len(ids), m.max_batch_size
        compiled = sum(self.compile_seconds.values())
        t0 = time.perf_counter()
        self._lora_args(lora_slots, b, rows)  # checks them before any step runs
        if chunked:
            logits = self._chunked_prefill(ids, lora_slots)
        else:
            tokens, cu = self._packed(ids)
            lora = self._lora_args(lora_slots, b, cu.shape[0] - 1)
            lora = (None, *lora) if lora else ()
            (logits,) = self._run(
                "prefill", m.prefill, tokens, cu, self.block_tables[: cu.shape[0] - 1], *lora
            )
        first = jnp.argmax(logits[:b], -1).astype(jnp.int32)
        jax.block_until_ready(first)
        # Run time only: compiling (the first call of a shape) is counted in compile_seconds.
        t_prefill = time.perf_counter() - t0 - (sum(self.compile_seconds.values()) - compiled)
        compiled = sum(self.compile_seconds.values())
        active = np.zeros(rows, np.int32)
        active[:b] = 1
        pos = np.zeros(rows, np.int32)
        pos[:b] = lens
        nxt = jnp.zeros((rows,), jnp.int32).at[:b].set(first)
        positions, step_active = jnp.asarray(pos), jnp.asarray(active)
        tables = self.block_tables[:rows]
        lora = self._lora_args(lora_slots, b, rows)
        out_tokens, out_logits = [first], [logits[:b]]
        t0 = time.perf_counter()
        for _ in range(max_new_tokens - 1):
            step_logits, nxt = self._run("decode", self.model.decode_step, nxt, positions,
                                         tables, positions + 1, *lora)  # fmt: skip
            positions = positions + step_active
            out_tokens.append(nxt[:b])
            if return_logits:
                out_logits.append(step_logits[:b])
        result = np.stack([np.asarray(x) for x in out_tokens], 1)
        t_decode = time.perf_counter() - t0 - (sum(self.compile_seconds.values()) - compiled)
        self.last_stats = {
            "prefill_tokens": int(lens.sum()), "prefill_seconds": t_prefill,
            "decode_tokens": b * (max_new_tokens - 1), "decode_seconds": t_decode,
        }  # fmt: skip
        toks = result.tolist()
        if return_logits:
            return toks, np.stack([np.asarray(x, np.float32) for x in out_logits], 1)
        return toks


def load_pretrained(
    path: str | Path,
    *,
    max_batch_tokens: int,
    max_seq_len: int,
    kv_block_size: int = 16,
    max_batch_size: int,
    target: Target | None = None,
    levers: Levers | None = None,
    packed: bool = False,
    interpret: bool | None = None,
    kernels: str = "pallas",
    scan_layers: bool = False,
    prefill_chunk: int | str | None = "auto",
    compiler_options: dict[str, Any] | None = None,
    kv_pages: int | None = None,
    kv_dtype: str = "bf16",
    max_lora_rank: int = 0,
    max_loras: int = 0,
    mesh: Any = None,
    ep: int = 1,
) -> CausalLM:
    """Loads a local HuggingFace checkpoint directory onto the default device with its arena.

    Args:
      path: a directory with `config.json` and `model.safetensors` (or the shards of
        `model.safetensors.index.json`).
      max_batch_tokens, max_seq_len, kv_block_size, max_batch_size: the serve limits the
        arena is sized for (`BufferSizes.from_config`).
      target, levers: as for `BufferSizes.from_config`; default `gb10` and no levers, so the
        plan does not depend on the machine or the environment.
      packed: share bytes between buffers never live together (`ArenaPlan.packed` from the
        recorded lifetimes of prefill and decode), and give none to the buffers neither step
        uses; else every buffer of the seed's sizes has its own bytes.
      interpret: Pallas interpret mode (None: on CPU).
      kernels: `"pallas"` runs the Pallas kernels (interpreted on CPU: slow, what the model
        tests check), `"xla"` their plain-XLA implementations (`models.core.kernels`: the
        CPU's fast path), `"auto"` `"xla"` on a CPU backend and `"pallas"` elsewhere.
      scan_layers: run runs of identical layers under one `lax.scan` each (`ArenaLM`;
        compile time near that of one period); the weights are stacked on the host, before
        their one copy to the device.
      prefill_chunk: a prefill of more tokens than this runs as token chunks through every
        layer, its XLA temp that of one chunk (`ArenaLM.prefill_chunk`); `"auto"`:
        `DEFAULT_PREFILL_CHUNK` tokens; None: one pass.
      compiler_options: XLA options for the steps' compiles (`CausalLM.compiler_options`).
      kv_pages: None: KV pages for `max_batch_size + 1` sequences of `max_seq_len` tokens,
        which `generate` uses. An int: a pool of that many pages plus the null page 0, for
        the serving engine (`jaxarena.engine`), which owns the pages and hands every step
        its block tables; `prefill_logits` and `generate` then refuse to run.
      kv_dtype: the attention layers' paged KV cache, `"bf16"` or `"fp8"` (`float8_e4m3fn`
        pages with per-layer K and V scales from the checkpoint, 1.0 where it has none, as
        vLLM's `kv_cache_dtype="fp8"`; `jaxarena.models.blocks.attention`): half the cache
        bytes per token, what `jaxarena budget --kv-dtype fp8` counts. MLA's latent cache and
        the recurrent states are not affected by it.
      max_lora_rank, max_loras: > 0: LoRA adapter slots (`CausalLM.load_lora`,
        `jaxarena.models.lora`); the arena then holds the seed's `lora_*` buffers (sized
        for `adapter_max_rank = max_lora_rank`). 0: none (the plan is unchanged).
      mesh: None: one device. An int `tp` or a one-axis `"tp"` mesh
        (`tensor_parallel.tp_mesh`): tensor parallelism over its devices, each reading only
        its slice of every tensor (`ModelConfig.shard(tp)` is what a device holds; the arena
        is the per-device plan's; `jaxarena.models.tensor_parallel`).
      ep: with a mesh, 1 (routed experts split column-/row-parallel like an MLP) or the
        mesh's size (each device holds `num_experts / ep` whole experts).

    Returns:
      A `CausalLM` whose weights, arena and caches are on the device.

    Raises:
      CheckpointError: a missing, truncated or corrupt file; a missing or unexpected tensor;
        a shape the config does not imply; an unexpected dtype. The message names the tensor
        and file.
      ConfigError: an invalid `config.json` (from `ModelConfig.from_hf`) or serve limits.
      ValueError: a `kv_dtype` other than "bf16" and "fp8"; `kernels` not one of `"pallas"`,
        `"xla"`, `"auto"` (both before anything is read).
      NotImplementedError: a family or feature this implementation does not run (an FP8
        KV cache for a model with MLA blocks).
    """
    kernels = resolve_kernels(kernels)  # a bad value fails before the checkpoint is read
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype={kv_dtype!r} must be one of {sorted(KV_DTYPES)}")
    ckpt = open_checkpoint(path)
    root = ckpt.path
    raw = ckpt.config
    model_type = raw.get("model_type")
    family = family_for(model_type, root)
    cfg = ModelConfig.from_hf(root / "config.json")
    if max_lora_rank or max_loras:
        cfg = dataclasses.replace(cfg, adapter_max_rank=max_lora_rank)
    arch = with_kv_dtype(family.arch(model_type, raw, cfg, root, max_seq_len), kv_dtype, root)
    target, levers = target or Target.preset("gb10"), levers or Levers()
    if mesh is not None:
        return _load_on_mesh(as_mesh(mesh), family, ckpt, cfg, arch, locals())
    reader = Reader(ckpt, fp8_spec(raw, root))
    host = family.read_params(reader, cfg, arch)
    extra = reader.unused()
    if extra:
        raise CheckpointError(f"{root}: {len(extra)} tensor(s) the {model_type} layout does not "
                              f"use: {extra[:8]}{' ...' if len(extra) > 8 else ''} (does "
                              "config.json match the weights?)")  # fmt: skip
    layout = None
    if max_lora_rank or max_loras:
        if scan_layers:
            raise NotImplementedError("LoRA slots with scan_layers=True are not implemented")
        prefixes = [prefix for prefix, _ in family.tensor_names(cfg, arch).blocks]
        layout = lora_layout(arch, cfg, prefixes, max_loras=max_loras, max_rank=max_lora_rank)
        for i, tabs in lora_tables(layout).items():
            host["layers"][i] = {**host["layers"][i], "lora": tabs}
    sizes = BufferSizes.from_config(cfg, max_batch_tokens, max_seq_len, kv_block_size,
                                    max_batch_size, levers=levers, target=target)  # fmt: skip
    plan = ArenaPlan.sequential(sizes, guard_bytes=GUARD_BYTES)
    model = ArenaLM(config=cfg, arch=arch, plan=plan, max_batch_tokens=max_batch_tokens,
                    max_seq_len=max_seq_len, kv_block_size=kv_block_size,
                    max_batch_size=max_batch_size, target=target, levers=levers,
                    interpret=interpret, kernels=kernels,
                    scan_layers=scan_layers,
                    prefill_chunk=prefill_chunk)  # fmt: skip
    if scan_layers:
        host = model.stack_params(host)
    params = jax.device_put(host)  # the one host -> device copy of the weights
    pages, tables = page_tables(model, kv_pages)
    caches = model.init_caches(num_blocks=pages, rows=max_batch_size + 1)
    if packed:
        plan = packed_plan(model, sizes, params, caches, tables)
        model = dataclasses.replace(model, plan=plan)
    arena = model.plan.allocate()
    return CausalLM(model=model, params=params, path=str(root), model_type=model_type,
                    fp8=reader.fp8 is not None, arena=arena, caches=caches, block_tables=tables,
                    arena_pointer=arena.unsafe_buffer_pointer(),
                    compiler_options=compiler_options,
                    serving_pool=kv_pages is not None, lora=layout)  # fmt: skip


def _load_on_mesh(mesh: Any, family: Any, ckpt: Any, cfg: ModelConfig, arch: Any,
                  a: dict[str, Any]) -> CausalLM:  # fmt: skip
    """`load_pretrained` over a tensor-parallel mesh (`a`: its arguments)."""
    for what in ("packed", "scan_layers", "max_lora_rank", "max_loras"):
        if a[what]:
            raise NotImplementedError(f"load_pretrained(mesh=...) with {what}={a[what]!r}")

    keys = ("max_batch_tokens", "max_seq_len", "kv_block_size", "max_batch_size", "target",
            "levers", "interpret", "kernels", "prefill_chunk")  # fmt: skip
    model, params, arena, caches, tables, extra = load_on_mesh(
        mesh, family, ckpt, fp8_spec(ckpt.config, ckpt.path), cfg, arch,
        {k: a[k] for k in keys}, guard_bytes=GUARD_BYTES, kv_pages=a["kv_pages"], ep=a["ep"])  # fmt: skip
    if extra:
        raise CheckpointError(f"{ckpt.path}: {len(extra)} tensor(s) the {a['model_type']} layout "
                              f"does not use: {extra[:8]}")  # fmt: skip
    return CausalLM(model=model, params=params, path=str(ckpt.path), model_type=a["model_type"],
                    fp8=fp8_spec(ckpt.config, ckpt.path) is not None, arena=arena, caches=caches,
                    block_tables=tables, compiler_options=a["compiler_options"],
                    arena_pointer=arena.addressable_shards[0].data.unsafe_buffer_pointer(),
                    serving_pool=a["kv_pages"] is not None, mesh=mesh,
                    whole_config=cfg)  # fmt: skip
