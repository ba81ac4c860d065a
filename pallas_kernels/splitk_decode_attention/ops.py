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
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxarena import Levers, Target
from jaxarena.workspaces import (
    MAX_DECODE_SPLITS,
    SPLITK_ATTN_REGIONS,
    splitk_policy,
    splitk_slots_needed,
)
from jaxarena.workspaces import num_splits as _policy_num_splits
from pallas_kernels._args import check_finite as _check_finite
from pallas_kernels._args import check_nonempty as _check_nonempty
from pallas_kernels._args import check_rank as _shape
from pallas_kernels._args import is_concrete as _is_concrete
from pallas_kernels._args import is_int as _is_int
from pallas_kernels._args import resolve_interpret
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

_SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_FP8 = jnp.dtype(jnp.float8_e4m3fn)
# Triton's dot needs every dimension >= 16; narrower pages or chunks use multiply-and-sum.
_MIN_DOT = 16
# Query rows per program: a power of two; larger groups (MQA) get several head blocks.
_MAX_BLOCK_H = 32
_MAX_BLOCK_H_NO_DOT = 16
# Wider heads (MLA's 576/512) get fewer rows per program and more warps (no spills).
_WIDE = 256
_ROW_BYTES = 256  # jaxarena's arena row
_WORDS_PER_ROW = _ROW_BYTES // 4
_I32_LIMIT = 2**31


def _is_pow2(n: int) -> bool:
    return n > 0 and pl.next_power_of_2(n) == n


def _chunks(d: int) -> tuple[tuple[int, int], ...]:
    """Power-of-two column chunks of a head dim, widest first: 80 -> (0, 64), (64, 16)."""
    out, c0 = [], 0
    for bit in reversed(range(d.bit_length())):
        w = 1 << bit
        if d & w:
            out.append((c0, w))
            c0 += w
    return tuple(out)


def splitk_num_splits(
    batch_size: int,
    num_q_heads: int,
    *,
    levers: Levers | None = None,
    target: Target | None = None,
) -> int:
    """The split count the seed's policy gives a decode step of `batch_size` sequences.

    `num_splits(splitk_policy(levers, target), target.sm_count, num_q_heads,
    legacy_ref_seqs=batch_size)`, capped at 16 (the legacy rule alone can ask for up to one
    split per SM; the cap only lowers the slots used). `levers=None` reads the environment
    (`Levers.from_env()`), `target=None` detects the device (`Target.detect()`). The slots
    used, `splitk_slots_needed(B, Hq, splits)`, never exceed what `BufferSizes.from_config`
    sizes for the same levers and target when `batch_size <= max_batch_size`.
    """
    levers = Levers.from_env() if levers is None else levers
    target = Target.detect() if target is None else target
    policy = splitk_policy(levers, target)
    n = _policy_num_splits(policy, target.sm_count, num_q_heads, legacy_ref_seqs=batch_size)
    return max(1, min(int(n), MAX_DECODE_SPLITS))


