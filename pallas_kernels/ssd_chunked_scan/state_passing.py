"""Phase 2 of the SSD scan: the chunk-to-chunk state passing, one Pallas kernel per call.

`pass_states` turns each chunk's own state contribution into the state entering every chunk
(`h_in`), over a packed stream of sequences. The per-chunk bookkeeping (which sequence runs
across each chunk edge, where the chunk's last sequence starts, the decay over that part) is
elementwise jnp over chunks; the walk over the chunks is `ssd_state_passing_kernel`, one
program per (head, block of state elements) looping over the chunks inside the kernel, so the
number of launches does not depend on the number of chunks (an XLA while loop would launch a
few kernels per chunk).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.ssd_chunked_scan.kernel import ssd_state_passing_kernel

__all__ = ["STATE_BLOCK", "pass_states"]

STATE_BLOCK: int = 1024
"""State elements (of `P * N`) one program carries across the chunks: 8 f32 per thread at
4 warps (40 registers on sm_90a, no spills); `H * P * N / 1024` programs (512 for H=64,
P=64, N=128)."""


def pass_states(
    chunk_states: jax.Array,
    dA_cumsum: jax.Array,
    seq: jax.Array,
    cu_seqlens: jax.Array,
    init: jax.Array,
    *,
    interpret: bool,
    block: int = STATE_BLOCK,
) -> jax.Array:
    """The state of the sequence running at each chunk's first token, before that token.

    Chunks are `L` tokens cut from token 0 of the packed stream. For chunk `c`, let `first`
    and `last` be the sequences of its first and last token. `h_in[c]` is `first`'s state
    entering the chunk: its initial state if it starts at the chunk's first token, else the
    state carried out of chunk `c - 1`. The state carried out of chunk `c` belongs to `last`:
    `decay[c] * (last starts inside c ? init[last] : h_in[c]) + chunk_states[c]`, with
    `decay[c] = exp(dA_cumsum[c, L-1] - dA_cumsum[c, p-1])` over the part of the chunk from
    `last`'s start `p` (or from the chunk start, `p = 0`, where the sum is the whole row).

    Args:
      chunk_states: `[nc, H, P, N]` f32, chunk c's own contribution to the state of its last
        sequence at the chunk's end (from zero at the sequence's start or the chunk start).
        Consumed: the result reuses its buffer (`input_output_aliases`).
      dA_cumsum: `[H, nc, L]` f32, the within-chunk inclusive cumulative sum of `dt' A`.
      seq: `[nc * L]` int32, each token's sequence (non-decreasing; padding tokens past the
        stream's end belong to the last sequence).
      cu_seqlens: `[S + 1]` int32 sequence starts (`seq[t]` is the last `s` with
        `cu_seqlens[s] <= t`).
      init: `[S, H, P, N]` f32 initial states.
      interpret: run the Pallas interpreter (CPU) instead of compiling for the GPU.
      block: state elements per program; a power of two dividing `P * N`, at most the product.

    Returns:
      `h_in` `[nc, H, P, N]` f32.
    """
    nc, H, P, N = chunk_states.shape
    L = dA_cumsum.shape[-1]
    S = init.shape[0]
    E = P * N
    block = min(block, E)
    if E % block or block & (block - 1):
        raise ValueError(f"{block=} must be a power of two dividing P * N = {E}")
    cu = cu_seqlens.astype(jnp.int32)
    seq_c = seq.reshape(nc, L)
    chunk_start = jnp.arange(nc, dtype=jnp.int32) * L
    s0, s_last = seq_c[:, 0], seq_c[:, -1]
    # The first sequence of chunk c continues from chunk c - 1 iff it started before c * L.
    continues = cu[s0] < chunk_start
    # The last sequence of chunk c starts at offset p_last > 0 inside it, or continues.
    p_last = cu[s_last] - chunk_start
    fresh_last = p_last > 0
    base_last = jnp.take_along_axis(dA_cumsum, jnp.clip(p_last - 1, 0, L - 1)[None, :, None], 2)
    base_last = jnp.where(fresh_last[None, :], base_last[..., 0], 0.0)  # [H, nc]
    decay = jnp.exp(dA_cumsum[:, :, -1] - base_last)  # [H, nc]
    meta = jnp.stack([continues.astype(jnp.int32), fresh_last.astype(jnp.int32), s0, s_last])
    whole = pl.no_block_spec
    h_in = pl.pallas_call(
        functools.partial(ssd_state_passing_kernel, num_chunks=nc, block=block),
        grid=(H, E // block),
        in_specs=[whole, whole, whole, whole],
        out_specs=whole,
        out_shape=jax.ShapeDtypeStruct((nc, H, E), jnp.float32),
        # h_in replaces the chunk states in their buffer (one [nc, H, P, N] f32 less).
        input_output_aliases={0: 0},
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="ssd_state_passing",
    )(
        chunk_states.astype(jnp.float32).reshape(nc, H, E),
        decay,
        meta,
        init.astype(jnp.float32).reshape(S, H, E),
    )
    return h_in.reshape(nc, H, P, N)
