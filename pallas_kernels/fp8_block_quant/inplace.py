"""The arena forms' kernels: FP8 quantization stored straight into the arena, in place.

Compiled (GPU), the WHOLE arena goes into each `pallas_call`, aliased to its output
(`memory_space=pl.ANY`), and the kernel stores each value at its byte position in the
regions; nothing but the arena is written and no temporary grows with the shapes. In interpret
mode (CPU) the kernels get the three regions' row windows stacked into one operand and
written back after the calls (`pallas_kernels._arena_io`): there a whole-arena operand would
be copied. The addressing is the same, with rows relative to the operand.

How the kernels address the arena:
  - The arena `uint8[rows, 256]` is passed as `uint32[rows, 64]` (a reinterpretation XLA
    compiles to a bitcast). One word holds four e4m3 bytes of a row of q (little endian: byte
    `4w + k` is bits `8k..8k+7` of word `w`), one f32 scale or one packed UE8M0 word.
  - Why 32-bit words: Pallas' Triton lowering computes element offsets in int32 unless the
    array is larger than 2^32 BYTES, and Triton adds int32 offsets to pointers as signed
    values. A `uint8` view of an arena between 2 and 4 GiB would therefore address a byte past
    2^31 with a negative offset. Counted in 4-byte words, an arena of at most 4 GiB has at
    most 2^30 elements (int32 is safe) and a larger one gets 64-bit offsets.
  - Every store position is computed as `(arena row, word in row)`: the region's first row is
    a static Python int, and the byte offset inside the region (`row * K + column`) is int32
    (`ops.py` checks that a region's span stays below 2^31 bytes), so nothing overflows.
  - The inputs are read whole (`memory_space=pl.ANY`) with masked loads: rows past `M` and
    columns past `K` read as zeros, so they are never padded (a padded copy would be a
    temporary growing with the shapes). Each grid step quantizes one `[rows, block]` tile,
    loading it contiguously; after the e4m3 cast the four bytes of each word are regrouped
    with a reshape + split and packed with shifts.
  - Packed UE8M0 scales need four groups per word: a second, small kernel reads the row-major
    scales back from the arena and packs them into the k-major region.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._arena_io import ROW_BYTES, WORD, plan_windows
from pallas_kernels._cost import declare_fixed, nbytes
from pallas_kernels.fp8_block_quant.kernel import (
    activation,
    block_scale,
    quantize_bits,
    reciprocal,
    row_tile,
)

__all__ = ["ROW_BYTES", "WORD", "quantize_inplace"]

_PACK_TILE = 128  # most tokens per grid step of the UE8M0 packing pass


class _At(NamedTuple):
    """Where a region is: its first row in the arena operand and the operand's last row
    (indices are clamped to it)."""

    row0: int
    last_row: int


def _word_position(region_row0: int, byte_offset: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(arena row, word in row) of the word at `byte_offset` (int32, word aligned) in a region
    starting at arena row `region_row0`."""
    return region_row0 + byte_offset // ROW_BYTES, (byte_offset % ROW_BYTES) // WORD


