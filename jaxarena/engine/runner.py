"""The engine's device side: a model loaded with its page pool, the sampler's penalty state,
and the fixed set of compiled executables every engine step runs one of.

Executables (all compiled by `warm_up`, before serving; nothing compiles afterwards, whatever
the mix of requests):

* `decode`: one token for each of the `max_batch_size` slots through `ArenaLM.decode_step`
  (split-K attention over the pages), then the sampler. Slot `r` is row `r` (its block-table
  row and its recurrent-state row); a slot with no token this step reads and writes only the
  null page 0.
* `mixed@T` for each token bucket `T`: one pass of `T` tokens through `ArenaLM.prefill` with
  `cached_lens` (chunked prefill): sequence `s < max_batch_size` is slot `s` (0 tokens when
  the slot has none this step: its caches are left as they are), sequence `max_batch_size`
  is the padding (the rest of the `T` tokens, on the null page and the spare state row). A
  step that mixes prefill chunks with decodes runs them all here, a decode being a 1-token
  chunk; the sampler reads each slot's last token.

Both take and return the arena, the caches and the penalty state donated, so they stay in
place; the step's inputs are small host arrays (tokens, positions, block tables, per-slot
sampling parameters) and its outputs the sampled tokens and their logprobs.

For a model with LoRA slots (`load_pretrained(max_lora_rank=..., max_loras=...)`) every
executable has a second form, `decode+lora` and `mixed@T+lora`, taking one more input last:
each row's adapter slot (`int32[R]` / `int32[R + 1]`, -1: the base model). A step runs that
form only when one of its rows names an adapter (the host knows); a step without one runs the
plain form, the base model's step to the launch, so serving LoRA costs a batch without
adapters nothing on the device (at twice the compiles). Adapters are loaded into the slots
between steps (`load_adapter`) without recompiling.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena.engine.multiprocess import same_program
from jaxarena.engine.sampling import (
    PenaltyState,
    SlotParams,
    record_tokens,
    reset_row,
    sample,
    slot_params,
)
from jaxarena.models.lora import set_slot
from jaxarena.models.tensor_parallel import shard_step
from jaxarena.testing import count_traces

__all__ = ["Runner", "StepOutput", "abstract_inputs", "penalty_state", "step_functions"]


def _decode(decode_step, params, arena, caches, pen, tokens, positions, tables, slots, active,
            lora_slots=None):  # fmt: skip
    arena, caches, logits, _ = decode_step(params, arena, caches, tokens, positions, tables,
                                           positions + 1, lora_slots)  # fmt: skip
    tok, lp, top_ids, top_lp = sample(logits, slots, pen)
    return arena, caches, record_tokens(pen, active, tok), tok, lp, top_ids, top_lp


def _mixed(prefill, params, arena, caches, pen, tokens, cu_seqlens, tables, cached, slots, active,
           lora_slots=None):  # fmt: skip
    arena, caches, logits = prefill(params, arena, caches, tokens, cu_seqlens, tables, cached,
                                    lora_slots)  # fmt: skip
    logits = logits[: active.shape[0]]  # the slots' rows; the padding sequence's is dropped
    tok, lp, top_ids, top_lp = sample(logits, slots, pen)
    return arena, caches, record_tokens(pen, active, tok), tok, lp, top_ids, top_lp


LORA = "+lora"  # the suffix of the executables that take the rows' adapter slots


def step_functions(model: Any, token_buckets: tuple[int, ...], *, lora: bool = False,
                   mesh: Any = None) -> dict[str, Callable]:  # fmt: skip
    """The engine's executables for `model` (an `ArenaLM`) by name: `"decode"` and
    `"mixed@T"` per token bucket (and with `lora` each again as `name + "+lora"`, taking the
    rows' adapter slots), each `fn(params, arena, caches, penalty_state, *inputs)` returning
    `(arena, caches, penalty_state, tokens, logprob, top_ids, top_logprobs)`; jit them with
    arguments 1-3 donated (`abstract_inputs` gives the inputs' shapes). With a tensor-parallel
    `mesh` the model's step runs per device (`tensor_parallel.shard_step`) and the sampler on
    its gathered logits."""
    decode, prefill = model.decode_step, model.prefill
    if mesh is not None:
        decode, prefill = shard_step(decode, mesh), shard_step(prefill, mesh)
    out = {"decode": functools.partial(_decode, decode)}
    for t in token_buckets:
        out[f"mixed@{t}"] = functools.partial(_mixed, prefill)
    if lora:
        out.update({name + LORA: fn for name, fn in out.items()})
    return out


def abstract_inputs(model: Any, name: str) -> tuple[Any, ...]:
    """The `jax.ShapeDtypeStruct`s of executable `name`'s inputs after the penalty state
    (see `step_functions`), for `model` (an `ArenaLM`)."""
    lora = name.endswith(LORA)
    name = name.removesuffix(LORA)
    i32, sds = jnp.int32, jax.ShapeDtypeStruct
    r = model.max_batch_size
    p = model.pages_per_seq
    slots = jax.tree.map(lambda a: sds(a.shape, a.dtype), slot_params(r, {}))
    active = sds((r,), jnp.bool_)
    if name == "decode":
        out = (sds((r,), i32), sds((r,), i32), sds((r, p), i32), slots, active)
        return out + ((sds((r,), i32),) if lora else ())
    t = int(name.split("@")[1])
    s = r + 1
    out = (sds((t,), i32), sds((s + 1,), i32), sds((s, p), i32), sds((s,), i32), slots, active)
    return out + ((sds((s,), i32),) if lora else ())


def penalty_state(model: Any, mesh: Any = None) -> PenaltyState:
    """The sampler's zeroed penalty state for `model`'s slots (`[max_batch_size, vocab]`); with
    a tensor-parallel `mesh`, made replicated on its devices as the executables take it (each
    device, in whichever process, allocating its own copy) rather than moved there by the
    first step."""
    r, vocab = model.max_batch_size, model.vocab_size

    def zeros() -> PenaltyState:
        return PenaltyState(prompt_mask=jnp.zeros((r, vocab), jnp.bool_),
                            output_counts=jnp.zeros((r, vocab), jnp.int32))  # fmt: skip

    if mesh is None:
        return zeros()
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(zeros, out_shardings=replicated)()


class StepOutput:
    """One executable's results on the device: `tokens int32[R]` and, fetched only when
    asked, the chosen logprobs `float32[R]` and the top ids / logprobs `[R, n]`."""

    def __init__(self, tokens, logprob, top_ids, top_logprobs) -> None:
        self._dev = (tokens, logprob, top_ids, top_logprobs)

    def tokens(self) -> np.ndarray:
        """The sampled token of every slot row (a host copy)."""
        return np.asarray(self._dev[0])

    def logprobs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(chosen [R], top_ids [R, n], top_logprobs [R, n])`, host copies."""
        return tuple(np.asarray(x) for x in self._dev[1:])  # type: ignore[return-value]


class Runner:
    """Runs the engine's executables on a `CausalLM` loaded with `kv_pages` (its arena, its
    caches = the page pool) and keeps the penalty state (`PenaltyState`, `[slots, vocab]`).

    Args:
      lm: `load_pretrained(..., kv_pages=N)`.
      token_buckets: the token counts of the mixed executables, ascending, the last
        `max_batch_tokens`.
      log: progress lines (compiling each executable).
    """

    def __init__(self, lm: Any, *, token_buckets: tuple[int, ...],
                 log: Callable[[str], None] = print) -> None:  # fmt: skip
        m = lm.model
        self.lm = lm
        self.model = m
        self.slots = m.max_batch_size
        self.pages_per_seq = int(lm.block_tables.shape[1])
        self.token_buckets = tuple(token_buckets)
        self.log = log
        self.pen = penalty_state(m, getattr(lm, "mesh", None))
        self.lora = lm.lora is not None
        self.compile_seconds: dict[str, float] = {}
        self.counters: dict[str, Any] = {}
        self._exe: dict[str, Any] = {}
        self._reset = jax.jit(reset_row, donate_argnums=(0,))
        self.runs: dict[str, int] = {}
        # Across processes, the leader's channel to the followers (jaxarena.engine.multiprocess):
        # every device operation is sent down it before it runs. None: one process.
        self.channel: Any = None

    # -- compiling ------------------------------------------------------------------------------

    def _compile(self, name: str, fn: Callable, inputs: tuple[Any, ...]) -> None:
        t0 = time.perf_counter()
        counter = count_traces(fn)
        jitted = jax.jit(counter, donate_argnums=(1, 2, 3))
        lm = self.lm
        with same_program(lm.mesh):  # across processes: one program in all of them
            lowered = jitted.lower(lm.params, lm.arena, lm.caches, self.pen, *inputs)
        compiled = lowered.compile(compiler_options=lm.compiler_options)
        self._exe[name] = compiled
        self.counters[name] = counter
        self.compile_seconds[name] = time.perf_counter() - t0
        self.log(f"  compiled {name} in {self.compile_seconds[name]:.1f} s")

    def warm_up(self) -> None:
        """Compiles every executable (`decode`, `mixed@T` per token bucket)."""
        fns = step_functions(self.model, self.token_buckets, lora=self.lora, mesh=self.lm.mesh)
        self.log(f"compiling {len(fns)} executables")
        for name, fn in fns.items():
            self._compile(name, fn, abstract_inputs(self.model, name))

    @property
    def executables(self) -> tuple[str, ...]:
        """The compiled executables' names."""
        return tuple(self._exe)

    def memory(self, name: str) -> dict[str, int]:
        """XLA's memory analysis of executable `name` (bytes: argument, output, alias, temp)."""
        m = self._exe[name].memory_analysis()
        return {"argument": m.argument_size_in_bytes, "output": m.output_size_in_bytes,
                "alias": m.alias_size_in_bytes, "temp": m.temp_size_in_bytes}  # fmt: skip

    def bucket(self, tokens: int) -> int:
        """The smallest token bucket that holds `tokens` tokens."""
        for t in self.token_buckets:
            if tokens <= t:
                return t
        raise ValueError(f"{tokens} tokens exceed the largest bucket {self.token_buckets[-1]}")

    # -- running --------------------------------------------------------------------------------

    def _call(self, name: str, *inputs: Any) -> StepOutput:
        if self.channel is not None:
            self.channel.send(("_call", name, *inputs))
        lm = self.lm
        out = self._exe[name](lm.params, lm.arena, lm.caches, self.pen, *inputs)
        lm.arena, lm.caches, self.pen = out[0], out[1], out[2]
        self.runs[name] = self.runs.get(name, 0) + 1
        return StepOutput(*out[3:])

    def _lora(self, name: str, lora_slots: np.ndarray | None, rows: int) -> tuple[str, tuple]:
        """The executable to run and its extra input: the plain form unless a row has an
        adapter slot."""
        if lora_slots is None or not (np.asarray(lora_slots) >= 0).any():
            return name, ()
        if not self.lora:
            raise ValueError("adapter slots given, but the model has no LoRA slots")
        out = np.full(rows, -1, np.int32)
        out[: len(lora_slots)] = lora_slots
        return name + LORA, (out,)

    def decode(self, tokens: np.ndarray, positions: np.ndarray, tables: np.ndarray,
               slots: SlotParams, active: np.ndarray,
               lora_slots: np.ndarray | None = None) -> StepOutput:  # fmt: skip
        """One decode step over every slot row (`int32[R]` tokens and positions, `int32[R,
        pages_per_seq]` tables, `bool[R]` rows whose token counts for the penalties, `int32[R]`
        adapter slots: None or -1, the base model)."""
        name, extra = self._lora("decode", lora_slots, self.slots)
        return self._call(name, tokens, positions, tables, slots, active, *extra)

    def mixed(self, tokens: np.ndarray, cu_seqlens: np.ndarray, tables: np.ndarray,
              cached: np.ndarray, slots: SlotParams, active: np.ndarray,
              lora_slots: np.ndarray | None = None) -> StepOutput:  # fmt: skip
        """One mixed pass: `tokens int32[T]` (T a bucket), `cu_seqlens int32[R + 2]`, `tables
        int32[R + 1, pages_per_seq]`, `cached int32[R + 1]` (see the module docstring), the
        slots' adapter slots `int32[R]` (the padding sequence runs the base model)."""
        name, extra = self._lora(f"mixed@{tokens.shape[0]}", lora_slots, self.slots + 1)
        return self._call(name, tokens, cu_seqlens, tables, cached, slots, active, *extra)

    def load_adapter(self, slot: int, adapter: Any) -> None:
        """Writes an adapter (`jaxarena.models.lora.read_adapter`'s tables; None: empty) into
        LoRA slot `slot` of the model's parameters: one jitted update, no recompile."""
        if self.channel is not None:
            self.channel.send(("load_adapter", slot, adapter))
        lm = self.lm
        lm.params = set_slot(lm.params, lm.lora, slot, adapter)

    def reset_slot(self, slot: int, prompt_ids: list[int], output_ids: list[int]) -> None:
        """Sets slot `slot`'s penalty rows to a request's prompt tokens and output counts (a
        request entering the slot, or resuming after preemption)."""
        if self.channel is not None:
            self.channel.send(("reset_slot", slot, list(prompt_ids), list(output_ids)))
        vocab = self.model.vocab_size
        mask = np.zeros(vocab, np.bool_)
        mask[np.asarray(prompt_ids, np.int64)] = True
        counts = np.bincount(np.asarray(output_ids, np.int64), minlength=vocab).astype(np.int32)
        self.pen = self._reset(self.pen, np.int32(slot), mask, counts)
