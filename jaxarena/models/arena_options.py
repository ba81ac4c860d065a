"""Choices `load_pretrained` makes about a model's arena and caches: the KV cache's dtype
(`with_kv_dtype`), the page pool and its block tables (`page_tables`, on one device or a
mesh) and the packed plan from recorded lifetimes (`packed_plan`)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ArenaPlan, BufferSizes, record_lifetimes
from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.mla import MLA
from jaxarena.models.stack import ArenaLM

__all__ = ["GUARD_BYTES", "packed_plan", "page_tables", "with_kv_dtype"]

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


def page_tables(model: ArenaLM, kv_pages: int | None) -> tuple[int, jax.Array]:
    """`(pages of the KV pool, block tables int32[max_batch_size + 1, pages_per_seq])`.

    `kv_pages` None: every row's pages of `max_seq_len` tokens, handed out shuffled (so the
    paged reads are exercised as a serving engine would use them). An int: the serving
    engine's pool, that many pages plus the null page 0; the engine hands each step its own
    block tables, so these point every row at the null page.

    Raises:
      ValueError: `kv_pages` is neither None nor an int >= 1.
    """
    rows = model.max_batch_size + 1  # + the padding sequence of a fixed-shape prefill
    per_seq = model.pages_per_seq
    if kv_pages is None:
        perm = np.random.default_rng(0).permutation(rows * per_seq).astype(np.int32)
        return rows * per_seq, jnp.asarray(perm.reshape(rows, per_seq))
    if isinstance(kv_pages, bool) or not isinstance(kv_pages, int) or kv_pages < 1:
        raise ValueError(f"kv_pages={kv_pages!r} must be an int >= 1 or None")
    return kv_pages + 1, jnp.zeros((rows, per_seq), jnp.int32)


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
