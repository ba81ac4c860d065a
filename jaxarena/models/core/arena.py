"""Arena access for the blocks: store and load an activation region, and the linear layer.

Activations live in the arena's regions as bfloat16 (the seed sizes activations for bf16);
arithmetic is float32. `put` stores, `get` reads back from the NEWEST arena: XLA orders
in-place updates by data dependencies only, so a block re-reads what it needs where it uses
it.

Linear layers. A weight is one of
- a float array `[in, out]` (bf16 from a checkpoint, f32 for random weights): `x @ w`;
- an FP8 weight `{"w": float8_e4m3fn[out, in], "scale_inv": float32[ceil(out/128),
  ceil(in/128)]}` (the Qwen3-FP8 / DeepSeek-V3 format): the input is quantized 1 x 128 by the
  `fp8_block_quant` kernel into the arena's FP8 regions (in decode as values: `linear`'s
  `act_values`) and multiplied block-scaled (`fp8_block_matmul`);
- a tuple of those (FP8 q/k/v; gate/up where `fuse_outputs` cannot join them into one
  weight): the outputs concatenated; the input is quantized once.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ArenaPlan, workspaces
from jaxarena.models.core.xla_fp8 import fp8_block_matmul_xla, fp8_block_quant_xla
from pallas_kernels import fp8_block_quant, fp8_block_quant_into
from pallas_kernels._args import resolve_interpret
from pallas_kernels.grouped_gemm.ops import default_block_m, fp8_config, run_gemm

__all__ = [
    "BF16",
    "F32",
    "put",
    "get",
    "stored",
    "linear",
    "fp8_block_matmul",
    "is_fp8",
    "dequant_weight",
    "fp8_regions",
    "fuse_outputs",
]

BF16 = jnp.bfloat16
F32 = jnp.float32


def is_fp8(w: Any) -> bool:
    """Whether `w` is an FP8 block-scaled weight (`{"w", "scale_inv"}`)."""
    return isinstance(w, dict) and "scale_inv" in w


def _parts(w: Any) -> tuple[Any, ...]:
    return tuple(w) if isinstance(w, (tuple, list)) else (w,)


def dequant_weight(w: dict[str, jax.Array]) -> jax.Array:
    """`float32[in, out]` of an FP8 weight (only where the activation cannot be quantized)."""
    q, s = w["w"], w["scale_inv"]
    n, k = q.shape
    full = jnp.repeat(jnp.repeat(s, workspaces.FP8_BLOCK, 0), workspaces.FP8_BLOCK, 1)[:n, :k]
    return (q.astype(F32) * full).T


def _concat(a: Any, b: Any, axis: int) -> Any:
    """`a` and `b` joined along `axis`: host arrays, or `jax.ShapeDtypeStruct`s (the shapes-only
    reader of `jaxarena.step_report`), whose shape the joined array would have."""
    if isinstance(a, jax.ShapeDtypeStruct):
        shape = list(a.shape)
        shape[axis] += b.shape[axis]
        return jax.ShapeDtypeStruct(tuple(shape), a.dtype)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.concatenate([a, b], axis=axis)
    return jnp.concatenate([a, b], axis=axis)


def fuse_outputs(a: Any, b: Any) -> Any:
    """Linear weights `a` and `b` (same input) as ONE weight whose outputs are `a`'s columns
    then `b`'s, so that `linear` runs one GEMM for both: float `[in, out_a + out_b]`, or FP8
    `{"w": [out_a + out_b, in], "scale_inv"}` with the two scale grids stacked (exact when
    `out_a` is a multiple of the 128 x 128 block: no block then spans both weights).

    Returns the tuple `(a, b)` (two GEMMs, one input quantization) where they cannot be one:
    FP8 with `out_a % 128 != 0`, one FP8 and one float, or two float dtypes. Works on host
    arrays, jax arrays and `jax.ShapeDtypeStruct`s (leaves of the FP8 dict included)."""
    if is_fp8(a) and is_fp8(b):
        if a["w"].shape[0] % workspaces.FP8_BLOCK:
            return (a, b)
        return {k: _concat(a[k], b[k], 0) for k in ("w", "scale_inv")}
    if is_fp8(a) or is_fp8(b) or a.dtype != b.dtype:
        return (a, b)
    return _concat(a, b, 1)


def fp8_regions(plan: ArenaPlan, t: int, k: int,
                *groups: tuple[str, str, str]) -> tuple[str, str, str] | None:  # fmt: skip
    """The first of `groups` (FP8 activation regions: q, row-major scales, k-major scales)
    whose regions in `plan` hold the quantization of `t` rows of width `k`
    (`workspaces.fp8_act_bytes`), or None when none does (the projection then reads its bf16
    input and dequantizes FP8 weights: the same product, one launch more per weight)."""
    need = workspaces.fp8_act_bytes(t, k)
    for group in groups:
        if all(name in plan.regions and plan.regions[name].nbytes >= need[role]
               for name, role in zip(group, ("q", "scale", "kmajor"), strict=True)):  # fmt: skip
            return group
    return None


def fp8_block_matmul(xq: jax.Array, xs: jax.Array, w: dict[str, jax.Array], *,
                     interpret: bool | None = None,
                     kernels: str = "pallas") -> jax.Array:  # fmt: skip
    """Block-scaled product of 1 x 128 quantized activations and 128 x 128 quantized weights.

    Args:
      xq: `float8_e4m3fn[T, K]` activations; xs: `float32[T, ceil(K/128)]` their scales.
      w: `{"w": float8_e4m3fn[N, K], "scale_inv": float32[ceil(N/128), ceil(K/128)]}`.
      interpret: the Pallas kernel's mode (None: interpreted on a CPU, compiled on a GPU).
      kernels: `"xla"`: the same product in plain XLA (`core.xla_fp8`), no kernel.

    Returns:
      `float32[T, N]`: `sum_b xs[t, b] * scale_inv[n // 128, b] * (xq[t, blk b] . w[n, blk b])`,
      accumulated in f32. It is the FP8 grouped GEMM kernel (`grouped_gemm_fp8`'s, the MoE
      experts') with one group of T rows: each program keeps a `[block_m, 64]` f32 tile and
      adds its 32-deep e4m3 dot products scaled by `xs * scale_inv` (DeepGEMM's per-block
      promotion), so no `[T, N, K / 128]` partial products exist; K and N need not be
      multiples of 128 (masked loads read zeros past them).

    Measured (`step_report`, deviceless H200, max_seq_len 4096), against the former float32
    partial-product einsum: DeepSeek-V3 widths with 4 layers (3 dense), prefill 2048 tokens
    17.4 GB -> 982 MB temp, 261 -> 209 launches; decode 8 sequences 67.2 MB -> 2.2 MB,
    268 -> 239 launches. Qwen3-8B widths, 4 layers, FP8 weights: prefill 6.78 GB -> 386 MB,
    174 -> 130; decode 31.9 MB -> 0.93 MB, 189 -> 150. Of the launches left above the bf16
    step's, one copy per quantized input (its scales: the kernel's operands are slices of
    the arena; the decode step now quantizes as values and copies none, `linear`'s
    `act_values`). A loop over the K blocks accumulating `[T, N]` in f32 was the other route:
    2.5 GB and 14,547 launches at that prefill, 14.7 MB and 11,724 at that decode.

    Raises:
      ValueError: operand shapes that do not fit together (naming the operand and the rule).
    """
    t, k = xq.shape
    wq, ws = w["w"], w["scale_inv"]
    n = wq.shape[0]
    blocks = workspaces.fp8_scale_cols(k)
    want = {"xs": (t, blocks), "w": (n, k), "scale_inv": (-(-n // workspaces.FP8_BLOCK), blocks)}
    for name, got in (("xs", xs.shape), ("w", wq.shape), ("scale_inv", ws.shape)):
        if tuple(got) != want[name]:
            raise ValueError(f"{name}.shape={tuple(got)} must be {want[name]} for xq.shape="
                             f"{(t, k)} and {n} output columns (128 x 128 weight blocks)")  # fmt: skip
    if t == 0 or n == 0 or k == 0:
        return jnp.zeros((t, n), F32)
    if kernels == "xla":
        return fp8_block_matmul_xla(xq, xs, w)
    interpret = resolve_interpret(interpret)
    bm = default_block_m(t)
    cfg = fp8_config(t, k, n, 1, bm, gather=False, interpret=interpret)
    # One group of T rows: the work list is static (tile i of group 0), the bounds [0, T) and
    # the "zero group" of rows past T is empty.
    tiles = -(-t // bm)
    items = np.stack([np.zeros(tiles, np.int32), np.arange(tiles, dtype=np.int32)], axis=1)
    bounds = np.array([0, t, t], np.int32)
    count = np.array([tiles], np.int32)
    bits = functools.partial(jax.lax.bitcast_convert_type, new_dtype=jnp.uint8)
    return run_gemm(jnp.asarray(items), jnp.asarray(bounds), jnp.asarray(count), None,
                    bits(xq), xs, bits(wq)[None], ws[None], cfg=cfg, out_dtype=F32,
                    interpret=interpret)  # fmt: skip


def put(plan: ArenaPlan, arena: jax.Array, name: str, value: jax.Array) -> jax.Array:
    """Stores `value` at the start of region `name` as bf16; returns the new arena."""
    return plan.write(arena, name, value.astype(BF16))


def get(plan: ArenaPlan, arena: jax.Array, name: str, shape: tuple[int, ...]) -> jax.Array:
    """Reads bf16 `shape` from the start of region `name`, as float32."""
    return plan.view(arena, name, shape, BF16).astype(F32)


def stored(value: jax.Array) -> jax.Array:
    """`value` rounded as a region stores it (bf16), as float32, without going through the
    arena: for the intermediates no kernel reads or writes in place, which stay XLA values
    that XLA fuses (see "what goes through the arena" in jaxarena/models/README.md). The same
    numbers as `get` after `put`."""
    return value.astype(BF16).astype(F32)


def _bf16_product(x: jax.Array, w: jax.Array) -> jax.Array:
    """`stored(x @ w)` for bf16 values `x` and bf16 `w` as one bf16 GEMM, as float32."""
    return jnp.dot(x.astype(BF16), w, preferred_element_type=BF16).astype(F32)


def _bf16_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x @ w` for bf16 values `x` and a bf16 `w` as a bf16 GEMM with float32 accumulation
    and output: the products `x @ w.astype(F32)` sums (exact bf16 x bf16 products, f32 sums),
    without the float32 copy of the weight that form makes each step (on CPU the copy is most
    of the cost: 14.4 vs 8.4 CPU-ms for `[4, 1024] @ [1024, 6144]`, measured)."""
    return jnp.dot(x.astype(BF16), w, preferred_element_type=F32)


