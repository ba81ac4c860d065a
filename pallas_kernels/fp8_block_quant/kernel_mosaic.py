"""The standalone FP8 block quantizer on Pallas' Mosaic GPU backend (`backend="mosaic_gpu"`).

The migration path off Pallas-Triton (deprecated in jax 0.12; README, "Kernels"). Same
arithmetic as the Triton kernel (`kernel.py`): per row and block, `amax = max|x|` in f32,
`scale = max(amax, 1e-4) / 448` (`"ue8m0"`: rounded up to a power of two), `q =
e4m3fn(clamp(x * (1 / scale), -448, 448))`.

Structure (Mosaic GPU's model, not Triton's): one CTA per `[tile, width]` tile on a named
`(rows, blocks)` grid; the tile is copied GMEM -> SMEM by TMA (one barrier), loaded into
registers in the WGMMA layout (64-row tiles; without that annotation Mosaic's layout inference
finds no solution for the row reduction), and q and the scales go back SMEM -> GMEM by TMA. The
scales are written block-major (`[nb, rows]`: a TMA copy needs at least 16 contiguous bytes,
and a `[tile, 1]` column has 4) and transposed by XLA.

Interpret mode is jax's Mosaic GPU interpreter (`plgpu.InterpretGPUParams`, jax >= 0.12), which
runs on the CPU and simulates SMEM, TMA and barriers; there the divisions use `kernel.py`'s
XLA spellings, so the results match the reference bit for bit. Compiled, Mosaic GPU lowers f32
`/` to PTX `div.full.f32` and `1 / s` to `rcp.approx.f32` (seen in the PTX of a deviceless H200
compile with jax 0.12.0.1): up to 2 ulp off, so q can differ from the reference in the last
e4m3 step next to a rounding boundary, which the Triton kernel avoids with inline PTX
(`div.rn.f32`, `rcp.rn.f32`). Not run on a GPU yet.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.fp8_block_quant.kernel import (
    FP8_E4M3_MAX,
    MAX_TILE_ELEMENTS,
    block_scale,
    reciprocal,
)

__all__ = ["MOSAIC_TILE_ROWS", "mosaic_gpu_unavailable", "quantize_mosaic"]

MOSAIC_TILE_ROWS = 64
"""Rows per CTA: the WGMMA register layout's tile height."""


def _plgpu():
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu


def mosaic_gpu_unavailable() -> str | None:
    """Why this jax cannot run the Mosaic GPU kernel here (None when it can).

    Needs `jax.experimental.pallas.mosaic_gpu` with `kernel` and `InterpretGPUParams` (jax >=
    0.12); older versions lack the CPU interpreter (and 0.10 needs absl to import the module).
    """
    try:
        plgpu = _plgpu()
    except Exception as e:  # noqa: BLE001 - ImportError, or absl missing on jax 0.10
        return f"jax {jax.__version__} cannot import Pallas' Mosaic GPU backend ({e})"
    missing = [n for n in ("kernel", "InterpretGPUParams", "Layout") if not hasattr(plgpu, n)]
    if missing:
        return (
            f"jax {jax.__version__}'s Pallas Mosaic GPU backend lacks {missing} (the CPU "
            "interpreter came with jax 0.12)"
        )
    return None


def _body(x_gmem, q_gmem, s_gmem, x_smem, q_smem, s_smem, barrier, *, scale_format, ptx):
    plgpu = _plgpu()
    i, j = jax.lax.axis_index("rows"), jax.lax.axis_index("blocks")
    tile, width = x_smem.shape
    rows, cols = pl.ds(i * tile, tile), pl.ds(j * width, width)
    plgpu.copy_gmem_to_smem(x_gmem.at[rows, cols], x_smem, barrier)
    plgpu.barrier_wait(barrier)
    x = plgpu.load(x_smem, layout=plgpu.Layout.WGMMA).astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=1)
    scale = block_scale(amax, scale_format=scale_format, ptx=ptx)
    inv = jax.lax.broadcast_in_dim(reciprocal(scale, ptx=ptx), x.shape, (0,))
    q_smem[...] = jnp.clip(x * inv, -FP8_E4M3_MAX, FP8_E4M3_MAX).astype(jnp.float8_e4m3fn)
    s_smem[...] = scale
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, q_gmem.at[rows, cols])
    plgpu.copy_smem_to_gmem(s_smem, s_gmem.at[j, rows])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("num_rows", "block_size", "scale_format", "interpret"))
def quantize_mosaic(
    x: jax.Array, *, num_rows: int, block_size: int, scale_format: str, interpret: bool
) -> tuple[jax.Array, jax.Array]:
    """`(q_bits uint8[num_rows, K], scales f32[num_rows, nb])` as `ops._quantize` returns them.

    `x` is `[M, K]` (bf16, f16, f32), validated by the caller, `M <= num_rows`; rows past M
    are zero rows (zeros, the floor scale). `interpret`: the Mosaic GPU interpreter (CPU)
    instead of the compiled kernel.

    Raises:
      NotImplementedError: this jax has no Mosaic GPU interpreter (see
        `mosaic_gpu_unavailable`), or a block wider than the largest tile.
    """
    reason = mosaic_gpu_unavailable()
    if reason is not None:
        raise NotImplementedError(f"backend='mosaic_gpu': {reason}; use backend='triton'")
    plgpu = _plgpu()
    m, k = x.shape
    nb = pl.cdiv(k, block_size)
    width = pl.next_power_of_2(block_size)  # as the Triton kernel: zero columns pad a block
    if MOSAIC_TILE_ROWS * width > 2 * MAX_TILE_ELEMENTS:
        raise NotImplementedError(
            f"backend='mosaic_gpu' takes blocks up to {2 * MAX_TILE_ELEMENTS // MOSAIC_TILE_ROWS}"
            f" columns, got {block_size=}"
        )
    rows = pl.cdiv(num_rows, MOSAIC_TILE_ROWS) * MOSAIC_TILE_ROWS
    # Zero padding leaves every block's max |x| unchanged; zero rows get the floor scale.
    a = jnp.pad(x, ((0, rows - m), (0, nb * block_size - k)))
    if width != block_size:
        a = jnp.pad(a.reshape(rows, nb, block_size), ((0, 0), (0, 0), (0, width - block_size)))
        a = a.reshape(rows, nb * width)
    body = functools.partial(_body, scale_format=scale_format, ptx=False)
    q, scales_t = plgpu.kernel(
        body,
        out_type=[
            jax.ShapeDtypeStruct((rows, nb * width), jnp.float8_e4m3fn),
            jax.ShapeDtypeStruct((nb, rows), jnp.float32),
        ],
        scratch_types=[
            plgpu.SMEM((MOSAIC_TILE_ROWS, width), a.dtype),
            plgpu.SMEM((MOSAIC_TILE_ROWS, width), jnp.float8_e4m3fn),
            plgpu.SMEM((MOSAIC_TILE_ROWS,), jnp.float32),
            plgpu.Barrier(num_arrivals=1),
        ],
        grid=(rows // MOSAIC_TILE_ROWS, nb),
        grid_names=("rows", "blocks"),
        kernel_name="fp8_block_quant_mosaic",
        interpret=plgpu.InterpretGPUParams() if interpret else None,
    )(a)
    q_bits = jax.lax.bitcast_convert_type(q, jnp.uint8)
    if width != block_size:
        q_bits = q_bits.reshape(rows, nb, width)[:, :, :block_size].reshape(rows, nb * block_size)
    return q_bits[:num_rows, :k], scales_t.T[:num_rows]
