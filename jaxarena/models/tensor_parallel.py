"""Tensor parallelism over a mesh: each device's slice of a checkpoint, and the steps run
per device with their all-reduces.

The contract is `ModelConfig.shard(tp=...)` (jaxarena/_config/shard.py): the config ONE device
sees. A model over `tp` devices is the `ArenaLM` of that per-device config, run inside
`jax.shard_map` over a one-axis mesh (`AXIS`), with three collectives `ArenaLM` adds when its
`tp_axis` is set:

  * the embedding is vocab-parallel: each device holds `padded_vocab / tp` rows (the
    vocabulary padded with zero rows to a multiple of `tp`), looks up the tokens it holds
    (zeros for the others) and a `psum` assembles the rows (exact: one addend is non-zero);
  * every block's output is a partial sum (the attention output projection, the MLP's and
    experts' down projections, Mamba-2's and Gated DeltaNet's out_proj are row-parallel over
    the heads / channels this device holds) and one `psum` per block all-reduces it before
    the residual add: two per dense decoder layer, as Megatron-LM's;
  * the LM head is vocab-parallel and an `all_gather` puts the logits together.

Mamba-2 with fewer groups than devices (`n_groups < tp`, `tp % n_groups == 0`; mamba2-2.7b has
one group) holds its heads' x, z and dt channels and the whole group's B and C (replicated by
the rule below); the gated RMSNorm over the group's channels, which then span `tp / n_groups`
devices, completes its sum of squares with one float32 `psum` of `[tokens, n_groups]` per mixer
(`Mamba2._spanning_norm`; `ArenaLM.tp_groups` carries the whole model's `n_groups`).

Every weight, the arena and the caches carry a leading device axis (`[tp, ...]`, sharded over
`AXIS`): device `r`'s slice is whatever `ModelConfig.shard` says device `r` holds, including
the replicated pieces (norms, routers, MLA's down projections, KV heads when there are fewer
than `tp`), so one `PartitionSpec` serves every leaf and no slice needs to be a regular
block of a global tensor.

`ShardReader` reads device `r`'s slice straight from the memory-mapped safetensors file: a
family's `read_params` run with the per-device config asks for per-device shapes, and the
reader cuts each stored tensor along every axis whose size differs (the rule below), so only
that slice's bytes are read and only they reach the device. Tensors that concatenate several
differently split parts along one axis (Mamba-2's `in_proj` `z | x | B | C | dt`, a conv over
`x | B | C` or `q | k | v`, Qwen3.5's `in_proj_qkv`, fused experts' `gate_up_proj`) are cut
part by part (`tensor_layouts`). gpt-oss's `gate_up_proj` interleaves gate and up columns
(`g0 u0 g1 u1 ...`): the default contiguous cut of `2 inter` into `tp` even-width slices hands
each device whole `(g_i, u_i)` pairs, so it needs no layout.

The split rule of one axis (or one part of it) of global size `G` that a device holds `L` of:
`G = n L` units; with `n == tp` device `r` holds unit `r`; with `n < tp` (fewer KV heads or
groups than devices, `tp % n == 0`) device `r` holds unit `r n / tp`, a replicated copy shared
by `tp / n` devices, the unit its query heads use. The vocabulary axis is padded first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ArenaPlan, BufferSizes, ModelConfig
from jaxarena.models.arena_options import page_tables
from jaxarena.models.checkpoint import CheckpointError, Reader
from jaxarena.models.stack import ArenaLM

__all__ = [
    "AXIS",
    "ShardReader",
    "as_mesh",
    "check_degrees",
    "check_tensor_parallel",
    "device_slices",
    "load_on_mesh",
    "per_device_bytes",
    "shard_step",
    "stack_on_mesh",
    "tensor_layouts",
    "tp_mesh",
    "zeros_on_mesh",
]

AXIS = "tp"
_P = jax.sharding.PartitionSpec

# Parameters added after a row-parallel projection: kept on device 0 only (zeros elsewhere),
# so the all-reduce adds them once. gpt-oss's down bias is one only with ep == 1 (experts split
# over their intermediate dimension); with ep == tp each device adds its own experts' biases.
_ROW_PARALLEL_BIASES = {"attention": ("bo",)}
_ROW_PARALLEL_BIASES_EP1 = {"moe_gpt_oss": ("b_down",)}


def tp_mesh(tp: int, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
    """A one-axis mesh (`AXIS`) of the first `tp` devices (of `devices`, else `jax.devices()`).

    Raises:
      ValueError: `tp` is not a positive int, or there are fewer devices.
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp={tp!r} must be a positive int")
    devs = list(jax.devices() if devices is None else devices)
    if len(devs) < tp:
        raise ValueError(f"tp={tp} needs {tp} devices; {len(devs)} available "
                         f"({devs[0].platform if devs else 'none'})")  # fmt: skip
    return jax.sharding.Mesh(np.asarray(devs[:tp]), (AXIS,))


