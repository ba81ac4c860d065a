"""`Lifetimes`: when each arena buffer is live, as half-open step intervals per mode.

A forward pass is a sequence of steps; a buffer is live over `[start, end)` when it holds a
value that a later step still reads. A pass runs in one of several *modes* (`prefill`,
`decode`, `verify`) that never run at the same time, so two buffers *conflict* (must not share
a byte) iff some mode has intersecting intervals for both, and the least memory any layout can
need is the peak, over modes and steps, of the bytes live at one step (`Lifetimes.peak`).

Two sources of lifetimes:

* `Lifetimes.standard(config)`: the documented table below, for the standard layer schedule
  of the seed's runtime. It is written from what each buffer is for (the comments in
  `_sizes.py` and the sizing spec), not from a trace, and it is conservative where the seed's
  use is not certain.
* `record_lifetimes(fn, *args, mode=...)`: intervals recorded from the `plan.view` and
  `plan.write` calls a step function makes when it is traced.

Rules shared by both:

* A buffer the lifetimes do not name is *unknown* and counts as live at every step of every
  mode (the conservative default): `ArenaPlan.packed` never lets it share a byte.
* A buffer the lifetimes do name is live exactly over its intervals; in a mode where it has
  none it is dead (that mode does not use it). So a recording must cover a whole pass of its
  mode; merge several recordings (`a | b`) to cover several modes.

The standard schedule (`standard_schedule`)
-----------------------------------------------

Every mode runs the same phases; the modes differ in which buffers they use. One pass is

    upload, embed,                                   # prologue
    <block>.pre_norm ... <block>.ffn_add             # one block per mixer kind (below)
    final_norm, lm_head, mtp_propose                 # epilogue

with these phases in each block (`LAYER_PHASES`):

    pre_norm   residual add + RMSNorm (and the hyper-connection pre-mix) -> norm_output
    quant_in   activation quantization of the mixer input (FP8 prefill, q8_1 MMQ)
    proj_in    input projections: QKV / GDN QKVZ + BA / Mamba-2 in_proj / MLA latents (+LoRA)
    prep       RoPE, de-interleave, conv1d, gates; prefill K/V staging; QSA selection
    mix        the mixer: attention (split-K in decode), GDN FLA or SSD chunked scan
    quant_out  quantization of the mixer output
    o_proj     output projection (grouped O latent, LoRA)
    post_norm  residual add + RMSNorm (and the hyper-connection post-mix)
    router     MoE router logits (bf16 and f32), top-k ids and weights
    ffn_quant  quantization of the FFN input (dense int8/FP8/NVFP4, grouped FP8 MoE)
    ffn_up     gate and up GEMMs (routed experts, shared expert, fused dense decode GEMM)
    ffn_act    SiLU(gate) * up and its quantization for the down GEMM
    ffn_down   down GEMMs and the expert combine
    ffn_add    FFN output + residual -> hidden_states (and the hyper-connection post-mix)

Blocks: `attn` when the model has attention layers, `ssm` when it has gated-delta-net or
Mamba-2 layers (an attention-free, SSM-free config gets an `attn` block so that every buffer
has a place). Layers of one kind repeat the same pattern and every buffer that lives across
layers is live for the whole pass, so one block per kind gives exactly the conflicts and the
peak of the fully unrolled pass. Every block carries the FFN phases: for configs whose FFN
layers are separate (`moe`/`mlp` entries in `layer_types`, Nemotron-H) this only adds
conflicts, never removes one.

Modes: `prefill` runs the chunked prefill kernels (FP8 projections, GDN FLA, SSD, QSA
selection, grouped FP8 MoE, the dense FFN's activation quantization); `decode` runs the
one-token kernels (split-K attention, the fused dense gate+up GEMM); `verify` (batched MTP
verify, up to 256 rows) may take either path, so it uses the union of both.

The table (`_TABLE`; scopes: `pass` = the whole pass, `layer` = every block, `attn`/`ssm` =
blocks of that kind, `epilogue`):

| buffer | live (modes: scope first..last phase) |
|---|---|
| hidden_states, residual | all: pass (the residual stream) |
| scratch | all: pass (step metadata, top-k ids/weights, q12 staging: the union of its uses) |
| token_ids, lora_seq_slot | all: pass (read by every hash-routed MoE / LoRA projection) |
| norm_unit_w | all: pass (a constant zero weight; sharing would overwrite it) |
| hc_streams | all: pass (hyper-connection residual streams) |
| ssm_rowwise_w_bf16 | all: pass (a weight cache that outlives the pass) |
| q2_dequant_scratch | all: pass (one dequantized weight, reused by every projection) |
| norm_output | all: layer pre_norm..proj_in, ssm mix..o_proj (gated norm at d_inner width), layer post_norm..ffn_up, epilogue final_norm..lm_head |
| qkv_output | all: attn proj_in..mix |
| attn_output | all: attn mix..o_proj, ssm mix..o_proj |
| gate_logits, gate_logits_f32, moe_router_in_f32 | all: layer router |
| moe_output | all: layer o_proj..ffn_add (the FFN output; also the o_proj output, to be safe) |
| logits | all: epilogue lm_head..mtp_propose (read by the caller after the pass) |
| ssm_qkvz | prefill+verify: attn prep..mix (K then V rows); all: ssm proj_in..o_proj (QKVZ / in_proj, z read after the mixer); all: layer ffn_up..ffn_down (shared-expert up) |
| ssm_ba | all: attn proj_in..mix (MLA q_latent, K rope), ssm proj_in..mix (beta/alpha), layer router..ffn_down (LatentMoE latent), epilogue mtp_propose (concat) |
| ssm_deinterleaved | all: attn prep..mix (query rows, absorbed MLA Q), ssm prep..o_proj (QKVZ with z, Mamba-2 xBC) |
| ssm_gates | all: ssm prep..mix, epilogue mtp_propose (propose's normed rows) |
| ssm_conv_out_f32 | all: attn prep..mix (MLA Q rope rows), ssm prep..mix (f32 conv output) |
| expert_gate_out, expert_up_out | all: layer ffn_up..ffn_down |
| expert_down_out | all: layer ffn_down..ffn_add |
| splitk_workspace | decode+verify: attn mix |
| gdn_fla_scratch, ssd_scratch | prefill+verify: ssm mix |
| qsa_select_scratch | prefill+verify: attn prep..mix |
| o_latent | all: attn o_proj |
| hc_post, hc_comb, hc_lowrank_scratch | all: layer pre_norm..ffn_add, epilogue final_norm |
| ffn_act_q8, ffn_act_a, ffn_act_scale, ffn_act_scale_kmajor | prefill+verify: layer ffn_quant..ffn_down |
| ffn_gate_up_fused | decode+verify: layer ffn_up..ffn_down |
| fp8_act, fp8_act_scale, fp8_act_scale_kmajor | prefill+verify: layer quant_in..proj_in, mix..o_proj, epilogue final_norm..lm_head |
| moe_fp8_scratch | prefill+verify: layer ffn_quant..ffn_down |
| lora_xa, lora_delta | all: layer proj_in, o_proj, ffn_up, ffn_down (shrink then expand, per projection) |
| lora_hact | all: layer ffn_up..ffn_down |
| q2_act_q8 | all: layer quant_in..proj_in, mix..o_proj, ffn_quant..ffn_down, epilogue final_norm..lm_head |

Assumptions: the MTP propose's own decoder layer runs as a separate pass (so only its concat
and normed rows are in this epilogue); the o_proj output may land in `moe_output`; the dense
FFN's `ffn_act_*` buffers serve the FFN only (the mixer projections quantize into `fp8_act`,
whose K covers exactly their input widths).
"""

