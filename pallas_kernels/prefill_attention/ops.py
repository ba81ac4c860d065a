"""Public wrappers: paged prefill attention, standalone and in place in an arena.

Causal flash attention for packed variable-length prompts whose keys and values are read
from a vLLM-layout paged KV cache. The caller appends the chunk's keys and values to the
cache first (as a model does before attention), so one call serves both

- plain prefill: `seq_lens == the query counts`, every query sees its prompt up to itself;
- chunked prefill (vLLM's): a chunk of `qlen` queries of a sequence whose first
  `seq_lens[s] - qlen` tokens are already in the cache sees those plus the chunk up to
  itself. Query `i` of sequence `s` sits at position `seq_lens[s] - qlen_s + i`.

Work decomposition (see `kernel.py`): the packed queries are cut into tiles of `block_t`
tokens that never straddle two sequences; a tile table (`int32[max_tiles, 5]`, at most
`ceil(T / block_t) + S` tiles, built with `jnp` from `cu_seqlens_q` and `seq_lens`) tells
each program its tokens, their positions and its sequence. One program per (tile, KV head,
query-head block) walks only the keys its rows can see, in blocks of `block_k`, gathering
them through the block table, with an f32 online softmax. Nothing outside the kernel grows
faster than `T`: the temporaries are the tile table and, in the standalone form, the output.

Options follow the split-K decode kernel's semantics: `window_size` (Hugging Face's
`sliding_window`: the query at position `p` sees keys `[p - window_size + 1, p]`), `sinks`
(gpt-oss: `exp(sink)` joins each head's softmax denominator, no value), `softcap` (Gemma-2:
`softcap * tanh(x / softcap)` on the scaled logits), `sm_scale` (default `1 / sqrt(D_qk)`),
`D_qk != D_v` (separate caches, or MLA's latent cache with `v_cache=None, v_head_dim`), and
the FP8 KV cache (vLLM's `kv_cache_dtype="fp8"`): `float8_e4m3fn` pages with f32 scales per
tensor or per KV head, the real key `k_scale * k` and value `v_scale * v`.

Padding tokens (rows of q past `cu_seqlens_q[-1]`) give zeros, in both forms.

In place (the arena form): the WHOLE arena goes into the `pallas_call` as `uint32[rows, 64]`
words (an XLA bitcast on the GPU), aliased to its output (`input_output_aliases`,
`memory_space=pl.ANY`); the kernel stores the output at the region's static offset. In
interpret mode only the region's rows travel (`_arena_io`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._arena_io import ROW_BYTES, WORDS_PER_ROW, plan_windows
from pallas_kernels._args import resolve_interpret
from pallas_kernels._cost import KernelCost, Workload, declare_cost
from pallas_kernels.prefill_attention.checks import FP8_DTYPE, OUTPUT_REGION
from pallas_kernels.prefill_attention.checks import validate as _validate
from pallas_kernels.prefill_attention.kernel import (
    TILE_FIELDS,
    Place,
    PrefillConfig,
    prefill_attention_kernel,
)

__all__ = ["paged_prefill_attention", "paged_prefill_attention_into", "prefill_blocks"]

_MIN_DOT = 16  # Triton's dot needs every dimension >= 16


def _chunks(d: int) -> tuple[tuple[int, int, int], ...]:
    """Power-of-two column chunks of a head dim, widest first, each loaded at least 16 wide:
    80 -> (0, 64, 64), (64, 16, 16); 24 -> (0, 16, 16), (16, 8, 16)."""
    out, c0 = [], 0
    for bit in reversed(range(d.bit_length())):
        w = 1 << bit
        if d & w:
            out.append((c0, w, max(w, _MIN_DOT)))
            c0 += w
    return tuple(out)


def prefill_blocks(group_size: int, head_dim: int, v_head_dim: int, itemsize: int) -> dict:
    """The tile geometry and launch parameters the kernel uses for these shapes.

    Returns `dict(block_h, block_t, block_k, num_warps)`: `block_h` query heads of one KV
    head times `block_t` tokens make the program's `block_m` rows; `block_k` keys per loop
    iteration. Chosen so that the tiles fit the registers of an H200 / B200 with no spills
    (checked by tests/gpu/test_prefill_gpu.py): 64 rows for head dims up to 256, 32 beyond
    (MLA's 576/512), fewer keys per block and more warps for wider heads and for f32.
    """
    dmax = max(head_dim, v_head_dim)
    block_m = 64 if dmax <= 256 else 32
    block_k = 64 if dmax <= 128 else (32 if dmax <= 256 else 16)
    if itemsize == 4:
        block_k = max(block_k // 2, _MIN_DOT)
    block_h = min(pl.next_power_of_2(group_size), block_m)
    return dict(
        block_h=block_h,
        block_t=block_m // block_h,
        block_k=block_k,
        # f32 tiles are twice as wide in registers: 4 warps spill at D=128.
        num_warps=4 if dmax <= 128 and itemsize == 2 else 8,
    )


def _tile_table(cu, seq_lens, *, T, block_t, max_tiles, cap):
    """`int32[max_tiles, 5]` rows `(q0, q1, pos0, seq, kv_end)` (see `kernel.py`).

    Groups: the S sequences, then the padding tokens `[cu[S], T)`. Group `g` gets
    `ceil(len_g / block_t)` tiles, in order. Values are clamped so that traced bad input
    (offsets past T, decreasing offsets, contexts past the table) stays in bounds.
    """
    i32 = jnp.int32
    S = seq_lens.shape[0]
    cu = lax.cummax(jnp.clip(cu.astype(i32), 0, T))
    qlen = cu[1:] - cu[:-1]
    starts = jnp.concatenate([cu[:-1], cu[S:]])
    lens = jnp.concatenate([qlen, T - cu[S:]])
    ntiles = (lens + block_t - 1) // block_t
    tile_end = jnp.cumsum(ntiles, dtype=i32)
    idx = jnp.arange(max_tiles, dtype=i32)
    # The group of each tile: how many groups end at or before it (a count, not searchsorted:
    # that is a while loop on a GPU).
    grp = jnp.sum(tile_end[None, :] <= idx[:, None], axis=1, dtype=i32)
    used = grp <= S
    g = jnp.minimum(grp, S)
    local = idx - (tile_end[g] - ntiles[g])
    q0 = starts[g] + local * block_t
    q1 = jnp.minimum(q0 + block_t, starts[g] + lens[g])
    seq = jnp.minimum(g, S - 1)
    ctx = jnp.clip(seq_lens.astype(i32), 0, cap)[seq]
    pos0 = ctx - qlen[seq] + (q0 - cu[seq])
    kv_end = jnp.clip(pos0 + (q1 - q0), 0, cap)
    real = used & (g < S)
    q0, q1 = jnp.where(used, q0, 0), jnp.where(used, q1, 0)
    kv_end = jnp.where(real, kv_end, 0)
    cols = dict(q0=q0, q1=q1, pos0=pos0, seq=seq, kv_end=kv_end)
    # The columns are materialised before the stack: fused into it, the whole table is one
    # loop fusion of many inputs, which spilled registers (12 B at 32 registers, jax 0.12,
    # inside a chunked prefill's loop).
    cols = lax.optimization_barrier(cols)
    return jnp.stack([cols[f] for f in TILE_FIELDS], axis=1)


def _prefill_cost(q, k_cache, v_cache, d_v, window, block_h, block_t, geo):
    """The declared cost (`pallas_kernels._cost`) for prompts of `Workload.context` tokens
    packed into the `T` rows, each from an empty cache: a program (tile of `block_t`
    tokens, KV head, head block) reads the keys its rows see, rounded up to `block_k`
    (K and, unless V is K's prefix, V of its KV head), its query rows, and writes its
    output rows; flops are q.k and p.v over the causal (windowed) keys."""
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    head_blocks = -(-(Hq // Hkv) // block_h)
    bk = geo["block_k"]
    per_key = D * jnp.dtype(k_cache.dtype).itemsize + (
        0 if v_cache is None else d_v * jnp.dtype(v_cache.dtype).itemsize)
    it = jnp.dtype(q.dtype).itemsize

    def cost(w: Workload) -> KernelCost:
        L = max(1, min(w.context, T))
        seqs, keys_read = -(-T // L), 0
        for j in range(-(-L // block_t)):
            end = min((j + 1) * block_t, L)
            lo = max(0, j * block_t - window + 1) if window else 0
            keys_read += -(-(end - lo // bk * bk) // bk) * bk
        w_ = min(window or L, L)  # query i sees min(i + 1, window) keys
        pairs = w_ * (w_ + 1) // 2 + (L - w_) * w_
        kv = seqs * Hkv * head_blocks * keys_read * per_key
        return KernelCost(bytes=kv + T * Hq * (D + d_v) * it,
                          flops=2 * seqs * Hq * pairs * (D + d_v))  # fmt: skip

    return cost


@functools.partial(
    jax.jit, static_argnames=("opts", "interpret", "debug"), donate_argnames=("buf",)
)
def _prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scales, sinks, buf, *,
             opts: tuple, interpret: bool, debug: bool = False):  # fmt: skip
    """The kernel. `scales`: `(k_scale, v_scale)` as `f32[Hkv]` (FP8 cache) or None. `buf`:
    the arena (arena form) or None (standalone).

    `opts = (sm_scale, softcap, window, d_v, out_offset)`, `out_offset` the region's byte
    offset in the arena form, else None.
    """
    sm_scale, softcap, window, d_v, out_offset = opts
    T, Hq, D = q.shape
    num_blocks, page_size, Hkv, _ = k_cache.shape
    S, max_pages = block_tables.shape
    group = Hq // Hkv
    itemsize = jnp.dtype(q.dtype).itemsize
    geo = prefill_blocks(group, D, d_v, itemsize)
    block_h, block_t = geo["block_h"], geo["block_t"]
    max_tiles = -(-T // block_t) + S
    tiles = _tile_table(cu_seqlens_q, seq_lens, T=T, block_t=block_t, max_tiles=max_tiles,
                        cap=max_pages * page_size)  # fmt: skip
    row_words = d_v * itemsize // 4
    arena_form = out_offset is not None
    if arena_form:
        win = plan_windows(buf.shape[0], [(out_offset, T * Hq * d_v * itemsize)],
                           whole=not interpret)  # fmt: skip
        place = Place(win.row0(0, out_offset), out_offset % ROW_BYTES // 4, WORDS_PER_ROW)
        dst = win.take(buf, 0)
    else:
        place = Place(0, 0, row_words)
    cfg = PrefillConfig(
        sm_scale=sm_scale,
        num_q_heads=Hq,
        num_kv_heads=Hkv,
        group_size=group,
        block_h=block_h,
        block_t=block_t,
        block_k=geo["block_k"],
        page_size=page_size,
        num_blocks=num_blocks,
        max_pages=max_pages,
        qk_chunks=_chunks(D),
        v_chunks=_chunks(d_v),
        softcap=softcap,
        window=window,
        sinks=sinks is not None,
        fp8=scales is not None,
        out_itemsize=itemsize,
        out_dtype=jnp.dtype(q.dtype).name,
        out=place,
        dst_is_input=arena_form,
    )
    # 2-D views (free reshapes): one row per token and head, one row per cached key.
    k2 = k_cache.reshape(num_blocks * page_size * Hkv, D)
    v2 = k2 if v_cache is None else v_cache.reshape(num_blocks * page_size * Hkv, d_v)
    inputs = [q.reshape(T * Hq, D), k2, v2, block_tables.reshape(-1), tiles]
    if scales is not None:
        inputs += list(scales)
    if sinks is not None:
        inputs.append(sinks)
    aliases = {}
    if arena_form:
        aliases = {len(inputs): 0}
        inputs.append(dst)
        out_shape = jax.ShapeDtypeStruct(dst.shape, jnp.uint32)
    else:
        out_shape = jax.ShapeDtypeStruct((T * Hq, row_words), jnp.uint32)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    declare_cost("paged_prefill_attention", (max_tiles, Hkv, -(-group // block_h)), inputs,
                 _prefill_cost(q, k_cache, v_cache, d_v, window, block_h, block_t, geo))
    out = pl.pallas_call(
        functools.partial(prefill_attention_kernel, cfg=cfg),
        grid=(max_tiles, Hkv, -(-group // block_h)),
        in_specs=[any_spec] * len(inputs),
        out_specs=any_spec,
        out_shape=out_shape,
        input_output_aliases=aliases,
        interpret=interpret,
        # Explicit Triton params: jax 0.10 otherwise lowers GPU pallas_calls with Mosaic GPU.
        compiler_params=plgpu.CompilerParams(num_warps=geo["num_warps"], num_stages=2),
        name="paged_prefill_attention",
        debug=debug,
    )(*inputs)
    if arena_form:
        return win.put(buf, [out], 0)
    return lax.bitcast_convert_type(out, q.dtype).reshape(T, Hq, d_v)


def _run(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, buf, *, d_v, sm_scale,
         softcap, window_size, sinks, interpret, out_offset, k_scale=None, v_scale=None,
         debug=False):  # fmt: skip
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    opts = (
        scale,
        None if softcap is None else float(softcap),
        None if window_size is None else int(window_size),
        d_v,
        out_offset,
    )
    sinks = None if sinks is None else jnp.asarray(sinks, jnp.float32)
    scales = None
    if jnp.dtype(k_cache.dtype) == FP8_DTYPE:  # per tensor or per KV head -> f32[Hkv]
        hkv = k_cache.shape[2]
        scales = tuple(jnp.broadcast_to(jnp.asarray(s, jnp.float32).reshape(-1), (hkv,))
                       for s in (k_scale, v_scale))  # fmt: skip
    return _prefill(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scales, sinks, buf, opts=opts,
        interpret=resolve_interpret(interpret), debug=debug,
    )  # fmt: skip


def paged_prefill_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array | None,
    block_tables: jax.Array,
    cu_seqlens_q: jax.Array,
    seq_lens: jax.Array,
    *,
    sm_scale: float | None = None,
    window_size: int | None = None,
    sinks: jax.Array | None = None,
    softcap: float | None = None,
    v_head_dim: int | None = None,
    k_scale: Any = None,
    v_scale: Any = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Causal prefill (and chunked-prefill) attention of packed queries over a paged KV cache.

    Sequence `s` owns the query rows `cu_seqlens_q[s]:cu_seqlens_q[s + 1]` (`qlen_s` of them)
    and has `seq_lens[s]` tokens of context in the cache, the chunk's own keys and values
    included (append them first). Its query `i` sits at position `p = seq_lens[s] - qlen_s +
    i` and computes `softmax(x) @ V` over the keys `t <= p` (and `t > p - window_size`), with
    `x_t = sm_scale * q . K[t]`; query head `h` reads KV head `h // (Hq // Hkv)` (GQA, MQA),
    key/value `t` is row `t % block_size` of page `block_tables[s, t // block_size]`. Plain
    prefill is `seq_lens[s] == qlen_s`. Softmax statistics and accumulation are f32.

    Args:
      q: `[T, Hq, D]` float32, bfloat16 or float16, the sequences' queries back to back;
        `D` a power of two or a multiple of 8 (64, 80, 96, 128, 192, 256, 576, ...).
      k_cache: `[num_blocks, block_size, Hkv, D]` in q's dtype or `float8_e4m3fn` (any
        `block_size`). Read only.
      v_cache: `[num_blocks, block_size, Hkv, D_v]` in k_cache's dtype (`D_v` may differ from
        `D`), or None with `v_head_dim` (MLA's latent cache: the values are the first
        `v_head_dim` columns of k_cache). Read only.
      block_tables: `int32[S, max_blocks_per_seq]`, page ids of each sequence in order;
        entries past the context (or wholly before the first query's window) are not read.
      cu_seqlens_q: `int32[S + 1]`, starting at 0, non-decreasing, `cu_seqlens_q[S] <= T`
        (a sequence may have 0 queries). Rows `cu_seqlens_q[S]:T` are padding.
      seq_lens: `int32[S]`, context lengths, each `>= qlen_s` and `<= max_blocks_per_seq *
        block_size`. The values of cu_seqlens_q, seq_lens and the used table entries are
        checked when concrete; under `jit` the wrapper clamps offsets into `[0, T]`, lengths
        to the table's reach and page ids into `[0, num_blocks)`: bad input reads wrong
        keys, never out of bounds.
      sm_scale: logit scale, a Python float; default `1 / sqrt(D)`.
      window_size: sliding window (an int >= 1) or None: the query at position `p` sees keys
        `[max(0, p - window_size + 1), p]` (Hugging Face's `sliding_window`).
      sinks: `[Hq]` float (cast to f32): gpt-oss's sinks, `exp(sinks[h])` joins head `h`'s
        denominator with no value (not scaled, not capped).
      softcap: Gemma-2 soft-cap, a float > 0: `x = softcap * tanh(x / softcap)`.
      v_head_dim: with `v_cache=None`, the value width.
      k_scale, v_scale: with a `float8_e4m3fn` cache (required there, refused otherwise):
        the dequantization scales, a float or a float array of shape `()`, `(1,)` (per
        tensor, vLLM's `layer._k_scale`) or `(Hkv,)` (per KV head); key `t` is
        `k_scale * K[t]`, value `t` is `v_scale * V[t]`.
      interpret: `None` interprets on CPU and compiles the Triton kernel on a GPU.

    Keys past the causal limit, before the window or past the context never enter the
    arithmetic (selected away), so stale cache bytes there, NaN included, do not matter.

    Returns:
      `out [T, Hq, D_v]` in q's dtype; rows past `cu_seqlens_q[S]` (padding) are zeros, and so
      is a head whose query sees no key and has no sink.

    Raises:
      ValueError: wrong ranks, dtypes (tables, offsets, lengths not int32) or shapes (head
        dims that differ, `Hq % Hkv != 0`, row counts that disagree with `seq_lens`), no
        token or no sequence, bad concrete offsets (not from 0, decreasing, past T), a
        concrete `seq_lens[s] < qlen_s` or past the block table, a used page id out of range,
        a concrete q with a NaN or infinity, a bad `sm_scale`, `softcap` (<= 0), a missing
        or bad `k_scale` / `v_scale` with an FP8 cache (or one given without it),
        `window_size` (< 1), `sinks` shape or value, `v_head_dim` inconsistent with
        `v_cache`. All before tracing.
      NotImplementedError: f64 or another unsupported float, a cache dtype other than q's or
        `float8_e4m3fn`, a head dim neither a power of two nor a multiple of 8, an odd `D_v` with a
        16-bit output.
    """
    d_v = _validate(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, sm_scale=sm_scale,
        window_size=window_size, sinks=sinks, softcap=softcap, v_head_dim=v_head_dim,
        k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    return _run(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, None, d_v=d_v,
        sm_scale=sm_scale, softcap=softcap, window_size=window_size, sinks=sinks,
        interpret=interpret, out_offset=None, k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip


def paged_prefill_attention_into(
    arena: jax.Array,
    plan: Any,
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array | None,
    block_tables: jax.Array,
    cu_seqlens_q: jax.Array,
    seq_lens: jax.Array,
    *,
    region: str = OUTPUT_REGION,
    sm_scale: float | None = None,
    window_size: int | None = None,
    sinks: jax.Array | None = None,
    softcap: float | None = None,
    v_head_dim: int | None = None,
    k_scale: Any = None,
    v_scale: Any = None,
    interpret: bool | None = None,
) -> jax.Array:
    """`paged_prefill_attention` computed in place into an arena region.

    The whole arena goes into the kernel (aliased, `memory_space=pl.ANY`); it stores the
    output at the start of `region` as `[T, Hq * D_v]` in q's dtype (padding rows as zeros),
    bit for bit the bytes of `paged_prefill_attention`. Every other byte of the arena is left
    unchanged, and no temporary the size of the output exists.

    Args:
      arena: the plan's `uint8` arena. Donate it to the enclosing `jax.jit` for the write to
        happen in place (otherwise XLA copies it once); use the returned arena afterwards.
      plan: a `jaxarena.ArenaPlan` with the region, which must start on a 4-byte boundary
        (the default 256-byte alignment does) and hold `T * Hq * D_v * itemsize` bytes
        (below 2^31).
      q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, sm_scale, window_size,
        sinks, softcap, v_head_dim, k_scale, v_scale, interpret: as for
        `paged_prefill_attention`.
      region: the region written, `"attn_output"` by default.

    Returns:
      The arena with the region's first `T * Hq * D_v * itemsize` bytes written.

    Raises:
      ValueError: everything `paged_prefill_attention` rejects, a missing region or one too
        small for `T` tokens, a region not on a 4-byte boundary, an arena that is not the
        plan's; all before tracing, with nothing written.
      NotImplementedError: as for `paged_prefill_attention`; also an output of 2^31 bytes or
        more.
    """
    d_v = _validate(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, sm_scale=sm_scale,
        window_size=window_size, sinks=sinks, softcap=softcap, v_head_dim=v_head_dim,
        k_scale=k_scale, v_scale=v_scale, arena=arena, plan=plan, region=region,
    )  # fmt: skip
    return _run(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, arena, d_v=d_v,
        sm_scale=sm_scale, softcap=softcap, window_size=window_size, sinks=sinks,
        interpret=interpret, out_offset=plan.regions[region].offset_bytes, k_scale=k_scale,
        v_scale=v_scale,
    )  # fmt: skip
