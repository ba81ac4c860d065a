"""The block-FP8 grouped GEMM in the arena: `moe_fp8_scratch` holds its activations, scales,
work list and tile counter, exactly at the seed's offsets (spec §10,
`jaxarena.workspaces.moe_fp8_scratch_layout`).

One call, three steps inside the caller's jit:
  1. the activations `x[T, K]` are quantized 1 x 128 straight into the slab's `activation`
     (`[ceil16(T), K]` e4m3 bytes) and `scales` (`f32[ceil16(T), K / 128]`) parts
     (`fp8_block_quant`'s in-place kernel, no k-major copy);
  2. the work list (`int32[I, 2]`, 8 bytes per item) and the item count (the u32 counter, reset
     to this step's count) are stored into the `worklist` and `counter` parts;
  3. the GEMM reads all four from the arena (on a GPU the whole arena, viewed as 32-bit words,
     goes in read-only: a bitcast, no copy) and writes its `[M, N]` output.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxarena import workspaces
from jaxarena._arena.bytes import store_bytes
from pallas_kernels._arena_io import ROW_BYTES, plan_windows
from pallas_kernels._args import resolve_interpret
from pallas_kernels._cost import declare_fixed, nbytes, touched_groups
from pallas_kernels.fp8_block_quant.inplace import quantize_inplace
from pallas_kernels.grouped_gemm.checks import (
    check_fp8,
    check_group_offset,
    check_group_sizes,
    check_row_ids,
)
from pallas_kernels.grouped_gemm.kernel import ArenaAt, grouped_gemm_kernel
from pallas_kernels.grouped_gemm.ops import (
    FP8_BLOCK,
    fp8_config,
    max_work_items,
    work_list,
)

__all__ = ["MOE_FP8_REGION", "grouped_gemm_fp8_into"]

MOE_FP8_REGION = "moe_fp8_scratch"
"""The arena region of the FP8 MoE slab."""

_BLOCK_M = 128  # the seed sizes the work list in 128-row tiles
_I32_LIMIT = 2**31


@functools.partial(jax.jit, static_argnames=("cfg", "parts", "q_rows", "out_dtype", "interpret"))
def _run(arena, x, w_bits, scale_inv, group_sizes, row_ids, offset, *, cfg, parts, q_rows,
         out_dtype, interpret):  # fmt: skip
    act, scl, wl, cnt = parts  # absolute byte offsets of the four parts
    nb = pl.cdiv(cfg.k, FP8_BLOCK)
    arena = quantize_inplace(arena, x, offsets=(act, scl, None), rows=q_rows,
                             block_size=FP8_BLOCK, scale_format="f32", interpret=interpret)  # fmt: skip
    items, bounds, count = work_list(group_sizes, cfg.m, cfg.block_m)
    arena = store_bytes(arena, wl, jax.lax.bitcast_convert_type(items, jnp.uint8))
    arena = store_bytes(arena, cnt, jax.lax.bitcast_convert_type(count.astype(jnp.uint32),
                                                                 jnp.uint8))  # fmt: skip
    extents = [(act, q_rows * cfg.k), (scl, q_rows * nb * 4), (wl, items.size * 4), (cnt, 4)]
    win = plan_windows(arena.shape[0], extents, whole=not interpret)
    words = win.take_joined(arena)  # read-only: the whole arena (a bitcast) or its windows
    row0 = [win.joined_row0(i, off) for i, off in enumerate((act, scl, wl, cnt))]
    cfg = cfg.__class__(**{**cfg.__dict__, "arena": ArenaAt(*row0, words.shape[0] - 1)})
    operands = [bounds] + ([row_ids] if cfg.gather else []) + [words, w_bits, scale_inv]
    operands += [offset] if cfg.rhs_groups else []
    n_tiles = pl.cdiv(cfg.n, cfg.block_n)
    rows = pl.cdiv(cfg.m, cfg.block_m) * cfg.block_m if interpret else cfg.m
    cols = n_tiles * cfg.block_n if interpret else cfg.n
    # The weights of the groups (experts) the rows touch under uniform routing, the rows of
    # lhs once per N tile, the output once; 2 * M * N * K flops.
    rhs_like = [a for a in operands if a.ndim == 3]
    share = touched_groups(rhs_like[0].shape[0], cfg.m) / rhs_like[0].shape[0] if rhs_like else 1
    declare_fixed("grouped_gemm_fp8_arena", (items.shape[0], n_tiles), operands,
                  bytes=share * nbytes(*rhs_like) + n_tiles * cfg.m * (cfg.k + 4 * nb)
                  + cfg.m * cfg.n * jnp.dtype(out_dtype).itemsize,
                  flops=2 * cfg.m * cfg.n * cfg.k)  # fmt: skip
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(
        functools.partial(grouped_gemm_kernel, cfg=cfg),
        grid=(items.shape[0], n_tiles),
        in_specs=[any_spec] * len(operands),
        out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct((rows, cols), out_dtype),
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=8, num_stages=1),
        name="grouped_gemm_fp8_arena",
    )(*operands)
    return arena, (out[: cfg.m, : cfg.n] if interpret else out)


def grouped_gemm_fp8_into(
    arena: jax.Array,
    plan: Any,
    x: jax.Array,
    w: jax.Array,
    scale_inv: jax.Array,
    group_sizes: jax.Array,
    *,
    layout: dict[str, tuple[int, int]],
    row_ids: jax.Array | None = None,
    region: str = MOE_FP8_REGION,
    out_dtype: Any = jnp.bfloat16,
    interpret: bool | None = None,
    group_offset: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """`grouped_gemm_fp8` with its activations, scales, work list and counter in the arena.

    Same arithmetic as `grouped_gemm_fp8` (128-row tiles). The `moe_fp8_scratch` parts are
    written at `layout`'s offsets inside `region`: `activation` gets `x`'s e4m3 bytes
    (`[ceil16(T), K]`, rows past T zero), `scales` their f32 scales `[ceil16(T), K / 128]`,
    `worklist` the `int32[I, 2]` items (`I = ceil(M / 128) + G`), `counter` the u32 item count,
    reset every call. Every other byte of the arena is left unchanged.

    Args:
      arena: the plan's `uint8` arena. Donate it to the enclosing `jax.jit` for the writes to
        be in place; use the returned one.
      plan: a `jaxarena.ArenaPlan` with `region`, 256-byte aligned.
      x, w, scale_inv, group_sizes, row_ids, out_dtype, interpret, group_offset: as for
        `grouped_gemm_fp8` (`x [T, K]`, `K % 4 == 0`).
      layout: the slab's parts, `jaxarena.workspaces.moe_fp8_scratch_layout(...)` for the
        model's config and the step's rows (the sizing's own numbers).
      region: the slab's region name.

    Returns:
      `(arena, out [M, N])`.

    Raises:
      ValueError: as `grouped_gemm_fp8`; a part too small for what is written (naming the
        part, the bytes needed and the bytes it has); a region not on a 256-byte row.
      ArenaError (a ValueError): a missing region, or one smaller than the layout's bytes.
      NotImplementedError: `K % 4 != 0`, or an activation span of 2^31 bytes or more.
    """
    t, k, n, wg = check_fp8(x, w, scale_inv, FP8_BLOCK)
    m = t if row_ids is None else check_row_ids(row_ids, t)
    offset = check_group_offset(group_offset, group_sizes, wg)
    g = wg if offset is None else group_sizes.shape[0]
    check_group_sizes(group_sizes, g, m)
    if set(layout) != set(workspaces.MOE_FP8_PARTS):
        raise ValueError(f"layout must have the parts {workspaces.MOE_FP8_PARTS}, got "
                         f"{sorted(layout)}")  # fmt: skip
    plan.check_fits((region, (layout["counter"][0] + 4,), jnp.uint8, "moe_fp8_scratch layout"),
                    arena=arena, what="grouped_gemm_fp8_into")  # fmt: skip
    base = int(plan.regions[region].offset_bytes)
    if base % ROW_BYTES:
        raise ValueError(f"region {region!r} at byte {base} is not on a {ROW_BYTES}-byte row")
    if k % 4:
        raise NotImplementedError(f"grouped_gemm_fp8_into needs K % 4 == 0, got K={k}")
    q_rows = workspaces.fp8_rows(t)
    need = {
        "activation": q_rows * k,
        "scales": q_rows * workspaces.fp8_scale_cols(k, FP8_BLOCK) * 4,
        "worklist": max_work_items(m, g, _BLOCK_M) * 8,
        "counter": 4,
    }
    for part, needed in need.items():
        if layout[part][1] < needed:
            raise ValueError(
                f"moe_fp8_scratch part {part!r} holds {layout[part][1]} bytes; x.shape={(t, k)}"
                f", M={m}, G={g} need {needed}"
            )
    if q_rows * k >= _I32_LIMIT:
        raise NotImplementedError(f"activation span {q_rows * k} bytes >= 2^31: split the rows")
    out_dtype = jnp.dtype(out_dtype)
    interpret = resolve_interpret(interpret)
    if m == 0 or n == 0 or k == 0 or t == 0:
        return arena, jnp.zeros((m, n), out_dtype)
    cfg = fp8_config(m, k, n, g, _BLOCK_M, gather=row_ids is not None, interpret=interpret,
                     rhs_groups=0 if offset is None else wg)  # fmt: skip
    parts = tuple(base + layout[p][0] for p in workspaces.MOE_FP8_PARTS)
    ids = None if row_ids is None else row_ids.astype(jnp.int32)
    w_bits = jax.lax.bitcast_convert_type(w, jnp.uint8)
    return _run(arena, x, w_bits, scale_inv, group_sizes, ids, offset, cfg=cfg, parts=parts,
                q_rows=q_rows, out_dtype=out_dtype, interpret=interpret)  # fmt: skip