from __future__ import annotations

import dataclasses
import numbers
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from jaxarena import _events
from jaxarena._config import ModelConfig
from jaxarena._plan import ArenaError

__all__ = [
    "Interval",
    "Lifetimes",
    "Peak",
    "MODES",
    "LAYER_PHASES",
    "standard_schedule",
    "record_lifetimes",
]

# The modes of the seed's runtime, which never run at the same time.
MODES = ("prefill", "decode", "verify")

LAYER_PHASES = (
    "pre_norm",
    "quant_in",
    "proj_in",
    "prep",
    "mix",
    "quant_out",
    "o_proj",
    "post_norm",
    "router",
    "ffn_quant",
    "ffn_up",
    "ffn_act",
    "ffn_down",
    "ffn_add",
)
_PROLOGUE = ("upload", "embed")
_EPILOGUE = ("final_norm", "lm_head", "mtp_propose")


class Interval(NamedTuple):
    """Steps `[start, end)` of `mode` during which a buffer is live (`0 <= start < end`)."""

    mode: str
    start: int
    end: int


class Peak(NamedTuple):
    """The step with the most live bytes: `bytes` live at step `step` of `mode`, held by
    `names` (each counted rounded up to the alignment, guard band included)."""

    bytes: int
    mode: str
    step: int
    names: tuple[str, ...]


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True, init=False)
class Lifetimes:
    """When each buffer is live: half-open step intervals per mode. Frozen and hashable.

    Build one with `Lifetimes({name: [(mode, start, end), ...]}, num_steps={mode: n})`, with
    `Lifetimes.standard(config)` (the documented table of the seed's layer schedule), or with
    `record_lifetimes(step, ...)`. Combine recordings of different modes with `a | b`.

    A buffer named here is live exactly over its intervals (dead in a mode where it has none);
    a buffer not named here is *unknown* and live at every step of every mode. Overlapping and
    touching intervals are merged, so two `Lifetimes` with the same live steps compare equal.

    Args:
      live: `{buffer name: iterable of (mode, start, end)}`; `0 <= start < end <= num_steps`.
        An empty iterable means "never live" (the buffer may share bytes with anything).
      num_steps: `{mode: number of steps}`, each >= 1. Default: per mode, the largest `end`.
      step_labels: optional `{mode: one label per step}` (e.g. phase names), for reports.

    Raises:
      ArenaError: every malformed entry at once (bad names, modes, bounds, label counts).
    """

    live_items: tuple[tuple[str, tuple[Interval, ...]], ...]
    steps_items: tuple[tuple[str, int], ...]
    labels_items: tuple[tuple[str, tuple[str, ...]], ...] = dataclasses.field(
        compare=False, repr=False
    )

    def __init__(
        self,
        live: Mapping[str, Iterable[tuple[str, int, int]]],
        *,
        num_steps: Mapping[str, int] | None = None,
        step_labels: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        problems: list[str] = []
        if not isinstance(live, Mapping):
            raise ArenaError(
                f"live must be a mapping {{name: [(mode, start, end), ...]}}, got "
                f"{type(live).__name__}"
            )
        parsed: dict[str, list[tuple[str, int, int]]] = {}
        for name, intervals in live.items():
            if not isinstance(name, str) or not name:
                problems.append(f"buffer name {name!r} must be a non-empty str")
                continue
            try:
                items = list(intervals)
            except TypeError:
                problems.append(f"{name}: intervals={intervals!r} must be an iterable of tuples")
                continue
            good = []
            for item in items:
                if (
                    not isinstance(item, tuple | list)
                    or len(item) != 3
                    or not isinstance(item[0], str)
                    or not item[0]
                    or not _is_int(item[1])
                    or not _is_int(item[2])
                ):
                    problems.append(
                        f"{name}: interval {item!r} must be (mode: str, start: int, end: int)"
                    )
                elif not 0 <= item[1] < item[2]:
                    problems.append(
                        f"{name}: interval {tuple(item)!r} needs 0 <= start < end (half-open)"
                    )
                else:
                    good.append((item[0], int(item[1]), int(item[2])))
            parsed[name] = good

        steps: dict[str, int] = {}
        if num_steps is None:
            for intervals in parsed.values():
                for mode, _, end in intervals:
                    steps[mode] = max(steps.get(mode, 0), end)
        elif not isinstance(num_steps, Mapping):
            problems.append(f"num_steps={num_steps!r} must be a mapping {{mode: int}}")
        else:
            for mode, n in num_steps.items():
                if not isinstance(mode, str) or not mode:
                    problems.append(f"num_steps: mode {mode!r} must be a non-empty str")
                elif not _is_int(n) or n < 1:
                    problems.append(f"num_steps[{mode!r}]={n!r} must be an int >= 1")
                else:
                    steps[mode] = int(n)
            for name, intervals in parsed.items():
                for mode, start, end in intervals:
                    if mode not in steps:
                        problems.append(
                            f"{name}: mode {mode!r} is not in num_steps ({', '.join(steps)})"
                        )
                    elif end > steps[mode]:
                        problems.append(
                            f"{name}: interval {(mode, start, end)!r} ends past "
                            f"num_steps[{mode!r}]={steps[mode]}"
                        )
        if not steps and not problems:
            problems.append(
                "lifetimes need at least one mode: give num_steps={mode: n} or some interval"
            )

        labels: dict[str, tuple[str, ...]] = {}
        if step_labels is not None:
            for mode, names in step_labels.items():
                names = tuple(str(x) for x in names)
                if mode not in steps:
                    problems.append(f"step_labels: mode {mode!r} is not a mode of these lifetimes")
                elif len(names) != steps[mode]:
                    problems.append(
                        f"step_labels[{mode!r}] has {len(names)} labels for num_steps={steps[mode]}"
                    )
                else:
                    labels[mode] = names
        if problems:
            raise ArenaError("invalid Lifetimes:\n  - " + "\n  - ".join(problems))

        live_items = tuple((name, _normalize(parsed[name], steps)) for name in sorted(parsed))
        object.__setattr__(self, "live_items", live_items)
        object.__setattr__(self, "steps_items", tuple(sorted(steps.items())))
        object.__setattr__(self, "labels_items", tuple(sorted(labels.items())))
        # Read-only views, built once (not dataclass fields: equality uses the tuples above).
        object.__setattr__(self, "_live", dict(live_items))
        object.__setattr__(self, "_steps", dict(self.steps_items))
        object.__setattr__(self, "_labels", dict(self.labels_items))

    # -- views ------------------------------------------------------------------------------

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes, sorted by name."""
        return tuple(m for m, _ in self.steps_items)

    @property
    def num_steps(self) -> Mapping[str, int]:
        """`{mode: number of steps}` (read-only)."""
        return types.MappingProxyType(self._steps)

    @property
    def live(self) -> Mapping[str, tuple[Interval, ...]]:
        """`{name: intervals}` of the buffers named here (read-only; merged and sorted)."""
        return types.MappingProxyType(self._live)

    def __contains__(self, name: object) -> bool:
        return name in self._live

    def label(self, mode: str, step: int) -> str:
        """The label of `step` in `mode` (`""` when the lifetimes carry none)."""
        labels = self._labels.get(mode)
        return labels[step] if labels else ""

    def intervals(self, name: str) -> tuple[Interval, ...]:
        """The live intervals of `name`; for an unknown buffer, every step of every mode."""
        known = self._live.get(name)
        if known is not None:
            return known
        return tuple(Interval(m, 0, n) for m, n in self.steps_items)

    def conflicts(self, a: str, b: str) -> bool:
        """True when `a` and `b` are live at a common step of some mode (must not share bytes)."""
        return _first_common(self.intervals(a), self.intervals(b)) is not None

    def common_step(self, a: str, b: str) -> Interval | None:
        """The first interval in which both `a` and `b` are live, or None."""
        return _first_common(self.intervals(a), self.intervals(b))

    # -- bounds -----------------------------------------------------------------------------

    def peak(self, sizes: Any, *, align_bytes: int = 256, guard_bytes: int = 0) -> Peak:
        """The step with the most live bytes: the lower bound of any layout's size.

        Each non-empty buffer counts `round_up(nbytes + guard_bytes, align_bytes)` (what it
        occupies in a plan with that alignment); the peak is the maximum over modes and steps.
        No layout of `sizes` that respects these lifetimes is smaller (`ArenaPlan.packed`
        rounds its total up so that `total_bytes >= peak().bytes` always holds).

        Args:
          sizes: a `BufferSizes` or a `{name: nbytes}` mapping; names the lifetimes lack are
            unknown (live always), zero-size buffers are skipped, names the lifetimes have
            but `sizes` lacks are ignored.
          align_bytes: the plan's region alignment (a power of two).
          guard_bytes: the plan's guard band after each region.
        """
        footprint = _footprints(sizes, align_bytes, guard_bytes)
        best = Peak(0, self.modes[0], 0, ())
        for mode, _ in self.steps_items:
            # Sweep: at equal steps an end (-) comes before a start (+): intervals are half-open.
            events: list[tuple[int, int, str]] = []
            for name in footprint:
                for iv in self.intervals(name):
                    if iv.mode == mode:
                        events.append((iv.start, 1, name))
                        events.append((iv.end, 0, name))
            events.sort(key=lambda e: (e[0], e[1]))
            live_bytes = 0
            for step, kind, name in events:
                live_bytes += footprint[name] if kind else -footprint[name]
                if kind and live_bytes > best.bytes:
                    best = Peak(live_bytes, mode, step, ())
        if best.bytes:
            names = tuple(
                n
                for n in footprint
                if any(
                    iv.mode == best.mode and iv.start <= best.step < iv.end
                    for iv in self.intervals(n)
                )
            )
            best = best._replace(names=names)
        return best

    def lower_bound_bytes(self, sizes: Any, *, align_bytes: int = 256, guard_bytes: int = 0) -> int:
        """`peak(sizes, ...).bytes`: no plan of `sizes` honouring these lifetimes is smaller.

        Use it to compare any plan, a sequential one included, with the best possible:
        `ArenaPlan.sequential(sizes).total_bytes / lifetimes.lower_bound_bytes(sizes)`.
        """
        return self.peak(sizes, align_bytes=align_bytes, guard_bytes=guard_bytes).bytes

    # -- combining --------------------------------------------------------------------------

    def __or__(self, other: Lifetimes) -> Lifetimes:
        """Union of two lifetimes, e.g. a decode and a prefill recording.

        A mode present in both must have the same step count; its intervals are united. A
        buffer named by only one side is dead in the other side's modes (each side is taken
        to cover whole passes of its modes).
        """
        if not isinstance(other, Lifetimes):
            return NotImplemented
        steps = dict(self.steps_items)
        for mode, n in other.steps_items:
            if steps.get(mode, n) != n:
                raise ArenaError(
                    f"cannot merge lifetimes: mode {mode!r} has num_steps={steps[mode]} on one "
                    f"side and {n} on the other (rename one mode)"
                )
            steps[mode] = n
        live: dict[str, list[Interval]] = {}
        for side in (self, other):
            for name, intervals in side.live_items:
                live.setdefault(name, []).extend(intervals)
        labels = dict(self.labels_items)
        labels.update(other.labels_items)
        return Lifetimes(live, num_steps=steps, step_labels=labels)

    # -- sources ----------------------------------------------------------------------------

    @classmethod
    def standard(cls, config: ModelConfig) -> Lifetimes:
        """The documented table (module docstring) for the seed's standard layer schedule.

        Covers all 46 `BufferSizes` fields in the modes `prefill`, `decode` and `verify`; the
        steps are the phases of `standard_schedule(config)` (also the step labels).
        """
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        phases = _phases(config)
        index = {p: i for i, p in enumerate(phases)}
        blocks = _blocks(config)
        live: dict[str, list[tuple[str, int, int]]] = {}
        for name, uses in _TABLE.items():
            out = live.setdefault(name, [])
            for modes, scope, first, last in uses:
                if scope == "pass":
                    spans = [(0, len(phases))]
                elif scope == "epilogue":
                    spans = [(index[first], index[last] + 1)]
                else:
                    kinds = blocks if scope == "layer" else [k for k in blocks if k == scope]
                    spans = [(index[f"{k}.{first}"], index[f"{k}.{last}"] + 1) for k in kinds]
                out.extend((m, s, e) for m in modes for s, e in spans)
        n = len(phases)
        return cls(
            live,
            num_steps={m: n for m in MODES},
            step_labels={m: phases for m in MODES},
        )

    @classmethod
    def from_events(
        cls,
        events: Sequence[tuple[str, str]],
        *,
        mode: str,
        live_out: Iterable[str] = (),
    ) -> Lifetimes:
        """Lifetimes of one pass from its `(kind, name)` arena events, in program order.

        Event `i` is step `i`. A region is live from a write to the last view before its next
        write; a view with no earlier write in the pass is live from step 0 (an input); a
        region written and not viewed afterwards, or named in `live_out`, stays live to the
        end (the caller reads it). Two writes with no view between them share one interval:
        a write stores a prefix of the region, so the first write's tail may still be read.

        The rule assumes that what a view reads was stored by the writes since the previous
        view-free gap; a step that rewrites a region's header and later reads its older tail
        after a view in between must list the region in `live_out` or keep it unknown.
        """
        if not isinstance(mode, str) or not mode:
            raise ArenaError(f"mode={mode!r} must be a non-empty str")
        live_out = frozenset(live_out)
        n = max(len(events), 1)
        opened: dict[str, int] = {}
        last_view: dict[str, int] = {}
        live: dict[str, list[tuple[str, int, int]]] = {}
        for step, (kind, name) in enumerate(events):
            if kind == "write":
                start = opened.get(name)
                if start is not None and last_view.get(name, -1) >= start:
                    live.setdefault(name, []).append((mode, start, last_view[name] + 1))
                    opened[name] = step
                elif start is None:
                    opened[name] = step
            elif kind == "view":
                opened.setdefault(name, 0)
                last_view[name] = step
            else:
                raise ArenaError(f"event kind={kind!r} must be 'view' or 'write'")
        for name, start in opened.items():
            viewed = last_view.get(name, -1) >= start
            end = last_view[name] + 1 if viewed and name not in live_out else n
            live.setdefault(name, []).append((mode, start, end))
        labels = [f"{kind} {name}" for kind, name in events] or ["(no events)"]
        return cls(live, num_steps={mode: n}, step_labels={mode: labels})


def record_lifetimes(
    fn: Callable[..., Any],
    *args: Any,
    mode: str = "decode",
    live_out: Iterable[str] = (),
) -> Lifetimes:
    """Records buffer lifetimes by tracing `fn(*args)` once, listening to the arena.

    Every `plan.view` and `plan.write` traced is one step (`Lifetimes.from_events` gives the
    rule). The trace runs under `jax.disable_jit()` inside `jax.make_jaxpr`, so nested and
    already-compiled `jax.jit` functions are traced again instead of coming from JAX's cache
    (which would skip their events), and `lax.scan`/`fori_loop` bodies are unrolled: a
    48-layer scan records 48 layers. A `lax.cond` records both branches, one after the other;
    a `while_loop` with a traced condition records its body once. Nothing is compiled or run.

    Typical use: record with a sequential plan, pack, then run with the packed plan:

        seq = ArenaPlan.sequential(sizes)
        lt = record_lifetimes(functools.partial(step, seq), seq_arena, tokens, mode="decode")
        plan = ArenaPlan.packed(sizes, lt)        # then call step(plan, plan.allocate(), ...)

    Args:
      fn: the step; bind non-array arguments (the plan, static ints) with `functools.partial`.
      *args: its arguments: arrays or `jax.ShapeDtypeStruct`s (nothing is read).
      mode: the name of the mode this pass runs in.
      live_out: regions the caller reads after the step; they stay live to its end.

    Returns:
      `Lifetimes` with the single mode `mode`. Regions `fn` never touches are not named, so a
      plan treats them as live always.
    """
    import jax

    events: list[tuple[str, str]] = []
    with _events.listening(lambda kind, name: events.append((kind, name))), jax.disable_jit():
        jax.make_jaxpr(fn)(*args)
    return Lifetimes.from_events(events, mode=mode, live_out=live_out)


def standard_schedule(config: ModelConfig) -> tuple[str, ...]:
    """The phases of one pass of `config` in the standard schedule (the same in every mode):
    `upload, embed, <block>.<phase>... , final_norm, lm_head, mtp_propose`."""
    return _phases(config)


# -- the table ---------------------------------------------------------------------------------

_ALL = MODES
_PV = ("prefill", "verify")
_DV = ("decode", "verify")
_PASS = ((_ALL, "pass", "", ""),)

# name -> uses; a use is (modes, scope, first phase, last phase), both phases included.
# Scopes: "pass" (whole pass), "layer" (every block), "attn", "ssm", "epilogue".
_TABLE: dict[str, tuple[tuple[tuple[str, ...], str, str, str], ...]] = {
    "hidden_states": _PASS,
    "residual": _PASS,
    "norm_output": (
        (_ALL, "layer", "pre_norm", "proj_in"),
        (_ALL, "ssm", "mix", "o_proj"),
        (_ALL, "layer", "post_norm", "ffn_up"),
        (_ALL, "epilogue", "final_norm", "lm_head"),
    ),
    "qkv_output": ((_ALL, "attn", "proj_in", "mix"),),
    "attn_output": ((_ALL, "attn", "mix", "o_proj"), (_ALL, "ssm", "mix", "o_proj")),
    "gate_logits": ((_ALL, "layer", "router", "router"),),
    "gate_logits_f32": ((_ALL, "layer", "router", "router"),),
    "moe_router_in_f32": ((_ALL, "layer", "router", "router"),),
    "moe_output": ((_ALL, "layer", "o_proj", "ffn_add"),),
    "logits": ((_ALL, "epilogue", "lm_head", "mtp_propose"),),
    "ssm_qkvz": (
        (_PV, "attn", "prep", "mix"),
        (_ALL, "ssm", "proj_in", "o_proj"),
        (_ALL, "layer", "ffn_up", "ffn_down"),
    ),
    "ssm_ba": (
        (_ALL, "attn", "proj_in", "mix"),
        (_ALL, "ssm", "proj_in", "mix"),
        (_ALL, "layer", "router", "ffn_down"),
        (_ALL, "epilogue", "mtp_propose", "mtp_propose"),
    ),
    "ssm_deinterleaved": ((_ALL, "attn", "prep", "mix"), (_ALL, "ssm", "prep", "o_proj")),
    "ssm_gates": (
        (_ALL, "ssm", "prep", "mix"),
        (_ALL, "epilogue", "mtp_propose", "mtp_propose"),
    ),
    "ssm_conv_out_f32": ((_ALL, "attn", "prep", "mix"), (_ALL, "ssm", "prep", "mix")),
    "scratch": _PASS,
    "expert_gate_out": ((_ALL, "layer", "ffn_up", "ffn_down"),),
    "expert_up_out": ((_ALL, "layer", "ffn_up", "ffn_down"),),
    "expert_down_out": ((_ALL, "layer", "ffn_down", "ffn_add"),),
    "splitk_workspace": ((_DV, "attn", "mix", "mix"),),
    "gdn_fla_scratch": ((_PV, "ssm", "mix", "mix"),),
    "ssd_scratch": ((_PV, "ssm", "mix", "mix"),),
    "o_latent": ((_ALL, "attn", "o_proj", "o_proj"),),
    "norm_unit_w": _PASS,
    "hc_streams": _PASS,
    "hc_post": (
        (_ALL, "layer", "pre_norm", "ffn_add"),
        (_ALL, "epilogue", "final_norm", "final_norm"),
    ),
    "hc_comb": (
        (_ALL, "layer", "pre_norm", "ffn_add"),
        (_ALL, "epilogue", "final_norm", "final_norm"),
    ),
    "hc_lowrank_scratch": (
        (_ALL, "layer", "pre_norm", "ffn_add"),
        (_ALL, "epilogue", "final_norm", "final_norm"),
    ),
    "qsa_select_scratch": ((_PV, "attn", "prep", "mix"),),
    "token_ids": _PASS,
    "ffn_act_q8": ((_PV, "layer", "ffn_quant", "ffn_down"),),
    "ffn_act_a": ((_PV, "layer", "ffn_quant", "ffn_down"),),
    "ffn_act_scale": ((_PV, "layer", "ffn_quant", "ffn_down"),),
    "ffn_act_scale_kmajor": ((_PV, "layer", "ffn_quant", "ffn_down"),),
    "ffn_gate_up_fused": ((_DV, "layer", "ffn_up", "ffn_down"),),
    "fp8_act": (
        (_PV, "layer", "quant_in", "proj_in"),
        (_PV, "layer", "mix", "o_proj"),
        (_PV, "epilogue", "final_norm", "lm_head"),
    ),
    "moe_fp8_scratch": ((_PV, "layer", "ffn_quant", "ffn_down"),),
    "fp8_act_scale": (
        (_PV, "layer", "quant_in", "proj_in"),
        (_PV, "layer", "mix", "o_proj"),
        (_PV, "epilogue", "final_norm", "lm_head"),
    ),
    "fp8_act_scale_kmajor": (
        (_PV, "layer", "quant_in", "proj_in"),
        (_PV, "layer", "mix", "o_proj"),
        (_PV, "epilogue", "final_norm", "lm_head"),
    ),
    "lora_xa": (
        (_ALL, "layer", "proj_in", "proj_in"),
        (_ALL, "layer", "o_proj", "o_proj"),
        (_ALL, "layer", "ffn_up", "ffn_up"),
        (_ALL, "layer", "ffn_down", "ffn_down"),
    ),
    "lora_delta": (
        (_ALL, "layer", "proj_in", "proj_in"),
        (_ALL, "layer", "o_proj", "o_proj"),
        (_ALL, "layer", "ffn_up", "ffn_up"),
        (_ALL, "layer", "ffn_down", "ffn_down"),
    ),
    "lora_hact": ((_ALL, "layer", "ffn_up", "ffn_down"),),
    "lora_seq_slot": _PASS,
    "q2_dequant_scratch": _PASS,
    "q2_act_q8": (
        (_ALL, "layer", "quant_in", "proj_in"),
        (_ALL, "layer", "mix", "o_proj"),
        (_ALL, "layer", "ffn_quant", "ffn_down"),
        (_ALL, "epilogue", "final_norm", "lm_head"),
    ),
    "ssm_rowwise_w_bf16": _PASS,
}


def _blocks(config: ModelConfig) -> list[str]:
    blocks = []
    if config.num_attention_layers > 0:
        blocks.append("attn")
    if config.num_ssm_layers > 0:
        blocks.append("ssm")
    return blocks or ["attn"]


def _phases(config: ModelConfig) -> tuple[str, ...]:
    body = tuple(f"{k}.{p}" for k in _blocks(config) for p in LAYER_PHASES)
    return _PROLOGUE + body + _EPILOGUE


# -- helpers -----------------------------------------------------------------------------------


def _normalize(
    intervals: list[tuple[str, int, int]], steps: Mapping[str, int]
) -> tuple[Interval, ...]:
    """Sorted by (mode, start), overlapping and touching intervals of a mode merged."""
    out: list[Interval] = []
    for mode, start, end in sorted(intervals):
        if out and out[-1].mode == mode and start <= out[-1].end:
            if end > out[-1].end:
                out[-1] = Interval(mode, out[-1].start, end)
        else:
            out.append(Interval(mode, start, end))
    return tuple(out)


def _first_common(a: Sequence[Interval], b: Sequence[Interval]) -> Interval | None:
    # Both are sorted by (mode, start) and disjoint within a mode: a two-pointer merge.
    i = j = 0
    while i < len(a) and j < len(b):
        x, y = a[i], b[j]
        if x.mode != y.mode:
            if x.mode < y.mode:
                i += 1
            else:
                j += 1
            continue
        lo, hi = max(x.start, y.start), min(x.end, y.end)
        if lo < hi:
            return Interval(x.mode, lo, hi)
        if x.end <= y.end:
            i += 1
        else:
            j += 1
    return None


def _footprints(sizes: Any, align_bytes: int, guard_bytes: int) -> dict[str, int]:
    """`{name: round_up(nbytes + guard, align)}` of the non-empty buffers of `sizes`."""
    from jaxarena._plan import _is_pow2, _size_items

    if not _is_pow2(align_bytes):
        raise ArenaError(f"align_bytes={align_bytes!r} must be a power of two")
    if not _is_int(guard_bytes) or guard_bytes < 0:
        raise ArenaError(f"guard_bytes={guard_bytes!r} must be an int >= 0")
    return {
        name: _round_up(nbytes + guard_bytes, align_bytes)
        for name, nbytes in _size_items(sizes)
        if nbytes
    }
