"""The kernel backend choice: each Pallas kernel call a block makes, dispatched on
`Env.kernels` to the kernel (`"pallas"`) or to its plain-XLA implementation (`"xla"`).

The wrappers take the kernels' own arguments plus `kernels=`; with `"pallas"` they call the
kernel unchanged. With `"xla"` they compute the same result in `jnp` and keep the arena
side effects a block reads back: the attention output regions (`attn_output`) are written
as the kernels write them. The scratch the kernels use internally (the split-K partials in
`splitk_workspace`) is not written: no block reads it, and its bytes are undefined between
steps anyway.

`"xla"` exists for the CPU, where the kernels run in the Pallas interpreter (program by
program: a 28-layer Qwen3-0.6B-width model decoded 3.4 tokens/s on 2 cores); the kernels
stay the GPU path and the model tests keep testing them by default (`"pallas"`).
"""

from __future__ import annotations

from typing import Any

import jax

import pallas_kernels as pk
from jaxarena.models.core import xla_attention as xa

__all__ = [
    "KERNELS",
    "check_kernels",
    "paged_prefill_attention",
    "paged_prefill_attention_into",
    "resolve_kernels",
    "splitk_decode_attention_into",
]

KERNELS: tuple[str, ...] = ("pallas", "xla")
"""The backends a model runs (`Env.kernels`); `load_pretrained` also takes `"auto"`."""


def check_kernels(kernels: Any, name: str = "kernels") -> str:
    """`kernels` if it is one of `KERNELS`, else a ValueError naming `name`."""
    if kernels not in KERNELS:
        raise ValueError(f"{name}={kernels!r} must be one of {KERNELS}")
    return kernels


def resolve_kernels(kernels: Any) -> str:
    """`"auto"` -> `"xla"` when the default backend is the CPU, else `"pallas"`; the other
    values are checked and returned."""
    if kernels == "auto":
        return "xla" if jax.default_backend() == "cpu" else "pallas"
    return check_kernels(kernels)


def _attn_opts(kw: dict[str, Any]) -> dict[str, Any]:
    """The kernels' keyword options as `xla_attention` names them (policy args dropped)."""
    out = {"window": kw.pop("window_size", None)}
    for name in ("sm_scale", "softcap", "sinks", "k_scale", "v_scale", "v_head_dim"):
        out[name] = kw.pop(name, None)
    for name in ("interpret", "levers", "target", "num_splits"):  # the kernels' own choices
        kw.pop(name, None)
    if kw:
        raise TypeError(f"the XLA attention path does not take {sorted(kw)}")
    return out


def splitk_decode_attention_into(arena: jax.Array, plan: Any, q: jax.Array, k_cache, v_cache,
                                 block_tables, seq_lens, *, kernels: str = "pallas",
                                 **kw: Any) -> jax.Array:  # fmt: skip
    """`pallas_kernels.splitk_decode_attention_into`, or with `kernels="xla"` the same
    output (`[B, Hq * D_v]` in q's dtype at the start of `attn_output`) from
    `xla_attention.decode_attention_xla`."""
    if check_kernels(kernels) == "pallas":
        return pk.splitk_decode_attention_into(arena, plan, q, k_cache, v_cache, block_tables,
                                               seq_lens, **kw)  # fmt: skip
    out = xa.decode_attention_xla(q, k_cache, v_cache, block_tables, seq_lens,
                                  **_attn_opts(kw))  # fmt: skip
    return plan.write(arena, "attn_output", out.reshape(out.shape[0], -1))


def paged_prefill_attention(q: jax.Array, k_cache, v_cache, block_tables, cu_seqlens_q,
                            seq_lens, *, kernels: str = "pallas",
                            **kw: Any) -> jax.Array:  # fmt: skip
    """`pallas_kernels.paged_prefill_attention`, or with `kernels="xla"`
    `xla_attention.prefill_attention_xla` (the same `[T, Hq, D_v]` in q's dtype)."""
    if check_kernels(kernels) == "pallas":
        return pk.paged_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q,
                                          seq_lens, **kw)  # fmt: skip
    return xa.prefill_attention_xla(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens,
                                    **_attn_opts(kw))  # fmt: skip


def paged_prefill_attention_into(arena: jax.Array, plan: Any, q: jax.Array, k_cache, v_cache,
                                 block_tables, cu_seqlens_q, seq_lens, *,
                                 kernels: str = "pallas", **kw: Any) -> jax.Array:  # fmt: skip
    """`pallas_kernels.paged_prefill_attention_into` (MLA's latent prefill), or with
    `kernels="xla"` the same output written at the start of `region` (`attn_output`)."""
    if check_kernels(kernels) == "pallas":
        return pk.paged_prefill_attention_into(arena, plan, q, k_cache, v_cache, block_tables,
                                               cu_seqlens_q, seq_lens, **kw)  # fmt: skip
    region = kw.pop("region", "attn_output")
    out = xa.prefill_attention_xla(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens,
                                   **_attn_opts(kw))  # fmt: skip
    return plan.write(arena, region, out.reshape(out.shape[0], -1))
