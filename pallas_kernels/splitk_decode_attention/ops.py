"""Public wrappers: split-K paged decode attention, standalone and in place in an arena.

Decode attention over a vLLM-layout paged KV cache. The keys of every sequence are cut into
`num_splits` contiguous page ranges; an attention kernel runs one program per
`(sequence, KV head, query-head block, split)` and stores each split's unnormalised output and
its running max / sum in the split-K workspace; a combine kernel merges the splits with the
log-sum-exp rescaling and writes the output (and the log-sum-exp). See `kernel.py`.

Options (all per call, all in both forms), and whose semantics each follows:

- `window_size` (sliding window; Mistral / Gemma-2/3 local layers / gpt-oss, as Hugging Face
  transformers' `sliding_window`): the query at position `len - 1` sees the `window_size` most
  recent keys `[len - window_size, len)`. Pages wholly before the window are never read; the
  splits share the window's pages only.
- `sinks` (gpt-oss's attention sinks): one learned logit per query head joins the softmax
  denominator (`exp(sink)`, with no value and neither scaled nor soft-capped), so that
  `out = sum_t e^{x_t} v_t / (e^{sink} + sum_t e^{x_t})`. A sequence of length 0 gives 0.
- `softcap` (Gemma-2's logit soft-capping): `x = softcap * tanh(x / softcap)` applied to the
  scaled logits `x = sm_scale * q . k`, before the mask and the softmax.
- FP8 KV cache (vLLM's `kv_cache_dtype="fp8"` / `fp8_e4m3`): `float8_e4m3fn` pages and f32
  scales, per tensor (as vLLM's `layer._k_scale` / `_v_scale`) or per KV head; the real key is
  `k_scale * k`, the real value `v_scale * v`. The kernel converts the pages to q's dtype
  (exact) and multiplies the dot products by the scales.
- Head dims that are not powers of two (80, 96, 192, ...; any multiple of 8) run in
  power-of-two column chunks inside the kernel; nothing is padded in HBM. `D_qk != D_v`:
  separate caches of different widths, or (`v_cache=None, v_head_dim=D_v`) the layout of
  DeepSeek's MLA absorbed decode as vLLM and FlashMLA store it: one latent cache
  `[num_blocks, block_size, 1, 576]` whose first 512 columns are the values and whose 576
  columns are the keys.
- `return_lse` (FlashAttention / vLLM's `softmax_lse`, natural log): `lse[b, h] =
  log(sum_t exp(x_t))` over the scaled, soft-capped logits of the visible keys (plus
  `exp(sink)`), `-inf` for a sequence with no key and no sink. Computed where the splits are
  merged, so `merge(out_a, lse_a, out_b, lse_b)` of two calls over disjoint key sets is the
  attention over their union (prefix caching, cascade attention).

Workspace layout (`f32[slots, D_v + 2]`, the arena's `splitk_workspace` seen as rows): the
partial of (sequence `b`, query head `h`, split `s`) is row `(b * num_splits + s) * Hq + h`,
holding `[o[0:D_v], m, l]`: `o = sum_t exp(x_t - m) v_t` (unnormalised), `m = max_t x_t`,
`l = sum_t exp(x_t - m)` over the split's keys `t`. An empty split holds
`o = 0, m = -inf, l = 0`. Only the first `B * Hq * num_splits` rows are written; with
`num_splits == 1` nothing is split: the attention kernel writes the normalised output directly
and the workspace is not touched (this is why the seed's legacy policy, which sizes one slot
per SM, never needs more slots than it sized). None of the options needs more slots or wider
ones; a slot is `(D_v + 2) * 4` bytes, so an arena sized with `head_dim = D_qk` has room for
`D_v <= D_qk`, and an MLA model's arena must be sized with the value width (512) or more.

The split ranges are page ranges of each sequence's own visible keys `[t0, len)` (`t0 = 0`
without a window): with `first = t0 // block_size`, `n = ceil(len / block_size) - first` and
`P = ceil(n / num_splits)`, split `s` holds the pages `[first + s * P, min(first + (s + 1) * P,
first + n))` of the block table.

In place (the arena form): the WHOLE arena goes into both `pallas_call`s as `uint32[rows, 64]`
words (a reinterpretation XLA compiles to a bitcast), aliased to their output
(`input_output_aliases`, `memory_space=pl.ANY`); the kernels store the partials and the output
at the plan's static offsets. Nothing but the arena (and the optional LSE) is written, and no
temporary grows with the shapes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxarena import Levers, Target
from jaxarena.workspaces import (
    SPLITK_ATTN_REGIONS,
    splitk_slots_needed,
)
from pallas_kernels._arena_io import ROW_BYTES, WORDS_PER_ROW, plan_windows
from pallas_kernels._args import resolve_interpret
from pallas_kernels._cost import KernelCost, Workload, declare_cost
from pallas_kernels.splitk_decode_attention.checks import FP8_DTYPE as _FP8
from pallas_kernels.splitk_decode_attention.checks import splitk_num_splits
from pallas_kernels.splitk_decode_attention.checks import validate as _validate
from pallas_kernels.splitk_decode_attention.kernel import (
    KernelConfig,
    Place,
    splitk_attention_kernel,
    splitk_combine_kernel,
)

__all__ = [
    "SPLITK_ATTN_REGIONS",
    "splitk_decode_attention",
    "splitk_decode_attention_into",
    "splitk_num_splits",
    "splitk_slots_needed",
]

# Triton's dot needs every dimension >= 16; narrower pages or chunks use multiply-and-sum.
_MIN_DOT = 16
# Query rows per program: a power of two; larger groups (MQA) get several head blocks.
_MAX_BLOCK_H = 32
_MAX_BLOCK_H_NO_DOT = 16
# Wider heads (MLA's 576/512) get fewer rows per program and more warps (no spills).
_WIDE = 256


def _chunks(d: int) -> tuple[tuple[int, int], ...]:
    """Power-of-two column chunks of a head dim, widest first: 80 -> (0, 64), (64, 16)."""
    out, c0 = [], 0
    for bit in reversed(range(d.bit_length())):
        w = 1 << bit
        if d & w:
            out.append((c0, w))
            c0 += w
    return tuple(out)


def _from_words(words: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """uint32 words -> `dtype[shape]` (an XLA bitcast and reshape)."""
    return lax.bitcast_convert_type(words, jnp.dtype(dtype)).reshape(shape)


@functools.partial(
    jax.jit,
    static_argnames=("opts", "interpret", "count_pages", "debug"),
    donate_argnames=("buf",),
)
def _decode(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array | None,
    block_tables: jax.Array,
    seq_lens: jax.Array,
    scales: tuple[jax.Array, jax.Array] | None,
    sinks: jax.Array | None,
    buf: jax.Array | None,
    *,
    opts: tuple,
    interpret: bool,
    count_pages: bool = False,
    debug: bool = False,
):
    """Both passes. `buf`: the workspace (standalone), the arena (arena form) or None.

    `opts = (num_splits, sm_scale, softcap, window, return_lse, d_v, arena_offsets)` with
    `arena_offsets = (ws_offset, out_offset)` in the arena form, else None. `count_pages`
    adds an `int32[B, Hkv, head_blocks, S]` output: the pages each program's loop visited.
    `debug` prints the kernels' jaxprs and Triton IR when lowering for a GPU (tests read it).
    """
    num_splits, sm_scale, softcap, window, return_lse, d_v, arena_offsets = opts
    B, Hq, D = q.shape
    _, block_size, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    qk_chunks, v_chunks = _chunks(D), _chunks(d_v)
    use_dot = block_size >= _MIN_DOT and min(w for _, w in qk_chunks + v_chunks) >= _MIN_DOT
    wide = max(D, d_v) > _WIDE
    if use_dot:
        cap = _MIN_DOT if wide else _MAX_BLOCK_H
        block_h = min(max(pl.next_power_of_2(group), _MIN_DOT), cap)
    else:
        block_h = min(pl.next_power_of_2(group), _MAX_BLOCK_H_NO_DOT)
    num_head_blocks = -(-group // block_h)
    itemsize = jnp.dtype(q.dtype).itemsize
    out_row_words = d_v * itemsize // 4
    arena_form = arena_offsets is not None
    split = num_splits > 1

    # Operands: `att` receives the attention pass's stores (partials, or with one split the
    # output); the combine reads the partials from `src` and stores the output into `dst`.
    win = None  # the arena operands (`_arena_io`): the whole arena, or row windows
    # The arena form with `arena_offsets[1] is None`: only the partials are in the arena and
    # the output is a value of its own (no `attn_output` region written or needed).
    out_in_arena = arena_form and arena_offsets[1] is not None
    if arena_form:
        # On the GPU the whole arena (an XLA bitcast to words). In interpret mode the kernels
        # get only the rows their stores touch (sliced out, written back): the interpreter
        # carries an aliased operand twice through its grid loop, so the whole arena would be
        # copied on CPU. The addressing is the same, relative to the window's first row.
        offsets = (arena_offsets[0], arena_offsets[1] or 0)
        used = (
            splitk_slots_needed(B, Hq, num_splits) * (d_v + 2) * 4,
            B * Hq * d_v * itemsize if out_in_arena else 0,
        )
        win = plan_windows(buf.shape[0], list(zip(offsets, used, strict=True)),
                           whole=not interpret)  # fmt: skip
        ws_place, out_place = (
            Place(win.row0(i, off), off % ROW_BYTES // 4, WORDS_PER_ROW)
            for i, off in enumerate(offsets)
        )
        if not out_in_arena:
            out_place = Place(0, 0, out_row_words)
        if split or out_in_arena:
            att = win.take(buf, win.window_of(0 if split else 1))
    else:
        out_place = Place(0, 0, out_row_words)
        ws_place = Place(0, 0, d_v + 2)
        if split:
            ws = buf if buf is not None else jnp.zeros((B * Hq * num_splits, d_v + 2), jnp.float32)
            att = src = lax.bitcast_convert_type(ws, jnp.uint32)
    out_words_shape = jax.ShapeDtypeStruct((B * Hq, out_row_words), jnp.uint32)
    lse_shape = jax.ShapeDtypeStruct((B, Hq), jnp.float32)
    cfg = KernelConfig(
        sm_scale=sm_scale,
        num_splits=num_splits,
        num_q_heads=Hq,
        group_size=group,
        block_h=block_h,
        use_dot=use_dot,
        qk_chunks=qk_chunks,
        v_chunks=v_chunks,
        v_from_k=v_cache is None,
        softcap=softcap,
        window=window,
        fp8=scales is not None,
        sinks=sinks is not None,
        out_itemsize=itemsize,
        out_dtype=jnp.dtype(q.dtype).name,
        return_lse=return_lse,
        count_pages=count_pages,
        ws=ws_place if split else None,
        out=out_place,
    )
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    params = plgpu.CompilerParams(num_warps=8 if wide else 4, num_stages=2)

    inputs = [q, k_cache] + ([] if v_cache is None else [v_cache]) + [block_tables, seq_lens]
    if scales is not None:
        inputs += list(scales)
    if sinks is not None:
        inputs.append(sinks)
    in_place = split or out_in_arena
    outs = [jax.ShapeDtypeStruct(att.shape, jnp.uint32) if in_place else out_words_shape]
    aliases = {}
    if in_place:
        aliases = {len(inputs): 0}
        inputs.append(att)
    lse_here = return_lse and not split
    if lse_here:
        outs.append(lse_shape)
    if count_pages:
        outs.append(jax.ShapeDtypeStruct((B, Hkv, num_head_blocks, num_splits), jnp.int32))
    _declare(inputs, q, k_cache, v_cache, block_tables, cfg, d_v, num_head_blocks, split)
    results = pl.pallas_call(
        functools.partial(
            splitk_attention_kernel, cfg=dataclasses.replace(cfg, dst_is_input=in_place)
        ),
        grid=(B, Hkv, num_head_blocks, num_splits),
        in_specs=[any_spec] * len(inputs),
        out_specs=[any_spec] * len(outs),
        out_shape=outs,
        input_output_aliases=aliases,
        interpret=interpret,
        # Explicit Triton params: jax 0.10 otherwise lowers GPU pallas_calls with Mosaic GPU.
        # Two stages let Triton prefetch the next page while the current one is reduced.
        compiler_params=params,
        name="splitk_decode_attention",
        debug=debug,
    )(*inputs)
    results = list(results)
    att = results.pop(0)
    lse = results.pop(0) if lse_here else None
    pages = results.pop(0) if count_pages else None

    if split:
        # Arena form: dst is src (the whole arena, or one window) unless the interpreter got
        # two windows; then dst follows src as a second, aliased input.
        src = dst = att
        two = out_in_arena and win.window_of(0) != win.window_of(1)
        if two:
            # The partials' window goes back first; the output window is then read from the
            # updated arena, so no older arena version stays alive (XLA would copy it).
            buf = win.put(buf, [att], win.window_of(0))
            dst = win.take(buf, win.window_of(1))
        inputs = ([] if sinks is None else [sinks]) + [src] + ([dst] if two else [])
        outs = [jax.ShapeDtypeStruct(dst.shape, jnp.uint32) if out_in_arena else out_words_shape]
        if return_lse:
            outs.append(lse_shape)
        declare_cost("splitk_combine", (B, Hkv, num_head_blocks), inputs,
                     _combine_cost(B, Hq, num_splits, d_v, itemsize))
        results = pl.pallas_call(
            functools.partial(
                splitk_combine_kernel, cfg=dataclasses.replace(cfg, dst_is_input=two)
            ),  # fmt: skip
            grid=(B, Hkv, num_head_blocks),
            in_specs=[any_spec] * len(inputs),
            out_specs=[any_spec] * len(outs),
            out_shape=outs,
            input_output_aliases={len(inputs) - 1: 0} if out_in_arena else {},
            interpret=interpret,
            compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
            name="splitk_combine",
            debug=debug,
        )(*inputs)
        if not arena_form:
            buf = None if buf is None else lax.bitcast_convert_type(att, jnp.float32)
        dst = results[0]
        lse = results[1] if return_lse else None
    else:
        dst = att
    if not arena_form:
        return _from_words(dst, (B, Hq, d_v), q.dtype), lse, buf, pages
    if not out_in_arena:  # the partials' window back into the arena; the output a value
        buf = win.put(buf, [att], win.window_of(0)) if split else buf
        return buf, lse, _from_words(dst, (B, Hq, d_v), q.dtype), pages
    return win.put(buf, [dst], win.window_of(1)), lse, None, pages


def _visible_pages(context: int, window: int | None, block_size: int, max_pages: int) -> int:
    """Pages a sequence of `context` tokens visits: those holding its visible keys."""
    n = min(context, max_pages * block_size)
    t0 = max(0, n - window) if window else 0
    return -(-n // block_size) - t0 // block_size


def _declare(inputs, q, k_cache, v_cache, block_tables, cfg, d_v, head_blocks, split):
    """The attention pass's declared cost (`pallas_kernels._cost`): per (sequence, KV head,
    head block) program group it reads the visible pages of its KV head (K, and V unless V
    is K's prefix), the query block, the block table row; it writes the partials
    (`[o, m, l]` f32 per split) or, with one split, the output. Flops: q.k and p.v."""
    B, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    max_pages = block_tables.shape[1]
    k_page = bs * D * jnp.dtype(k_cache.dtype).itemsize  # one KV head's slice of a page
    v_page = 0 if v_cache is None else bs * d_v * jnp.dtype(v_cache.dtype).itemsize
    q_bytes = B * Hq * D * jnp.dtype(q.dtype).itemsize
    out = B * Hq * cfg.num_splits * (d_v + 2) * 4 if split else \
        B * Hq * d_v * cfg.out_itemsize  # fmt: skip
    # The FP8 scales and the sinks (operands after seq_lens, before the aliased buffer).
    first = 4 if v_cache is None else 5
    small = sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
                for x in inputs[first:first + 2 * cfg.fp8 + cfg.sinks])  # fmt: skip

    def cost(w: Workload) -> KernelCost:
        pages = _visible_pages(w.context, cfg.window, bs, max_pages)
        kv = B * Hkv * head_blocks * pages * (k_page + v_page)
        keys = min(w.context, max_pages * bs, cfg.window or w.context)
        return KernelCost(bytes=kv + q_bytes + out + B * (pages + 1) * 4 + small,
                          flops=2 * B * Hq * keys * (D + d_v))  # fmt: skip

    declare_cost("splitk_decode_attention", (B, Hkv, head_blocks, cfg.num_splits), inputs, cost)


def _combine_cost(B: int, Hq: int, splits: int, d_v: int, itemsize: int) -> KernelCost:
    """The combine pass reads every split's partial row and writes the output once."""
    cost = KernelCost(bytes=B * Hq * splits * (d_v + 2) * 4 + B * Hq * d_v * itemsize,
                      flops=3 * B * Hq * splits * d_v)  # fmt: skip
    return lambda w: cost


def _prepare(q, k_cache, k_scale, v_scale, sinks):
    """The scales as `f32[Hkv]` (or None) and the sinks as `f32[Hq]` (or None)."""
    scales = None
    if jnp.dtype(k_cache.dtype) == _FP8:
        hkv = k_cache.shape[2]
        scales = tuple(
            jnp.broadcast_to(jnp.asarray(s, jnp.float32).reshape(-1), (hkv,))
            for s in (k_scale, v_scale)
        )
    return scales, None if sinks is None else jnp.asarray(sinks, jnp.float32)


def splitk_decode_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array | None,
    block_tables: jax.Array,
    seq_lens: jax.Array,
    *,
    num_splits: int | None = None,
    sm_scale: float | None = None,
    workspace: jax.Array | None = None,
    levers: Levers | None = None,
    target: Target | None = None,
    interpret: bool | None = None,
    window_size: int | None = None,
    sinks: jax.Array | None = None,
    softcap: float | None = None,
    k_scale: Any = None,
    v_scale: Any = None,
    v_head_dim: int | None = None,
    return_lse: bool = False,
) -> Any:
    """Decode attention over a paged KV cache (vLLM layout), split-K over the keys.

    `out[b, h] = softmax(x) @ V[b]` with `x_t = sm_scale * q[b, h] . K[b, t]` over the visible
    keys `t` of sequence `b` (its first `seq_lens[b]` keys, or the last `window_size` of
    them), where query head `h` reads KV head `h // (Hq // Hkv)` (GQA; MQA when `Hkv == 1`),
    and key/value `t` is row `t % block_size` of page `block_tables[b, t // block_size]`. A
    sequence with no visible key gives zeros. Softmax statistics and accumulation are f32.
    See the module docstring for the options' semantics, the split ranges and the workspace.

    Args:
      q: `[B, Hq, D]` float32, bfloat16 or float16; `D` a power of two or a multiple of 8
        (64, 80, 96, 128, 192, 256, 576, ...).
      k_cache: `[num_blocks, block_size, Hkv, D]` in q's dtype or `float8_e4m3fn`;
        `block_size` a power of two. Read only.
      v_cache: `[num_blocks, block_size, Hkv, D_v]` in k_cache's dtype (`D_v` may differ
        from `D`), or None with `v_head_dim` (values inside k_cache). Read only.
      block_tables: `int32[B, max_blocks_per_seq]`: page ids of each sequence, in order.
        Entries past a sequence's last page (or before its window) are never read.
      seq_lens: `int32[B]`, each in `[0, max_blocks_per_seq * block_size]`. Checked when
        concrete (eager calls, together with the used block-table entries); under `jit`
        nothing about the values is known statically, so the kernel clamps each length to
        `max_blocks_per_seq * block_size` and each page id into `[0, num_blocks)`: bad input
        reads wrong pages, never out of bounds.
      num_splits: key splits per (sequence, head), 1..16. `None` takes the seed's policy
        (`splitk_num_splits(B, Hq, levers=levers, target=target)`).
      sm_scale: logit scale, a Python float; default `1 / sqrt(D)`.
      workspace: optional `float32[slots, D_v + 2]`, e.g. the arena's `splitk_workspace`
        viewed as rows. Donated: its first `B * Hq * num_splits` rows (none with one split)
        are overwritten in place (`input_output_aliases`), the others are left unchanged; use
        the returned workspace, not the one passed. Without it a temporary is used.
      levers, target: pin the policy's inputs (`None`: environment and detected device).
      interpret: `None` interprets on CPU and compiles the Triton kernel on GPU.
      window_size: sliding window, `None` (all keys) or an int >= 1: the query at position
        `len - 1` sees keys `[max(0, len - window_size), len)` (Hugging Face's
        `sliding_window` for Mistral, Gemma-2/3 local layers and gpt-oss). Pages before the
        window are never read.
      sinks: `[Hq]` float (cast to f32), gpt-oss's attention sinks: `exp(sinks[h])` joins
        head `h`'s softmax denominator and contributes no value (not scaled, not capped).
      softcap: Gemma-2 logit soft-cap, a float > 0: `x = softcap * tanh(x / softcap)` on the
        scaled logits.
      k_scale, v_scale: required with `float8_e4m3fn` caches (and refused otherwise): a float
        > 0 or a float array of shape `()`, `(1,)` (per tensor) or `(Hkv,)` (per KV head), as
        vLLM's FP8 KV cache stores them: the real key is `k_scale * k`, the value
        `v_scale * v`. Concrete scales must be finite and > 0 (0 is refused).
      v_head_dim: with `v_cache=None`, the values are the first `v_head_dim` columns of
        `k_cache` (MLA's latent cache: 576-wide keys, 512-wide values).
      return_lse: also return `lse f32[B, Hq]`, natural-log log-sum-exp of the visible
        scaled (soft-capped) logits, plus `exp(sink)`; `-inf` when there is nothing to sum.

    Non-finite values: keys and values past `seq_lens[b]` (or before the window) never enter
    the arithmetic (selected away, not multiplied by 0), so stale bytes there, NaN included,
    do not matter. A NaN or infinity in a traced q, or in a key or value the sequence does
    attend to, gives NaN for the heads it reaches: never a plausible 0.

    Returns:
      `out [B, Hq, D_v]` in q's dtype; with `return_lse`, `(out, lse)`; with a workspace,
      `workspace` is appended: `(out, workspace)` or `(out, lse, workspace)`.

    Raises:
      ValueError: wrong ranks or dtypes (q not floating; tables or lengths not int32), head
        dims that differ, `Hq % Hkv != 0`, k/v caches of different page shapes or dtypes, a
        batch size mismatch or a batch of 0, a concrete q with a NaN or infinity,
        `num_splits` outside 1..16, a workspace of the wrong shape/dtype
        or with fewer than `B * Hq * num_splits` slots (nothing is written), concrete lengths
        beyond what the block table covers or used page ids out of range, a bad `sm_scale`,
        `softcap` (<= 0), `window_size` (< 1), `sinks` shape or value, FP8 scales missing,
        misshaped or <= 0, scales with a non-FP8 cache, `v_head_dim` inconsistent with
        `v_cache`. All before tracing.
      NotImplementedError: f64 or another unsupported float, a KV cache dtype other than
        q's or float8_e4m3fn, a head dim neither a power of two nor a multiple of 8, a page
        size that is not a power of two.
    """
    splits, d_v = _validate(
        q, k_cache, v_cache, block_tables, seq_lens, num_splits=num_splits,
        sm_scale=sm_scale, levers=levers, target=target, window_size=window_size, sinks=sinks,
        softcap=softcap, k_scale=k_scale, v_scale=v_scale, v_head_dim=v_head_dim,
        return_lse=return_lse, workspace=workspace,
    )  # fmt: skip
    out, lse, ws, _ = _run(
        q, k_cache, v_cache, block_tables, seq_lens, workspace, splits=splits, d_v=d_v,
        sm_scale=sm_scale, softcap=softcap, window_size=window_size, sinks=sinks,
        k_scale=k_scale, v_scale=v_scale, return_lse=return_lse, interpret=interpret,
        arena_offsets=None,
    )  # fmt: skip
    result = (out, lse) if return_lse else (out,)
    if workspace is not None:
        result = (*result, ws)
    return result[0] if len(result) == 1 else result


