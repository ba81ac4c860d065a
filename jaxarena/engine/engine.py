"""`Engine`: continuous batching of requests on one device's fixed workspace.

One engine step: the scheduler (`jaxarena.engine.scheduler`) picks, under one token budget
(`max_batch_tokens`), a token for every running decode and prefill chunks of newer requests,
takes pages for them from the block manager (`jaxarena.engine.pages`, preempting the newest
request when the pool runs out), and the runner (`jaxarena.engine.runner`) runs one compiled
executable on them: `decode` when every scheduled request decodes, else `mixed@T`, the
smallest token bucket that holds the step. The sampler runs inside the executable; only the
sampled token of each slot (and logprobs, when a request asks) comes back to the host.

The page pool is sized before anything is loaded, from the same arithmetic as `jaxarena
budget` (`MemoryBudget.kv_pool`): the device's memory (given, or on a GPU its limit times
`memory_utilization`) minus weights, arena and reserve, less one recurrent-state slot per
request slot; or an explicit `kv_pages`. The allocation is checked against it to the byte.

Prefix caching (full pages shared by a hash of their tokens) is on for models whose every
cache is paged attention (or MLA); it is off for the Mamba-2 and Gated DeltaNet hybrids,
whose recurrent state at a page boundary is not kept.

LoRA: with `max_lora_rank` and `max_loras` the model holds `max_loras` adapter slots; the
engine knows any number of PEFT adapters by name (`loras=`, `add_lora`), a request names one
(`add_request(..., adapter=name)`), and `AdapterSlots` loads adapters into slots on demand,
evicting the least recently used one no running request holds. A step's rows carry their
adapter slots as data: one batch mixes adapters and the base model, and nothing recompiles.
The prefix cache keys include the adapter.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxarena import ModelConfig, Target
from jaxarena._sizing.kv_pool import KVPool, slot_bytes
from jaxarena.engine.adapters import AdapterSlots
from jaxarena.engine.loading import eos_ids, less_lora_tables, max_positions, read_json, size_pool
from jaxarena.engine.multiprocess import KVChannel, check_processes, follow
from jaxarena.engine.pages import BlockManager
from jaxarena.engine.runner import Runner
from jaxarena.engine.sampling import slot_params
from jaxarena.engine.scheduler import Request, Scheduler
from jaxarena.engine.types import RequestError, SamplingParams, TokenEvent
from jaxarena.models.lora import adapter_rank
from jaxarena.models.tensor_parallel import check_degrees

__all__ = ["CompletionOutput", "Engine"]


@dataclasses.dataclass
class CompletionOutput:
    """A finished request of `Engine.generate`: its tokens, their logprobs (with
    `SamplingParams.logprobs`; one `(chosen, top n)` entry per token) and why it ended."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[Any] | None = None


