"""Public wrappers: split-K paged decode attention, standalone and into an arena.

Decode attention over a vLLM-layout paged KV cache. The keys of every sequence are cut into
`num_splits` contiguous page ranges; a Pallas kernel runs one program per
`(sequence, KV head, query-head block, split)` and stores each split's unnormalised output
and its running max / sum in the split-K workspace; a combine step in plain `jnp` (a few
element-wise ops and a sum over at most 16 splits, which XLA fuses into one loop; a second
kernel would buy nothing) merges the splits with the log-sum-exp rescaling.

Workspace layout (`f32[slots, D + 2]`, the arena's `splitk_workspace` seen as rows): the
partial of (sequence `b`, query head `h`, split `s`) is row
`(b * num_splits + s) * Hq + h`, holding `[o[0:D], m, l]`: `o = sum_t exp(x_t - m) v_t`
(unnormalised), `m = max_t x_t`, `l = sum_t exp(x_t - m)` over the split's keys `t`, with
`x_t = sm_scale * q . k_t`. An empty split holds `o = 0, m = -inf, l = 0`. Only the first
`B * Hq * num_splits` rows are written. With `num_splits == 1` nothing is split: the kernel
writes the normalised output directly and the workspace is not touched (this is why the
seed's legacy policy, which sizes one slot per SM, never needs more slots than it sized).

The split ranges are page ranges of each sequence's own length: with
`num_pages = ceil(len / block_size)` and `P = ceil(num_pages / num_splits)`, split `s` holds
the pages `[s * P, min((s + 1) * P, num_pages))` of the block table, i.e. the tokens
`[s * P * block_size, min((s + 1) * P * block_size, len))`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxarena import Levers, Target
from jaxarena.workspaces import (
    MAX_DECODE_SPLITS,
    SPLITK_ATTN_REGIONS,
    splitk_policy,
    splitk_slot_bytes,
    splitk_slots_needed,
)
from jaxarena.workspaces import num_splits as _policy_num_splits
from pallas_kernels._args import check_finite as _check_finite
from pallas_kernels._args import check_nonempty as _check_nonempty
from pallas_kernels._args import check_rank as _shape
from pallas_kernels._args import is_concrete as _is_concrete
from pallas_kernels._args import is_int as _is_int
from pallas_kernels._args import resolve_interpret
from pallas_kernels.splitk_decode_attention.kernel import splitk_decode_attention_kernel

__all__ = [
    "SPLITK_ATTN_REGIONS",
    "splitk_decode_attention",
    "splitk_decode_attention_into",
    "splitk_num_splits",
    "splitk_slots_needed",
]

_SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# Triton's dot needs every dimension >= 16; narrower pages use multiply-and-sum instead.
_MIN_DOT = 16
# Query rows per program: a power of two; larger groups (MQA) get several head blocks.
_MAX_BLOCK_H = 32
_MAX_BLOCK_H_NO_DOT = 16


def _is_pow2(n: int) -> bool:
    return n > 0 and pl.next_power_of_2(n) == n


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
    workspace: Any = None,
    arena: Any = None,
    plan: Any = None,
) -> int:
    """Checks every argument of both entry points before anything is traced.

    Returns:
      The split count to run (`num_splits`, or the policy's when it is None).

    Raises:
      ValueError: bad shapes or dtypes (see `splitk_decode_attention`), `num_splits` outside
        1..16, a workspace (or arena region) too small for the slots needed, concrete
        `seq_lens` negative or longer than the block table covers, concrete block-table
        entries that are used and out of `[0, num_blocks)`, a bad `sm_scale`, `levers` or
        `target`, or (arena form) a missing or too small region or a foreign arena.
      NotImplementedError: valid input the kernel does not handle: a float dtype other than
        f32/bf16/f16, a KV cache dtype other than q's, a head dim or page size that is not a
        power of two.
    """
    B, Hq, D = _shape("q", q, 3, "[batch, num_q_heads, head_dim]")
    kshape = _shape("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    vshape = _shape("v_cache", v_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    bshape = _shape("block_tables", block_tables, 2, "[batch, max_blocks_per_seq]")
    lshape = _shape("seq_lens", seq_lens, 1, "[batch]")
    _check_nonempty("q", B, "batch size q.shape[0]")
    q_dtype = jnp.dtype(q.dtype)
    if not jnp.issubdtype(q_dtype, jnp.floating):
        raise ValueError(f"q must be floating (float32, bfloat16, float16), got q.dtype={q_dtype}")
    if kshape != vshape:
        raise ValueError(
            f"k_cache and v_cache must have the same shape, got k_cache.shape={kshape} and "
            f"v_cache.shape={vshape}"
        )
    num_blocks, block_size, Hkv, Dk = kshape
    if Dk != D:
        raise ValueError(
            f"head dims differ: q.shape[-1]={D} but k_cache.shape[-1]={Dk}; q, k_cache and "
            "v_cache must share head_dim"
        )
    if Hkv < 1 or Hq < 1 or Hq % Hkv:
        raise ValueError(
            f"num_q_heads must be a positive multiple of num_kv_heads (GQA/MQA), got "
            f"q.shape[1]={Hq} and k_cache.shape[2]={Hkv}"
        )
    if jnp.dtype(k_cache.dtype) != jnp.dtype(v_cache.dtype):
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
    if sm_scale is not None:
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, int | float | np.number):
            raise ValueError(f"sm_scale must be a Python float or None, got {sm_scale=!r}")
        if not math.isfinite(float(sm_scale)):
            raise ValueError(f"sm_scale must be finite, got {sm_scale=}")
    if levers is not None and not isinstance(levers, Levers):
        raise ValueError(f"levers must be a jaxarena.Levers or None, got {levers=!r}")
    if target is not None and not isinstance(target, Target):
        raise ValueError(f"target must be a jaxarena.Target or None, got {target=!r}")

    if q_dtype not in _SUPPORTED_DTYPES:
        raise NotImplementedError(f"q.dtype={q_dtype} is not supported; use f32, bf16 or f16")
    if jnp.dtype(k_cache.dtype) != q_dtype:
        raise NotImplementedError(
            f"k_cache.dtype={k_cache.dtype} differs from q.dtype={q_dtype}; a KV cache in "
            "another dtype (e.g. FP8) is not supported, cast q or the cache"
        )
    if not _is_pow2(D):
        raise NotImplementedError(f"head_dim={D} must be a power of two (Triton tiles)")
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
            used = np.arange(max_pages)[None, :] < -(-lens[:, None] // block_size)
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
    row = f"[{D} + 2] f32"

    if workspace is not None:
        wshape = _shape("workspace", workspace, 2, f"[slots, head_dim + 2] (rows of {row})")
        if jnp.dtype(workspace.dtype) != jnp.float32 or wshape[1] != D + 2:
            raise ValueError(
                f"workspace must be float32[slots, {D + 2}] (head_dim + 2), got "
                f"workspace.dtype={workspace.dtype}, workspace.shape={wshape}"
            )
        if needed > wshape[0]:
            raise ValueError(
                f"workspace too small: B={B} x Hq={Hq} x num_splits={splits} needs {needed} "
                f"slots but workspace.shape[0]={wshape[0]}; use fewer splits or a larger "
                "workspace (size the arena for this batch and policy)"
            )
    if plan is None:
        return splits

    if not callable(getattr(plan, "check_fits", None)):
        raise ValueError(f"plan must be a jaxarena.ArenaPlan, got {type(plan).__name__}")
    uses = [(SPLITK_ATTN_REGIONS[1], (B, Hq * D), q_dtype, "the output")]
    if needed:
        note = f"B={B} x Hq={Hq} x num_splits={splits} = {needed} slots of {row}"
        uses.append((SPLITK_ATTN_REGIONS[0], (needed, D + 2), jnp.float32, note))
    plan.check_fits(*uses, arena=arena, what="splitk_decode_attention_into")
    return splits


def _combine(ws: jax.Array, *, batch: int, num_q_heads: int, num_splits: int) -> jax.Array:
    """Merges the splits' partials (rows `(b * S + s) * Hq + h`) into `f32[B, Hq, D]`."""
    d = ws.shape[1] - 2
    part = ws[: batch * num_splits * num_q_heads].reshape(batch, num_splits, num_q_heads, d + 2)
    o, m, denom = part[..., :d], part[..., d], part[..., d + 1]
    m_max = jnp.max(m, axis=1, keepdims=True)
    # All splits empty (seq_len 0): m_max = -inf; use 0 so that the weights are exp(-inf) = 0.
    m_max = jnp.where(jnp.isfinite(m_max), m_max, 0.0)
    w = jnp.exp(m - m_max)  # [B, S, Hq]; 0 for empty splits
    l_sum = jnp.sum(w * denom, axis=1)
    o_sum = jnp.sum(w[..., None] * o, axis=1)
    # 0 only for an exactly empty sum (no key); a NaN sum stays NaN, never a plausible 0.
    safe = jnp.where(l_sum == 0.0, 1.0, l_sum)
    return jnp.where((l_sum == 0.0)[..., None], 0.0, o_sum / safe[..., None])


@functools.partial(
    jax.jit,
    static_argnames=("num_splits", "sm_scale", "interpret"),
    donate_argnames=("workspace",),
)
def _decode(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    block_tables: jax.Array,
    seq_lens: jax.Array,
    workspace: jax.Array | None,
    *,
    num_splits: int,
    sm_scale: float,
    interpret: bool,
) -> tuple[jax.Array, jax.Array | None]:
    B, Hq, D = q.shape
    _, block_size, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    use_dot = block_size >= _MIN_DOT and D >= _MIN_DOT
    if use_dot:
        block_h = min(max(pl.next_power_of_2(group), _MIN_DOT), _MAX_BLOCK_H)
    else:
        block_h = min(pl.next_power_of_2(group), _MAX_BLOCK_H_NO_DOT)
    num_head_blocks = -(-group // block_h)
    write_partials = num_splits > 1
    kernel = functools.partial(
        splitk_decode_attention_kernel,
        sm_scale=sm_scale,
        num_splits=num_splits,
        num_q_heads=Hq,
        group_size=group,
        block_h=block_h,
        write_partials=write_partials,
        use_dot=use_dot,
    )
    whole = pl.no_block_spec
    common = dict(
        grid=(B, Hkv, num_head_blocks, num_splits),
        interpret=interpret,
        # Explicit Triton params: jax 0.10 otherwise lowers GPU pallas_calls with Mosaic GPU.
        # Two stages let Triton prefetch the next page while the current one is reduced.
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        name="splitk_decode_attention",
    )
    args = (q, k_cache, v_cache, block_tables, seq_lens)
    if not write_partials:
        out = pl.pallas_call(
            kernel,
            in_specs=[whole] * 5,
            out_specs=whole,
            out_shape=jax.ShapeDtypeStruct((B, Hq, D), q.dtype),
            **common,
        )(*args)
        return out, workspace
    own = workspace is None
    if own:
        workspace = jnp.zeros((B * Hq * num_splits, D + 2), jnp.float32)
    workspace = pl.pallas_call(
        kernel,
        in_specs=[whole] * 6,
        out_specs=whole,
        out_shape=jax.ShapeDtypeStruct(workspace.shape, jnp.float32),
        input_output_aliases={5: 0},
        **common,
    )(*args, workspace)
    out = _combine(workspace, batch=B, num_q_heads=Hq, num_splits=num_splits)
    return out.astype(q.dtype), (None if own else workspace)


def splitk_decode_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    block_tables: jax.Array,
    seq_lens: jax.Array,
    *,
    num_splits: int | None = None,
    sm_scale: float | None = None,
    workspace: jax.Array | None = None,
    levers: Levers | None = None,
    target: Target | None = None,
    interpret: bool | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Decode attention over a paged KV cache (vLLM layout), split-K over the keys.

    `out[b, h] = softmax(sm_scale * q[b, h] . K[b, :len_b]^T) @ V[b, :len_b]`, where query
    head `h` reads KV head `h // (Hq // Hkv)` (GQA; MQA when `Hkv == 1`), key/value `t` of
    sequence `b` is row `t % block_size` of page `block_tables[b, t // block_size]`, and
    `len_b = seq_lens[b]`. A sequence of length 0 gives zeros. Softmax statistics and
    accumulation are f32. See the module docstring for the split ranges and the workspace
    layout.

    Args:
      q: `[B, Hq, D]` float32, bfloat16 or float16; `D` a power of two (64, 128, 256, ...).
      k_cache, v_cache: `[num_blocks, block_size, Hkv, D]` in q's dtype; `block_size` a power
        of two. Read only.
      block_tables: `int32[B, max_blocks_per_seq]`: page ids of each sequence, in order.
        Entries past a sequence's last page are never read.
      seq_lens: `int32[B]`, each in `[0, max_blocks_per_seq * block_size]`. Checked when
        concrete (eager calls, together with the used block-table entries); under `jit`
        nothing about the values is known statically, so the kernel clamps each length to
        `max_blocks_per_seq * block_size` and each page id into `[0, num_blocks)`: bad input
        reads wrong pages, never out of bounds.
      num_splits: key splits per (sequence, head), 1..16. `None` takes the seed's policy
        (`splitk_num_splits(B, Hq, levers=levers, target=target)`).
      sm_scale: logit scale, a Python float; default `1 / sqrt(D)`.
      workspace: optional `float32[slots, D + 2]`, e.g. the arena's `splitk_workspace` viewed
        as rows. Donated: its first `B * Hq * num_splits` rows (none with one split) are
        overwritten in place (`input_output_aliases`), the others are left unchanged; use the
        returned workspace, not the one passed. Without it a temporary is used.
      levers, target: pin the policy's inputs (`None`: environment and detected device).
      interpret: `None` interprets on CPU and compiles the Triton kernel on GPU.

    Non-finite values: keys and values past `seq_lens[b]` (the unused tail of the last page)
    never enter the arithmetic, so stale bytes there (NaN included) do not matter. A concrete
    `q` must be finite (ValueError). A NaN or infinity in a traced `q`, or in a key or value
    the sequence does attend to, gives NaN for the heads it reaches: never a plausible 0.

    Returns:
      `out [B, Hq, D]` in q's dtype, or `(out, workspace)` when a workspace is passed.

    Raises:
      ValueError: wrong ranks or dtypes (q not floating; tables or lengths not int32), head
        dims that differ, `Hq % Hkv != 0`, k/v caches of different shapes or dtypes, a batch
        size mismatch or a batch of 0, a concrete non-finite q, `num_splits` outside 1..16, a workspace of the wrong shape/dtype or
        with fewer than `B * Hq * num_splits` slots (nothing is written), concrete lengths
        beyond what the block table covers or used page ids out of range. All before tracing.
      NotImplementedError: f64 or another unsupported float, a KV cache dtype other than
        q's, a head dim or page size that is not a power of two.
    """
    splits = _validate(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        num_splits=num_splits,
        sm_scale=sm_scale,
        levers=levers,
        target=target,
        workspace=workspace,
    )
    interpret = resolve_interpret(interpret)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    out, ws = _decode(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        workspace,
        num_splits=splits,
        sm_scale=scale,
        interpret=interpret,
    )
    return out if workspace is None else (out, ws)


def splitk_decode_attention_into(
    arena: jax.Array,
    plan: Any,
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    block_tables: jax.Array,
    seq_lens: jax.Array,
    *,
    num_splits: int | None = None,
    sm_scale: float | None = None,
    levers: Levers | None = None,
    target: Target | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """`splitk_decode_attention` with its workspace and output in the arena.

    The workspace is the plan's `splitk_workspace` region seen as
    `float32[nbytes // ((D + 2) * 4), D + 2]` (as many slots as it holds; the sizing gives
    `slots * (head_dim + 2) * 4` bytes); the partials land in its first `B * Hq * num_splits`
    rows (none with one split). The output is stored at the start of `attn_output` as
    `[B, Hq * D]` in q's dtype. Every other byte of the arena is left unchanged.

    Args:
      arena: the plan's `uint8` arena. Donate it to the enclosing `jax.jit` for the writes to
        happen in place; use the returned arena afterwards.
      plan: a `jaxarena.ArenaPlan` with `attn_output` and (for more than one split)
        `splitk_workspace` regions.
      q, k_cache, v_cache, block_tables, seq_lens, num_splits, sm_scale, levers, target,
        interpret: as for `splitk_decode_attention`.

    Returns:
      The arena with `attn_output` (and the used workspace slots) written.

    Raises:
      ValueError: everything `splitk_decode_attention` rejects, a missing region, an
        `attn_output` smaller than `B * Hq * D * itemsize`, a `splitk_workspace` with fewer
        slots than `B * Hq * num_splits`, or an arena that is not the plan's; all before
        tracing, with nothing written.
      NotImplementedError: as for `splitk_decode_attention`.
    """
    splits = _validate(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        num_splits=num_splits,
        sm_scale=sm_scale,
        levers=levers,
        target=target,
        arena=arena,
        plan=plan,
    )
    interpret = resolve_interpret(interpret)
    B, Hq, D = q.shape
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    ws = None
    if splits > 1:
        slots = plan.regions["splitk_workspace"].nbytes // splitk_slot_bytes(D)
        ws = plan.view(arena, "splitk_workspace", (slots, D + 2), jnp.float32)
    out, ws = _decode(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        ws,
        num_splits=splits,
        sm_scale=scale,
        interpret=interpret,
    )
    if ws is not None:
        # Only the rows the kernel wrote; the rest of the region keeps its bytes.
        arena = plan.write(arena, "splitk_workspace", ws[: splitk_slots_needed(B, Hq, splits)])
    return plan.write(arena, "attn_output", out.reshape(B, Hq * D))
