"""Public wrappers: FP8 block-scaled activation quantization, standalone and into an arena.

DeepSeek-V3 style 1 x `block_size` groups: for every row and every `block_size` columns of
`x[M, K]`, `amax = max|x|` (f32), `scale = max(amax, 1e-4) / 448` (`"ue8m0"`: rounded up to a
power of two), `q = e4m3fn(clamp(x / scale, -448, 448))`, round to nearest even.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxarena import workspaces
from jaxarena.workspaces import FP8_ACT_REGIONS
from pallas_kernels._args import is_int, resolve_interpret
from pallas_kernels.fp8_block_quant.kernel import fp8_block_quant_kernel

__all__ = [
    "FP8_ACT_REGIONS",
    "SCALE_FORMATS",
    "fp8_block_quant",
    "fp8_block_quant_into",
]

SCALE_FORMATS: tuple[str, ...] = ("f32", "ue8m0")
"""Accepted `scale_format` values."""

_SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# Triton tiles must be powers of two; the widest tile we compile is this many elements, which
# bounds the block width (a tile of one row) and sets the row tile (8192 / width, at most 64).
_MAX_TILE_ELEMENTS = 8192
_MAX_ROW_TILE = 64


def _validate(
    x: Any,
    *,
    block_size: Any,
    scale_format: Any,
    arena: Any = None,
    plan: Any = None,
    regions: Any = FP8_ACT_REGIONS,
) -> None:
    """Checks every argument of both entry points; raises before anything is traced.

    Raises:
      ValueError: `x` is not 2-D or not floating; `block_size` is not a positive multiple of
        16; `scale_format` is unknown; (arena form) a region is missing or too small for the
        bytes written, or `arena` is not the plan's `uint8` arena.
      NotImplementedError: valid input the kernel does not handle (a float dtype other than
        f32/bf16/f16, a block wider than the largest tile).
    """
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is None or dtype is None:
        raise ValueError(f"x must be an array with .shape and .dtype, got {type(x).__name__}")
    if len(shape) != 2:
        raise ValueError(
            f"x must be 2-D [M, K] (tokens x features), got x.shape={tuple(shape)}; "
            "reshape leading dimensions into M first"
        )
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"x must be a floating array (bfloat16, float16 or float32), got x.dtype={dtype}"
        )
    if not is_int(block_size):
        raise ValueError(f"block_size must be an int, got {block_size=!r}")
    if block_size <= 0 or block_size % 16:
        raise ValueError(f"block_size must be a positive multiple of 16, got {block_size=}")
    if not isinstance(scale_format, str) or scale_format not in SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {SCALE_FORMATS}, got {scale_format=!r}")
    if dtype not in _SUPPORTED_DTYPES:
        raise NotImplementedError(
            f"x.dtype={dtype} is not supported; use bfloat16, float16 or float32"
        )
    if pl.next_power_of_2(int(block_size)) > _MAX_TILE_ELEMENTS:
        raise NotImplementedError(
            f"{block_size=} is wider than the largest tile ({_MAX_TILE_ELEMENTS} columns)"
        )
    if plan is None:
        return

    if (
        not isinstance(regions, tuple | list)
        or len(regions) != 3
        or not all(isinstance(r, str) for r in regions)
    ):
        raise ValueError(
            f"regions must be three region names (q, scales, k-major scales), got {regions=!r}"
        )
    if not callable(getattr(plan, "check_fits", None)):
        raise ValueError(f"plan must be a jaxarena.ArenaPlan, got {type(plan).__name__}")
    m, k = (int(d) for d in shape)
    rows = workspaces.fp8_rows(m)
    num_blocks = workspaces.fp8_scale_cols(k, int(block_size))
    q_name, scale_name, kmajor_name = regions
    note = f"x.shape={(m, k)} with {block_size=}: {rows} rows = ceil16(M)"
    plan.check_fits(
        (q_name, (rows, k), jnp.uint8, note),
        (scale_name, (rows, num_blocks), jnp.float32, note),
        (kmajor_name, (num_blocks, rows), jnp.float32, note),
        arena=arena,
        what="fp8_block_quant_into",
    )


def _row_tile(m: int, block_width: int) -> int:
    """Rows per grid step: a power of two; one that divides `m` when possible (no padding)."""
    cap = min(_MAX_ROW_TILE, _MAX_TILE_ELEMENTS // block_width)
    tile = cap
    while tile >= 16:
        if m % tile == 0:
            return tile
        tile //= 2
    return min(cap, pl.next_power_of_2(m))


@functools.partial(jax.jit, static_argnames=("num_rows", "block_size", "scale_format", "interpret"))
def _quantize(
    x: jax.Array, *, num_rows: int, block_size: int, scale_format: str, interpret: bool
) -> tuple[jax.Array, jax.Array]:
    """Returns `(q_bits uint8[num_rows, K], scales f32[num_rows, nb])`; rows >= M are zeros."""
    m, k = x.shape
    num_blocks = pl.cdiv(k, block_size)
    # Triton tiles are powers of two: a block of 48 columns travels as 64 with 16 zero columns.
    width = pl.next_power_of_2(block_size)
    tile = _row_tile(num_rows, width)
    rows_padded = pl.cdiv(num_rows, tile) * tile
    # Zero padding: zero rows quantize to zeros with the floor scale, zero columns leave each
    # block's max |x| unchanged.
    xp = jnp.pad(x, ((0, rows_padded - m), (0, num_blocks * block_size - k)))
    if width != block_size:
        xp = xp.reshape(rows_padded, num_blocks, block_size)
        xp = jnp.pad(xp, ((0, 0), (0, 0), (0, width - block_size)))
        xp = xp.reshape(rows_padded, num_blocks * width)

    kernel = functools.partial(
        fp8_block_quant_kernel, scale_format=scale_format, ptx_reciprocal=not interpret
    )
    q_bits, scales = pl.pallas_call(
        kernel,
        grid=(rows_padded // tile, num_blocks),
        in_specs=[pl.BlockSpec((tile, width), lambda i, j: (i, j))],
        out_specs=[
            pl.BlockSpec((tile, width), lambda i, j: (i, j)),
            pl.BlockSpec((tile, 1), lambda i, j: (i, j)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((rows_padded, num_blocks * width), jnp.uint8),
            jax.ShapeDtypeStruct((rows_padded, num_blocks), jnp.float32),
        ],
        interpret=interpret,
        # Explicit Triton params: jax 0.10 otherwise lowers GPU pallas_calls with Mosaic GPU,
        # and the kernel's PTX inline assembly is Triton's. A memory-bound elementwise tile
        # has no loop to pipeline, so one stage.
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        name="fp8_block_quant",
    )(xp)
    if width != block_size:
        q_bits = q_bits.reshape(rows_padded, num_blocks, width)[:, :, :block_size]
        q_bits = q_bits.reshape(rows_padded, num_blocks * block_size)
    return q_bits[:num_rows, :k], scales[:num_rows]


def fp8_block_quant(
    x: jax.Array,
    *,
    block_size: int = 128,
    scale_format: str = "f32",
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Quantizes activations to FP8 e4m3 with one scale per row and `block_size` columns.

    For each row of `x` and each group of `block_size` columns (the last group is shorter
    when `K % block_size != 0`): `amax = max|x|` in f32, `scale = max(amax, 1e-4) / 448`
    (with `scale_format="ue8m0"` rounded up to a power of two, exactly),
    `q = e4m3fn(clamp(x / scale, -448, 448))` with round to nearest even, so `q * scale ~ x`.
    An all-zero group gets the floor scale and zeros, never NaN or inf. `x` must be finite.

    Args:
      x: `[M, K]` bfloat16, float16 or float32. Not donated; the caller keeps it.
      block_size: columns per scale group, a positive multiple of 16 (128: DeepSeek-V3).
        Powers of two need no repacking; others are padded to the next power of two.
      scale_format: `"f32"` or `"ue8m0"` (power-of-two scales, as Blackwell MX GEMMs read).
      interpret: `None` runs the Pallas interpreter on CPU and the compiled Triton kernel on
        GPU; `True`/`False` force one.

    Returns:
      `(q, scales)`: `q` is `float8_e4m3fn[M, K]`; `scales` is
      `float32[M, ceil(K / block_size)]`, row-major (one row per token).

    Raises:
      ValueError: `x` is not 2-D or not floating, `block_size` is not a positive multiple of
        16, or `scale_format` is unknown.
      NotImplementedError: a floating dtype other than the three above, or `block_size` over
        8192.
    """
    _validate(x, block_size=block_size, scale_format=scale_format)
    interpret = resolve_interpret(interpret)
    m, k = x.shape
    if m == 0 or k == 0:
        return (
            jnp.zeros((m, k), jnp.float8_e4m3fn),
            jnp.zeros((m, pl.cdiv(k, block_size)), jnp.float32),
        )
    q_bits, scales = _quantize(
        x,
        num_rows=m,
        block_size=int(block_size),
        scale_format=scale_format,
        interpret=interpret,
    )
    return jax.lax.bitcast_convert_type(q_bits, jnp.float8_e4m3fn), scales


