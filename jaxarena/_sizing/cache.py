"""KV-cache bytes per token and recurrent-state bytes per sequence, per device.

* `kv_bytes_per_token`: what one more token of context costs over the layers whose cache grows
  with the context (full attention, MLA latents).
* `state_bytes_per_sequence`: the fixed per-sequence state (Mamba / gated-delta-net conv and
  SSM states, sliding-window KV capped at the window).

Per device under tp: heads, groups and KV heads of `config.shard(tp, ep)` (KV heads replicated
when fewer than tp; MLA latents on every device).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from jaxarena._sizing.weights import layer_kinds

if TYPE_CHECKING:  # pragma: no cover
    from jaxarena._config.model import ModelConfig

__all__ = ["dtype_bytes", "kv_bytes_per_token", "sliding_tokens", "state_bytes_per_sequence"]

_DTYPE_BYTES = {"bf16": 2, "fp8": 1}


def dtype_bytes(name: str, what: str) -> int:
    if not isinstance(name, str) or name not in _DTYPE_BYTES:
        raise ValueError(f"{what}={name!r} must be one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def _cache_layers(c: Any) -> Iterator[tuple[str, bool]]:
    """(mixer kind, sliding) per layer that keeps a KV cache."""
    raw = c.layer_types or ()
    for i, kind in enumerate(layer_kinds(c)):
        if kind in ("attention", "mla"):
            sliding = bool(raw) and raw[i] == "sliding_attention" and c.sliding_window > 0
            yield kind, sliding


def _kv_per_token_layer(c: Any, kind: str, itemsize: int) -> int:
    if kind == "mla":
        return (c.kv_lora_rank + c.qk_rope_head_dim) * itemsize
    return 2 * c.num_key_value_heads * c.head_dim * itemsize


def kv_bytes_per_token(
    config: ModelConfig, kv_dtype: str = "bf16", *, tp: int = 1, ep: int = 1
) -> int:
    """KV-cache bytes one more token of context costs on one device, over every layer whose
    cache grows with the context (full attention: `2 * kv_heads * head_dim`; MLA: the latent
    `kv_lora_rank + qk_rope_head_dim`, replicated on every tp device). Sliding-window layers are
    capped and so counted in `state_bytes_per_sequence` instead.

    KV heads under tp are those of `config.shard(tp)`: when there are fewer KV heads than
    devices each device keeps one, so the per-device bytes stop shrinking at tp = kv_heads.
    """
    itemsize = dtype_bytes(kv_dtype, "kv_dtype")
    c = config.shard(tp=tp, ep=ep) if (tp, ep) != (1, 1) else config
    return sum(
        _kv_per_token_layer(c, k, itemsize) for k, sliding in _cache_layers(c) if not sliding
    )


def sliding_tokens(window: int, max_seq_len: int, kv_block_size: int) -> int:
    """Cache slots a sliding-window layer holds per sequence: `min(window, max_seq_len)` in a
    ring buffer; paged, the blocks a window of that many tokens can touch at any alignment,
    `ceil((w - 1) / B) + 1` blocks of `B` tokens (capped at the sequence's own blocks)."""
    w = min(window, max_seq_len)
    if kv_block_size <= 0:
        return w
    blocks = min(-(-(w - 1) // kv_block_size) + 1, -(-max_seq_len // kv_block_size))
    return blocks * kv_block_size


def state_bytes_per_sequence(
    config: ModelConfig,
    *,
    max_seq_len: int,
    kv_block_size: int = 0,
    kv_dtype: str = "bf16",
    state_dtype: str = "f32",
    tp: int = 1,
    ep: int = 1,
) -> int:
    """Fixed bytes one sequence holds on one device whatever its length (beyond the window):

    * Mamba-2: conv state `(conv_kernel - 1) * (d_inner + 2 * n_groups * d_state)` in bf16 and
      SSM state `heads * head_dim * d_state` in `state_dtype`;
    * gated delta net: conv state `(conv_kernel - 1) * (2 * k_heads * k_dim + v_heads *
      v_dim)` in bf16 and the recurrent state `v_heads * k_dim * v_dim` in `state_dtype`;
    * Mamba-1: conv `(conv_kernel - 1) * d_inner` bf16 and SSM `d_inner * d_state`;
    * sliding-window attention: the KV of `sliding_tokens(window, max_seq_len, kv_block_size)`
      tokens in `kv_dtype`.

    Per device under tp: heads and groups of `config.shard(tp)`.
    """
    state_item = {"f32": 4, "bf16": 2}.get(state_dtype)
    if state_item is None:
        raise ValueError(f"state_dtype={state_dtype!r} must be 'f32' or 'bf16'")
    kv_item = dtype_bytes(kv_dtype, "kv_dtype")
    c = config.shard(tp=tp, ep=ep) if (tp, ep) != (1, 1) else config
    k1 = max(c.conv_kernel - 1, 0)
    total = 0
    for kind in layer_kinds(c):
        if kind == "mamba2":
            total += k1 * c.mamba2_d_xbc * 2
            total += c.mamba_num_heads * c.mamba_head_dim * c.ssm_state_size * state_item
        elif kind == "gdn":
            conv = 2 * c.linear_num_key_heads * c.linear_key_head_dim
            conv += c.linear_num_value_heads * c.linear_value_head_dim
            total += k1 * conv * 2
            total += (
                c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
                * state_item
            )  # fmt: skip
        elif kind == "mamba1":
            di = c.mamba1_d_inner
            total += k1 * di * 2 + di * c.mamba1_d_state * state_item
    window = c.sliding_window
    for kind, sliding in _cache_layers(c):
        if sliding:
            tokens = sliding_tokens(window, max_seq_len, kv_block_size)
            total += tokens * _kv_per_token_layer(c, kind, kv_item)
    return total
