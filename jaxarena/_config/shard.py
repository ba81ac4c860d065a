"""Per-device sizing under tensor parallelism (`tp`) and expert parallelism (`ep`).

`ModelConfig.shard(tp=..., ep=...)` (built from `shard_changes`) is the config ONE device sees
when the model is split as Megatron-LM / vLLM split it for serving; `BufferSizes.from_config` of
that config is then the per-device arena. The sizing formulas are not duplicated here: every byte still comes
from `BufferSizes.from_config`, only the model dimensions it reads change.

The split, field by field (anything not listed is kept as is):

  tensor parallel (`tp` devices, activations replicated between layers)
    hidden_size                      not split (the residual stream is replicated)
    num_attention_heads              / tp (QKV column-parallel; also MLA's query heads)
    num_key_value_heads              / tp; when fewer KV heads than devices, each device keeps
                                     ONE (replicated) KV head, which needs tp % kv_heads == 0
    intermediate_size                / tp (dense FFN gate/up column-, down row-parallel)
    shared_expert_intermediate_size  / tp (the shared expert is a dense FFN)
    moe_intermediate_size            / tp when ep == 1 (experts TP-sharded inside);
                                     unsplit when ep > 1 (see below)
    linear_num_key_heads,            / tp (gated-delta-net heads)
    linear_num_value_heads
    mamba_num_heads                  / tp
    mamba1_d_inner                   / tp (Mamba-1 channels, as vLLM's MambaMixer splits them)
    moe_layer_widths                 each / tp when ep == 1, like moe_intermediate_size
    n_groups                         / tp; when fewer groups than devices, each device keeps
                                     ONE (replicated) group, which needs tp % n_groups == 0
                                     (vLLM's Mamba-2 mixer does the same); the gated
                                     RMSNorm of a group spanning devices all-reduces its
                                     sums of squares (no buffer of its own)
    vocab_size                       vocab-parallel LM head: the vocabulary is padded up to a
                                     multiple of `vocab_multiple * tp` (Megatron's
                                     `make_vocab_size_divisible_by`; default 1, i.e. the least
                                     padding) and each device holds `padded / tp` columns
    kv_lora_rank, q_lora_rank,       not split (MLA's down-projections are replicated)
    qk_rope_head_dim
    o_groups, o_lora_rank            not split (conservative: a device holding only its
                                     heads' groups would need less)
    hc_mult, hc_lowrank              not split (hyper-connections act on hidden-wide streams)
    index_n_heads, index_head_dim,   not split (the sparse-attention indexer is replicated, as
    index_topk, ...                  in vLLM's DeepSeek-V3.2 indexer)
    moe_latent_size                  not split (the LatentMoE latent is hidden-like)
    head dims, layer counts          never split (no pipeline parallelism here)

  expert parallel (`ep`), vLLM's convention: EP *replaces* TP for the routed experts. Each
  device holds `num_experts / ep` whole experts (`experts_per_device`), so with ep > 1
  `moe_intermediate_size` is NOT divided by tp. The router is replicated: every device scores
  every expert for every token, so the per-device config keeps the GLOBAL `num_experts`
  (`ModelConfig` has a single expert count, and the router's buffers need the global one).
  Effect on each MoE buffer:
    gate_logits, gate_logits_f32     exact: `M * (num_experts + zero_expert_num)` router
                                     logits, computed on every device
    scratch (routing ids/weights)    exact: every device holds the full top-k routing
    expert_gate_out/up_out/down_out  `k_max * top_k * moe_intermediate_size`: the worst case
                                     that every pick of every token lands on this device's
                                     experts; exact when top_k <= num_experts / ep (every
                                     bundled preset), an overestimate otherwise
    moe_fp8_scratch                  same worst-case expanded rows; its tile worklist counts
                                     `num_experts + 1` groups where `num_experts / ep + 1`
                                     would do (a few KiB too many, never too few)
  `num_experts_per_tok` (top-k) is kept: routing still picks top-k of the global experts.

Uneven splits are `ConfigError`s naming the field, its value and tp/ep; the only roundings
are the documented ones above (KV-head and group replication, vocabulary padding).
"""

from __future__ import annotations

import math
from typing import Any

from jaxarena._errors import ConfigError

__all__ = ["experts_per_device", "shard_changes"]

# Fields divided exactly by tp, with the reason a reader sees in the error message.
_SPLIT_BY_TP: dict[str, str] = {
    "num_attention_heads": "query heads are split over the tensor-parallel devices",
    "intermediate_size": "the dense FFN is split column-/row-parallel",
    "shared_expert_intermediate_size": "the shared expert is split like a dense FFN",
    "linear_num_key_heads": "gated-delta-net key heads are split over the devices",
    "linear_num_value_heads": "gated-delta-net value heads are split over the devices",
    "mamba_num_heads": "Mamba-2 heads are split over the devices",
    "mamba1_d_inner": "Mamba-1's inner channels are split over the devices",
}


