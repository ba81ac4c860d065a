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
from jaxarena.models.core import xla_gdn, xla_moe, xla_ssd
from pallas_kernels.grouped_gemm import grouped_gemm_fp8_into as _gg_fp8_into

__all__ = [
    "KERNELS",
    "check_kernels",
    "gdn_chunked_into",
    "gdn_state_update",
    "grouped_gemm",
    "grouped_gemm_fp8_into",
    "paged_prefill_attention",
    "paged_prefill_attention_into",
    "resolve_kernels",
    "splitk_decode_attention_into",
    "splitk_decode_attention_value",
    "ssd_chunked_scan_into",
    "ssd_state_update",
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
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r} must be one of {(*KERNELS, 'auto')}")
    return kernels


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
    in_arena = kw.pop("output_in_arena", True)
    out = xa.decode_attention_xla(q, k_cache, v_cache, block_tables, seq_lens,
                                  **_attn_opts(kw))  # fmt: skip
    if not in_arena:
        return arena, out
    return plan.write(arena, "attn_output", out.reshape(out.shape[0], -1))


def splitk_decode_attention_value(arena: jax.Array, plan: Any, q: jax.Array, k_cache,
                                  v_cache, block_tables, seq_lens, *, kernels: str = "pallas",
                                  **kw: Any) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`splitk_decode_attention_into` with `output_in_arena=False`: `(arena, out [B, Hq,
    D_v])`, the partials in `splitk_workspace` and the output a value (what a GEMM reads
    next; see the kernel's docstring). The arena comes back tied to the output by an
    optimization barrier, so a later write of the arena is ordered after the combine's read
    of the partials."""
    arena, out = splitk_decode_attention_into(arena, plan, q, k_cache, v_cache, block_tables,
                                              seq_lens, kernels=kernels,
                                              output_in_arena=False, **kw)  # fmt: skip
    out, arena = jax.lax.optimization_barrier((out, arena))
    return arena, out


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


def grouped_gemm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                 kernels: str = "pallas", **kw: Any) -> jax.Array:  # fmt: skip
    """`pallas_kernels.grouped_gemm.grouped_gemm` (the MoE experts), or with `kernels="xla"`
    `xla_moe.grouped_gemm_xla`."""
    if check_kernels(kernels) == "pallas":
        return pk.grouped_gemm(lhs, rhs, group_sizes, **kw)
    kw.pop("interpret", None)
    kw.pop("block_m", None)
    return xla_moe.grouped_gemm_xla(lhs, rhs, group_sizes, **kw)


def grouped_gemm_fp8_into(arena: jax.Array, plan: Any, x: jax.Array, w: jax.Array,
                          scale_inv: jax.Array, group_sizes: jax.Array, *,
                          kernels: str = "pallas", **kw: Any) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`pallas_kernels.grouped_gemm.grouped_gemm_fp8_into`, or with `kernels="xla"`
    `xla_moe.grouped_gemm_fp8_xla`. The XLA path writes nothing in `moe_fp8_scratch`: the
    slab is the kernel's own input (quantized rows, work list, counter), read by no block."""
    if check_kernels(kernels) == "pallas":
        return _gg_fp8_into(arena, plan, x, w, scale_inv, group_sizes, **kw)
    for name in ("interpret", "layout", "region"):
        kw.pop(name, None)
    return arena, xla_moe.grouped_gemm_fp8_xla(x, w, scale_inv, group_sizes, **kw)


def ssd_chunked_scan_into(arena: jax.Array, plan: Any, x: jax.Array, dt: jax.Array,
                          A: jax.Array, B: jax.Array, C: jax.Array, *, kernels: str = "pallas",
                          **kw: Any) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """`pallas_kernels.ssd_chunked_scan_into` (Mamba-2 prefill), or with `kernels="xla"`
    `xla_ssd.ssd_scan_xla`: the same `(arena, y, final_states)`, `ssd_scratch` unwritten (the
    kernel's own intermediates, read by no block)."""
    if check_kernels(kernels) == "pallas":
        return pk.ssd_chunked_scan_into(arena, plan, x, dt, A, B, C, **kw)
    kw.pop("interpret", None)
    return (arena, *xla_ssd.ssd_scan_xla(x, dt, A, B, C, **kw))


def ssd_state_update(state: jax.Array, x: jax.Array, dt: jax.Array, A: jax.Array,
                     B: jax.Array, C: jax.Array, *, kernels: str = "pallas",
                     **kw: Any) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`pallas_kernels.ssd_state_update` (Mamba-2 decode; rows `0..B-1` of the state cache),
    or with `kernels="xla"` `xla_ssd.ssd_state_update_xla`."""
    if check_kernels(kernels) == "pallas":
        return pk.ssd_state_update(state, x, dt, A, B, C, **kw)
    kw.pop("interpret", None)
    return xla_ssd.ssd_state_update_xla(state, x, dt, A, B, C, **kw)


def gdn_chunked_into(arena: jax.Array, plan: Any, q: jax.Array, k: jax.Array, v: jax.Array,
                     g: jax.Array, beta: jax.Array, *, kernels: str = "pallas",
                     **kw: Any) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """`pallas_kernels.gdn_chunked_into` (Gated DeltaNet prefill), or with `kernels="xla"`
    `xla_gdn.gdn_scan_xla`: the same `(arena, o, final_states)`, `gdn_fla_scratch` unwritten
    (the kernel's chunk intermediates, read by no block)."""
    if check_kernels(kernels) == "pallas":
        return pk.gdn_chunked_into(arena, plan, q, k, v, g, beta, **kw)
    kw.pop("interpret", None)
    return (arena, *xla_gdn.gdn_scan_xla(q, k, v, g, beta, **kw))


def gdn_state_update(state: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array,
                     g: jax.Array, beta: jax.Array, *, kernels: str = "pallas",
                     **kw: Any) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`pallas_kernels.gdn_state_update` (Gated DeltaNet decode), or with `kernels="xla"`
    `xla_gdn.gdn_state_update_xla`."""
    if check_kernels(kernels) == "pallas":
        return pk.gdn_state_update(state, q, k, v, g, beta, **kw)
    kw.pop("interpret", None)
    return xla_gdn.gdn_state_update_xla(state, q, k, v, g, beta, **kw)
