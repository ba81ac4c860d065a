"""The decoder: a stack of residual blocks on one arena. Llama/Mistral/Qwen3, Mamba-2,
Nemotron-H and the random-weight reference hybrid are all cases of `ArenaLM`.

A model is `embed -> blocks -> final RMSNorm -> LM head` (tied to the embeddings or not),
each block `x += mixer(rmsnorm(x))` with a mixer from `jaxarena.models.blocks`
(`Attention`, `MLP`, `Mamba2`, ...). The decoder owns the residual stream: it writes the
embeddings to `hidden_states`, and around every block copies the skip path to `residual`,
writes the pre-norm to `norm_output`, and adds the block's output back into `hidden_states`.
Caches are one entry per block (`None` for a block without one): a dict keyed by
`cache_keys` (`"<kind>.<index>"`, e.g. `"attention.001"`).

Prefill and decode share one loop (`_blocks`); they differ only in the `StepContext` they
build (prefill: packed prompts with `cu_seqlens`; decode: one token per sequence with
`seq_lens`) and in which block method runs.

Arena discipline (the step rule, jaxarena/models/README.md): what a Pallas kernel reads or
writes in place goes through the arena's regions (attention output, split-K partials, FP8
activations, SSD scratch); the residual stream, the pre-norms and the GEMM outputs stay XLA
values, rounded to bfloat16 where their regions would have stored them (`core.arena.stored`);
arithmetic is float32. Results read from an arena version (the caches, a product of arena
bytes) are tied to it with `lax.optimization_barrier` before the next write.

`prefill` and `decode_step` are pure; jit them with the arena and the caches donated
(`jax.jit(model.decode_step, donate_argnums=(1, 2))`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxarena import ArenaPlan, Levers, ModelConfig, Target
from jaxarena._sizing.step_temp import DEFAULT_PREFILL_CHUNK
from jaxarena.models.blocks.base import Block, Env, StepContext
from jaxarena.models.core.arena import BF16, F32, put, stored
from jaxarena.models.core.kernels import check_kernels, resolve_kernels
from jaxarena.models.core.norms import rms_norm
from jaxarena.models.scan_layers import (
    layer_runs,
    sliced_after,
    stack_caches,
    stack_params,
    unstack_caches,
)

__all__ = ["Arch", "ArenaLM", "DEFAULT_PREFILL_CHUNK"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arch:
    """What distinguishes one model from another beyond its dimensions (static, hashable).

    Attributes:
      blocks: the residual blocks, in order (`jaxarena.models.blocks` instances).
      rms_eps: epsilon of the block pre-norms and the final norm.
      tie_embeddings: the LM head is the embedding matrix (no `lm_head` parameter).
      embed_scale: the embeddings are multiplied by this (Gemma: `sqrt(hidden)` rounded to
        bf16, the activation dtype); None: not scaled.
      final_softcap: the logits become `c * tanh(logits / c)` (Gemma 2); None: none.
      norm_offset: the pre-norms and the final norm scale by `w + norm_offset` (1 for the
        zero-centred `(1 + w)` norms of Qwen3-Next / Qwen3.5).

    A block whose parameters hold `"post_norm"` has its output RMS-normalized with it before
    the residual add (Gemma's post-attention / post-feedforward norms).
    """

    blocks: tuple[Block, ...]
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    embed_scale: float | None = None
    final_softcap: float | None = None
    norm_offset: float = 0.0

    def __post_init__(self) -> None:
        bad = [b for b in self.blocks if not isinstance(b, Block)]
        if bad:
            raise ValueError(f"Arch.blocks must be Block instances "
                             f"(jaxarena.models.blocks), got {bad[:3]}")  # fmt: skip

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kind of each block (`"attention"`, `"mamba"`, `"mlp"`, ...)."""
        return tuple(b.kind for b in self.blocks)

    @property
    def cache_keys(self) -> tuple[str, ...]:
        """The key of each block's cache, `"<kind>.<index>"` (`"mamba.000"`, ...).

        The kind comes first on purpose: jax flattens a dict in key order, so the caches
        reach XLA grouped by kind (all KV caches, then all SSM states). XLA's CPU buffer
        assignment depends on the parameter order; in block order it kept one more
        interpreter copy alive in the reference hybrid's decode step (+126 KB temp,
        tests/models/test_hybrid_e2e.py::test_decode_footprint).
        """
        return tuple(f"{b.kind}.{i:03d}" for i, b in enumerate(self.blocks))

    def init_caches(self, config: ModelConfig, *, num_blocks: int, kv_block_size: int,
                    rows: int) -> dict[str, Any]:  # fmt: skip
        """Zeroed decode caches, `{cache key: Block.init_cache(...)}` for every block."""
        return {key: b.init_cache(config, num_blocks=num_blocks, kv_block_size=kv_block_size,
                                  rows=rows)
                for key, b in zip(self.cache_keys, self.blocks, strict=True)}  # fmt: skip


def _split_head(h: jax.Array, w: jax.Array, tied: bool) -> jax.Array:
    """`h @ W` (float32 `h [T, hidden]`, bf16 `W`: `[vocab, hidden]` when `tied`, else
    `[hidden, vocab]`) as ONE bf16 GEMM of `[hi; lo]`, `h = hi + lo` its two bf16 parts
    (exact to 2^-17 relative), with f32 accumulation: the `kernels="xla"` (CPU) form, which
    reads the bf16 head once instead of making a transposed float32 copy of it every step
    (Qwen3-0.6B: 151,936 x 1024, 0.6 GB of float32 writes per decode step)."""
    t = h.shape[0]
    hi = h.astype(BF16)
    lo = (h - hi.astype(F32)).astype(BF16)
    dims = (((1,), (1,)) if tied else ((1,), (0,)), ((), ()))
    out = lax.dot_general(jnp.concatenate([hi, lo]), w, dims, preferred_element_type=F32)
    return out[:t] + out[t:]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArenaLM:
    """A decoder bound to one arena plan (see the module docstring).

    Attributes:
      config: the model dimensions (the same `ModelConfig` the plan was sized from).
      arch: the blocks and the family's remaining choices (`Arch`).
      plan: the arena layout, from `BufferSizes.from_config` at the serve limits (or packed).
      max_batch_tokens, max_seq_len, kv_block_size, max_batch_size: the serve limits the plan
        was sized for.
      target, levers: what sized the split-K workspace; the decode kernel uses the same policy.
      interpret: Pallas interpret mode (None: on CPU).
      kernels: `"pallas"` (the Pallas kernels), `"xla"` (their plain-XLA implementations,
        the CPU's fast path) or `"auto"` (`"xla"` on a CPU backend, else `"pallas"`); see
        `jaxarena.models.core.kernels`.
      scan_layers: run each run of identical layers (`layer_runs`) as one `lax.scan`, so the
        compile time stays near that of one period; the steps then take the parameters and
        caches in the scanned layout (`stack_params`, `init_caches`;
        `jaxarena/models/scan_layers.py`). False: every block unrolled, one entry each.
      prefill_chunk: a prefill of more tokens than this runs as token chunks through every
        layer (`prefill`), so its XLA temp is that of one chunk; `"auto"`:
        `DEFAULT_PREFILL_CHUNK`; None: always one pass. Models with a block that cannot
        continue a sequence (`unchunked_kinds`) run one pass.
      tp_axis: None: the model runs on one device. A mesh axis name: `config` is ONE device's
        share (`ModelConfig.shard(tp=...)`) and the steps run inside `shard_map` over that
        axis (`jaxarena.models.tensor_parallel`): the embedding and the LM head are
        vocab-parallel, and every block's output is all-reduced before the residual add.
      tp_vocab: with `tp_axis`, the whole model's vocabulary (the gathered logits are cut to it).
      tp_groups: with `tp_axis`, the whole model's Mamba-2 `n_groups` (`Env.tp_groups`): fewer
        than the devices, each gated-RMSNorm group spans several of them. None: no group
        spans devices.
    """

    config: ModelConfig
    arch: Arch
    plan: ArenaPlan
    max_batch_tokens: int
    max_seq_len: int
    kv_block_size: int
    max_batch_size: int
    target: Target
    levers: Levers
    interpret: bool | None = None
    kernels: str = "pallas"
    scan_layers: bool = False
    prefill_chunk: int | str | None = "auto"
    tp_axis: str | None = None
    tp_vocab: int | None = None
    tp_groups: int | None = None

    def __post_init__(self) -> None:
        if self.kernels != "auto":
            check_kernels(self.kernels, "ArenaLM.kernels")
        c = self.prefill_chunk
        if not (c is None or c == "auto" or (isinstance(c, int) and not isinstance(c, bool)
                                               and c >= 1)):  # fmt: skip
            raise ValueError(f"prefill_chunk={c!r} must be None, 'auto' or an int >= 1")

    @property
    def vocab_size(self) -> int:
        """The whole model's vocabulary, the logits' width (`config`'s on one device; over a
        mesh `config` holds one device's share and `tp_vocab` the whole)."""
        return self.tp_vocab or self.config.vocab_size

    @property
    def pages_per_seq(self) -> int:
        """Columns of a block table: the KV pages of the longest sequence a step can hold,
        `ceil(max(max_seq_len, max_batch_tokens) / kv_block_size)` (a prefill's padding
        sequence may take every token of the step)."""
        return -(-max(self.max_seq_len, self.max_batch_tokens) // self.kv_block_size)

    @property
    def env(self) -> Env:
        """What every block runs against (config, plan, KV page size, decode policy)."""
        return Env(config=self.config, plan=self.plan, kv_block_size=self.kv_block_size,
                   target=self.target, levers=self.levers, interpret=self.interpret,
                   kernels=resolve_kernels(self.kernels), tp_axis=self.tp_axis,
                   tp_groups=self.tp_groups)  # fmt: skip

    def init_caches(self, *, num_blocks: int, rows: int) -> dict[str, Any]:
        """Zeroed decode caches, one entry per block (`Block.init_cache`) under its
        `Arch.cache_keys` key: an attention block a paged bf16 KV cache (`k`, `v`:
        `[num_blocks, kv_block_size, Hkv, D]`), a Mamba block its f32 SSM state
        (`[rows, H, P, N]`) and conv window (`[rows, 3, d_xbc]`), an MLP None. With
        `scan_layers`, in the scanned layout (each run's caches made at their stacked shape,
        not stacked from per-block copies)."""
        if not self.scan_layers:
            return self.arch.init_caches(self.config, num_blocks=num_blocks,
                                         kv_block_size=self.kv_block_size, rows=rows)  # fmt: skip
        shapes = jax.eval_shape(
            lambda: self.arch.init_caches(
                self.config, num_blocks=num_blocks, kv_block_size=self.kv_block_size, rows=rows
            )
        )
        shapes = self.stack_caches(shapes)
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    # -- the scanned layout (jaxarena/models/scan_layers.py) --------------------------------------

    @property
    def layer_runs(self) -> tuple[tuple[int, int, int], ...]:
        """The runs `(start, period, repeats)` of identical blocks (`scan_layers.layer_runs`)."""
        return layer_runs(self.arch.blocks)

    def stack_params(self, params):
        """Per-block parameters in the scanned layout, stacked on the host (numpy)."""
        return stack_params(self.layer_runs, params)

    def stack_caches(self, caches):
        """Per-block caches (`Arch.init_caches`) in the scanned layout."""
        return stack_caches(self.layer_runs, self.arch.blocks, self.arch.cache_keys, caches)

    def unstack_caches(self, caches):
        """Scanned caches back to one entry per block."""
        return unstack_caches(self.layer_runs, self.arch.blocks, self.arch.cache_keys, caches)

    @property
    def unchunked_kinds(self) -> tuple[str, ...]:
        """The kinds of this model's blocks that cannot prefill a prompt in chunks (no
        `chunked_prefill`), sorted; empty when every block can."""
        return tuple(sorted({b.kind for b in self.arch.blocks if not b.chunked_prefill}))

    # -- the shared loop -------------------------------------------------------------------------

    def _blocks(self, mode: str, params, arena, caches, tokens, ctx: StepContext):
        """Embeds `tokens` into `hidden_states` and runs every block (`mode`: `"prefill"`,
        `"prefill_chunk"`, a prefill pass that is one chunk of a longer prefill, or
        `"decode"`) with its pre-norm and residual add; returns `(arena, caches, h)`."""
        # The residual stream is an XLA value rounded as its region would store it (bf16):
        # no kernel reads it in place, and XLA fuses the norms and adds (README: "what goes
        # through the arena").
        emb = self._embed(params["embed"], tokens)
        if self.arch.embed_scale is not None:
            emb = emb.astype(F32) * self.arch.embed_scale
        h = stored(emb)
        out_caches = {}
        if self.scan_layers:
            keys = self.arch.cache_keys
            for (start, period, repeats), group in zip(self.layer_runs, params["layers"],
                                                       strict=True):  # fmt: skip
                blocks = self.arch.blocks[start : start + period]
                run_keys = keys[start : start + period]
                cs = [caches[k] for k in run_keys]
                if repeats == 1:
                    for key, block, p, c in zip(run_keys, blocks, group, cs, strict=True):
                        arena, out_caches[key], h = self._block(mode, block, p, arena, c, h, ctx)
                    continue
                arena, h, cs = self._scan_run(mode, blocks, group, repeats, arena, cs, h, ctx)
                out_caches.update(zip(run_keys, cs, strict=True))
            return arena, out_caches, h
        blocks = zip(self.arch.cache_keys, self.arch.blocks, params["layers"], strict=True)
        for key, block, p in blocks:
            arena, out_caches[key], h = self._block(mode, block, p, arena, caches[key], h, ctx)
        return arena, out_caches, h

    def _embed(self, table: jax.Array, tokens: jax.Array) -> jax.Array:
        """The embedding rows of `tokens`; vocab-parallel under `tp_axis` (each device holds
        `table.shape[0]` rows of the padded vocabulary: the rows it holds, zeros for the
        others, summed over the devices, exactly)."""
        if self.tp_axis is None:
            return table[tokens]
        rows = table.shape[0]
        local = tokens - lax.axis_index(self.tp_axis) * rows
        mine = (local >= 0) & (local < rows)
        emb = jnp.where(mine[:, None], table[jnp.clip(local, 0, rows - 1)], 0)
        return lax.psum(emb, self.tp_axis)

    def _block(self, mode: str, block: Block, p, arena, cache, h, ctx: StepContext):
        """One block with its pre-norm and residual add: `(arena, cache, h)`."""
        env, eps = self.env, self.arch.rms_eps
        if mode == "decode":
            # Decode's FP8 activations are a few rows: quantized as values, so no arena slice
            # is copied out for each GEMM (`Env.fp8_act_values`); prefill keeps the regions.
            env = dataclasses.replace(env, fp8_act_values=True)
        normed = stored(rms_norm(h, p["norm"], eps, self.arch.norm_offset))
        if block.input_in_ctx:
            block_ctx = ctx._replace(x=normed)
        else:
            arena, block_ctx = put(self.plan, arena, "norm_output", normed), ctx
        step = block.decode if mode == "decode" else block.prefill
        arena, cache, out = step(env, p, arena, cache, block_ctx)
        if self.tp_axis is not None:
            # The row-parallel output projections' partial sums, all-reduced in bf16 (the
            # activation dtype, as vLLM and Megatron-LM reduce): half the bytes of float32.
            out = lax.psum(out.astype(BF16), self.tp_axis).astype(F32)
        if "post_norm" in p:
            out = rms_norm(out, p["post_norm"], eps)
        h = stored(h + out)
        if mode == "prefill_chunk":
            # In a chunk of a long prefill the residual stream is materialised (bf16) after
            # every block: else XLA may fuse each add into its consumers and keep every
            # block's float32 output alive to the end of the pass (mamba2-2.7b, 2048-token
            # chunks: +16 MiB per layer, 1,175 MiB of temp at 64 layers where one chunk needs
            # 111). One more launch per block (the add no longer fuses into the next norm),
            # so the one-pass prefill, held to the plain step's launches, does not do it.
            h = lax.optimization_barrier(h.astype(BF16)).astype(F32)
        return arena, cache, h

    def _scan_run(self, mode: str, blocks, group, repeats: int, arena, caches, h, ctx):
        """A run of `repeats` repetitions of `blocks` as one `lax.scan` (scanned layout,
        jaxarena/models/scan_layers.py): the arena, the residual stream and the run's caches
        are the carry (updated in place); the stacked parameters stay loop-invariant and each
        block slices its repetition's parameters only once the block before it is done
        (`scan_layers.sliced_after`). Returns `(arena, h, caches)`."""

        def body(carry, k):
            arena, h, cs = carry
            new = []
            for j, (block, stack, c) in enumerate(zip(blocks, group, cs, strict=True)):
                p, h = sliced_after(stack, k, h, first=j == 0, in_place=block.scan_in_place)
                block_ctx, layer_c = ctx, c
                if c is not None and block.paged_kv:
                    pages = jax.tree.leaves(c)[0].shape[0] // repeats
                    block_ctx = ctx._replace(block_tables=ctx.block_tables + k * pages)
                elif c is not None:
                    layer_c = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, k, 0, False), c)
                arena, layer_c, h = self._block(mode, block, p, arena, layer_c, h, block_ctx)
                if c is not None and not block.paged_kv:
                    layer_c = jax.tree.map(
                        lambda a, u: lax.dynamic_update_index_in_dim(a, u.astype(a.dtype), k, 0),
                        c, layer_c)  # fmt: skip
                new.append(layer_c)
            return (arena, h, new), None

        ks = jnp.arange(repeats, dtype=jnp.int32)
        (arena, h, caches), _ = lax.scan(body, (arena, h, list(caches)), ks)
        return arena, h, caches

    def _lm_head(self, arena, params, h):
        """Final norm and LM head of the hidden rows `h`: `(arena, logits)`, the logits as
        the `logits` region would store them, bf16, an XLA value (the step's output, which
        the GEMM writes directly: float32 logits would cost a bf16 temporary as large)."""
        h = rms_norm(h, params["final_norm"], self.arch.rms_eps, self.arch.norm_offset)
        w = params["embed"] if self.arch.tie_embeddings else params["lm_head"]
        if resolve_kernels(self.kernels) == "xla" and w.dtype == BF16:
            logits = _split_head(h, w, self.arch.tie_embeddings)
        else:
            logits = h @ (w.T if self.arch.tie_embeddings else w).astype(F32)
        if self.arch.final_softcap is not None:
            logits = self.arch.final_softcap * jnp.tanh(logits / self.arch.final_softcap)
        logits = logits.astype(BF16)
        if self.tp_axis is not None:  # vocab-parallel head: gather, drop the padding columns
            logits = lax.all_gather(logits, self.tp_axis, axis=1, tiled=True)[:, : self.vocab_size]
        return arena, logits

    # -- steps -----------------------------------------------------------------------------------

    def prefill_chunk_tokens(self, tokens: int) -> int | None:
        """The chunk length a prefill of `tokens` tokens runs in (static), or None for one
        pass: `prefill_chunk` (`"auto"`: `DEFAULT_PREFILL_CHUNK`) when it is smaller than
        `tokens` and every block can continue a sequence from an earlier chunk."""
        chunk = DEFAULT_PREFILL_CHUNK if self.prefill_chunk == "auto" else self.prefill_chunk
        if chunk is None or tokens <= chunk or self.unchunked_kinds:
            return None
        return chunk

    def prefill(self, params, arena, caches, tokens, cu_seqlens, block_tables, cached_lens=None,
                lora_slots=None, *, all_logits: bool = False):  # fmt: skip
        """Runs the prompts of `S` sequences packed into one pass (or one chunk of them).

        A prefill longer than the chunk (`prefill_chunk_tokens`) runs as consecutive token
        chunks through every layer, each continuing the earlier ones from the caches (the
        full chunks under one `lax.scan`, then the remainder), so its XLA temp is that of one
        chunk, not of `T` tokens; the results are those of one pass but for the GEMMs' row
        counts.

        Args:
          params: `{"embed", "layers": [one dict per block], "final_norm"[, "lm_head"]}`.
          arena: the plan's arena (donated).
          caches: `init_caches(...)` (donated); sequence `s` uses SSM cache row `s` and the KV
            blocks of `block_tables[s]`.
          tokens: `int32[T]`, the prompts back to back, `T <= max_batch_tokens`.
          cu_seqlens: `int32[S + 1]`, sequence `s` is `tokens[cu_seqlens[s]:cu_seqlens[s+1]]`
            (every sequence at least one token).
          block_tables: `int32[S, max_blocks_per_seq]`.
          cached_lens: chunked prefill: `int32[S]`, the tokens of each sequence already in
            the caches (earlier chunks); this chunk's tokens sit at positions
            `cached_lens[s]...` and attend to those plus themselves. None: all zeros (a
            sequence may have 0 tokens in a chunk only when given). A model with a block
            that cannot continue a sequence from an earlier chunk (`unchunked_kinds`) raises
            NotImplementedError.
          lora_slots: `int32[S]`, each sequence's LoRA adapter slot (-1: none), for a model
            whose blocks hold LoRA tables (`jaxarena.models.lora`); None: no LoRA.
          all_logits: static; return the logits of every token instead of each sequence's last.

        Returns:
          `(arena, caches, logits)`: `bfloat16[S, vocab]` (each sequence's last prompt token),
          or `bfloat16[T, vocab]` with `all_logits`.
        """
        t = tokens.shape[0]
        if t > self.max_batch_tokens:
            raise ValueError(f"{t} prompt tokens exceed max_batch_tokens={self.max_batch_tokens}")
        if cached_lens is not None and self.unchunked_kinds:
            raise NotImplementedError(
                f"chunked prefill (cached_lens): this model's {list(self.unchunked_kinds)} "
                "blocks cannot continue a sequence from an earlier chunk"
            )  # fmt: skip
        chunk = self.prefill_chunk_tokens(t)
        if chunk is None:
            arena, caches, h = self._prefill_pass(params, arena, caches, tokens, cu_seqlens,
                                                  block_tables, cached_lens,
                                                  lora_slots=lora_slots)  # fmt: skip
            rows = jnp.arange(t, dtype=jnp.int32) if all_logits else cu_seqlens[1:] - 1
            arena, logits = self._lm_head(arena, params, h[rows])
            return arena, caches, logits
        return self._chunked_prefill(params, arena, caches, tokens, cu_seqlens, block_tables,
                                     cached_lens, chunk, all_logits, lora_slots)  # fmt: skip

    def _chunked_prefill(self, params, arena, caches, tokens, cu_seqlens, block_tables,
                         cached_lens, chunk: int, all_logits: bool,
                         lora_slots=None):  # fmt: skip
        """`prefill` as consecutive `chunk`-token passes (see `prefill`): chunk `j` holds
        tokens `[j chunk, (j + 1) chunk)`, each sequence's part of it continuing the tokens
        before (`cached_lens` plus its tokens in earlier chunks). Returns what `prefill`
        returns."""
        t, s = tokens.shape[0], cu_seqlens.shape[0] - 1
        base = jnp.zeros((s,), jnp.int32) if cached_lens is None else cached_lens.astype(jnp.int32)
        lens = cu_seqlens[1:] - cu_seqlens[:-1]
        last = cu_seqlens[1:] - 1  # each sequence's last token

        def one(arena, caches, rows_h, start, n):
            toks = lax.dynamic_slice_in_dim(tokens, start, n)
            cu = jnp.clip(cu_seqlens - start, 0, n)
            cached = base + jnp.clip(start - cu_seqlens[:-1], 0, lens)
            arena, caches, h = self._prefill_pass(params, arena, caches, toks, cu,
                                                  block_tables, cached, "prefill_chunk",
                                                  lora_slots)  # fmt: skip
            if rows_h is not None:  # keep the rows of the sequences that end in this chunk
                here = (last >= start) & (last < start + n)
                rows_h = jnp.where(here[:, None], h[jnp.clip(last - start, 0, n - 1)], rows_h)
            return arena, caches, rows_h, h

        full, rem = divmod(t, chunk)
        rows_h = None if all_logits else jnp.zeros((s, self.config.hidden_size), jnp.float32)

        def body(carry, j):
            arena, caches, rows_h = carry
            arena, caches, rows_h, h = one(arena, caches, rows_h, j * chunk, chunk)
            return (arena, caches, rows_h), (h if all_logits else None)

        steps = jnp.arange(full, dtype=jnp.int32)
        (arena, caches, rows_h), hs = lax.scan(body, (arena, caches, rows_h), steps)
        if rem:
            arena, caches, rows_h, h_rem = one(arena, caches, rows_h, full * chunk, rem)
        if all_logits:
            rows_h = hs.reshape(full * chunk, -1)
            if rem:
                rows_h = jnp.concatenate([rows_h, h_rem])
        arena, logits = self._lm_head(arena, params, rows_h)
        return arena, caches, logits

    def _prefill_pass(self, params, arena, caches, tokens, cu_seqlens, block_tables, cached_lens,
                      mode: str = "prefill", lora_slots=None):  # fmt: skip
        """One pass of `tokens` through every block: `(arena, caches, h)` with `h` the final
        residual stream, `float32[T, hidden]` (bf16-rounded)."""
        t = tokens.shape[0]
        idx = jnp.arange(t, dtype=jnp.int32)
        # Each token's sequence: how many sequence ends are <= it. A count, as in the SSD scan,
        # not `searchsorted`, whose default method is a while loop of log2(S) steps on a GPU.
        seq = jnp.sum(cu_seqlens[None, 1:] <= idx[:, None], axis=1, dtype=jnp.int32)
        positions, seq_lens, cached = idx - cu_seqlens[seq], None, None
        if cached_lens is not None:
            # Padding tokens (past cu_seqlens[S]) count as the last sequence's; clamp so their
            # positions stay where the block table reaches.
            cached = cached_lens.astype(jnp.int32)
            positions = positions + cached[jnp.minimum(seq, cached.shape[0] - 1)]
            seq_lens = cached + (cu_seqlens[1:] - cu_seqlens[:-1])
        if lora_slots is not None:  # per sequence -> per token (padding: the last sequence's)
            lora_slots = lora_slots.astype(jnp.int32)[jnp.minimum(seq, lora_slots.shape[0] - 1)]
        ctx = StepContext(positions=positions, seq_ids=seq, block_tables=block_tables,
                          cu_seqlens=cu_seqlens, seq_lens=seq_lens,
                          cached_lens=cached, lora_slots=lora_slots)  # fmt: skip
        return self._blocks(mode, params, arena, caches, tokens, ctx)

    def decode_step(self, params, arena, caches, tokens, positions, block_tables, seq_lens,
                    lora_slots=None):  # fmt: skip
        """One decode step for `B` sequences (one new token each).

        Args:
          params: as for `prefill`.
          arena, caches: donated; sequence `b` uses SSM cache row `b`.
          tokens: `int32[B]`, the newest token of each sequence.
          positions: `int32[B]`, its position (the sequence length before this token).
          block_tables: `int32[B, max_blocks_per_seq]`.
          seq_lens: `int32[B]`, lengths after this token (`positions + 1`).
          lora_slots: `int32[B]`, each sequence's LoRA adapter slot (-1: none); None: no LoRA.

        Returns:
          `(arena, caches, logits bfloat16[B, vocab], next_tokens int32[B])` (greedy).
        """
        bsz = tokens.shape[0]
        seq = jnp.arange(bsz, dtype=jnp.int32)
        slots = None if lora_slots is None else lora_slots.astype(jnp.int32)
        ctx = StepContext(positions=positions, seq_ids=seq, block_tables=block_tables,
                          seq_lens=seq_lens, lora_slots=slots)  # fmt: skip
        arena, caches, h = self._blocks("decode", params, arena, caches, tokens, ctx)
        arena, logits = self._lm_head(arena, params, h)
        return arena, caches, logits, jnp.argmax(logits, -1).astype(jnp.int32)
