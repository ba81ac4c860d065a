"""The `ModelConfig` fields that only the weight count and the memory budget read, and how a
HuggingFace `config.json` gives them.

The arena sizing never reads these; `jaxarena._sizing.weights` does, to count every parameter
tensor exactly as the HuggingFace implementation of the family holds it. Each absent key takes
the default of that family's HF config class (e.g. Mamba and Gemma tie their embeddings by
default, gpt-oss has attention biases).
"""

from __future__ import annotations

import math
from typing import Any

from jaxarena._config.hf_json import Obj, show
from jaxarena._errors import ConfigError

__all__ = ["WEIGHT_DEFAULTS", "FFN_KINDS", "weight_fields"]

# Field -> default (the value for a config that states nothing: no biases, untied, ...).
WEIGHT_DEFAULTS: dict[str, Any] = {
    "tie_word_embeddings": False,  # LM head shares the embedding matrix
    "attention_bias": False,  # q/k/v/o projection biases
    "mlp_bias": False,  # gate/up/down projection biases
    "v_head_dim": 0,  # MLA value head width (0: head_dim - qk_rope_head_dim)
    "sliding_window": 0,  # tokens a sliding_attention layer keeps (0: no window)
    "conv_kernel": 4,  # Mamba / gated-delta-net causal conv width
    "mamba_proj_bias": False,  # Mamba in_proj/out_proj biases
    "mamba_conv_bias": True,  # Mamba conv1d bias (gated delta nets have none)
    "mamba1_d_inner": 0,  # Mamba-1 inner width (Mamba-1 has no heads)
    "mamba1_d_state": 0,  # Mamba-1 SSM state size
    "mamba1_dt_rank": 0,  # Mamba-1 time-step projection rank
    "num_mtp_layers": 0,  # multi-token-prediction layers the checkpoint ships
    "ffn_layer_types": (),  # per layer "dense"/"moe"/"none"; () = every layer the same
    "moe_layer_widths": (),  # per MoE layer expert width, when they differ (Nemotron-H Puzzle)
    "vision_param_count": 0,  # parameters of the vision tower of a VL model
    "other_param_count": 0,  # family blocks with no ModelConfig dims (hyper-connections, ...)
    "max_position_embeddings": 0,  # the context the model was trained for (0: not stated)
    "rope_scaled": False,  # RoPE scaling (yarn, linear, ...) that may extend that context
    "quant_method": "",  # quantization_config.quant_method of the checkpoint ("": float)
}
FFN_KINDS = frozenset({"dense", "moe", "none"})

_TIED_BY_DEFAULT = frozenset(
    {"mamba", "mamba2", "falcon_mamba", "gemma", "gemma2", "gemma3", "gemma3_text"}
)
_DEEPSEEK = ("deepseek_v2", "deepseek_v3", "deepseek_v32")
_QWEN_MOE = (
    "qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_vl_moe", "qwen3_5_moe", "qwen3_5_moe_text",
    "qwen3_6_moe",
)  # fmt: skip
_HC_FAMILIES = ("qwen4_exp", "qwen4_exp_text", "qwen3_8_flash_next")