class Engine:
    """Serves a stream of requests on one device (see the module docstring).

    Build it with `Engine.from_pretrained`. Not thread-safe: one thread calls `add_request`,
    `abort` and `step` (`AsyncEngine` does that for asyncio servers).

    Attributes:
      runner: the device side (`Runner`: the model, its pool, the executables).
      scheduler, pages: the host side (`Scheduler`, `BlockManager`).
      pool: the page pool's arithmetic (`KVPool`).
      eos_token_ids: the ids that end a request (unless `ignore_eos`).
      max_seq_len: prompt plus output tokens at most (the serve limit, capped at the
        model's `max_position_embeddings`).
      stats_steps: engine steps run so far by kind (`"decode"`, `"mixed"`).
    """

    def __init__(self, runner: Runner, pool: KVPool, *, eos_token_ids: frozenset[int],
                 prefix_caching: bool, model_type: str, path: str,
                 max_position_embeddings: int | None = None,
                 log: Callable[[str], None] = print) -> None:  # fmt: skip
        m = runner.model
        self.runner = runner
        self.pool = pool
        self.model_type = model_type
        self.path = path
        self.config: ModelConfig = runner.lm.config  # the whole model's (a mesh: not m's)
        self.eos_token_ids = eos_token_ids
        self.prefix_caching = prefix_caching
        self.max_batch_size = m.max_batch_size
        self.max_batch_tokens = m.max_batch_tokens
        self.kv_block_size = m.kv_block_size
        self.max_seq_len = min(m.max_seq_len, max_position_embeddings or m.max_seq_len)
        self.vocab_size = self.config.vocab_size
        self.recurrent = slot_bytes(self.config) > 0
        self.pages = BlockManager(pool.pages, m.kv_block_size, prefix_caching)
        self.adapters: AdapterSlots | None = None
        if runner.lora:
            self.adapters = AdapterSlots(
                runner.lm.lora.max_loras,
                lambda slot, name: runner.load_adapter(slot, self.adapters.data(name)),
            )
        self.scheduler = Scheduler(self.pages, max_batch_size=m.max_batch_size,
                                   max_batch_tokens=m.max_batch_tokens,
                                   max_seq_len=self.max_seq_len, page_size=m.kv_block_size,
                                   prefix_caching=prefix_caching,
                                   adapters=self.adapters)  # fmt: skip
        self.log = log
        self._requests: dict[str, Request] = {}
        self._seeds: dict[str, int] = {}
        self._slot_owner: dict[int, str] = {}
        self._events: list[TokenEvent] = []
        self._next_id = 0
        self._rng = secrets.SystemRandom()
        self.stats_steps = {"decode": 0, "mixed": 0}
        self.role: str | None = None  # across processes: "leader" or "follower"
        self._closed = False

    # -- building -------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        max_batch_size: int = 8,
        max_seq_len: int = 2048,
        max_batch_tokens: int = 512,
        kv_block_size: int = 16,
        memory: int | str | None = None,
        memory_utilization: float = 0.9,
        kv_pages: int | None = None,
        kv_dtype: str = "bf16",
        kernels: str = "auto",
        target: Target | str | None = None,
        prefix_caching: bool | None = None,
        token_buckets: Sequence[int] | None = None,
        compiler_options: dict[str, Any] | None = None,
        log: Callable[[str], None] = print,
        warm_up: bool = True,
        loras: dict[str, str | Path] | None = None,
        max_lora_rank: int | None = None,
        max_loras: int | None = None,
        tp: int = 1,
        ep: int = 1,
        **load_options: Any,
    ) -> Engine:
        """Loads a checkpoint, sizes and allocates its page pool, compiles every executable.

        Args:
          path: a checkpoint directory as `jaxarena.models.load_pretrained` reads it.
          max_batch_size, max_seq_len, max_batch_tokens, kv_block_size: the serve limits
            (slots, tokens per request, tokens per step, tokens per page).
          memory: the device memory the pool is sized from (bytes or "80GB"); None: on a GPU
            its limit times `memory_utilization`.
          kv_pages: an explicit page count (overrides `memory`). Without either on a machine
            without a GPU: pages for `max_batch_size` sequences of `max_seq_len` tokens.
          kv_dtype: the KV pages, "bf16" or "fp8" (e4m3 with per-layer scales: twice the
            tokens in the same memory; `load_pretrained`).
          kernels: "auto" (the Pallas kernels on a GPU, their plain-XLA forms on a CPU, where
            the Pallas interpreter would dominate), "pallas" or "xla" (`load_pretrained`).
          target: the arena's target (a `Target` or a preset name); None: the device's.
          prefix_caching: None: on where every cache is paged (attention, MLA), off for the
            Mamba-2 / Gated DeltaNet hybrids; True for a hybrid raises ValueError.
          token_buckets: the mixed executables' token counts; None: 256 (when smaller) and
            `max_batch_tokens`.
          compiler_options: XLA options for the executables' compiles.
          log: where the progress lines go (None: nowhere).
          warm_up: compile every executable now (else `warm_up()` before the first step).
          loras: PEFT adapters by name (`{name: directory}`), each checked now; `add_lora`
            registers more later.
          max_lora_rank, max_loras: the LoRA slots (rank and count); None: the largest rank
            of `loras` and `min(len(loras), max_batch_size)` (at least 1), or no LoRA slots
            without `loras` or a rank.
          tp, ep: tensor parallelism over the first `tp` devices, experts split whole over them
            with `ep == tp` (`load_pretrained(mesh=tp, ep=ep)`); the pool is sized per device
            (`budget --tp N --ep M`). Across JAX processes (`jax.distributed`) the devices are
            `jax.devices()` of them all: call this in every process alike; process 0 (the
            leader) steps, the others `follow()` (`jaxarena.engine.multiprocess`).
          load_options: more `load_pretrained` arguments (`interpret`, `scan_layers`, ...).

        Raises:
          ValueError: limits or a pool that do not fit (the message gives the arithmetic);
            `tp` not a positive int or `ep` other than 1 and `tp`; across processes, a `tp`
            that leaves a process without devices.
          CheckpointError, ConfigError, NotImplementedError: as `load_pretrained`.
        """
        from jaxarena.models import load_pretrained

        log = log or (lambda _msg: None)
        for name, v in (("max_batch_size", max_batch_size), ("max_seq_len", max_seq_len),
                        ("max_batch_tokens", max_batch_tokens), ("kv_block_size", kv_block_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be an int >= 1")
        check_degrees(tp, ep)  # before anything is sized or read
        role = check_processes(tp)  # None in one process; else "leader" or "follower"
        if kv_block_size & (kv_block_size - 1):
            raise ValueError(f"kv_block_size={kv_block_size} must be a power of two (the split-K "
                             "decode kernel tiles a page in powers of two)")  # fmt: skip
        if max_batch_tokens < max_batch_size:
            raise ValueError(f"max_batch_tokens={max_batch_tokens} must be >= max_batch_size="
                             f"{max_batch_size}: a step decodes one token per running request")  # fmt: skip
        root = Path(path)
        cfg = ModelConfig.from_hf(root / "config.json")
        raw = read_json(root / "config.json")
        if isinstance(target, str):
            target = Target.preset(target)
        if target is None:
            import jax

            target = Target.detect() if jax.devices()[0].platform != "cpu" else Target.preset("gb10")
        recurrent = slot_bytes(cfg) > 0
        if prefix_caching and recurrent:
            raise ValueError(f"prefix caching is not available for {raw.get('model_type')!r}: "
                             "its Mamba-2 / Gated DeltaNet state at a page boundary is not "
                             "kept (leave prefix_caching unset)")  # fmt: skip
        prefix_caching = (not recurrent) if prefix_caching is None else bool(prefix_caching)
        loras = dict(loras or {})
        if max_lora_rank is None:
            max_lora_rank = max((adapter_rank(p) for p in loras.values()), default=0)
        if max_loras is None:
            max_loras = max(1, min(len(loras), max_batch_size)) if max_lora_rank else 0
        if (max_lora_rank or max_loras) and not (max_lora_rank >= 1 and max_loras >= 1):
            raise ValueError(f"LoRA slots need max_lora_rank >= 1 and max_loras >= 1, got "
                             f"{max_lora_rank} and {max_loras}")  # fmt: skip
        if max_lora_rank or max_loras:
            load_options.update(max_lora_rank=max_lora_rank, max_loras=max_loras)
            cfg = dataclasses.replace(cfg, adapter_max_rank=max_lora_rank)  # the lora_* buffers
            if memory is not None or kv_pages is None:
                memory = less_lora_tables(memory, memory_utilization, cfg, max_loras)
        pool = size_pool(cfg, raw, max_batch_size=max_batch_size, max_seq_len=max_seq_len,
                              max_batch_tokens=max_batch_tokens, kv_block_size=kv_block_size,
                              memory=memory, memory_utilization=memory_utilization,
                              kv_pages=kv_pages, kv_dtype=kv_dtype, target=target,
                              log=log, tp=tp, ep=ep)  # fmt: skip
        log("sizing the page pool:\n  " + pool.table().replace("\n", "\n  "))
        log(f"loading {root}")
        t0 = time.perf_counter()
        lm = load_pretrained(root, max_batch_tokens=max_batch_tokens, max_seq_len=max_seq_len,
                             kv_block_size=kv_block_size, max_batch_size=max_batch_size,
                             target=target, compiler_options=compiler_options,
                             kv_pages=pool.pages, kv_dtype=kv_dtype, kernels=kernels,
                             **({"mesh": tp, "ep": ep} if tp > 1 else {}),
                             **load_options)  # fmt: skip
        allocated = lm.cache_bytes
        if allocated != pool.total_bytes:
            raise RuntimeError(f"the caches hold {allocated:,} bytes where the pool's arithmetic "
                               f"says {pool.total_bytes:,}: a sizing bug, please report it")  # fmt: skip
        log(f"  loaded in {time.perf_counter() - t0:.1f} s: weights {lm.weight_bytes:,} B, "
            f"arena {lm.arena_bytes:,} B, pool {allocated:,} B")  # fmt: skip
        if token_buckets is None:
            token_buckets = sorted({min(256, max_batch_tokens), max_batch_tokens})
        buckets = tuple(sorted(set(int(t) for t in token_buckets)))
        if not buckets or buckets[-1] != max_batch_tokens or buckets[0] < 1:
            raise ValueError(f"token_buckets={list(token_buckets)} must be >= 1 and end at "
                             f"max_batch_tokens={max_batch_tokens}")  # fmt: skip
        runner = Runner(lm, token_buckets=buckets, log=log)
        if role == "leader":
            runner.channel = KVChannel()
        engine = cls(runner, pool, eos_token_ids=eos_ids(root, raw),
                     prefix_caching=prefix_caching, model_type=lm.model_type, path=str(path),
                     max_position_embeddings=max_positions(raw), log=log)  # fmt: skip
        engine.role = role
        for name, adapter_path in loras.items():
            engine.add_lora(name, adapter_path)
        if warm_up:
            runner.warm_up()
        return engine

    def warm_up(self) -> None:
        """Compiles every executable (done by `from_pretrained` unless `warm_up=False`)."""
        self.runner.warm_up()

    # -- across processes (jaxarena.engine.multiprocess) ----------------------------------------

    def follow(self, log: Callable[[str], None] | None = None) -> int:
        """On a follower (a process other than 0 of a multi-process engine): runs the
        leader's device operations until the leader's `close()`; returns how many.

        Raises:
          RuntimeError: this engine is not a follower.
          FollowerError: an operation failed (named in the message).
        """
        if self.role != "follower":
            raise RuntimeError(f"Engine.follow() runs on processes other than 0 of a "
                               f"multi-process engine; this one's role is {self.role!r}")  # fmt: skip
        return follow(self.runner, KVChannel(), log)

    def close(self) -> None:
        """Across processes, on the leader: tells the followers to stop (their `follow()`
        returns); no step may run afterwards. Idempotent; does nothing in one process."""
        channel, self.runner.channel = self.runner.channel, None
        if channel is not None:
            channel.send(("stop",))
            self._closed = True

    # -- requests -------------------------------------------------------------------------------

    def add_lora(self, name: str, path: str | Path) -> None:
        """Registers the PEFT adapter at `path` under `name` (read and checked now; loaded
        into a device slot when a request names it).

        Raises:
          RuntimeError: the engine was built without LoRA slots.
          LoraError: the adapter does not fit the model (file, tensor and rule named).
          ValueError: a name already registered.
        """
        from jaxarena.models.lora import read_adapter

        if self.adapters is None:
            raise RuntimeError("this engine has no LoRA slots: Engine.from_pretrained(..., "
                               "loras={...}) or max_lora_rank=R, max_loras=N")  # fmt: skip
        if name in self.adapters:
            raise ValueError(f"adapter {name!r} is already registered")
        self.adapters.register(name, read_adapter(path, self.runner.lm.lora))
        self.log(f"adapter {name!r}: {path}")

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                    request_id: str | None = None, adapter: str | None = None) -> str:  # fmt: skip
        """Queues a request (with LoRA adapter `adapter`, a registered name; None: the base
        model); returns its id.

        Raises:
          RequestError: an empty prompt, ids outside the vocabulary, a prompt that leaves no
            room for one new token within `max_seq_len` (or the model's context), a request
            needing more pages than the whole pool, a duplicate request id, an unknown
            adapter (param "model").
        """
        params = SamplingParams() if params is None else params
        ids = self.validate(prompt_ids, params, adapter)
        if request_id is None:
            request_id = f"req-{self._next_id}"
            self._next_id += 1
        if request_id in self._requests:
            raise RequestError(f"request id {request_id!r} is already in use", "request_id")
        req = Request(request_id=request_id, prompt_ids=ids, params=params,
                      eos_ids=self.eos_token_ids, adapter=adapter,
                      extra_key=None if adapter is None else f"lora:{adapter}")  # fmt: skip
        self.scheduler.add(req)  # RequestError: more pages than the pool
        self._requests[request_id] = req
        self._seeds[request_id] = (params.seed if params.seed is not None
                                   else self._rng.randrange(2**63))  # fmt: skip
        return request_id

    def validate(self, prompt_ids: Sequence[int], params: SamplingParams,
                 adapter: str | None = None) -> list[int]:  # fmt: skip
        """The checks of `add_request` that need no engine state (so another thread may call
        it): returns the prompt as a list of ints.

        Raises:
          RequestError: as `add_request` (but for a duplicate id).
        """
        if not isinstance(params, SamplingParams):
            raise RequestError(f"params must be a SamplingParams, got {type(params).__name__}")
        ids = list(prompt_ids)
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise RequestError(f"the prompt holds {t!r}, not a token id", "prompt")
        bad = [int(t) for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"the prompt has token ids {bad[:5]} outside [0, vocab_size="
                               f"{self.vocab_size})", "prompt")  # fmt: skip
        self.scheduler.check(len(ids), params, adapter)
        return [int(t) for t in ids]

    def abort(self, request_id: str) -> None:
        """Ends a request now (its pages freed); its last event has finish_reason "abort".
        An unknown or finished id is ignored."""
        req = self.scheduler.abort(request_id)
        if req is not None:
            self._forget(req)
            self._events.append(self._event(req, (), None))

    def has_unfinished(self) -> bool:
        """Whether any request waits or runs."""
        return self.scheduler.has_unfinished

    def stats(self) -> dict[str, int]:
        """`kv_pages_total`, `kv_pages_in_use` (held by requests; cached-only pages not
        counted), `kv_pages_cached`, `requests_running`, `requests_waiting`, and with LoRA
        slots `lora_loads` (adapters written into a slot so far)."""
        out = {"kv_pages_total": self.pages.num_pages, "kv_pages_in_use": self.pages.num_in_use,
               "kv_pages_cached": self.pages.num_cached,
               "requests_running": self.scheduler.num_running,
               "requests_waiting": self.scheduler.num_waiting}  # fmt: skip
        if self.adapters is not None:
            out["lora_loads"] = self.adapters.loads
        return out

    @property
    def preemptions(self) -> int:
        """Requests preempted so far (their pages freed, their tokens recomputed later)."""
        return self.scheduler.num_preemptions

    def budget_table(self) -> str:
        """The page pool's arithmetic (`KVPool.table`)."""
        return self.pool.table()

    # -- stepping -------------------------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        """Runs one engine step; returns the events of this step (new tokens, ends, aborts)."""
        if self.role == "follower" or self._closed:
            raise RuntimeError(f"Engine.step() on a {'closed' if self._closed else 'follower'} "
                               "engine: only process 0's engine steps, until its close()")  # fmt: skip
        events, self._events = self._events, []
        plan = self.scheduler.schedule()
        if not plan.items:
            return events
        ends = {it.request.request_id: it.start + it.num_tokens == len(it.request.all_ids)
                for it in plan.items}  # fmt: skip
        out = self._run(plan, ends)
        tokens = out.tokens()
        want_lp = any(ends[it.request.request_id] and it.request.params.logprobs is not None
                      for it in plan.items)  # fmt: skip
        lps = out.logprobs() if want_lp else None
        sampled = {it.request.request_id: int(tokens[it.slot]) for it in plan.items
                   if ends[it.request.request_id]}  # fmt: skip
        finished = {r.request_id for r in self.scheduler.update(plan, sampled)}
        for it in plan.items:
            req = it.request
            if not ends[req.request_id]:
                continue
            lp = None
            if lps is not None and req.params.logprobs is not None:
                n = req.params.logprobs
                chosen, ids, vals = lps
                top = tuple((int(i), float(v)) for i, v in zip(ids[it.slot, :n], vals[it.slot, :n],
                                                               strict=True))  # fmt: skip
                lp = ((float(chosen[it.slot]), top),)
            if req.request_id in finished:
                self._forget(req)
            events.append(self._event(req, (sampled[req.request_id],), lp))
        return events

    def _event(self, req: Request, tokens: tuple[int, ...], lp) -> TokenEvent:
        return TokenEvent(req.request_id, tokens, lp, req.finish_reason,
                          prompt_tokens=len(req.prompt_ids),
                          completion_tokens=len(req.output_ids))  # fmt: skip

    def _forget(self, req: Request) -> None:
        self._requests.pop(req.request_id, None)
        self._seeds.pop(req.request_id, None)

    def _run(self, plan, ends: dict[str, bool]):
        """Builds the step's inputs and runs `decode` or the right `mixed@T`."""
        r, p = self.max_batch_size, self.runner.pages_per_seq
        entries, active = {}, np.zeros(r, np.bool_)
        lora = np.full(r, -1, np.int32) if self.adapters is not None else None
        for it in plan.items:
            req = it.request
            if lora is not None:
                lora[it.slot] = req.lora_slot
            if self._slot_owner.get(it.slot) != req.request_id:
                self._slot_owner[it.slot] = req.request_id
                pr = req.params
                if pr.repetition_penalty != 1 or pr.presence_penalty or pr.frequency_penalty:
                    self.runner.reset_slot(it.slot, req.prompt_ids, req.output_ids)
            seed = self._seeds[req.request_id]
            entries[it.slot] = (req.params, seed, len(req.output_ids))
            active[it.slot] = ends[req.request_id]
        slots = slot_params(r, entries)
        decode_only = all(it.num_tokens == 1 and ends[it.request.request_id]
                          for it in plan.items)  # fmt: skip
        if decode_only and self.recurrent and (
                len(plan.items) < self.scheduler.num_running
                or any(it.start == 0 for it in plan.items)):
            # A running request left out of a decode step would have its recurrent state
            # advanced by its row's padding token, and a one-token prompt's first step would
            # start from the state its slot's previous request left: the decode step carries
            # every row's state forward. The mixed pass leaves an absent row as it is and
            # starts a row whose cached length is 0 from zero states.
            decode_only = False
        tables = np.zeros((r + 1, p), np.int32)
        for req in self.scheduler.running:
            pages = self.pages.pages(req.request_id)
            tables[req.slot, : len(pages)] = pages
        if decode_only:
            self.stats_steps["decode"] += 1
            tok, pos = np.zeros(r, np.int32), np.zeros(r, np.int32)
            for it in plan.items:
                tok[it.slot] = it.request.all_ids[it.start]
                pos[it.slot] = it.start
            dec_tables = np.where(active[:, None], tables[:r], 0).astype(np.int32)
            return self.runner.decode(tok, pos, dec_tables, slots, active, lora)
        self.stats_steps["mixed"] += 1
        by_slot = {it.slot: it for it in plan.items}
        cached = np.zeros(r + 1, np.int32)
        for req in self.scheduler.running:
            cached[req.slot] = req.num_computed
        pieces, lens = [], np.zeros(r + 1, np.int64)
        for s in range(r):
            it = by_slot.get(s)
            if it is not None:
                pieces.append(it.request.all_ids[it.start : it.start + it.num_tokens])
                lens[s] = it.num_tokens
                cached[s] = it.start
        total = int(lens.sum())
        t = self.runner.bucket(total)
        lens[r] = t - total  # the padding sequence: null page, spare state row
        tokens = np.zeros(t, np.int32)
        if total:
            tokens[:total] = np.concatenate([np.asarray(x, np.int32) for x in pieces])
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        return self.runner.mixed(tokens, cu, tables, cached, slots, active, lora)

    # -- offline --------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 adapters: str | Sequence[str | None] | None = None,
                 ) -> list[CompletionOutput]:  # fmt: skip
        """Runs every prompt to completion (continuous batching), each with its LoRA adapter
        (`adapters`: one name or None for all, or one per prompt); returns their outputs in
        prompt order.

        Raises:
          RequestError: a bad prompt or parameter (raised before any request runs).
        """
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise RequestError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        if adapters is None or isinstance(adapters, str):
            adapters = [adapters] * len(prompts)
        if len(adapters) != len(prompts):
            raise RequestError(f"{len(adapters)} adapters for {len(prompts)} prompts", "model")
        ids = []
        try:
            for p, sp, a in zip(prompts, params, adapters, strict=True):
                ids.append(self.add_request(p, sp, adapter=a))
        except RequestError:
            for rid in ids:
                self.abort(rid)
            self._events.clear()
            raise
        out = {rid: CompletionOutput(rid, list(p), [], None,
                                     [] if sp.logprobs is not None else None)
               for rid, p, sp in zip(ids, prompts, params, strict=True)}  # fmt: skip
        pending = set(ids)
        while pending:
            for ev in self.step():
                o = out.get(ev.request_id)
                if o is None:
                    continue
                o.token_ids.extend(ev.token_ids)
                if ev.logprobs is not None and o.logprobs is not None:
                    o.logprobs.extend(ev.logprobs)
                if ev.finished:
                    o.finish_reason = ev.finish_reason
                    pending.discard(ev.request_id)
        return [out[rid] for rid in ids]
