"""Public wrappers: the Gated DeltaNet chunked prefill (FLA's algorithm) over packed sequences.

Three Pallas kernels (kernel.py): per (chunk, value head) `gc`, `w`, `u` into the scratch;
per (value head, value-column block) the chunk recurrence with the state on chip, storing the
state entering each chunk (`S`), `v_new` (`uc`) and the final states; per (chunk, value head,
value-column block) the outputs. The launches do not depend on T (the arena form runs them
in rounds when more sequences come than its slots hold: `gdn_chunked_into`). The scratch is a
`uint16[rows, 128]` array of 256-byte rows laid out by `jaxarena.workspaces.gdn_fla_sections`
(W | U | S | uc | gc); in the arena form it is the arena itself (a bitcast) and the kernels
address `gdn_fla_scratch`'s rows, so the intermediates never need a temporary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._args import resolve_interpret
from pallas_kernels.gdn_chunked.checks import (
    GDN_REGION,
    ROW_BYTES,
    Dims,
    as_cu,
    region_chunk_slots,
    section_rows,
    validate,
)
from pallas_kernels.gdn_chunked.kernel import (
    ACTIVE,
    CHUNK,
    FIRST,
    LAST,
    GdnGeom,
    gdn_output_kernel,
    gdn_prep_kernel,
    gdn_state_kernel,
)

__all__ = ["GDN_REGION", "gdn_chunked", "gdn_chunked_into"]

# Value columns per program: the recurrence holds `[K, 32]` f32 of state (32 registers per
# thread at K = 128 and 4 warps); the output kernel a `[64, 64]` f32 accumulator beside the
# `[64, 64]` intra-chunk weights and their bf16 parts. All three run on 8 warps: on 4, at
# 128x128 heads, the output kernel spills and the other two sit at 255 registers (H200:
# 174 / 197 / 182 registers on 8, tests/gpu/test_gdn_gpu.py).
_BLOCK_V_STATE = 32
_BLOCK_V_OUT = 64


def _chunk_map(cu: jax.Array, num_slots: int) -> tuple[jax.Array, jax.Array]:
    """`(cmap int32[4, num_slots], used int32[])`: per chunk slot of the call its sequence,
    first token, valid rows and flags (kernel.py), and the slots in use. Sequence `s` takes
    `ceil(len_s / 64)` consecutive slots from `sum_{r < s} ceil(len_r / 64)` (none when
    empty); round `r` of the arena form runs slots `r NT .. (r + 1) NT - 1` in the region's
    slots `0 .. NT - 1`."""
    S = cu.shape[0] - 1
    lens = cu[1:] - cu[:-1]
    ccu = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum((lens + CHUNK - 1) // CHUNK)])
    c = jnp.arange(num_slots, dtype=jnp.int32)
    # The last s with ccu[s] <= c (skips empty sequences); a count, not a searchsorted loop.
    seq = jnp.sum(ccu[None, 1:S] <= c[:, None], axis=1, dtype=jnp.int32)
    j = c - ccu[seq]
    start = cu[seq] + CHUNK * j
    end = cu[seq + 1]
    n = jnp.clip(end - start, 0, CHUNK)
    active = c < ccu[S]
    flags = jnp.where(j == 0, FIRST, 0) | jnp.where(start + CHUNK >= end, LAST, 0)
    flags = jnp.where(active, flags | ACTIVE, 0)
    cmap = jnp.stack([seq, start, n, flags]).astype(jnp.int32)
    return cmap, ccu[S].astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("geom", "rounds", "interpret"))
def _gdn_impl(q, k, v, g, beta, final, cu, ws, *, geom: GdnGeom, rounds: bool, interpret: bool):
    """The three kernels over `geom.num_chunks` physical slots; `final` enters as the initial
    states (f32, aliased: it becomes the final states). With `rounds`, in a `while_loop` of
    `ceil(slots in use / NT)` rounds, each on the next `NT` slots of the call (`_chunk_map`):
    the scratch, `final` and `o` are carried, and a sequence cut by a round boundary
    continues from its state in `final` (the state kernel)."""
    T, HV, V, nt = geom.num_tokens, geom.num_value_heads, geom.value_dim, geom.num_chunks
    cu = cu.astype(jnp.int32)
    params = plgpu.CompilerParams(num_warps=8, num_stages=1)
    whole = pl.no_block_spec
    g32, beta32 = g.astype(jnp.float32), beta.astype(jnp.float32)
    st = dataclasses.replace(geom, block_v=min(_BLOCK_V_STATE, V))
    out = dataclasses.replace(geom, block_v=min(_BLOCK_V_OUT, V))
    o_shape = jax.ShapeDtypeStruct((T, HV, V), v.dtype)

    # The whole call's map at once (a few hundred ints; (T + 63 S) // 64 slots at most, so
    # ceil of that over NT rounds): a round only slices it.
    bound = max((T + (CHUNK - 1) * geom.num_seqs) // CHUNK, 1)
    cmap_all, used = _chunk_map(cu, -(-bound // nt) * nt if rounds else nt)

    def one_round(base, ws, final, o):
        cmap = lax.dynamic_slice_in_dim(cmap_all, base, nt, axis=1)
        nact = jnp.clip(used - base, 0, nt)[None]
        ws = pl.pallas_call(
            functools.partial(gdn_prep_kernel, geom=geom),
            grid=(nt, HV),
            in_specs=[whole] * 6,
            out_specs=whole,
            out_shape=jax.ShapeDtypeStruct(ws.shape, ws.dtype),
            input_output_aliases={5: 0},
            compiler_params=params,
            interpret=interpret,
            name="gdn_chunk_prep",
        )(cmap, k, v, g32, beta32, ws)
        ws, final = pl.pallas_call(
            functools.partial(gdn_state_kernel, geom=st),
            grid=(HV, V // st.block_v),
            in_specs=[whole] * 5,
            out_specs=[whole, whole],
            out_shape=[jax.ShapeDtypeStruct(ws.shape, ws.dtype),
                       jax.ShapeDtypeStruct(final.shape, final.dtype)],
            input_output_aliases={4: 0, 3: 1},
            compiler_params=params,
            interpret=interpret,
            name="gdn_chunk_state",
        )(cmap, nact, k, final, ws)  # fmt: skip
        # One round writes every row: o is a fresh output. In rounds each writes its chunks'
        # rows of the carried o.
        carried = () if o is None else (o,)
        o = pl.pallas_call(
            functools.partial(gdn_output_kernel, geom=out),
            grid=(nt, HV, V // out.block_v),
            in_specs=[whole] * (4 + len(carried)),
            out_specs=whole,
            out_shape=o_shape,
            input_output_aliases={4: 0} if carried else {},
            compiler_params=params,
            interpret=interpret,
            name="gdn_chunk_output",
        )(cmap, q, k, ws, *carried)
        return ws, final, o

    if not rounds:
        ws, final, o = one_round(0, ws, final, None)
        return o, final, ws
    num_rounds = (used + nt - 1) // nt

    def body(carry):
        r, ws, final, o = carry
        return (r + 1, *one_round(r * nt, ws, final, o))

    # Rows of tokens past cu[S] (none when cu ends at T) are never written: zeros.
    o = jnp.zeros(o_shape.shape, o_shape.dtype)
    carry = (jnp.zeros((), jnp.int32), ws, final, o)
    _, ws, final, o = lax.while_loop(lambda c: c[0] < num_rounds, body, carry)
    return o, final, ws


def _geom(dims: Dims, rows: dict[str, int], num_chunks: int, row0: int, *, scale,
          l2norm) -> GdnGeom:  # fmt: skip
    return GdnGeom(
        num_tokens=dims.num_tokens,
        num_heads=dims.num_heads,
        num_value_heads=dims.num_value_heads,
        key_dim=dims.key_dim,
        value_dim=dims.value_dim,
        num_seqs=dims.num_seqs,
        num_chunks=num_chunks,
        w_row=row0 + rows["W"],
        u_row=row0 + rows["U"],
        s_row=row0 + rows["S"],
        uc_row=row0 + rows["uc"],
        gc_row=row0 + rows["gc"],
        scale=float(dims.key_dim**-0.5 if scale is None else scale),
        l2norm=l2norm,
        block_v=min(_BLOCK_V_STATE, dims.value_dim),
    )


def _prepare(q, k, v, g, beta, cu_seqlens, initial_states, scale, use_qk_l2norm):
    cu_seqlens = as_cu(cu_seqlens)
    dims = validate(
        q, k, v, g, beta,
        cu_seqlens=cu_seqlens, initial_states=initial_states, scale=scale,
        use_qk_l2norm=use_qk_l2norm,
    )  # fmt: skip
    if cu_seqlens is None:
        cu_seqlens = jnp.array([0, dims.num_tokens], jnp.int32)
    shape = (dims.num_seqs, dims.num_value_heads, dims.key_dim, dims.value_dim)
    if initial_states is None:
        init = jnp.zeros(shape, jnp.float32)
    else:
        init = initial_states.astype(jnp.float32)
    return dims, jnp.asarray(cu_seqlens), init


def gdn_chunked(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    cu_seqlens: Any = None,
    initial_states: jax.Array | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Gated DeltaNet over a packed stream of sequences, chunked (FLA's `chunk_gated_delta_rule`).

    Per sequence, from its initial state `h [K, V]`, for every token t and value head i (key
    head `i // (HV / H)`): `h <- exp(g_t) h`, `h <- h + k_t (beta_t (v_t - h^T k_t))^T`,
    `o_t = scale h^T q_t` (with `use_qk_l2norm`, q and k are first divided by
    `sqrt(sum x^2 + 1e-6)`). Computed by chunks of 64 (module docstring): every sequence is
    padded to whole chunks; the intermediates are stored in bf16, the state and gates kept
    in f32, products take bf16 operands with f32 accumulation (errors: FLA's, see the tests).

    Args:
      q, k: `[T, H, K]` float32 / bfloat16 / float16, `K` in `SUPPORTED_HEAD_DIMS`.
      v: `[T, HV, V]`, `HV % H == 0` (GVA), `V` in `SUPPORTED_HEAD_DIMS`.
      g: `[T, HV]` float, the log decay per token (<= 0 in a model: `exp(g)` is not guarded
        against overflow for a large positive `g`).
      beta: `[T, HV]` float, the write strength (`sigmoid(b)` in a model).
      cu_seqlens: integer `[S + 1]` (array or list of ints), sequence `s` is tokens
        `cu[s]:cu[s + 1]`; None = one sequence. Concrete values are checked (non-decreasing
        from 0 to T); empty sequences return their initial state.
      initial_states: optional `[S, HV, K, V]` float (zeros when absent).
      scale: the output scale, a Python number; None = `K ** -0.5`.
      use_qk_l2norm: L2-normalise q and k per token and head inside the kernels.
      interpret: None = interpret on CPU, compiled (Triton) on GPU.

    Returns:
      `(o [T, HV, V] in v.dtype, final_states float32 [S, HV, K, V])`.

    Raises:
      ValueError: bad shapes or dtypes, `HV % H != 0`, bad concrete `cu_seqlens`, a bad
        `scale` or `use_qk_l2norm`; all before tracing.
      NotImplementedError: a head dim outside `SUPPORTED_HEAD_DIMS`, or a floating dtype other
        than float32 / bfloat16 / float16.
    """
    dims, cu, init = _prepare(q, k, v, g, beta, cu_seqlens, initial_states, scale, use_qk_l2norm)
    nt = dims.chunk_slots
    rows = section_rows(dims, nt)
    geom = _geom(dims, rows, nt, 0, scale=scale, l2norm=use_qk_l2norm)
    ws = jnp.zeros((rows["rows"], ROW_BYTES // 2), jnp.uint16)
    o, final, _ = _gdn_impl(
        q, k, v, g, beta, init, cu, ws, geom=geom, rounds=False,
        interpret=resolve_interpret(interpret),
    )  # fmt: skip
    return o, final


def _arena_window(arena: jax.Array, lo: int, hi: int, whole: bool) -> jax.Array:
    """Rows `lo:hi` of the `uint8[rows, 256]` arena as `uint16[hi - lo, 128]` (the whole arena
    when `whole`: an XLA bitcast on the GPU)."""
    part = arena if whole else lax.slice(arena, (lo, 0), (hi, ROW_BYTES))
    return lax.bitcast_convert_type(part.reshape(part.shape[0], ROW_BYTES // 2, 2), jnp.uint16)


def gdn_chunked_into(
    arena: jax.Array,
    plan: Any,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    cu_seqlens: Any = None,
    initial_states: jax.Array | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`gdn_chunked` with its intermediates in the arena's `gdn_fla_scratch` region.

    The region, sized by the seed for 128x128 heads (`jaxarena.workspaces.
    gdn_fla_scratch_layout`), holds `nt = region.nbytes // slot bytes` chunk slots laid out as
    `W | U | S | uc | gc` (`jaxarena.workspaces.gdn_fla_sections`); after the call it holds
    this call's `w`, `u`, the state entering each chunk, `v_new` and the gate cumsums of the
    slots in use. Only that region changes. Compiled, the whole arena is the kernels' operand
    (a bitcast, aliased: in place when the enclosing `jit` donates the arena); interpreted
    (CPU), only the region's rows are sliced out and written back (`dynamic_update_slice`,
    in place on a donated arena), as a CPU bitcast of the whole arena would copy it.

    Any mix of sequences fits: S sequences of T tokens use `sum ceil(len_s / 64) <=
    (T + 63 S) // 64` chunk slots (empty ones none), which can exceed `nt` (the seed's
    `nt = ceil(M / 64) + 16` covers M tokens in at most 17 sequences). When that static bound
    does exceed `nt`, the kernels run in rounds (a `while_loop`) of `nt` slots each, as many
    as the slots in use need (`ceil(used / nt)`, one for most calls), a sequence cut by a
    round boundary continuing from its f32 state (the same bits as without the cut). A round
    launches the three kernels and three scalar-sized XLA ops (its slice of the chunk map,
    its slot count, the counter) besides the loop's compare; the region's bytes stay the
    seed's. Every non-empty sequence still takes whole chunks (a one-token sequence does a
    64-row chunk's work), as in one round.

    Args:
      arena: the plan's `uint8[rows, 256]` arena; donate it to the enclosing `jit`.
      plan: its `jaxarena.ArenaPlan`, with a `gdn_fla_scratch` region on a 256-byte row.
      q, k, v, g, beta, cu_seqlens, initial_states, scale, use_qk_l2norm, interpret: as for
        `gdn_chunked`, with `K = V = 128`.

    Returns:
      `(arena, o [T, HV, V] in v.dtype, final_states float32 [S, HV, K, V])`.

    Raises:
      ArenaError (a ValueError): an arena that is not the plan's.
      ValueError: what `gdn_chunked` rejects; a plan without the region, a region not on an
        arena row or smaller than one chunk slot; never a write past the region.
      NotImplementedError: head dims other than 128, and what `gdn_chunked` refuses.
    """
    what = "gdn_chunked_into"
    if not callable(getattr(plan, "check_fits", None)):
        raise ValueError(f"{what}: plan must be a jaxarena.ArenaPlan, got {type(plan).__name__}")
    if GDN_REGION not in plan.regions:
        raise ValueError(f"plan has no {GDN_REGION!r} region; size the arena for a GDN model")
    dims, cu, init = _prepare(q, k, v, g, beta, cu_seqlens, initial_states, scale, use_qk_l2norm)
    if (dims.key_dim, dims.value_dim) != (128, 128):
        raise NotImplementedError(
            f"{what}: the {GDN_REGION!r} region is sized for 128x128 heads, got "
            f"K={dims.key_dim}, V={dims.value_dim}; use gdn_chunked for other head dims"
        )
    region = plan.regions[GDN_REGION]
    if region.offset_bytes % ROW_BYTES:
        raise ValueError(
            f"{what}: region {GDN_REGION!r} starts at byte {region.offset_bytes}, not on a "
            f"{ROW_BYTES}-byte arena row; build the plan with align_bytes >= {ROW_BYTES}"
        )
    nt = region_chunk_slots(region.nbytes, dims.num_value_heads)
    if nt < 1:
        raise ValueError(
            f"{what}: region {GDN_REGION!r} ({region.nbytes} bytes) holds no chunk slot of 64 "
            f"tokens for HV={dims.num_value_heads} value heads; size the arena for this model"
        )
    rows = section_rows(dims, nt)
    plan.check_fits(
        (GDN_REGION, (rows["rows"], ROW_BYTES), jnp.uint8, f"{nt} GDN chunk slots"),
        arena=arena,
        what=what,
    )
    interpret = resolve_interpret(interpret)
    lo = region.offset_bytes // ROW_BYTES
    hi = lo + rows["rows"]
    geom = _geom(dims, rows, nt, lo if not interpret else 0, scale=scale, l2norm=use_qk_l2norm)
    ws = _arena_window(arena, lo, hi, whole=not interpret)
    # Rounds only when the sequences may need more slots than the region holds (a static
    # bound: empty sequences take none, so the loop may still run once).
    rounds = dims.chunk_slots > nt
    o, final, ws = _gdn_impl(q, k, v, g, beta, init, cu, ws, geom=geom, rounds=rounds,
                             interpret=interpret)  # fmt: skip
    out = lax.bitcast_convert_type(ws, jnp.uint8).reshape(ws.shape[0], ROW_BYTES)
    if interpret:
        arena = lax.dynamic_update_slice(arena, out, (lo, 0))
    else:
        arena = out.reshape(plan.arena_shape)
    return arena, o, final
