"""Public wrappers: FP8 block-scaled activation quantization, standalone and in the arena.

DeepSeek-V3 style 1 x `block_size` groups (32, 64 or 128 in the models; any positive multiple
of 16 works): for every row and every `block_size` columns of `x[M, K]`, `amax = max|x|` (f32),
`scale = max(amax, 1e-4) / 448` correctly rounded (`"ue8m0"`: rounded up to a power of two),
`q = e4m3fn(clamp(x * (1 / scale), -448, 448))`, round to nearest even. The fused gated-MLP
forms quantize `silu(gate) * up` (f32) in the same pass.

Scale layouts (`scale_layout`):
  - `"row"`: `float32[M, nb]`, one row of scales per token (standalone only);
  - `"col"`: `float32[nb, align4(M)]`, token index contiguous (DeepGEMM's MN-major,
    TMA-aligned f32 layout, `get_mn_major_tma_aligned_tensor`);
  - `"packed_ue8m0"`: `int32[ceil(nb / 4), align4(M)]`, four UE8M0 exponents per word (byte
    `b` of word `w` is the biased f32 exponent, `bits >> 23`, of group `4w + b`), token index
    contiguous: the layout DeepGEMM's SM100 kernels read
    (`get_mn_major_tma_aligned_packed_ue8m0_tensor`). Needs `scale_format="ue8m0"`.
Rows past M (up to `align4(M)`, or `ceil16(M)` in the arena) are quantized as zero rows
(zeros, the floor scale) in q and the f32 layouts. In `"packed_ue8m0"` they are 0 words, as
vLLM's packed per-token-group quantizer (`per_token_group_quant_fp8_packed_for_deepgemm`)
stores them, so a consumer that reads whole TMA tiles reads zeros; exponent bytes of groups
past `nb` in the last word are 0, as DeepGEMM pads them. An all-zero group of a real row keeps
the floor scale: `2**-22`, exponent byte 0x69, as DeepGEMM's `per_token_cast_to_fp8` (floor
1e-4) gives; vLLM's packed quantizer writes 0x5e there (`2**-33`, from its 1e-10 floor). The
peers disagree; this follows DeepGEMM.

The arena forms write straight into the arena: on a GPU the WHOLE arena goes into the
`pallas_call` aliased to its output (`memory_space=pl.ANY`), viewed as 32-bit words, and the
kernel stores each value at its place in the regions; no temporary grows with the shapes. In
interpret mode (CPU) the kernel gets only the regions' rows (`inplace.py`).
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
from pallas_kernels._args import check_rank, is_int, resolve_interpret
from pallas_kernels.fp8_block_quant.inplace import ROW_BYTES, WORD, quantize_inplace
from pallas_kernels.fp8_block_quant.kernel import (
    MAX_TILE_ELEMENTS,
    fp8_block_quant_kernel,
    row_tile,
)
from pallas_kernels.fp8_block_quant.kernel_mosaic import quantize_mosaic

__all__ = [
    "FFN_ACT_REGIONS",
    "BACKENDS",
    "FP8_ACT_REGIONS",
    "SCALE_FORMATS",
    "SCALE_LAYOUTS",
    "fp8_block_quant",
    "fp8_block_quant_into",
    "fp8_silu_mul_quant",
    "fp8_silu_mul_quant_into",
]

SCALE_FORMATS: tuple[str, ...] = ("f32", "ue8m0")
"""Accepted `scale_format` values."""

BACKENDS: tuple[str, ...] = ("triton", "mosaic_gpu")
"""Accepted `backend` values of `fp8_block_quant` (README, "Kernels": the Triton deprecation)."""

SCALE_LAYOUTS: tuple[str, ...] = ("row", "col", "packed_ue8m0")
"""Accepted `scale_layout` values (the arena forms take `"col"` and `"packed_ue8m0"`)."""

FFN_ACT_REGIONS: tuple[str, str, str] = ("ffn_act_a", "ffn_act_scale", "ffn_act_scale_kmajor")
"""The seed's dense-FFN FP8 activation regions (the down projection's input)."""

_SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_I32_LIMIT = 2**31


def _align4(m: int) -> int:
    return -(-m // 4) * 4


def _check_x(name: str, x: Any) -> tuple[int, int]:
    m, k = check_rank(name, x, 2, "[M, K] (tokens x features); reshape leading dims into M")
    dtype = jnp.dtype(x.dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"{name} must be a floating array (bfloat16, float16 or float32), got "
            f"{name}.dtype={dtype}"
        )
    if dtype not in _SUPPORTED_DTYPES:
        raise NotImplementedError(
            f"{name}.dtype={dtype} is not supported; use bfloat16, float16 or float32"
        )
    return m, k


def _validate(
    x: Any,
    up: Any = None,
    *,
    fused: bool = False,
    block_size: Any,
    scale_format: Any,
    scale_layout: Any,
    arena_form: bool = False,
) -> tuple[int, int]:
    """Checks the arguments both entry points share; raises before anything is traced.

    Returns `(M, K)`.
    """
    names = ("gate", "up") if fused else ("x",)
    m, k = _check_x(names[0], x)
    if fused:
        if _check_x("up", up) != (m, k) or jnp.dtype(up.dtype) != jnp.dtype(x.dtype):
            raise ValueError(
                f"gate and up must have the same shape and dtype, got gate "
                f"{jnp.dtype(x.dtype)}{[m, k]} and up {jnp.dtype(up.dtype)}{list(up.shape)}"
            )
    if not is_int(block_size):
        raise ValueError(f"block_size must be an int, got {block_size=!r}")
    if block_size <= 0 or block_size % 16:
        raise ValueError(
            f"block_size must be a positive multiple of 16 (32, 64, 128 in practice), got "
            f"{block_size=}"
        )
    if not isinstance(scale_format, str) or scale_format not in SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {SCALE_FORMATS}, got {scale_format=!r}")
    layouts = ("col", "packed_ue8m0") if arena_form else SCALE_LAYOUTS
    if not isinstance(scale_layout, str) or scale_layout not in layouts:
        raise ValueError(
            f"scale_layout must be one of {layouts}, got {scale_layout=!r}"
            + ("; the arena form always writes the row-major scales too" if arena_form else "")
        )
    if scale_layout == "packed_ue8m0" and scale_format != "ue8m0":
        raise ValueError(
            f"scale_layout='packed_ue8m0' stores exponents only and needs "
            f"scale_format='ue8m0', got {scale_format=!r}"
        )
    if pl.next_power_of_2(int(block_size)) > MAX_TILE_ELEMENTS:
        raise NotImplementedError(
            f"{block_size=} is wider than the largest tile ({MAX_TILE_ELEMENTS} columns)"
        )
    return m, k


# -- standalone ------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("num_rows", "block_size", "scale_format", "interpret"))
def _quantize(
    x: jax.Array,
    up: jax.Array | None,
    *,
    num_rows: int,
    block_size: int,
    scale_format: str,
    interpret: bool,
) -> tuple[jax.Array, jax.Array]:
    """Returns `(q_bits uint8[num_rows, K], scales f32[num_rows, nb])`; rows >= M are zeros."""
    m, k = x.shape
    num_blocks = pl.cdiv(k, block_size)
    # Triton tiles are powers of two: a block of 48 columns travels as 64 with 16 zero columns.
    width = pl.next_power_of_2(block_size)
    tile = row_tile(num_rows, width)
    rows_padded = pl.cdiv(num_rows, tile) * tile

    def pad(a):
        # Zero padding: zero rows quantize to zeros with the floor scale, zero columns leave
        # each block's max |x| unchanged (silu(0) * 0 = 0).
        a = jnp.pad(a, ((0, rows_padded - m), (0, num_blocks * block_size - k)))
        if width != block_size:
            a = a.reshape(rows_padded, num_blocks, block_size)
            a = jnp.pad(a, ((0, 0), (0, 0), (0, width - block_size)))
            a = a.reshape(rows_padded, num_blocks * width)
        return a

    inputs = [pad(x)] if up is None else [pad(x), pad(up)]
    kernel = functools.partial(
        fp8_block_quant_kernel, scale_format=scale_format, ptx=not interpret, fused=up is not None
    )
    spec = pl.BlockSpec((tile, width), lambda i, j: (i, j))
    q_bits, scales = pl.pallas_call(
        kernel,
        grid=(rows_padded // tile, num_blocks),
        in_specs=[spec] * len(inputs),
        out_specs=[spec, pl.BlockSpec((tile, 1), lambda i, j: (i, j))],
        out_shape=[
            jax.ShapeDtypeStruct((rows_padded, num_blocks * width), jnp.uint8),
            jax.ShapeDtypeStruct((rows_padded, num_blocks), jnp.float32),
        ],
        interpret=interpret,
        # Explicit Triton params: jax 0.10 otherwise lowers GPU pallas_calls with Mosaic GPU,
        # and the kernel's PTX inline assembly is Triton's. A memory-bound elementwise tile
        # has no loop to pipeline, so one stage.
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        name="fp8_silu_mul_quant" if up is not None else "fp8_block_quant",
    )(*inputs)
    if width != block_size:
        q_bits = q_bits.reshape(rows_padded, num_blocks, width)[:, :, :block_size]
        q_bits = q_bits.reshape(rows_padded, num_blocks * block_size)
    return q_bits[:num_rows, :k], scales[:num_rows]


def _pack_ue8m0(scales: jax.Array, m: int) -> jax.Array:
    """`float32[R, nb]` power-of-two scales -> `int32[ceil(nb / 4), R]` packed exponents; the
    words of rows `m..R` (padding) are 0."""
    r, nb = scales.shape
    exps = jax.lax.shift_right_logical(
        jax.lax.bitcast_convert_type(scales, jnp.uint32), jnp.uint32(23)
    )
    exps = jnp.pad(exps, ((0, 0), (0, -nb % 4))).reshape(r, -1, 4)
    words = exps[..., 0] | exps[..., 1] << 8 | exps[..., 2] << 16 | exps[..., 3] << 24
    words = jnp.where(jnp.arange(r)[:, None] < m, words, jnp.uint32(0))
    return jax.lax.bitcast_convert_type(words, jnp.int32).T


def _standalone(x, up, *, block_size, scale_format, scale_layout, interpret, backend="triton"):
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend=!r}")
    m, k = _validate(
        x,
        up,
        fused=up is not None,
        block_size=block_size,
        scale_format=scale_format,
        scale_layout=scale_layout,
    )
    interpret = resolve_interpret(interpret)
    rows = m if scale_layout == "row" else _align4(m)
    nb = pl.cdiv(k, int(block_size))
    if m == 0 or k == 0:
        q = jnp.zeros((m, k), jnp.float8_e4m3fn)
        if scale_layout == "row":
            return q, jnp.zeros((m, nb), jnp.float32)
        if scale_layout == "col":
            return q, jnp.zeros((nb, rows), jnp.float32)
        return q, jnp.zeros((pl.cdiv(nb, 4), rows), jnp.int32)
    if backend == "mosaic_gpu":
        quantize = quantize_mosaic
    else:
        quantize = functools.partial(_quantize, up=up)
    q_bits, scales = quantize(
        x,
        num_rows=rows,
        block_size=int(block_size),
        scale_format=scale_format,
        interpret=interpret,
    )
    q = jax.lax.bitcast_convert_type(q_bits[:m], jnp.float8_e4m3fn)
    if scale_layout == "col":
        scales = scales.T
    elif scale_layout == "packed_ue8m0":
        scales = _pack_ue8m0(scales, m)
    return q, scales


def fp8_block_quant(
    x: jax.Array,
    *,
    block_size: int = 128,
    scale_format: str = "f32",
    scale_layout: str = "row",
    interpret: bool | None = None,
    backend: str = "triton",
) -> tuple[jax.Array, jax.Array]:
    """Quantizes activations to FP8 e4m3 with one scale per row and `block_size` columns.

    For each row of `x` and each group of `block_size` columns (the last group is shorter
    when `K % block_size != 0`): `amax = max|x|` in f32, `scale = max(amax, 1e-4) / 448`,
    a correctly rounded f32 division as the PyTorch/Triton peers (DeepGEMM's
    `per_token_cast_to_fp8`, DeepSeek-V3's `act_quant`) compute it (with
    `scale_format="ue8m0"` then rounded up to a power of two, exactly),
    `q = e4m3fn(clamp(x * (1 / scale), -448, 448))` with round to nearest even and a
    correctly rounded reciprocal, so `q * scale ~ x`. An all-zero group gets the floor scale
    and zeros, never NaN or inf. `x` must be finite.

    Args:
      x: `[M, K]` bfloat16, float16 or float32. Not donated; the caller keeps it.
      block_size: columns per scale group, a positive multiple of 16 (128: DeepSeek-V3, the
        default; 32 and 64 for MX-style recipes). Powers of two need no repacking; others
        are padded to the next power of two.
      scale_format: `"f32"` or `"ue8m0"` (power-of-two scales, as Blackwell MX GEMMs read).
      scale_layout: `"row"` (`float32[M, nb]`), `"col"` (`float32[nb, align4(M)]`) or
        `"packed_ue8m0"` (`int32[ceil(nb / 4), align4(M)]`, four exponents per word, DeepGEMM
        SM100); see the module docstring. Rows past M are zero rows (the floor scale), except
        in `"packed_ue8m0"`, where their words are 0 (as vLLM's packed quantizer).
      interpret: `None` runs the Pallas interpreter on CPU and the compiled kernel on GPU;
        `True`/`False` force one.
      backend: `"triton"` (Pallas-Triton, the default) or `"mosaic_gpu"` (Pallas' Mosaic GPU,
        `kernel_mosaic.py`: same results in interpret mode; compiled, its divisions are
        approximate, see that module). Interpret mode of `"mosaic_gpu"` needs jax >= 0.12.

    Returns:
      `(q, scales)`: `q` is `float8_e4m3fn[M, K]`; `scales` as `scale_layout` says, with
      `nb = ceil(K / block_size)`.

    Raises:
      ValueError: `x` is not 2-D or not floating, `block_size` is not a positive multiple of
        16, `scale_format` / `scale_layout` unknown, or `"packed_ue8m0"` with f32 scales.
      NotImplementedError: a floating dtype other than the three above, or `block_size` over
        8192 (over 256 with `"mosaic_gpu"`); `"mosaic_gpu"` on a jax without Pallas' Mosaic
        GPU interpreter.
    """
    return _standalone(
        x,
        None,
        block_size=block_size,
        scale_format=scale_format,
        scale_layout=scale_layout,
        interpret=interpret,
        backend=backend,
    )


def fp8_silu_mul_quant(
    gate: jax.Array,
    up: jax.Array,
    *,
    block_size: int = 128,
    scale_format: str = "f32",
    scale_layout: str = "row",
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Fused gated-MLP activation + FP8 quantization: `fp8_block_quant(silu(gate) * up)`.

    `silu(g) * u = g / (1 + exp(-g)) * u` is computed in f32 from the inputs and quantized
    without an intermediate rounding to the input dtype (vLLM's fused `silu_and_mul` +
    per-token-group FP8 quant, DeepGEMM/SGLang's `silu_and_mul` post-quant follow the same
    order). One kernel pass reads `gate` and `up` once. On a GPU, `exp` is the GPU's, so
    values within a few f32 ulps of an e4m3 rounding boundary can round differently from the
    CPU reference.

    Args:
      gate, up: `[M, I]`, the same float dtype (bf16, f16, f32); not donated.
      block_size, scale_format, scale_layout, interpret: as for `fp8_block_quant`.

    Returns:
      `(q float8_e4m3fn[M, I], scales)` as `fp8_block_quant` returns them.

    Raises:
      ValueError: as `fp8_block_quant`, and `gate` / `up` of different shapes or dtypes.
      NotImplementedError: as `fp8_block_quant`.
    """
    return _standalone(
        gate,
        up,
        block_size=block_size,
        scale_format=scale_format,
        scale_layout=scale_layout,
        interpret=interpret,
    )


# -- in the arena ----------------------------------------------------------------------------


def _into(arena, plan, x, up, *, block_size, scale_format, scale_layout, regions, interpret,
          what):  # fmt: skip
    m, k = _validate(
        x,
        up,
        fused=up is not None,
        block_size=block_size,
        scale_format=scale_format,
        scale_layout=scale_layout,
        arena_form=True,
    )
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
    block_size = int(block_size)
    rows = workspaces.fp8_rows(m)
    nb = workspaces.fp8_scale_cols(k, block_size)
    q_name, scale_name, kmajor_name = regions
    note = f"{'gate' if up is not None else 'x'}.shape={(m, k)} with {block_size=}: {rows} rows"
    packed = scale_layout == "packed_ue8m0"
    kmajor = ((kmajor_name, (pl.cdiv(nb, 4), rows), jnp.int32, note + ", packed ue8m0")
              if packed else (kmajor_name, (nb, rows), jnp.float32, note))  # fmt: skip
    plan.check_fits(
        (q_name, (rows, k), jnp.uint8, note),
        (scale_name, (rows, nb), jnp.float32, note),
        kmajor,
        arena=arena,
        what=what,
    )
    if rows == 0 or k == 0:
        return arena
    interpret = resolve_interpret(interpret)
    if k % WORD:
        raise NotImplementedError(
            f"{what} needs K % 4 == 0 (rows of q start on 4-byte words of the arena), got "
            f"K={k}; quantize with the standalone form and plan.write the results"
        )
    offsets = tuple(int(plan.regions[name].offset_bytes) for name in regions)
    bad = [n for n, o in zip(regions, offsets, strict=True) if o % ROW_BYTES]
    if bad:
        raise ValueError(
            f"{what}: regions {bad} do not start on a {ROW_BYTES}-byte arena row; build the "
            f"plan with align_bytes >= {ROW_BYTES}"
        )
    width = pl.next_power_of_2(block_size)
    tile = row_tile(rows, width)
    span = pl.cdiv(rows, tile) * tile * k  # the q offsets the grid computes (masked past R)
    if span >= _I32_LIMIT:
        raise NotImplementedError(
            f"{what}: the q region spans {span} bytes for shape {(m, k)}; in-region offsets "
            "are int32 (below 2^31): quantize in row chunks"
        )
    return quantize_inplace(
        arena,
        x,
        up,
        offsets=offsets,  # type: ignore[arg-type]
        rows=rows,
        block_size=block_size,
        scale_format=scale_format,
        packed=packed,
        interpret=interpret,
    )


_INTO_DOC = """
    With `R = ceil16(M)` (the rows the FP8 GEMMs read) and `nb = ceil(K / block_size)`, each
    written at the start of its region:
      - `{q}`: the e4m3fn bits of q, `[R, K]`, 1 byte per element, row-major;
      - `{s}`: `float32[R, nb]`, one row of scales per token;
      - `{t}`: `scale_layout="col"`: the transpose `float32[nb, R]` (token index contiguous);
        `"packed_ue8m0"`: `int32[ceil(nb / 4), R]`, four UE8M0 exponents per word (DeepGEMM
        SM100's layout; `R` is a multiple of 4 as TMA needs).
    Rows `M..R` hold zeros and the scale of an all-zero group (`1e-4 / 448`; `2**-22` for
    `"ue8m0"`), so a GEMM that reads the pad rows reads finite values; in `{t}` with
    `"packed_ue8m0"` their words are 0 (as vLLM's packed quantizer stores the padding, not
    DeepGEMM's 0x69 floor byte, which an all-zero group of a real row keeps). Bytes past those shapes
    and every other region are left unchanged.

    In place: on a GPU the whole arena goes into the kernel aliased to its output, viewed as
    32-bit words (a bitcast), and the kernel stores every value at its byte position (in
    interpret mode only the regions' rows, written back after the call): no GPU
    temporary grows with M or K, one launch (two with `"packed_ue8m0"`). 32-bit words keep
    every offset exact: Pallas addresses arrays of at most 2^32 bytes with int32 element
    offsets (signed in Triton), and a 4 GiB arena has 2^30 words; larger arenas get 64-bit
    offsets; in-region offsets are int32 and checked to stay below 2^31.
"""


def fp8_block_quant_into(
    arena: jax.Array,
    plan: Any,
    x: jax.Array,
    *,
    block_size: int = 128,
    scale_format: str = "f32",
    scale_layout: str = "col",
    regions: tuple[str, str, str] = FP8_ACT_REGIONS,
    interpret: bool | None = None,
) -> jax.Array:
    """Quantizes `x` like `fp8_block_quant`, writing the results into the arena in place.
    {doc}
    Args:
      arena: the plan's `uint8` arena (`plan.allocate()`). Donate it to the enclosing
        `jax.jit` (`donate_argnums`) for the writes to happen in place (without donation XLA
        copies the arena once); the donated array must not be used afterwards, use the
        returned one.
      plan: a `jaxarena.ArenaPlan` with the three regions, each starting on a 256-byte row
        (the default alignment).
      x: `[M, K]` bfloat16, float16 or float32 activations (not donated), `K % 4 == 0`.
      block_size, scale_format, interpret: as for `fp8_block_quant`.
      scale_layout: `"col"` (default) or `"packed_ue8m0"`: what the third region holds.
      regions: the three region names to write (q, row-major scales, k-major scales); the
        default is the projections' `fp8_act` group. The dense FFN's down projection uses
        `FFN_ACT_REGIONS` (`fp8_silu_mul_quant_into`'s default).

    Returns:
      The arena with the three regions written. Read them with `plan.view(...)`.

    Raises:
      ArenaError (a ValueError): a missing region, a region smaller than the bytes written,
        or an `arena` that is not the plan's `uint8` array (`ArenaPlan.check_fits`).
      ValueError: everything `fp8_block_quant` rejects, a region not on a 256-byte row; all
        before any tracing.
      NotImplementedError: as `fp8_block_quant`; also `K % 4 != 0` or a q region of 2^31
        bytes or more.
    """
    return _into(
        arena,
        plan,
        x,
        None,
        block_size=block_size,
        scale_format=scale_format,
        scale_layout=scale_layout,
        regions=regions,
        interpret=interpret,
        what="fp8_block_quant_into",
    )


def fp8_silu_mul_quant_into(
    arena: jax.Array,
    plan: Any,
    gate: jax.Array,
    up: jax.Array,
    *,
    block_size: int = 128,
    scale_format: str = "f32",
    scale_layout: str = "col",
    regions: tuple[str, str, str] = FFN_ACT_REGIONS,
    interpret: bool | None = None,
) -> jax.Array:
    """`fp8_silu_mul_quant(gate, up)` written into the arena in place, in one kernel pass.

    The seed's dense-FFN FP8 path: the down projection's input `silu(gate) * up` goes straight
    from the gate/up outputs to the `ffn_act_*` regions (`FFN_ACT_REGIONS`, the default); the
    bf16 product never exists in memory.
    {doc}
    Args:
      arena, plan, regions, interpret: as for `fp8_block_quant_into`.
      gate, up: `[M, I]`, the same float dtype, `I % 4 == 0` (not donated).
      block_size, scale_format, scale_layout: as for `fp8_block_quant_into`.

    Returns:
      The arena with the three regions written.

    Raises:
      As `fp8_block_quant_into`, and `gate` / `up` of different shapes or dtypes.
    """
    return _into(
        arena,
        plan,
        gate,
        up,
        block_size=block_size,
        scale_format=scale_format,
        scale_layout=scale_layout,
        regions=regions,
        interpret=interpret,
        what="fp8_silu_mul_quant_into",
    )


fp8_block_quant_into.__doc__ = fp8_block_quant_into.__doc__.replace(  # type: ignore[union-attr]
    "{doc}", _INTO_DOC.format(q="fp8_act", s="fp8_act_scale", t="fp8_act_scale_kmajor")
)
fp8_silu_mul_quant_into.__doc__ = fp8_silu_mul_quant_into.__doc__.replace(  # type: ignore[union-attr]
    "{doc}", _INTO_DOC.format(q="ffn_act_a", s="ffn_act_scale", t="ffn_act_scale_kmajor")
)