def fp8_block_quant_into(
    arena: jax.Array,
    plan: Any,
    x: jax.Array,
    *,
    block_size: int = 128,
    scale_format: str = "f32",
    regions: tuple[str, str, str] = FP8_ACT_REGIONS,
    interpret: bool | None = None,
) -> jax.Array:
    """Quantizes `x` like `fp8_block_quant` and stores the results in the arena's FP8 buffers.

    With `R = ceil16(M)` (the rows the FP8 GEMMs read) and `nb = ceil(K / block_size)`, each
    written at the start of its region, row-major:
      - `fp8_act`: the e4m3fn bits of q, `[R, K]`, 1 byte per element;
      - `fp8_act_scale`: `float32[R, nb]`, one row of scales per token;
      - `fp8_act_scale_kmajor`: its transpose `float32[nb, R]` (token index contiguous).
    Rows `M..R` hold zeros and the scale of an all-zero group (`1e-4 / 448`; `2**-22` for
    `"ue8m0"`), so a GEMM that reads the pad rows reads finite values. Bytes past those shapes
    and every other region are left unchanged.

    Args:
      arena: the plan's `uint8` arena (`plan.allocate()`). Donate it to the enclosing
        `jax.jit` (`donate_argnums`) for the writes to happen in place; the donated array
        must not be used afterwards, use the returned one.
      plan: a `jaxarena.ArenaPlan` with the three regions above.
      x: `[M, K]` bfloat16, float16 or float32 activations (not donated).
      block_size, scale_format, interpret: as for `fp8_block_quant`.
      regions: the three region names to write (q, row-major scales, k-major scales); the
        default is the projections' `fp8_act` group. The dense FFN's down projection, whose
        K is the intermediate size, uses `("ffn_act_a", "ffn_act_scale",
        "ffn_act_scale_kmajor")`, the seed's buffers for that activation.

    Returns:
      The arena with the three regions written. Read them with `plan.view(...)`.

    Raises:
      ValueError: everything `fp8_block_quant` rejects, a missing region, a region smaller than
        the bytes written (checked against `plan.regions[name].nbytes`), or an `arena` that is
        not the plan's `uint8` array; all before any tracing.
      NotImplementedError: as for `fp8_block_quant`.
    """
    _validate(
        x,
        block_size=block_size,
        scale_format=scale_format,
        arena=arena,
        plan=plan,
        regions=regions,
    )
    interpret = resolve_interpret(interpret)
    m, k = x.shape
    rows = workspaces.fp8_rows(m)
    if rows == 0 or k == 0:
        return arena
    q_bits, scales = _quantize(
        x,
        num_rows=rows,
        block_size=int(block_size),
        scale_format=scale_format,
        interpret=interpret,
    )
    q_name, scale_name, kmajor_name = regions
    arena = plan.write(arena, q_name, q_bits)
    arena = plan.write(arena, scale_name, scales)
    return plan.write(arena, kmajor_name, scales.T)