def _inplace_kernel(*refs, fused: bool, m: int, k: int, rows: int, num_blocks: int,
                    block_size: int, tile: int, width: int, q_at: _At, s_at: _At,
                    t_at: _At | None, scale_format: str, ptx: bool,
                    row_aligned: bool) -> None:  # fmt: skip
    """One `[tile, block]` tile of x (or of `silu(gate) * up`) -> its q words and scales,
    stored into the arena (`t_at=None`: no k-major f32 scales).

    Refs: `x_ref` (`gate_ref`, `up_ref` when fused), the arena operand `uint32[rows, 64]` (the
    whole arena, or the regions' row windows stacked: `_arena_io`) as input (aliased, never
    read) and as output.
    """
    if fused:
        x_ref, up_ref, _, arena_ref = refs
    else:
        (x_ref, _, arena_ref), up_ref = refs, None
    i, j = pl.program_id(0), pl.program_id(1)
    nw = width // WORD
    r = i * tile + jax.lax.broadcasted_iota(jnp.int32, (tile, nw), 0)  # token row
    w = jax.lax.broadcasted_iota(jnp.int32, (tile, nw), 1)  # word in the block
    col = j * block_size + WORD * w  # first column (byte of q) of each word
    # With whole blocks (K % block == 0, block a power of two) no column is masked or clamped:
    # masks and indices then vary only along rows, which lets Triton vectorize along columns.
    full_blocks = k % block_size == 0 and width == block_size
    col_ok = True if full_blocks else (WORD * w < block_size) & (col < k)

    def clamp_col(c):
        return c if full_blocks else jnp.minimum(c, k - 1)

    # x is read whole (memory_space=pl.ANY) with masked loads: rows past M and columns past K
    # read as zeros, so no padded copy exists. Indices are clamped: masked lanes never touch
    # memory on the GPU, and the interpreter's gathers stay in bounds. One contiguous
    # [tile, width] load (vector loads); after the cast the four bytes of each word are
    # regrouped with a reshape + split (Triton: reshape/trans/split).
    rr = i * tile + jax.lax.broadcasted_iota(jnp.int32, (tile, width), 0)
    cc = jax.lax.broadcasted_iota(jnp.int32, (tile, width), 1)
    ccol = j * block_size + cc
    ok = (rr < m) if full_blocks else (rr < m) & (cc < block_size) & (ccol < k)
    at = (jnp.minimum(rr, m - 1), clamp_col(ccol))
    gate = plgpu.load(x_ref.at[at], mask=ok, other=0)
    up = None if up_ref is None else plgpu.load(up_ref.at[at], mask=ok, other=0)
    xt = activation(gate, up)
    amax = jnp.max(jnp.abs(xt), axis=1)
    scale = block_scale(amax, scale_format=scale_format, ptx=ptx)  # [tile]
    inv = reciprocal(scale, ptx=ptx)[:, None]

    q3 = quantize_bits(xt, inv).astype(jnp.uint32).reshape(tile, nw, WORD)
    word = jnp.zeros((tile, nw), jnp.uint32)
    for b, part in enumerate(jnp.split(q3, WORD, axis=2)):  # little endian: byte b = bits 8b..
        word = word | (part.reshape(tile, nw) << jnp.uint32(8 * b))

    store_ok = (r < rows) & col_ok
    q_row0, last_row = q_at
    if row_aligned:
        # K is whole arena rows and a block never straddles one: the word index is the iota
        # plus a product with a constant, so Triton sees contiguous, 16-byte aligned words
        # and vectorizes the stores (with `// 256` and `% 256` it cannot).
        per_row = ROW_BYTES // block_size
        arow = q_row0 + jnp.minimum(r, rows - 1) * (k // ROW_BYTES) + j // per_row
        acol = (j % per_row) * (block_size // WORD) + w
    else:
        arow, acol = _word_position(q_row0, jnp.minimum(r, rows - 1) * k + col)
    plgpu.store(arena_ref.at[jnp.minimum(arow, last_row), acol], word, mask=store_ok)

    # Scales: one word per row of the tile, row-major [rows, nb] and k-major [nb, rows].
    tr = i * tile + jax.lax.broadcasted_iota(jnp.int32, (tile,), 0)
    s_ok = tr < rows
    tr_c = jnp.minimum(tr, rows - 1)
    s_bits = jax.lax.bitcast_convert_type(scale, jnp.uint32)
    srow, scol = _word_position(s_at.row0, (tr_c * num_blocks + j) * WORD)
    plgpu.store(arena_ref.at[jnp.minimum(srow, s_at.last_row), scol], s_bits, mask=s_ok)
    if t_at is not None:
        trow, tcol = _word_position(t_at.row0, (j * rows + tr_c) * WORD)
        plgpu.store(arena_ref.at[jnp.minimum(trow, t_at.last_row), tcol], s_bits, mask=s_ok)


def _pack_tile(rows: int) -> int:
    """Tokens per packing step: a power of two dividing `rows` (a multiple of 16), so no lane
    is masked (the interpreter's masked scatter would write a clamped duplicate index back)."""
    tile = _PACK_TILE
    while rows % tile:
        tile //= 2
    return tile


def _pack_kernel(_, arena_ref, *, m: int, rows: int, num_blocks: int, s_at: _At, t_at: _At) -> None:
    """Packs the row-major ue8m0 scales (already in the arena) into `int32[nb4, rows]` words:
    one word (4 groups) for `_pack_tile(rows)` tokens per grid step. Tokens `m..rows` (the
    padding) get 0 words."""
    i, g = pl.program_id(0), pl.program_id(1)
    tile = _pack_tile(rows)
    tr = i * tile + jax.lax.broadcasted_iota(jnp.int32, (tile,), 0)
    ok = tr < rows
    tr_c = jnp.minimum(tr, rows - 1)
    word = jnp.zeros((tile,), jnp.uint32)
    for b in range(WORD):
        group = 4 * g + b
        srow, scol = _word_position(s_at.row0, (tr_c * num_blocks
                                                + jnp.minimum(group, num_blocks - 1)) * WORD)  # fmt: skip
        bits = plgpu.load(arena_ref.at[jnp.minimum(srow, s_at.last_row), scol], mask=ok, other=0)
        exp = jnp.where(group < num_blocks, bits >> jnp.uint32(23), jnp.uint32(0))
        word = word | (exp << jnp.uint32(8 * b))
    word = jnp.where(tr < m, word, jnp.uint32(0))
    trow, tcol = _word_position(t_at.row0, (g * rows + tr_c) * WORD)
    plgpu.store(arena_ref.at[jnp.minimum(trow, t_at.last_row), tcol], word, mask=ok)


@functools.partial(
    jax.jit,
    static_argnames=(
        "offsets", "rows", "block_size", "scale_format", "packed", "interpret", "debug",
    ),
)  # fmt: skip
def quantize_inplace(
    arena: jax.Array,
    x: jax.Array,
    up: jax.Array | None = None,
    *,
    offsets: tuple[int, int, int | None],
    rows: int,
    block_size: int,
    scale_format: str,
    packed: bool = False,
    interpret: bool,
    debug: bool = False,
) -> jax.Array:
    """The arena with the three regions written; `debug=True` prints the kernel's jaxpr and
    Triton IR when lowering for a GPU (Pallas' `debug`), which the tests read.

    `offsets[2] = None` writes no k-major scales (the grouped FP8 MoE slab has no such part;
    not with `packed`)."""
    m, k = x.shape
    num_blocks = pl.cdiv(k, block_size)
    width = pl.next_power_of_2(block_size)
    tile = row_tile(rows, width)
    # rows = ceil16(M): the tile divides it, so no row lane is masked (the interpreter's masked
    # scatter would write a clamped duplicate index back with its old value).
    assert rows % tile == 0, (rows, tile)
    # The arena operand (`_arena_io`): on the GPU the whole arena viewed as words (a bitcast);
    # in interpret mode the row windows of the three regions, written back after the calls.
    nb4 = pl.cdiv(num_blocks, 4)
    kmajor = offsets[2] is not None
    assert kmajor or not packed, "packed ue8m0 scales need a k-major region"
    used = (rows * k, rows * num_blocks * WORD, (nb4 if packed else num_blocks) * rows * WORD)
    extents = list(zip(offsets, used, strict=True))[: 3 if kmajor else 2]
    win = plan_windows(arena.shape[0], extents, whole=not interpret)
    words = win.take_joined(arena)  # one operand: the whole arena, or the windows stacked
    ats = [_At(win.joined_row0(i, off), words.shape[0] - 1) for i, off in enumerate(offsets)
           if off is not None]  # fmt: skip
    q_at, s_at, t_at = ats if kmajor else (*ats, None)
    kernel = functools.partial(
        _inplace_kernel,
        fused=up is not None,
        m=m,
        k=k,
        rows=rows,
        num_blocks=num_blocks,
        block_size=block_size,
        tile=tile,
        width=width,
        q_at=q_at,
        s_at=s_at,
        t_at=None if packed or not kmajor else t_at,
        scale_format=scale_format,
        ptx=not interpret,
        row_aligned=k % ROW_BYTES == 0 and width == block_size and ROW_BYTES % width == 0,
    )
    inputs = [x] if up is None else [x, up]
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    params = plgpu.CompilerParams(num_warps=4, num_stages=1)
    # Reads x (and up), writes the FP8 bytes and one f32 scale per block of the rows.
    declare_fixed("fp8_silu_mul_quant_inplace" if up is not None else "fp8_block_quant_inplace",
                  (pl.cdiv(rows, tile), num_blocks), [*inputs, words],
                  bytes=nbytes(*inputs) + rows * (k + 4 * num_blocks))  # fmt: skip
    words = pl.pallas_call(
        kernel,
        grid=(pl.cdiv(rows, tile), num_blocks),
        in_specs=[any_spec] * (len(inputs) + 1),
        out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct(words.shape, jnp.uint32),
        input_output_aliases={len(inputs): 0},
        interpret=interpret,
        compiler_params=params,
        name="fp8_silu_mul_quant_inplace" if up is not None else "fp8_block_quant_inplace",
        debug=debug,
    )(*inputs, words)
    if packed:
        pack = functools.partial(_pack_kernel, m=m, rows=rows, num_blocks=num_blocks, s_at=s_at,
                                 t_at=t_at)  # fmt: skip
        declare_fixed("fp8_pack_ue8m0_inplace", (rows // _pack_tile(rows), nb4), [words],
                      bytes=rows * num_blocks * 4 + rows * nb4 * 4)  # f32 scales in, packed out
        words = pl.pallas_call(
            pack,
            grid=(rows // _pack_tile(rows), nb4),
            in_specs=[any_spec],
            out_specs=any_spec,
            out_shape=jax.ShapeDtypeStruct(words.shape, jnp.uint32),
            input_output_aliases={0: 0},
            interpret=interpret,
            compiler_params=params,
            name="fp8_pack_ue8m0_inplace",
            debug=debug,
        )(words)
    return win.put_joined(arena, words)
