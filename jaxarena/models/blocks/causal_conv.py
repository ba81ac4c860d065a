"""The causal depthwise conv1d of the SSM blocks (Mamba-2, Gated DeltaNet) over a packed
prefill, and what a chunked prefill continues from: each sequence's last pre-conv inputs
(its conv window, `kernel - 1` rows) and its recurrent state, taken from the block's cache
where the sequence has cached tokens (`StepContext.cached_lens > 0`), zeros where it starts
in this pass (its cache row may still hold an earlier request's values).

Cost (H200 deviceless, `benchmarks/step_costs.py` widths, 2048 tokens, 9 cache rows): a plain
prefill lowers to the ops it did before the window existed; a chunk (`cached_lens` given)
adds the masked copies of the states, which the scan kernels read apart from the final
states they write (`S x` a state's bytes of temp): mamba2-2.7b, 2 layers, 36 -> 38 launches,
131.3 -> 153.8 MiB of temp; Qwen3-Next widths, 4 layers (3 GDN), 86 -> 89, 208.5 -> 224.2 MiB.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxarena.models.blocks.base import StepContext

__all__ = ["cached_or_zeros", "prefill_conv"]


def cached_or_zeros(entry: jax.Array, ctx: StepContext) -> jax.Array | None:
    """Rows `0..S-1` of a cache entry (`[rows, ...]`, sequence s in row s) where the sequence
    continues from an earlier chunk (`ctx.cached_lens[s] > 0`), zeros where it starts here;
    None in a plain prefill (`ctx.cached_lens` None), where every sequence starts here."""
    if ctx.cached_lens is None:
        return None
    if ctx.x is not None:
        # Read once this block's input exists: the copy depends on nothing the earlier
        # layers compute, so XLA would make every layer's copy at the top of the pass (one
        # multi-output fusion) and keep them all alive (mamba2-2.7b, 64 layers, 65 cache
        # rows: 8 GB of prefill temp, one state per layer and row).
        entry, _ = jax.lax.optimization_barrier((entry, ctx.x))
    s = ctx.cached_lens.shape[0]
    keep = (ctx.cached_lens > 0).reshape((s,) + (1,) * (entry.ndim - 1))
    return jnp.where(keep, entry[:s], jnp.zeros((), entry.dtype))


def prefill_conv(x: jax.Array, w: jax.Array, ctx: StepContext, *, bias: jax.Array | None = None,
                 window: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """Causal depthwise conv1d (before its activation) within each packed sequence, and the
    window a later step continues from.

    Args:
      x: `float32[T, D]`, the pre-conv inputs of the pass, packed by `ctx.cu_seqlens`
        (`int32[S + 1]`, a sequence may have no token here) and `ctx.seq_ids`.
      w: `[K, D]`, the taps: output row t is `sum_j x[t - j] * w[K - 1 - j]`.
      ctx: the prefill's context.
      bias: optional `[D]`, added first.
      window: None: every sequence starts in this pass (inputs before its start are zeros).
        Else `float32[S, K - 1, D]`, each sequence's last `K - 1` pre-conv inputs before this
        pass, oldest first (zeros for a sequence that starts here: `cached_or_zeros`); the
        first `K - 1` tokens of a sequence read their taps before its start from it.

    Returns:
      `(conv float32[T, D], new_window float32[S, K - 1, D])`: the new window is the last
      `K - 1` inputs of (window ++ the sequence's tokens here), so a sequence with fewer than
      `K - 1` tokens keeps the newest part of its old window, one with none keeps it whole.
    """
    kk, cu, seq = w.shape[0], ctx.cu_seqlens, ctx.seq_ids
    idx = jnp.arange(x.shape[0], dtype=jnp.int32)
    conv = x * w[kk - 1] if bias is None else bias + x * w[kk - 1]
    # A token's index within its sequence's part of this pass.
    local = None if window is None else idx - cu[seq]
    for j in range(1, kk):
        same = (idx >= j) & (jnp.roll(seq, j) == seq)
        if window is None:
            before = 0.0
        else:
            # Tap j of a token fewer than j rows into its sequence reads window row
            # K - 1 + local - j (in 0..K-2 exactly there; clipped elsewhere, unused).
            before = window[seq, jnp.clip(kk - 1 + local - j, 0, kk - 2)]
        conv = conv + jnp.where(same[:, None], jnp.roll(x, j, axis=0), before) * w[kk - 1 - j]
    # The new window, oldest first: input j rows before each sequence's end.
    if window is not None:
        n = cu[1:] - cu[:-1]
        rows = jnp.arange(n.shape[0], dtype=jnp.int32)
    win = []
    for j in range(kk - 1, 0, -1):
        pos = cu[1:] - j
        before = 0.0 if window is None else window[rows, jnp.clip(kk - 1 + n - j, 0, kk - 2)]
        win.append(jnp.where((pos >= cu[:-1])[:, None], x[jnp.maximum(pos, 0)], before))
    return conv, jnp.stack(win, 1)