def tensor_layouts(block: Any, config: ModelConfig) -> dict[str, tuple[int, tuple[tuple[int, int],
                                                                                  ...]]]:  # fmt: skip
    """The tensors of `block` (names relative to its prefix) that concatenate differently split
    parts along one axis: `{suffix: (axis, ((width, units), ...))}` with the GLOBAL config's
    widths; each part of `width` is `units` units split by the rule of the module docstring."""
    kind, c = block.kind, config
    if kind == "mamba":
        nh, gn, g = c.mamba_num_heads, c.n_groups * c.ssm_state_size, c.n_groups
        d_in = c.mamba2_d_inner
        xbc = ((d_in, nh), (gn, g), (gn, g))
        return {"in_proj.weight": (0, ((d_in, nh), *xbc, (nh, nh))),
                "conv1d.weight": (0, xbc), "conv1d.bias": (0, xbc)}  # fmt: skip
    if kind == "gdn":
        nk, dk = c.linear_num_key_heads, c.linear_key_head_dim
        nv, dv = c.linear_num_value_heads, c.linear_value_head_dim
        qkv = (0, ((nk * dk, nk), (nk * dk, nk), (nv * dv, nv)))
        # in_proj_qkvz / in_proj_ba (Qwen3-Next) are grouped per key head: one part.
        return {"in_proj_qkv.weight": qkv, "conv1d.weight": qkv}
    if kind == "moe":
        i = c.moe_intermediate_size
        # transformers 5.x's fused experts: `[E, 2 inter, hidden]`, the gate rows then the up.
        return {"experts.gate_up_proj": (1, ((i, i), (i, i)))}
    return {}