def weight_fields(top: Obj, obj: Obj, model_type: str, kw: dict[str, Any]) -> dict[str, Any]:
    """The weight-only fields of one config.

    Args:
      top: the top-level JSON object; obj: the one holding the language model (`text_config`
        when there is one); model_type: the routed family; kw: the fields the family arm read
        (for `hidden_size`, `num_hidden_layers`, `num_experts`).

    Raises:
      ConfigError: a key has the wrong type or a negative value (named with its file).
    """
    mt = model_type
    n = kw["num_hidden_layers"]
    h = kw["hidden_size"]
    out: dict[str, Any] = {}
    tie = obj if obj.has("tie_word_embeddings") else top
    out["tie_word_embeddings"] = tie.bool("tie_word_embeddings", mt in _TIED_BY_DEFAULT)
    out["attention_bias"] = obj.bool("attention_bias", mt == "gpt_oss")
    out["mlp_bias"] = obj.bool("mlp_bias", False)
    out["v_head_dim"] = obj.int("v_head_dim")
    default_window = 4096 if mt in ("gemma2", "gemma3", "gemma3_text") else 0
    out["sliding_window"] = obj.int("sliding_window", default_window)
    for key in ("linear_conv_kernel_dim", "conv_kernel", "mamba_d_conv", "d_conv"):
        if obj.has(key):
            out["conv_kernel"] = obj.int(key)
            break
    if mt in ("mamba2", "mamba", "falcon_mamba"):
        out["mamba_proj_bias"] = obj.bool("use_bias", False)
        out["mamba_conv_bias"] = obj.bool("use_conv_bias", True)
    elif mt in ("nemotron_h", "nemotron_h_puzzle"):
        out["mamba_proj_bias"] = obj.bool("mamba_proj_bias", obj.bool("use_bias", False))
        out["mamba_conv_bias"] = obj.bool("use_conv_bias", True)
    elif mt == "jamba":
        out["mamba_proj_bias"] = obj.bool("mamba_proj_bias", False)
        out["mamba_conv_bias"] = obj.bool("mamba_conv_bias", True)
    if mt in ("mamba", "falcon_mamba", "jamba"):
        _mamba1(out, obj, mt, h)
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if obj.has(key):
            out["num_mtp_layers"] = obj.int(key)
            break
    ffn = _ffn_layer_types(obj, mt, n, kw.get("num_experts", 0))
    if len(set(ffn)) > 1:
        out["ffn_layer_types"] = ffn
    if mt == "nemotron_h_puzzle":
        widths = _puzzle_widths(obj)
        if len(set(widths)) > 1:
            out["moe_layer_widths"] = widths
    vision = top.obj("vision_config")
    if vision is not None and mt.startswith(("qwen3_vl", "qwen3_5", "qwen3_6", "qwen4_exp")):
        out["vision_param_count"] = _qwen3_vl_vision(vision, mt)
    elif vision is not None and mt == "gemma3":
        out["vision_param_count"] = _gemma3_vision(vision, h)
    out["max_position_embeddings"] = obj.int("max_position_embeddings", maximum=1 << 40)
    out["rope_scaled"] = _rope_scaled(obj)
    quant = top.obj("quantization_config")
    if quant is not None:
        out["quant_method"] = (quant.str("quant_method") or "").lower()
    if mt == "deepseek_v4":
        out["other_param_count"] = _deepseek_v4_other(obj, kw)
    elif mt in _HC_FAMILIES:
        out["other_param_count"] = _qwen4_exp_other(obj, kw)
    return out


def _rope_scaled(obj: Obj) -> bool:
    """True when `rope_parameters` or `rope_scaling` names a RoPE type other than `default`
    (for any layer type, as Gemma 3 lists them per layer type): a scaled RoPE (yarn, linear,
    dynamic, llama3, longrope) is how a model serves past `max_position_embeddings`."""
    for name in ("rope_parameters", "rope_scaling"):
        rope = obj.data.get(name)
        if not isinstance(rope, dict):
            continue
        for params in (rope, *(v for v in rope.values() if isinstance(v, dict))):
            kind = params.get("rope_type", params.get("type"))
            if isinstance(kind, str) and kind not in ("", "default"):
                return True
    return False


def _mamba1(out: dict[str, Any], obj: Obj, mt: str, h: int) -> None:
    jamba = mt == "jamba"
    expand = obj.int("mamba_expand" if jamba else "expand", 2)
    out["mamba1_d_inner"] = expand * h if jamba else obj.int("intermediate_size", expand * h)
    out["mamba1_d_state"] = obj.int("mamba_d_state" if jamba else "state_size", 16)
    key = "mamba_dt_rank" if jamba else "time_step_rank"
    rank = obj.data.get(key)
    if rank is None or rank == "auto":
        out["mamba1_dt_rank"] = math.ceil(h / 16)  # the HF classes' "auto"
    else:
        out["mamba1_dt_rank"] = obj.int(key)


