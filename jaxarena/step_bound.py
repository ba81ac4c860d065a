"""The least a step must move and compute, whatever its kernels: what `step-report`'s modeled
time is held against (README.md, "The step-time model").

Decode at batch `b`, every sequence attending `context` tokens:
- weights: every parameter read once, but the embedding table only for the `b` rows looked up
  (all of it when the LM head is tied to it) and a MoE layer's routed experts only for the
  expected share of experts `b` tokens touch under uniform routing, `1 - (1 - k / E) ** b`;
- the paged KV caches: `context` tokens read (the new one included: written, then read by
  the attention) and one written per sequence and attention layer (a sliding window is not
  taken into account);
- the recurrent states (Mamba, Gated DeltaNet): each sequence's read and written once.
Prefill of `tokens` tokens cut into prompts of `context` tokens (from empty caches): the same
weights (the experts at the share `tokens` touch), the KV of every token written, the states
written. Flops: `2 * tokens * (dense weights + k / E of the routed experts)`, the LM head's
`2 * vocab * hidden` per sequence, and causal attention's `2 * Hq * (D_qk + D_v)` per query
and visible key.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

__all__ = ["minimum"]

_EXPERT_KEYS = ("w_down", "w_gate_up", "w_up")


def _nbytes(a: Any) -> int:
    return math.prod(a.shape) * np.dtype(a.dtype).itemsize


def _is_expert(path: Any, leaf: Any, experts: int) -> bool:
    keys = {getattr(k, "key", None) for k in path}
    return experts > 0 and bool(keys & set(_EXPERT_KEYS)) and leaf.shape[:1] == (experts,)


def minimum(lm: Any, params: Any, caches: Any, kind: str, *, rows: int, context: int,
            pool: int) -> dict[str, int]:  # fmt: skip
    """`{"min_bytes", "min_flops"}` of one step (`kind`: "decode" at `lm.max_batch_size`
    sequences, "prefill" of `lm.max_batch_tokens` tokens); `rows`: the state caches' rows,
    `pool`: the KV pages of the caches (`abstract_model`'s)."""
    cfg = lm.config
    tokens = lm.max_batch_size if kind == "decode" else lm.max_batch_tokens
    seqs = lm.max_batch_size if kind == "decode" else -(-tokens // max(1, min(context, tokens)))
    experts, k = cfg.num_experts, max(1, cfg.num_experts_per_tok)
    share = 1.0 - (1.0 - k / experts) ** tokens if experts else 1.0
    h = cfg.hidden_size
    weight_bytes = 0.0
    flops = 0.0
    tied = "lm_head" not in params
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        top = getattr(path[0], "key", None)
        n = _nbytes(leaf)
        elems = math.prod(leaf.shape)
        if top == "embed":
            weight_bytes += n if tied else tokens * h * np.dtype(leaf.dtype).itemsize
            flops += 2 * seqs * elems if tied else 0
        elif top == "lm_head":
            weight_bytes += n
            flops += 2 * seqs * elems
        elif _is_expert(path, leaf, experts):
            weight_bytes += n * share
            flops += 2 * tokens * elems * k / experts if leaf.ndim == 3 else 0
        else:
            weight_bytes += n
            flops += 2 * tokens * elems if leaf.ndim == 2 and min(leaf.shape) > 1 else 0
    kv = state = 0
    attention_layers = 0
    for block in caches.values() if isinstance(caches, dict) else []:
        for leaf in jax.tree.leaves(block):
            if leaf.ndim >= 2 and leaf.shape[0] == pool and leaf.shape[1] == lm.kv_block_size:
                per_token = _nbytes(leaf) // (pool * lm.kv_block_size)
                if kind == "decode":
                    kv += tokens * (min(context, lm.max_seq_len) + 1) * per_token
                else:
                    kv += tokens * per_token
                attention_layers += 1
            elif leaf.shape[:1] == (rows,):
                state += (2 if kind == "decode" else 1) * seqs * (_nbytes(leaf) // rows)
    # Attention flops: K and V caches are two leaves per layer (one for a latent MLA cache).
    layers = attention_layers // 2 or attention_layers
    d = cfg.head_dim or (h // max(1, cfg.num_attention_heads))
    keys = tokens * min(context, lm.max_seq_len) if kind == "decode" else \
        tokens * (min(context, tokens) + 1) / 2  # fmt: skip
    flops += layers * 2 * cfg.num_attention_heads * 2 * d * keys
    return {"min_bytes": int(weight_bytes + kv + state), "min_flops": int(flops)}
