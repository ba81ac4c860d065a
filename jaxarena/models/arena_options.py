"""Two choices `load_pretrained` makes about a model's arena and caches: the KV cache's dtype
(`with_kv_dtype`) and the packed plan from recorded lifetimes (`packed_plan`)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxarena import ArenaPlan, BufferSizes, record_lifetimes
from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.mla import MLA
from jaxarena.models.stack import ArenaLM

__all__ = ["GUARD_BYTES", "packed_plan", "with_kv_dtype"]

# Guard bytes after every region of a loaded model's arena (checked by the tests).
GUARD_BYTES = 64


def with_kv_dtype(arch: Any, kv_dtype: str, root: Path) -> Any:
    """`arch` with every attention block's paged cache in `kv_dtype`.

    Raises:
      NotImplementedError: `kv_dtype="fp8"` and MLA blocks (their latent cache: the absorbed
        prefill and decode read bf16 latents only).
    """
    if kv_dtype == "bf16":
        return arch
    other = sorted({b.kind for b in arch.blocks if isinstance(b, MLA)})
    if other:
        raise NotImplementedError(
            f"{root}: kv_dtype={kv_dtype!r} is implemented for GQA attention caches only; this "
            f"model's {other} blocks (MLA's latent cache) keep a bf16 cache: load it with "
            "kv_dtype='bf16'"
        )
    blocks = tuple(dataclasses.replace(b, kv_dtype=kv_dtype) if isinstance(b, Attention) else b
                   for b in arch.blocks)  # fmt: skip
    return dataclasses.replace(arch, blocks=blocks)


def packed_plan(model: ArenaLM, sizes: BufferSizes, params, caches, tables) -> ArenaPlan:
    """A packed plan from the recorded lifetimes of prefill (all-token logits, the larger
    write) and decode; buffers neither step views or writes get no region (`drop_unnamed`:
    under the step rule most of the seed's activation buffers are XLA values)."""
    arena = jax.ShapeDtypeStruct(model.plan.arena_shape, jnp.uint8)
    t, s = model.max_batch_tokens, model.max_batch_size + 1
    tok = jax.ShapeDtypeStruct((t,), jnp.int32)
    cu = jax.ShapeDtypeStruct((s + 1,), jnp.int32)
    rows = jax.ShapeDtypeStruct((model.max_batch_size,), jnp.int32)
    # The one-pass prefill: a chunked one uses the same regions, inside a `lax.scan`.
    one_pass = dataclasses.replace(model, prefill_chunk=None)
    lt = record_lifetimes(functools.partial(one_pass.prefill, all_logits=True), params, arena,
                          caches, tok, cu, tables[:s], mode="prefill")  # fmt: skip
    lt = lt | record_lifetimes(model.decode_step, params, arena, caches, rows, rows,
                               tables[: model.max_batch_size], rows, mode="decode")  # fmt: skip
    plan = ArenaPlan.packed(sizes, lt, guard_bytes=GUARD_BYTES, drop_unnamed=True)
    plan.validate(lt)
    return plan