def _ffn_layer_types(obj: Obj, mt: str, n: int, experts: int) -> tuple[str, ...]:
    """Which layers have a dense FFN and which a MoE, by each family's rule."""
    if not experts:
        return ()
    if mt in _DEEPSEEK:
        first, freq = obj.int("first_k_dense_replace"), obj.int("moe_layer_freq", 1)
        if freq < 1:
            raise obj.error("moe_layer_freq", "must be >= 1")
        return tuple("moe" if i >= first and i % freq == 0 else "dense" for i in range(n))
    if mt in _QWEN_MOE:
        only = set()
        for i, layer in enumerate(obj.list("mlp_only_layers") or []):
            if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
                raise ConfigError(
                    f"{obj.source}: {obj.key('mlp_only_layers')}[{i}]={show(layer)} must be a "
                    f"layer index (a non-negative integer)"
                )
            only.add(layer)
        step = obj.int("decoder_sparse_step", 1)
        if step < 1:
            raise obj.error("decoder_sparse_step", "must be >= 1")
        return tuple("moe" if i not in only and (i + 1) % step == 0 else "dense" for i in range(n))
    if mt == "jamba":
        period, offset = obj.int("expert_layer_period", 2), obj.int("expert_layer_offset", 1)
        if period < 1:
            raise obj.error("expert_layer_period", "must be >= 1")
        return tuple("moe" if i % period == offset else "dense" for i in range(n))
    return ()


def _puzzle_widths(obj: Obj) -> tuple[int, ...]:
    widths = []
    for i, block in enumerate(obj.list("block_configs") or []):
        entry = obj.item_obj("block_configs", i, block)
        if entry.str("block_type") == "moe":
            widths.append(entry.int("moe_intermediate_size"))
    return tuple(widths)


def _qwen3_vl_vision(v: Obj, model_type: str) -> int:
    """Parameters of the Qwen3-VL vision tower (also Qwen3.5's and Qwen4-exp's): a Conv3d patch
    embedding with bias, learned position embeddings, `depth` pre-LayerNorm ViT blocks with
    biases, the patch merger, and one merger per deepstack layer (normalized after the
    `spatial_merge_size**2` shuffle). Absent keys take the HF vision config defaults."""
    h, inter, depth = (
        v.int("hidden_size", 1152),
        v.int("intermediate_size", 4304),
        v.int("depth", 27),
    )
    out = v.int("out_hidden_size", 3584)
    patch, temporal = v.int("patch_size", 16), v.int("temporal_patch_size", 2)
    channels, merge = v.int("in_channels", 3), v.int("spatial_merge_size", 2)
    positions = v.int("num_position_embeddings", 2304)
    listed = v.list("deepstack_visual_indexes")
    deep = len(listed) if listed is not None else (3 if model_type.startswith("qwen3_vl") else 0)
    wide = h * merge * merge
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (inter * h + inter) + (h * inter + h)

    def merger(norm_width: int) -> int:
        return 2 * norm_width + wide * wide + wide + out * wide + out

    return (
        h * channels * temporal * patch * patch + h + positions * h + depth * block
        + merger(h) + deep * merger(wide)
    )  # fmt: skip