def _run(q, k_cache, v_cache, block_tables, seq_lens, buf, *, splits, d_v, sm_scale, softcap,
         window_size, sinks, k_scale, v_scale, return_lse, interpret, arena_offsets,
         count_pages=False, debug=False):  # fmt: skip
    scales, sinks = _prepare(q, k_cache, k_scale, v_scale, sinks)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    opts = (
        splits,
        scale,
        None if softcap is None else float(softcap),
        None if window_size is None else int(window_size),
        return_lse,
        d_v,
        arena_offsets,
    )
    return _decode(
        q, k_cache, v_cache, block_tables, seq_lens, scales, sinks, buf, opts=opts,
        interpret=resolve_interpret(interpret), count_pages=count_pages, debug=debug,
    )  # fmt: skip


def splitk_decode_attention_into(
    arena: jax.Array,
    plan: Any,
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array | None,
    block_tables: jax.Array,
    seq_lens: jax.Array,
    *,
    num_splits: int | None = None,
    sm_scale: float | None = None,
    levers: Levers | None = None,
    target: Target | None = None,
    interpret: bool | None = None,
    window_size: int | None = None,
    sinks: jax.Array | None = None,
    softcap: float | None = None,
    k_scale: Any = None,
    v_scale: Any = None,
    v_head_dim: int | None = None,
    return_lse: bool = False,
    output_in_arena: bool = True,
) -> Any:
    """`splitk_decode_attention` computed in place in the arena.

    The whole arena goes into both kernels (aliased, `memory_space=pl.ANY`); they store the
    partials in the plan's `splitk_workspace` region, seen as `float32[slots, D_v + 2]` rows
    (the partials of a call land in its first `B * Hq * num_splits` rows, none with one
    split), and the output at the start of `attn_output` as `[B, Hq * D_v]` in q's dtype.
    Every other byte of the arena is left unchanged; bit for bit the same bytes as
    `splitk_decode_attention` with the region as its workspace.

    Args:
      arena: the plan's `uint8` arena. Donate it to the enclosing `jax.jit` for the writes to
        happen in place (otherwise XLA copies it once); use the returned arena afterwards.
      plan: a `jaxarena.ArenaPlan` with `attn_output` and (for more than one split)
        `splitk_workspace` regions, each starting on a 4-byte boundary (the default 256-byte
        alignment does) with its used part below 2^31 bytes.
      q, k_cache, v_cache, block_tables, seq_lens, num_splits, sm_scale, levers, target,
        interpret, window_size, sinks, softcap, k_scale, v_scale, v_head_dim, return_lse: as
        for `splitk_decode_attention`.
      output_in_arena: False: only the partials go to the arena; the output is returned as
        a value `[B, Hq, D_v]` in q's dtype and `attn_output` is neither written nor needed.
        For a caller whose next op is a GEMM: XLA cannot hand an arena slice to a GEMM in
        place, so it would copy `attn_output` out first (one launch per layer), and the
        GEMM's read of the arena would hold back the fusion of what follows it.

    Returns:
      The arena with `attn_output` (and the used workspace slots) written; with
      `return_lse`, `(arena, lse f32[B, Hq])` (the LSE is a small output, not in the arena).
      With `output_in_arena=False`, `(arena, out)` or `(arena, out, lse)`.

    Raises:
      ValueError: everything `splitk_decode_attention` rejects, a missing region, an
        `attn_output` smaller than `B * Hq * D_v * itemsize`, a `splitk_workspace` with fewer
        slots than `B * Hq * num_splits`, a region not on a 4-byte boundary, or an arena that
        is not the plan's; all before tracing, with nothing written.
      NotImplementedError: as for `splitk_decode_attention`; also a used region part of
        2^31 bytes or more.
    """
    splits, d_v = _validate(
        q, k_cache, v_cache, block_tables, seq_lens, num_splits=num_splits,
        sm_scale=sm_scale, levers=levers, target=target, window_size=window_size, sinks=sinks,
        softcap=softcap, k_scale=k_scale, v_scale=v_scale, v_head_dim=v_head_dim,
        return_lse=return_lse, arena=arena, plan=plan, output_in_arena=output_in_arena,
    )  # fmt: skip
    offsets = tuple(
        plan.regions[name].offset_bytes if name in plan.regions else 0
        for name in SPLITK_ATTN_REGIONS
    )
    if not output_in_arena:
        offsets = (offsets[0], None)
    arena, lse, out, _ = _run(
        q, k_cache, v_cache, block_tables, seq_lens, arena, splits=splits, d_v=d_v,
        sm_scale=sm_scale, softcap=softcap, window_size=window_size, sinks=sinks,
        k_scale=k_scale, v_scale=v_scale, return_lse=return_lse, interpret=interpret,
        arena_offsets=offsets,
    )  # fmt: skip
    head = (arena,) if output_in_arena else (arena, out)
    return (*head, lse) if return_lse else head[0] if output_in_arena else head