def check_degrees(tp: Any, ep: Any) -> None:
    """`ValueError` unless `tp` is a positive int and `ep` is 1 or `tp` (the experts are split
    over the tensor-parallel devices themselves)."""
    for name, v in (("tp", tp), ("ep", ep)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")
    if ep not in (1, tp):
        raise ValueError(f"ep={ep} must be 1 or equal to tp={tp}: the routed experts are split "
                         f"over the tensor-parallel devices themselves (use --tp {ep} --ep "
                         f"{ep}, or --ep 1)")  # fmt: skip


def check_tensor_parallel(arch: Any, config: ModelConfig, tp: int, ep: int = 1) -> ModelConfig:
    """The per-device config of `config` over `tp` devices (`ModelConfig.shard`), after checking
    the degrees. `ep`: 1, or `tp` to split the routed experts whole over the same devices
    (vLLM's expert parallelism; each device then holds `num_experts / tp` experts at their
    full width). Every block kind of `arch` splits (gpt-oss's experts and Mamba-2 with fewer
    groups than devices included), so `arch` adds no refusal today; it stays the place for one.

    Raises:
      ConfigError: a dimension does not split (from `ModelConfig.shard`).
      ValueError: `tp` or `ep` out of range (`check_degrees`).
    """
    check_degrees(tp, ep)
    return config.shard(tp=tp, ep=ep)


def _unit_slices(width: int, units: int, local: int, tp: int, rank: int, name: str) -> slice:
    """The slice of one part (`width` = `units` units) that device `rank` holds (`local` wide)."""
    n = units
    if n >= tp:
        if n % tp or width % tp or width // tp != local:
            raise CheckpointError(f"{name}: a part of {width} ({units} units) does not split "
                                  f"into {tp} slices of {local}")  # fmt: skip
        return slice(rank * local, (rank + 1) * local)
    if tp % n or width % n or width // n != local:
        raise CheckpointError(f"{name}: a part of {width} ({units} units) is not replicated "
                              f"as {local}-wide units over tp={tp}")  # fmt: skip
    u = rank * n // tp
    return slice(u * local, (u + 1) * local)


class ShardReader(Reader):
    """A `Reader` that hands out device `rank`'s slice of every tensor (see the module
    docstring): asked for a shape that differs from the stored one, it cuts the stored,
    memory-mapped tensor along each differing axis, so only the slice is read.

    Args:
      ckpt, fp8: as for `Reader`.
      tp, rank: the devices and this one.
      ep: 1, or `tp`: experts split whole over the devices (`expert_ids`).
      config: the WHOLE model's config (`local` is `config.shard(tp=tp)`).
      layouts: `{tensor name: (axis, parts)}` of the multi-part tensors (`tensor_layouts`,
        names made absolute with the block's prefix).
    """

    def __init__(self, ckpt: Any, fp8: Any, *, tp: int, rank: int, config: ModelConfig,
                 layouts: dict[str, tuple[int, tuple[tuple[int, int], ...]]],
                 ep: int = 1) -> None:  # fmt: skip
        super().__init__(ckpt, fp8)
        self.tp, self.ep, self.rank, self.config = tp, ep, rank, config
        self.layouts = layouts
        self.local_vocab = config.shard(tp=tp, ep=ep).vocab_size

    def expert_ids(self, num_experts: int) -> range:
        """This device's routed experts: all with `ep == 1`, else its `num_experts / ep`."""
        if self.ep == 1:
            return range(num_experts)
        n = num_experts // self.ep
        return range(self.rank * n, (self.rank + 1) * n)

    def raw(self, name: str, shape: tuple[int, ...], dtypes: Sequence[str]) -> np.ndarray:
        shape = tuple(shape)
        if name not in self.ckpt or self.ckpt.shape(name) == shape:
            return super().raw(name, shape, dtypes)
        stored = self.ckpt.shape(name)
        if len(stored) != len(shape):
            return super().raw(name, shape, dtypes)  # the shape error names the tensor
        a = super().raw(name, stored, dtypes)  # checks the dtype, records the use; mapped
        for axis, (g, lo) in enumerate(zip(stored, shape, strict=True)):
            if g != lo:
                a = self._cut(name, a, axis, g, lo)
        return a

    def _cut(self, name: str, a: np.ndarray, axis: int, g: int, lo: int) -> np.ndarray:
        if axis == 0 and g == self.config.vocab_size and lo == self.local_vocab:
            # Vocab-parallel: pad the rows to tp * local with zeros, take this device's.
            start = self.rank * lo
            rows = np.asarray(a[start : min(start + lo, g)])
            pad = [(0, lo - rows.shape[0])] + [(0, 0)] * (a.ndim - 1)
            return np.pad(rows, pad)
        layout = self.layouts.get(name)
        if layout is not None and layout[0] == axis:
            parts, out, at = layout[1], [], 0
            local_total = 0
            for width, units in parts:
                part_local = width // units * max(units // self.tp, 1)
                s = _unit_slices(width, units, part_local, self.tp, self.rank, name)
                out.append(np.take(a, np.arange(at + s.start, at + s.stop), axis=axis))
                at += width
                local_total += part_local
            if at != g or local_total != lo:
                raise CheckpointError(f"{self._where(name)}: its parts {parts} do not add up to "
                                      f"{g} (stored) / {lo} (per device)")  # fmt: skip
            return np.concatenate(out, axis=axis)
        if g % lo:
            raise CheckpointError(f"{self._where(name)}: axis {axis} of {g} does not split into "
                                  f"{self.tp} devices holding {lo} each")  # fmt: skip
        s = _unit_slices(g, g // lo, lo, self.tp, self.rank, name)
        index = [slice(None)] * a.ndim
        index[axis] = s
        return a[tuple(index)]


def device_slices(family: Any, ckpt: Any, fp8: Any, config: ModelConfig, arch: Any,
                  tp: int, rank: int, ep: int = 1) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """Device `rank`'s host weights (`family.read_params` of the per-device config through a
    `ShardReader`) and the checkpoint's tensors it did not read (every device reads every
    tensor name, replicated or cut, so one device's list is the model's)."""
    local = config.shard(tp=tp, ep=ep)
    names = family.tensor_names(config, arch)
    layouts = {}
    for block, (prefix, _) in zip(arch.blocks, names.blocks, strict=True):
        for suffix, lay in tensor_layouts(block, config).items():
            layouts[f"{prefix}.{suffix}"] = lay
    reader = ShardReader(ckpt, fp8, tp=tp, rank=rank, config=config, layouts=layouts, ep=ep)
    host = family.read_params(reader, local, arch)
    if rank:
        for block, p in zip(arch.blocks, host["layers"], strict=True):
            keys = _ROW_PARALLEL_BIASES.get(block.kind, ())
            if ep == 1:
                keys += _ROW_PARALLEL_BIASES_EP1.get(block.kind, ())
            for key in keys:
                if key in p:
                    p[key] = np.zeros_like(p[key])
    return host, reader.unused()


def stack_on_mesh(per_device: dict[int, Any], mesh: jax.sharding.Mesh) -> Any:
    """Global arrays `[tp, ...]` sharded over `AXIS` from `{device index: host tree}` (the
    addressable devices' trees; each leaf goes to its device once)."""
    devices = list(mesh.devices.flat)
    sharding = jax.sharding.NamedSharding(mesh, _P(AXIS))
    ranks = sorted(per_device)
    trees = [per_device[r] for r in ranks]
    leaves = [jax.tree.leaves(t) for t in trees]
    treedef = jax.tree.structure(trees[0])
    out = []
    for i in range(len(leaves[0])):
        first = np.asarray(leaves[0][i])
        arrays = [jax.device_put(np.asarray(leaves[k][i])[None], devices[r])
                  for k, r in enumerate(ranks)]  # fmt: skip
        out.append(jax.make_array_from_single_device_arrays((len(devices), *first.shape),
                                                            sharding, arrays))  # fmt: skip
    return jax.tree.unflatten(treedef, out)


def shard_step(fn: Callable[..., Any], mesh: jax.sharding.Mesh) -> Callable[..., Any]:
    """`fn(params, arena, caches, *args) -> (arena, caches, *outs)` (an `ArenaLM` step of the
    per-device model, `tp_axis=AXIS`) as one `shard_map` over `mesh`: params and caches carry a
    leading device axis, the arena is the sharded global arena (`ArenaPlan.sharding`), the
    other arguments and the outputs after the caches are replicated."""

    def local(params, arena, caches, *args):
        params = jax.tree.map(lambda a: a[0], params)
        caches = jax.tree.map(lambda a: a[0], caches)
        arena, caches, *outs = fn(params, arena, caches, *args)
        return arena, jax.tree.map(lambda a: a[None], caches), tuple(outs)

    def step(params, arena, caches, *args):
        specs = (_P(AXIS), _P(AXIS), _P(AXIS)) + (_P(),) * len(args)
        arena, caches, outs = jax.shard_map(local, mesh=mesh, in_specs=specs,
                                            out_specs=(_P(AXIS), _P(AXIS), _P()),
                                            check_vma=False)(params, arena, caches, *args)  # fmt: skip
        return (arena, caches, *outs)

    step.__name__ = getattr(fn, "__name__", "step")
    step.__wrapped__ = fn
    return step


def zeros_on_mesh(shapes: Any, mesh: jax.sharding.Mesh) -> Any:
    """Zeroed `[tp, ...]` arrays of the per-device `shapes` (a pytree of ShapeDtypeStructs),
    each device allocating its own slice."""
    tp = mesh.devices.size
    sharding = jax.sharding.NamedSharding(mesh, _P(AXIS))

    def make(s):
        return jax.jit(lambda: jnp.zeros((tp, *s.shape), s.dtype), out_shardings=sharding)()

    return jax.tree.map(make, shapes)


def as_mesh(mesh: Any) -> jax.sharding.Mesh:
    """`mesh` as a one-axis `AXIS` mesh: an int `tp` takes the first `tp` devices.

    Raises:
      ValueError: a mesh with other axes, or too few devices.
    """
    if isinstance(mesh, int) and not isinstance(mesh, bool):
        return tp_mesh(mesh)
    if not isinstance(mesh, jax.sharding.Mesh) or tuple(mesh.axis_names) != (AXIS,):
        raise ValueError(f"mesh must be an int (tensor-parallel devices) or a jax.sharding.Mesh "
                         f"with the one axis {AXIS!r} (tensor_parallel.tp_mesh), got {mesh!r}")  # fmt: skip
    return mesh


def load_on_mesh(mesh: jax.sharding.Mesh, family: Any, ckpt: Any, fp8: Any, config: ModelConfig,
                 arch: Any, model_args: dict[str, Any], *, guard_bytes: int,
                 kv_pages: int | None, ep: int = 1) -> tuple[Any, ...]:  # fmt: skip
    """The pieces of a `CausalLM` spread over `mesh` (`load_pretrained(..., mesh=...)`): each
    device's weights read from the checkpoint and placed on it, the per-device arena (the
    sequential plan of the per-device config at the limits in `model_args`, the other
    `ArenaLM` fields), zeroed caches.

    Returns:
      `(model, params, arena, caches, block_tables, unused tensor names)`.
    """
    tp = mesh.devices.size
    local = check_tensor_parallel(arch, config, tp, ep)
    m = model_args
    sizes = BufferSizes.from_config(local, m["max_batch_tokens"], m["max_seq_len"],
                                    m["kv_block_size"], m["max_batch_size"], levers=m["levers"],
                                    target=m["target"])  # fmt: skip
    model = ArenaLM(config=local, arch=arch, plan=ArenaPlan.sequential(sizes, guard_bytes=guard_bytes),
                    tp_axis=AXIS, tp_vocab=config.vocab_size, tp_groups=config.n_groups or None,
                    **m)  # fmt: skip
    per_device, unused = {}, None
    for r, dev in enumerate(mesh.devices.flat):
        if dev.process_index != jax.process_index():
            continue
        per_device[r], left = device_slices(family, ckpt, fp8, config, arch, tp, r, ep)
        unused = set(left) if unused is None else unused & set(left)
    if len(per_device) < tp and ep > 1:
        # Other processes read the other devices' experts.
        unused = {n for n in unused if ".experts." not in n}
    params = stack_on_mesh(per_device, mesh)
    pages, tables = page_tables(model, kv_pages)
    rows = m["max_batch_size"] + 1
    caches = zeros_on_mesh(jax.eval_shape(lambda: model.init_caches(num_blocks=pages, rows=rows)),
                           mesh)  # fmt: skip
    arena = model.plan.allocate(sharding=model.plan.sharding(mesh, AXIS))
    return model, params, arena, caches, tables, sorted(unused)


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of `[tp, ...]` arrays (`stack_on_mesh`, `zeros_on_mesh`)."""
    return sum(x.nbytes // x.shape[0] for x in jax.tree.leaves(tree))