def _check_float_option(name: str, value: Any, *, positive: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ValueError(f"{name} must be a Python float or None, got {name}={value!r}")
    if not math.isfinite(float(value)) or (positive and float(value) <= 0.0):
        rule = "finite and > 0" if positive else "finite"
        raise ValueError(f"{name} must be {rule}, got {name}={value}")


def _check_scale(name: str, scale: Any, hkv: int) -> None:
    """k_scale / v_scale: a positive float, or a float array of shape (), (1,) or (Hkv,)."""
    if scale is None:
        raise ValueError(
            f"{name} is required with a float8_e4m3fn KV cache (vLLM's per-tensor or "
            f"per-KV-head dequantization scale); pass a float or float32[{hkv}]"
        )
    if isinstance(scale, int | float | np.number) and not isinstance(scale, bool):
        vals = np.asarray([float(scale)])
    else:
        shape = getattr(scale, "shape", None)
        if shape is None or not jnp.issubdtype(getattr(scale, "dtype", np.int32), jnp.floating):
            raise ValueError(
                f"{name} must be a float or a floating array of shape (), (1,) or ({hkv},), "
                f"got {type(scale).__name__}"
            )
        if tuple(shape) not in ((), (1,), (hkv,)):
            raise ValueError(
                f"{name}.shape={tuple(shape)} must be (), (1,) (per tensor) or ({hkv},) "
                f"(per KV head, k_cache.shape[2]={hkv})"
            )
        if not _is_concrete(scale):
            return  # values unknown under jit
        vals = np.asarray(scale, np.float32).reshape(-1)
    bad = ~np.isfinite(vals) | (vals <= 0.0)
    if bad.any():
        raise ValueError(
            f"{name} must be finite and > 0 (a scale of 0 would dequantize every page to 0), "
            f"got {name}={vals.tolist() if vals.size > 1 else float(vals[0])}"
        )


def _validate(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    *,
    num_splits: Any,
    sm_scale: Any,
    levers: Any,
    target: Any,
    window_size: Any,
    sinks: Any,
    softcap: Any,
    k_scale: Any,
    v_scale: Any,
    v_head_dim: Any,
    return_lse: Any,
    workspace: Any = None,
    arena: Any = None,
    plan: Any = None,
) -> tuple[int, int]:
    """Checks every argument of both entry points before anything is traced.

    Returns:
      `(num_splits, d_v)`: the split count to run (`num_splits`, or the policy's when it is
      None) and the value head dim.

    Raises:
      ValueError: see `splitk_decode_attention` and `splitk_decode_attention_into`.
      NotImplementedError: see `splitk_decode_attention`.
    """
    B, Hq, D = _shape("q", q, 3, "[batch, num_q_heads, head_dim]")
    _check_nonempty("q", B, "batch size q.shape[0]")
    kshape = _shape("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    if v_cache is None:
        if not _is_int(v_head_dim) or not 1 <= v_head_dim <= kshape[3]:
            raise ValueError(
                "v_cache=None reads the values from the first v_head_dim columns of k_cache "
                f"(MLA's latent cache): v_head_dim must be an int in 1..{kshape[3]} "
                f"(k_cache.shape[3]), got {v_head_dim=!r}"
            )
        vshape = (*kshape[:3], int(v_head_dim))
    else:
        vshape = _shape("v_cache", v_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim_v]")
        if v_head_dim is not None and v_head_dim != vshape[3]:
            raise ValueError(
                f"v_head_dim={v_head_dim!r} disagrees with v_cache.shape[3]={vshape[3]}; "
                "pass v_head_dim only with v_cache=None"
            )
    bshape = _shape("block_tables", block_tables, 2, "[batch, max_blocks_per_seq]")
    lshape = _shape("seq_lens", seq_lens, 1, "[batch]")
    q_dtype = jnp.dtype(q.dtype)
    if not jnp.issubdtype(q_dtype, jnp.floating):
        raise ValueError(f"q must be floating (float32, bfloat16, float16), got q.dtype={q_dtype}")
    if kshape[:3] != vshape[:3]:
        raise ValueError(
            f"k_cache and v_cache must share [num_blocks, block_size, num_kv_heads], got "
            f"k_cache.shape={kshape} and v_cache.shape={vshape}"
        )
    num_blocks, block_size, Hkv, Dk = kshape
    Dv = vshape[3]
    if Dk != D:
        raise ValueError(
            f"head dims differ: q.shape[-1]={D} but k_cache.shape[-1]={Dk}; q and k_cache "
            "must share head_dim"
        )
    if Hkv < 1 or Hq < 1 or Hq % Hkv:
        raise ValueError(
            f"num_q_heads must be a positive multiple of num_kv_heads (GQA/MQA), got "
            f"q.shape[1]={Hq} and k_cache.shape[2]={Hkv}"
        )
    kv_dtype = jnp.dtype(k_cache.dtype)
    if v_cache is not None and kv_dtype != jnp.dtype(v_cache.dtype):
        raise ValueError(
            f"k_cache and v_cache must share a dtype, got k_cache.dtype={k_cache.dtype} and "
            f"v_cache.dtype={v_cache.dtype}"
        )
    for name, arr, shape, want in (
        ("block_tables", block_tables, bshape, (B, None)),
        ("seq_lens", seq_lens, lshape, (B,)),
    ):
        if jnp.dtype(arr.dtype) != jnp.int32:
            raise ValueError(f"{name} must be int32, got {name}.dtype={arr.dtype}")
        if shape[0] != want[0]:
            raise ValueError(f"{name}.shape[0]={shape[0]} must equal the batch size q.shape[0]={B}")
    max_pages = bshape[1]
    if max_pages < 1 or num_blocks < 1 or block_size < 1:
        raise ValueError(
            f"need at least one page: block_tables.shape[1]={max_pages}, "
            f"k_cache.shape[:2]={kshape[:2]}"
        )
    if num_splits is not None:
        if not _is_int(num_splits):
            raise ValueError(f"num_splits must be an int or None, got {num_splits=!r}")
        if not 1 <= num_splits <= MAX_DECODE_SPLITS:
            raise ValueError(
                f"num_splits must be in 1..{MAX_DECODE_SPLITS} (the workspace is sized for at "
                f"most {MAX_DECODE_SPLITS} splits), got {num_splits=}"
            )
    _check_float_option("sm_scale", sm_scale, positive=False)
    _check_float_option("softcap", softcap, positive=True)
    if window_size is not None and (not _is_int(window_size) or window_size < 1):
        raise ValueError(
            f"window_size must be None or an int >= 1 (keys seen: the window_size most "
            f"recent), got {window_size=!r}"
        )
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse must be True or False, got {return_lse=!r}")
    if sinks is not None:
        sshape = _shape("sinks", sinks, 1, f"[num_q_heads] (one logit per query head, {Hq})")
        if sshape != (Hq,) or not jnp.issubdtype(sinks.dtype, jnp.floating):
            raise ValueError(
                f"sinks must be a floating array of shape ({Hq},) (q.shape[1]), got "
                f"sinks.dtype={sinks.dtype}, sinks.shape={sshape}"
            )
        if _is_concrete(sinks) and not np.all(np.isfinite(np.asarray(sinks, np.float32))):
            raise ValueError(f"sinks must be finite, got sinks={np.asarray(sinks).tolist()}")
    if levers is not None and not isinstance(levers, Levers):
        raise ValueError(f"levers must be a jaxarena.Levers or None, got {levers=!r}")
    if target is not None and not isinstance(target, Target):
        raise ValueError(f"target must be a jaxarena.Target or None, got {target=!r}")

    if q_dtype not in _SUPPORTED_DTYPES:
        raise NotImplementedError(f"q.dtype={q_dtype} is not supported; use f32, bf16 or f16")
    if kv_dtype == _FP8:
        _check_scale("k_scale", k_scale, Hkv)
        _check_scale("v_scale", v_scale, Hkv)
    else:
        if kv_dtype != q_dtype:
            raise NotImplementedError(
                f"k_cache.dtype={kv_dtype} differs from q.dtype={q_dtype}; the cache must be "
                "in q's dtype or float8_e4m3fn (with k_scale and v_scale)"
            )
        for name, val in (("k_scale", k_scale), ("v_scale", v_scale)):
            if val is not None:
                raise ValueError(
                    f"{name} applies to a float8_e4m3fn KV cache only; k_cache.dtype={kv_dtype}"
                )
    for name, d in (("head_dim", D), ("v_head_dim", Dv)):
        if not (_is_pow2(d) or d % 8 == 0):
            raise NotImplementedError(
                f"{name}={d} must be a power of two or a multiple of 8 (the kernel works in "
                "power-of-two column chunks of at least 8)"
            )
    if q_dtype.itemsize == 2 and Dv % 2:
        raise NotImplementedError(f"v_head_dim={Dv} must be even for a 16-bit output")
    if not _is_pow2(block_size):
        raise NotImplementedError(
            f"block_size={block_size} (k_cache.shape[1]) must be a power of two (Triton tiles)"
        )

    # Values, when they are known (eager calls). Under jit the kernel clamps every length to
    # max_blocks_per_seq * block_size and every page id into [0, num_blocks).
    _check_finite("q", q, "every output of that query head would be NaN")
    if _is_concrete(seq_lens):
        lens = np.asarray(seq_lens)
        cap = max_pages * block_size
        if lens.size and lens.min() < 0:
            raise ValueError(f"seq_lens must be >= 0, got seq_lens={lens.tolist()}")
        if lens.size and lens.max() > cap:
            b = int(lens.argmax())
            raise ValueError(
                f"block_tables is too narrow: seq_lens[{b}]={int(lens[b])} needs "
                f"{-(-int(lens[b]) // block_size)} pages of {block_size} tokens but "
                f"block_tables.shape[1]={max_pages} (covers {cap} tokens)"
            )
        if _is_concrete(block_tables):
            table = np.asarray(block_tables)
            pages = np.arange(max_pages)[None, :]
            used = pages < -(-lens[:, None] // block_size)
            if window_size is not None:  # pages wholly before the window are never read
                used &= pages >= np.maximum(lens[:, None] - window_size, 0) // block_size
            bad = used & ((table < 0) | (table >= num_blocks))
            if bad.any():
                b, p = (int(i) for i in np.argwhere(bad)[0])
                raise ValueError(
                    f"block_tables[{b}, {p}]={int(table[b, p])} is out of range: page ids "
                    f"must be in [0, {num_blocks}) (k_cache.shape[0]={num_blocks})"
                )

    splits = (
        splitk_num_splits(B, Hq, levers=levers, target=target)
        if num_splits is None
        else int(num_splits)
    )
    needed = splitk_slots_needed(B, Hq, splits)
    row = f"[{Dv} + 2] f32"

    if workspace is not None:
        wshape = _shape("workspace", workspace, 2, f"[slots, head_dim_v + 2] (rows of {row})")
        if jnp.dtype(workspace.dtype) != jnp.float32 or wshape[1] != Dv + 2:
            raise ValueError(
                f"workspace must be float32[slots, {Dv + 2}] (head_dim_v + 2), got "
                f"workspace.dtype={workspace.dtype}, workspace.shape={wshape}"
            )
        if needed > wshape[0]:
            raise ValueError(
                f"workspace too small: B={B} x Hq={Hq} x num_splits={splits} needs {needed} "
                f"slots but workspace.shape[0]={wshape[0]}; use fewer splits or a larger "
                "workspace (size the arena for this batch and policy)"
            )
    if plan is None:
        return splits, Dv

    if not callable(getattr(plan, "check_fits", None)):
        raise ValueError(f"plan must be a jaxarena.ArenaPlan, got {type(plan).__name__}")
    uses = [(SPLITK_ATTN_REGIONS[1], (B, Hq * Dv), q_dtype, "the output")]
    if needed:
        note = f"B={B} x Hq={Hq} x num_splits={splits} = {needed} slots of {row}"
        uses.append((SPLITK_ATTN_REGIONS[0], (needed, Dv + 2), jnp.float32, note))
    plan.check_fits(*uses, arena=arena, what="splitk_decode_attention_into")
    for name, shape, dtype, *_ in uses:
        region = plan.regions[name]
        nbytes = math.prod(shape) * jnp.dtype(dtype).itemsize
        if region.offset_bytes % 4:
            raise ValueError(
                f"splitk_decode_attention_into: region {name!r} starts at byte "
                f"{region.offset_bytes}, not a multiple of 4; the kernels store 32-bit words "
                "(plans align regions to 256 bytes by default)"
            )
        if nbytes >= _I32_LIMIT:
            raise NotImplementedError(
                f"splitk_decode_attention_into: {nbytes} bytes in region {name!r}: offsets "
                "inside a region are int32, so a region's used part must stay below 2^31 bytes"
            )
    return splits, Dv


def _place(offset_bytes: int) -> Place:
    """The place of an arena region starting at `offset_bytes` in the `uint32[rows, 64]` view."""
    row0, col = divmod(offset_bytes, _ROW_BYTES)
    return Place(row0, col // 4, _WORDS_PER_ROW)


def _words(x: jax.Array) -> jax.Array:
    """uint8 `[rows, 256]` arena -> uint32 `[rows, 64]` (an XLA bitcast)."""
    return lax.bitcast_convert_type(x.reshape(x.shape[0], _WORDS_PER_ROW, 4), jnp.uint32)


def _window(arena: jax.Array, span: tuple[int, int]) -> jax.Array:
    """Rows `[span[0], span[1])` of the uint8 arena as uint32 words (sliced as bytes first: on
    CPU a bitcast of the whole arena is a copy)."""
    return _words(lax.slice(arena, (span[0], 0), (span[1], _ROW_BYTES)))


def _bytes(words: jax.Array, shape: tuple[int, ...] | None) -> jax.Array:
    """uint32 `[rows, 64]` -> uint8 `[rows, 256]` (or `shape`); an XLA bitcast on the GPU."""
    out = lax.bitcast_convert_type(words, jnp.uint8)
    return out.reshape((words.shape[0], _ROW_BYTES) if shape is None else shape)


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
    windows = None  # interpret-mode row windows of the arena: [(first row, rows), ...]
    if arena_form:
        ws_place, out_place = (_place(off) for off in arena_offsets)
        if not interpret:
            att = src = dst = _words(buf)  # an XLA bitcast on the GPU
        else:
            # The Pallas interpreter carries an aliased operand twice through its grid loop
            # (as input and as output), so the whole arena would be copied once on CPU. There
            # the kernels get only the rows their stores touch (sliced out, written back); the
            # addressing is the same, relative to the window's first row.
            used = (
                splitk_slots_needed(B, Hq, num_splits) * (d_v + 2) * 4,
                B * Hq * d_v * itemsize,
            )
            spans = [
                (off // _ROW_BYTES, -(-(off + n) // _ROW_BYTES)) if n else None
                for off, n in zip(arena_offsets, used, strict=True)
            ]
            if spans[0] is not None and spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]:
                spans = [(min(spans[0][0], spans[1][0]), max(spans[0][1], spans[1][1]))] * 2
            ws_place, out_place = (
                Place(p.row0 - sp[0], p.col0, p.width) if sp else p
                for p, sp in zip((ws_place, out_place), spans, strict=True)
            )
            windows = spans
            att = _window(buf, spans[0] if split else spans[1])
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
    in_place = split or arena_form
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
        two = arena_form and windows is not None and windows[0] != windows[1]
        if two:
            # The partials' window goes back first; the output window is then read from the
            # updated arena, so no older arena version stays alive (XLA would copy it).
            buf = lax.dynamic_update_slice(buf, _bytes(att, None), (windows[0][0], 0))
            dst = _window(buf, windows[1])
        inputs = ([] if sinks is None else [sinks]) + [src] + ([dst] if two else [])
        outs = [jax.ShapeDtypeStruct(dst.shape, jnp.uint32) if arena_form else out_words_shape]
        if return_lse:
            outs.append(lse_shape)
        results = pl.pallas_call(
            functools.partial(
                splitk_combine_kernel, cfg=dataclasses.replace(cfg, dst_is_input=two)
            ),  # fmt: skip
            grid=(B, Hkv, num_head_blocks),
            in_specs=[any_spec] * len(inputs),
            out_specs=[any_spec] * len(outs),
            out_shape=outs,
            input_output_aliases={len(inputs) - 1: 0} if arena_form else {},
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
    if windows is None:
        return _bytes(dst, buf.shape), lse, None, pages
    buf = lax.dynamic_update_slice(buf, _bytes(dst, None), (windows[1][0], 0))
    return buf, lse, None, pages


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

    Returns:
      The arena with `attn_output` (and the used workspace slots) written; with
      `return_lse`, `(arena, lse f32[B, Hq])` (the LSE is a small output, not in the arena).

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
        return_lse=return_lse, arena=arena, plan=plan,
    )  # fmt: skip
    offsets = tuple(
        plan.regions[name].offset_bytes if name in plan.regions else 0
        for name in SPLITK_ATTN_REGIONS
    )
    arena, lse, _, _ = _run(
        q, k_cache, v_cache, block_tables, seq_lens, arena, splits=splits, d_v=d_v,
        sm_scale=sm_scale, softcap=softcap, window_size=window_size, sinks=sinks,
        k_scale=k_scale, v_scale=v_scale, return_lse=return_lse, interpret=interpret,
        arena_offsets=offsets,
    )  # fmt: skip
    return (arena, lse) if return_lse else arena