def linear(plan: ArenaPlan, arena: jax.Array, src: Any, shape: tuple[int, int], w: Any,
           regions: tuple[str, ...] | None, *, quant: bool = False,
           interpret: bool | None = None, split: bool = False,
           stored_out: bool = False, act_values: bool = False,
           kernels: str = "pallas") -> tuple[jax.Array, Any]:  # fmt: skip
    """`x @ w` for `x` = region `src` (`shape = (T, K)`), or `src` itself when it is an
    array (a `stored` float32 value, not in the arena); see the module docstring.

    `regions` are the FP8 buffers the input is quantized into when a part of `w` is FP8 (or
    `quant`); None means they cannot hold this K (then the bf16 input is used as stored and
    FP8 weights are dequantized). Returns `(arena, float32[T, sum of outputs])`, or with
    `split` `(arena, tuple of float32[T, out_i])`, one per part (no concatenation).

    `stored_out`: the caller rounds the outputs to bf16 (`stored`) and `x` holds bf16 values
    (a `stored` value or a region). A bf16 weight's product is then a bf16 GEMM with a bf16
    output (float32 accumulation, one rounding: the same numbers as `stored(x @ w)`), so that
    XLA keeps a bf16 output buffer even where it merges GEMMs sharing `x` (its dot merger
    joins gate and up at small T into one output that a later bf16 cast cannot shrink:
    float32 `[2048, 6144]`, 48 MiB, at Qwen3-0.6B widths).

    `kernels="xla"` (`models.core.kernels`): the FP8 quantization and products in plain XLA
    (`core.xla_fp8`); the quantized input stays an XLA value and the FP8 regions are not
    written (only this product reads them). A bf16 weight's product is a bf16 GEMM with a
    float32 output (`x` holds bf16 values, as above: the same products and f32 sums, no
    float32 copy of the weight).

    `act_values` (the decode step, `Env.fp8_act_values`): the FP8 input is quantized by the
    same kernel as values (`fp8_block_quant`, row-major scales), not into `regions`: the
    GEMM reads the kernel's outputs, where an arena region would be copied out for it (a
    GEMM cannot read a slice of the uint8 arena in place: two copies per quantized input).
    The same numbers bit for bit (one kernel arithmetic, `fp8_block_quant.kernel`). The
    values are `T x K` bytes and `T x ceil(K / 128)` scales, small at decode's few rows;
    prefill keeps the regions, whose bytes the plan already holds. `regions` still decides
    whether the input is quantized at all (None: it cannot be, see above).
    """
    t, k = shape
    parts = _parts(w)
    fp8_in = (quant or any(is_fp8(p) for p in parts)) and regions is not None
    if fp8_in:
        x = src.astype(BF16) if not isinstance(src, str) else plan.view(arena, src, shape, BF16)
        if kernels == "xla":
            q, s = fp8_block_quant_xla(x)
        elif act_values:
            q, s = fp8_block_quant(x, interpret=interpret)
        else:
            arena = fp8_block_quant_into(arena, plan, x, regions=regions, interpret=interpret)
            rows, nb = workspaces.fp8_rows(t), workspaces.fp8_scale_cols(k)
            q = plan.view(arena, regions[0], (rows, k), jnp.float8_e4m3fn)[:t]
            s = plan.view(arena, regions[1], (rows, nb), F32)[:t]
        xd = None
        outs = []
        for p in parts:
            if is_fp8(p):
                outs.append(fp8_block_matmul(q, s, p, interpret=interpret, kernels=kernels))
            else:
                if xd is None:
                    xd = q.astype(F32) * jnp.repeat(s, workspaces.FP8_BLOCK, axis=1)[:, :k]
                outs.append(xd @ p.astype(F32))
    else:
        x = src if not isinstance(src, str) else get(plan, arena, src, shape)
        # XLA:CPU (the "xla" kernels' target) runs a bf16 GEMM with a bf16 output 1.7-6x slower
        # than with a float32 one (measured: [4, 1024] @ [1024, 151936] 370 vs 64 ms); the
        # float32 output rounded once by the caller (`stored`) is the same numbers.
        outs = [_bf16_product(x, p) if stored_out and kernels != "xla" and not is_fp8(p)
                and p.dtype == BF16 else
                _bf16_dot(x, p) if kernels == "xla" and not is_fp8(p) and p.dtype == BF16 else
                x @ (dequant_weight(p) if is_fp8(p) else p.astype(F32)) for p in parts]  # fmt: skip
    out = tuple(outs) if split else outs[0] if len(outs) == 1 else jnp.concatenate(outs, -1)
    if isinstance(src, str) or fp8_in and kernels != "xla" and not act_values:
        # The product read arena bytes (the region, or the FP8 buffers just written): tie it
        # to the arena so that the next write waits for it. Without a data dependency (the
        # output is an XLA value, not stored back) XLA could schedule the write first and
        # keep the old arena alive for the read, i.e. copy the whole arena.
        out, arena = jax.lax.optimization_barrier((out, arena))
    return arena, out