def _positive_int(name: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name}={value!r} must be a positive int, got {type(value).__name__}"
    if value < 1:
        return f"{name}={value} must be >= 1"
    return None


def _split_or_replicate(field: str, value: int, tp: int, problems: list[str]) -> int:
    """`value / tp`, or 1 (replicated) when `value < tp` and `tp % value == 0`."""
    if value == 0:
        return 0
    if value >= tp:
        if value % tp:
            problems.append(
                f"{field}={value} is not divisible by tp={tp}; with at least as many "
                f"{field} as devices they are split evenly (choose tp dividing {value})"
            )
            return value
        return value // tp
    if tp % value:
        problems.append(
            f"{field}={value} < tp={tp} and tp is not a multiple of it; each device keeps "
            f"one replicated copy, which needs tp % {field} == 0"
        )
        return value
    return 1


def shard_changes(
    config: Any, *, tp: int = 1, ep: int = 1, vocab_multiple: int = 1
) -> dict[str, Any]:
    """The field changes that turn `config` into the config one device holds under tensor
    parallelism `tp` and expert parallelism `ep` (the split is documented field by field in
    this module's docstring). `ModelConfig.shard` applies them.

    Args:
      config: the whole model (what `ModelConfig.from_hf` or `ModelConfig.preset` returns).
      tp: tensor-parallel degree, a positive int. `tp=1, ep=1` returns an equal config.
      ep: expert-parallel degree, a positive int; > 1 only for models with routed experts,
        and must divide `num_experts`. With `ep > 1` the routed experts are not TP-split.
      vocab_multiple: the vocabulary is padded to a multiple of `vocab_multiple * tp` before
        it is split (Megatron's `make_vocab_size_divisible_by`, 128 there); 1 pads least.

    Returns:
      `{field: per-device value}`. `num_experts` and `num_experts_per_tok` stay global (the
      router scores every expert on every device); use `experts_per_device` for the experts
      whose weights a device holds. `source` gets a `[tp=.., ep=..]` suffix when the config
      has one.

    Raises:
      ConfigError: `tp`, `ep` or `vocab_multiple` is not a positive int, or a dimension does
        not split evenly; every problem is listed, each naming the field, its value and tp/ep.
    """
    where = f" (config from {config.source})" if config.source else ""
    bad = [
        p
        for p in (
            _positive_int("tp", tp),
            _positive_int("ep", ep),
            _positive_int("vocab_multiple", vocab_multiple),
        )
        if p
    ]
    if bad:
        raise ConfigError("invalid parallelism:\n  - " + "\n  - ".join(bad))

    problems: list[str] = []
    changes: dict[str, Any] = {}
    for field, why in _SPLIT_BY_TP.items():
        value = getattr(config, field)
        if value % tp:
            problems.append(f"{field}={value} is not divisible by tp={tp} ({why})")
        else:
            changes[field] = value // tp
    changes["num_key_value_heads"] = _split_or_replicate(
        "num_key_value_heads", config.num_key_value_heads, tp, problems
    )
    changes["n_groups"] = _split_or_replicate("n_groups", config.n_groups, tp, problems)

    if ep > 1:
        if not config.is_moe:
            problems.append(
                f"ep={ep} needs a model with routed experts, but num_experts=0; use ep=1"
            )
        elif config.num_experts % ep:
            problems.append(
                f"num_experts={config.num_experts} is not divisible by ep={ep} (each device "
                "holds the same number of whole experts)"
            )
        # EP replaces TP for the expert weights (vLLM): whole experts, unsplit width.
    elif config.moe_intermediate_size % tp:
        problems.append(
            f"moe_intermediate_size={config.moe_intermediate_size} is not divisible by "
            f"tp={tp} (with ep=1 every expert is split column-/row-parallel; pass ep > 1 to "
            "keep experts whole)"
        )
    else:
        changes["moe_intermediate_size"] = config.moe_intermediate_size // tp
        uneven = [w for w in config.moe_layer_widths if w % tp]
        if uneven:
            problems.append(
                f"moe_layer_widths {uneven} are not divisible by tp={tp} (with ep=1 every "
                "expert is split column-/row-parallel; pass ep > 1 to keep experts whole)"
            )
        changes["moe_layer_widths"] = tuple(w // tp for w in config.moe_layer_widths)

    if problems:
        raise ConfigError(
            f"cannot shard the model over tp={tp}, ep={ep}{where}:\n  - " + "\n  - ".join(problems)
        )
    multiple = vocab_multiple * tp
    changes["vocab_size"] = math.ceil(config.vocab_size / multiple) * multiple // tp
    if config.source:
        changes["source"] = f"{config.source} [tp={tp}, ep={ep}]"
    return changes


def experts_per_device(config: Any, *, ep: int = 1) -> int:
    """Routed experts whose weights one device holds: `num_experts / ep` (0 for dense models).

    Raises:
      ConfigError: `ep` is not a positive int, `ep > 1` on a dense model, or `ep` does not
        divide `num_experts`.
    """
    shard_changes(config, ep=ep)  # one place validates
    return config.num_experts // ep