def _gemma3_vision(v: Obj, text_hidden: int) -> int:
    """Parameters of Gemma 3's SigLIP vision tower and its projector: a Conv2d patch embedding
    with bias, learned position embeddings (one per patch), `num_hidden_layers` pre-LayerNorm
    ViT blocks with biases, the post-LayerNorm, then the projector's RMSNorm and its
    `[vision hidden, text hidden]` matrix. Absent keys take the HF SigLIP defaults of
    Gemma 3 (gemma-3-4b/12b/27b: 421,290,864 with the 12B's text width 3840)."""
    h, inter, depth = (
        v.int("hidden_size", 1152),
        v.int("intermediate_size", 4304),
        v.int("num_hidden_layers", 27),
    )
    channels, patch, image = (
        v.int("num_channels", 3),
        v.int("patch_size", 14),
        v.int("image_size", 896),
    )
    block = 4 * h + 4 * (h * h + h) + (inter * h + inter) + (h * inter + h)
    tower = h * channels * patch * patch + h + (image // patch) ** 2 * h + depth * block + 2 * h
    return tower + h * text_hidden + h


def _deepseek_v4_other(obj: Obj, kw: dict[str, Any]) -> int:
    """DeepSeek-V4's KV compressors (per `compress_ratios` entry: 4 = overlapping windows with
    a sparse indexer, 128 = heavy compression, 0 = none) and its hyper-connection mixers."""
    h, n = kw["hidden_size"], kw["num_hidden_layers"]
    hd, lora_q, hc = kw["head_dim"], kw["q_lora_rank"], kw["hc_mult"]
    ih, ihd = kw["index_n_heads"] or 64, kw["index_head_dim"] or 128
    total = 0
    for ratio in (obj.list("compress_ratios") or [])[:n]:  # the V4 arm validated the entries
        if ratio == 0:
            continue
        width = 2 * hd if ratio == 4 else hd  # overlapping windows keep two series
        total += ratio * width + 2 * width * h + hd  # position bias, kv/gate projections, norm
        if ratio == 4:  # the indexer's own compressor, query projection and scorer
            total += ratio * 2 * ihd + 2 * 2 * ihd * h + ihd + ih * ihd * lora_q + ih * h
    mix = hc * (2 + hc)
    total += n * 2 * (mix * hc * h + mix + 3)  # attention and FFN mixers of every layer
    return total + hc * hc * h + hc + 1  # the head's mixer


def _qwen4_exp_other(obj: Obj, kw: dict[str, Any]) -> int:
    """Qwen4-exp's hyper-connection blocks (two per layer and a final mixer), the sparse
    indexer of its full-attention layers, and its per-layer n-gram embeddings (PLE)."""
    h, n = kw["hidden_size"], kw["num_hidden_layers"]
    hc, rank = obj.int("hc_count", 4), obj.int("hc_lowrank")
    wide = hc * h
    block = wide + 2 * rank * wide  # norm, low-rank down and up projections
    total = n * 2 * (block + hc * wide) + block  # + each block's injection weights; the mixer
    full = sum(1 for k in kw["layer_types"] if k == "full_attention")
    ih, ihd = obj.int("indexer_n_heads"), obj.int("indexer_head_dim")
    if ih:
        total += full * ((ih + obj.int("indexer_kv_heads", 1)) * ihd * h + 2 * ihd)
    ple_layers = obj.list("ple_layer_ids") or []
    if ple_layers:
        dim = obj.int("ple_embed_dim", h)
        heads = (obj.int("ngram_size", 3) - 1) * obj.int("heads_per_ngram", 8)
        base = obj.int("ngram_vocab_size_base")
        divisor = max(obj.int("make_ngram_vocab_size_divisible_by", 1), 1)
        kernel = obj.int("ple_conv_kernel_size", 4)
        if heads < 1:
            raise obj.error("ngram_size", "and heads_per_ngram must give at least one n-gram head")
        if base > 1 << 34:  # published bases are ~2e7; the prime search is by trial division
            raise obj.error("ngram_vocab_size_base", f"is implausibly large (at most {1 << 34})")
        for index in range(len(ple_layers)):
            # Head j of PLE layer i hashes into a table of the (i * heads + j + 1)-th prime
            # >= ngram_vocab_size_base; the tables are stacked and padded to the divisor.
            sizes = _primes_from(base, (index + 1) * heads)[index * heads :]
            rows = -(-sum(sizes) // divisor) * divisor
            total += rows * (dim // heads) + wide * dim + h * dim + 3 * wide + wide * kernel
    return total


def _primes_from(start: int, count: int) -> list[int]:
    """The first `count` primes >= `start` (trial division: a few dozen near 2e7 are quick)."""
    out: list[int] = []
    value = max(start, 2)
    while len(out) < count:
        if value == 2 or (value % 2 and all(value % d for d in range(3, math.isqrt(value) + 1, 2))):
            out.append(value)
        value += 1
    return out


def weight_field_problems(config: Any) -> list[str]:
    """What is wrong with the weight-only fields of `config` (`ModelConfig` validation)."""
    problems = []
    for name, default in WEIGHT_DEFAULTS.items():
        value = getattr(config, name)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                problems.append(f"{name}={show(value)} must be a bool")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append(f"{name}={show(value)} must be a non-negative int")
            elif value < 0:
                problems.append(f"{name}={value} must be >= 0")
        elif isinstance(value, list):
            object.__setattr__(config, name, tuple(value))  # keep the config hashable
    kinds = config.ffn_layer_types
    if not isinstance(kinds, tuple) or any(
        not isinstance(k, str) or k not in FFN_KINDS for k in kinds
    ):
        problems.append(
            f"ffn_layer_types={show(kinds)} must be a tuple of {sorted(FFN_KINDS)} entries"
        )
    elif kinds and len(kinds) != config.num_hidden_layers:
        problems.append(
            f"len(ffn_layer_types)={len(kinds)} != num_hidden_layers={config.num_hidden_layers}"
        )
    widths = config.moe_layer_widths
    if not isinstance(widths, tuple) or any(
        isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths
    ):
        problems.append(f"moe_layer_widths={show(widths)} must be a tuple of positive ints")
    return problems
