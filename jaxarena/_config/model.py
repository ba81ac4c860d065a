"""`ModelConfig`: every model dimension the arena sizing reads.

Field names are those of the seed's Rust `ModelConfig` (spec §14.1) so the two can be compared
line by line; defaults are the seed's serde defaults. Parsing HuggingFace `config.json` files
lives in `hf_source.py` / `hf_families.py`; this module only holds the value type, its
validation and the derived
quantities the sizing formulas call.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from jaxarena._config import hf_source
from jaxarena._config.hf_json import show
from jaxarena._config.hf_weights import weight_field_problems
from jaxarena._config.schema import (
    ATTENTION_KINDS,
    INT_DEFAULTS,
    INT_MAXIMA,
    LAYER_TYPES,
    SSM_KINDS,
)
from jaxarena._config.shard import shard_changes
from jaxarena._errors import ConfigError, ConfigWarning, join_problems

__all__ = ["ModelConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The model dimensions the buffer sizing reads, named as the seed's Rust `ModelConfig`.

    Every field but `hidden_size` has the seed's default, so any subset of keywords works:
    `ModelConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128)`. Zero is legal for every count (a pure Mamba model has no attention heads).

    The instance is frozen and hashable, so it can be a static argument of `jax.jit`.

    Layer structure: `layer_types` is a tuple of HuggingFace layer-type strings
    (`"full_attention"`, `"sliding_attention"`, `"linear_attention"`, `"mamba"`, `"moe"`,
    `"mlp"`, ...; see `LAYER_TYPES`). When it is empty the seed's fallback applies: every
    `full_attention_interval`-th layer is attention and the rest are SSM layers.

    `model_type` and `source` are informational (where the config came from); they do not
    enter any size.

    Every integer field has a documented sane range, `0..INT_MAXIMA[name]` (see
    `jaxarena._config.schema.INT_MAXIMA`: at least 16x the largest published value, e.g.
    `hidden_size <= 2**20`, `vocab_size <= 2**24`, `num_hidden_layers <= 2**16`).

    Raises:
      ConfigError: a field has the wrong type, a negative value or one beyond its sane range,
        `num_attention_heads` is not a multiple of `num_key_value_heads`, `num_experts_per_tok`
        exceeds `num_experts` on a model with experts, a layer type is unknown or not a string,
        `layer_types` disagrees with `num_hidden_layers`, or the Mamba-2 dimensions are
        incomplete.
    """

    hidden_size: int
    num_hidden_layers: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    attn_gated: bool = False
    mrope_interleaved: bool = False
    linear_num_key_heads: int = 0
    linear_key_head_dim: int = 0
    linear_num_value_heads: int = 0
    linear_value_head_dim: int = 0
    num_experts: int = 0
    zero_expert_num: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    moe_latent_size: int = 0
    layer_types: tuple[str, ...] = ()
    full_attention_interval: int = 1
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state_size: int = 0
    n_groups: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    o_lora_rank: int = 0
    o_groups: int = 0
    hc_mult: int = 0
    hc_lowrank: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    index_compress_ratio: int = 0
    adapter_max_rank: int = 0
    # Weight-only fields (see `jaxarena._config.hf_weights`): the parameter count and the
    # memory budget read them; the arena sizing does not.
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    v_head_dim: int = 0
    sliding_window: int = 0
    conv_kernel: int = 4
    mamba_proj_bias: bool = False
    mamba_conv_bias: bool = True
    mamba1_d_inner: int = 0
    mamba1_d_state: int = 0
    mamba1_dt_rank: int = 0
    num_mtp_layers: int = 0
    ffn_layer_types: tuple[str, ...] = ()
    moe_layer_widths: tuple[int, ...] = ()
    vision_param_count: int = 0
    other_param_count: int = 0
    # The context the config states, and whether a RoPE scaling may extend it: checked
    # against the serve limits (`check_context`), never a size, so not compared.
    max_position_embeddings: int = dataclasses.field(default=0, compare=False)
    rope_scaled: bool = dataclasses.field(default=False, compare=False)
    # How the checkpoint stores its weights (`quantization_config.quant_method`: "fp8",
    # "mxfp4", ...; "" for float): the budget's default weight format, not a size.
    quant_method: str = dataclasses.field(default="", compare=False)
    model_type: str = dataclasses.field(default="", compare=False)
    source: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        where = f" (in {self.source})" if self.source else ""
        problems: list[str] = []
        for name in ("hidden_size", *INT_DEFAULTS):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append(
                    f"{name}={value!r} must be a non-negative int, got {type(value).__name__}"
                )
            elif value < 0:
                problems.append(f"{name}={show(value)} must be >= 0")
        for name, maximum in INT_MAXIMA.items():
            value = getattr(self, name)
            if isinstance(value, int) and value > maximum:
                problems.append(
                    f"{name}={show(value)} is beyond the sane range 0..{maximum:,} of a model "
                    "dimension (a corrupt or mistyped config?)"
                )
        if (
            self.moe_layer_widths
            and isinstance(self.moe_layer_widths, tuple)
            and any(isinstance(w, int) and w > INT_MAXIMA["moe_intermediate_size"]
                    for w in self.moe_layer_widths)
        ):  # fmt: skip
            problems.append(
                f"moe_layer_widths has entries beyond "
                f"{INT_MAXIMA['moe_intermediate_size']:,} (the moe_intermediate_size bound)"
            )
        for name in ("attn_gated", "mrope_interleaved"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name}={getattr(self, name)!r} must be a bool")
        if not isinstance(self.layer_types, tuple):
            if isinstance(self.layer_types, list):
                # Lists are the natural spelling; store a tuple so the config stays hashable.
                object.__setattr__(self, "layer_types", tuple(self.layer_types))
            else:
                problems.append(
                    f"layer_types={self.layer_types!r} must be a tuple of layer-type strings"
                )
        problems += weight_field_problems(self)
        if problems:
            raise ConfigError(join_problems("invalid ModelConfig" + where, problems))

        if len(self.layer_types) > INT_MAXIMA["num_hidden_layers"]:
            problems.append(
                f"layer_types has {len(self.layer_types):,} entries, beyond the "
                f"{INT_MAXIMA['num_hidden_layers']:,} layers a model can have"
            )
        # Checked as strings first: an unhashable entry (a list, a dict) must not escape as a
        # TypeError from the set below.
        bad_kinds = sorted(
            {show(k) if not isinstance(k, str) else k for k in self.layer_types
             if not isinstance(k, str) or k not in LAYER_TYPES},
            key=str,
        )  # fmt: skip
        if bad_kinds:
            problems.append(
                f"layer_types has unknown entries {bad_kinds}; known: {sorted(LAYER_TYPES)}"
            )
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            problems.append(
                f"len(layer_types)={len(self.layer_types)} != num_hidden_layers="
                f"{self.num_hidden_layers}"
            )
        q, kv = self.num_attention_heads, self.num_key_value_heads
        if q and kv and q % kv:
            problems.append(
                f"num_attention_heads={q} is not a multiple of num_key_value_heads={kv}"
            )
        if self.num_experts > 0 and self.num_experts_per_tok > self.num_experts:
            problems.append(
                f"num_experts_per_tok={self.num_experts_per_tok} exceeds "
                f"num_experts={self.num_experts}"
            )
        if self.mamba_num_heads > 0:
            for name in ("mamba_head_dim", "ssm_state_size", "n_groups"):
                if getattr(self, name) == 0:
                    problems.append(f"mamba_num_heads={self.mamba_num_heads} needs {name} > 0")
            if self.n_groups and self.mamba2_d_inner % self.n_groups:
                problems.append(
                    f"mamba_num_heads*mamba_head_dim={self.mamba2_d_inner} is not divisible "
                    f"by n_groups={self.n_groups}"
                )
        if (
            "linear_attention" in self.layer_types
            and self.linear_num_key_heads == 0
            and self.mamba_num_heads == 0
        ):
            problems.append(
                "layer_types has linear_attention layers but linear_num_key_heads and "
                "mamba_num_heads are both 0"
            )
        if problems:
            raise ConfigError(join_problems("invalid ModelConfig" + where, problems))

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def from_hf(cls, source: Any, *, revision: str | None = None) -> ModelConfig:
        """Reads a HuggingFace config.

        Args:
          source: a path to a `config.json`, a directory holding one, an already-loaded dict,
            or (with `huggingface_hub` installed) a hub repo id such as `"Qwen/Qwen3-8B"`.
          revision: hub revision, only for repo ids.

        Returns:
          The config as the architecture really is (head_dim derived when absent, experts from
          `n_routed_experts`/`num_local_experts`, MRoPE under `rope_scaling` too, nested
          `text_config`, Nemotron-H patterns, ...). `jaxarena._config.hf_families` lists every
          family.

        Raises:
          ConfigError: invalid JSON, a missing required key, a wrong type, or an unknown
            `model_type` without usable generic fields. The message names the key and file.
        """
        return cls(**hf_source.load(source, revision=revision))

    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        """Loads a bundled preset by name (see `jaxarena.presets()`), e.g. `"qwen3-8b"`.

        Returns:
          The preset parsed exactly as `from_hf` parses its file; `source` is
          `"jaxarena/presets/<name>.json"`.

        Raises:
          ConfigError: `name` is not a string or not a bundled preset (the message lists the
            available names), or the preset file itself is invalid.
        """
        return cls(**hf_source.preset_fields(name))

    def shard(self, tp: int = 1, ep: int = 1, *, vocab_multiple: int = 1) -> ModelConfig:
        """The per-device config under tensor parallelism `tp` and expert parallelism `ep`.

        Heads, FFN widths, SSM heads and the vocabulary are divided as Megatron/vLLM split them
        (KV heads and Mamba groups are replicated when fewer than `tp`; the module docstring
        of `jaxarena._config.shard` lists every rule). `BufferSizes.from_config(
        config.shard(tp=4), ...)` gives the arena each device needs.

        Args:
          tp: tensor-parallel degree, a positive int. `tp=1, ep=1` returns an equal config.
          ep: expert-parallel degree, a positive int; > 1 only for models with routed experts,
            and must divide `num_experts`. With `ep > 1` the routed experts are not TP-split.
          vocab_multiple: the vocabulary is padded to a multiple of `vocab_multiple * tp`
            before it is split (Megatron's `make_vocab_size_divisible_by`); 1 pads least.

        Returns:
          A validated config with the per-device dimensions; `num_experts` and
          `num_experts_per_tok` stay global (use `experts_per_device` for the experts a device
          holds); `source` gets a `[tp=.., ep=..]` suffix when the config has one.

        Raises:
          ConfigError: a dimension does not divide evenly, or `tp`/`ep`/`vocab_multiple` is
            not a positive int; every problem is listed.
        """
        return self.replace(**shard_changes(self, tp=tp, ep=ep, vocab_multiple=vocab_multiple))

    def experts_per_device(self, ep: int = 1) -> int:
        """Routed experts whose weights one device holds: `num_experts / ep` (0 if dense).

        Raises:
          ConfigError: `ep` is not a positive int, `ep > 1` on a dense model, or `ep` does not
            divide `num_experts`.
        """
        shard_changes(self, ep=ep)  # one place validates
        return self.num_experts // ep

    def replace(self, **changes: Any) -> ModelConfig:
        """Returns a copy with `changes` applied (validated like a new config).

        Raises:
          ConfigError: a name that is not a field, or a value the config refuses.
        """
        fields = {f.name for f in dataclasses.fields(self) if f.init}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise ConfigError(f"ModelConfig has no field(s) {unknown}; fields: {sorted(fields)}")
        return dataclasses.replace(self, **changes)

    def check_context(
        self, tokens: int, what: str, error: type[Exception] = ConfigError
    ) -> None:
        """Checks a sequence length against the model's context (`max_position_embeddings`).

        Args:
          tokens: the sequence length asked for (a `max_seq_len`, a prompt + new tokens).
          what: how the message names it (`"--max-seq-len 1,000,000"`).
          error: the exception type raised (the CLI passes its one-line error).

        Raises:
          error: `tokens` past the context of a config without RoPE scaling.

        Warns:
          ConfigWarning: past the context of a config with RoPE scaling (how a model serves
          past it). Nothing when the config states no context.
        """
        context = self.max_position_embeddings
        if not context or tokens <= context:
            return
        text = (f"{what} is past the model's context: max_position_embeddings={context:,} in "
                f"{self.source or 'the config'}")  # fmt: skip
        if not self.rope_scaled:
            raise error(f"{text}; lower it to at most {context:,}")
        warnings.warn(f"{text}; its RoPE scaling may extend it (the sizes hold; the quality is "
                      "the scaling's)", ConfigWarning, stacklevel=2)  # fmt: skip

    # -- derived quantities of the seed (spec §11) --------------------------------------------

    @property
    def moe_input_size(self) -> int:
        """Width of a routed expert's input/output rows: the LatentMoE latent, else hidden."""
        return self.moe_latent_size if self.moe_latent_size > 0 else self.hidden_size

    @property
    def mamba2_d_inner(self) -> int:
        """Mamba-2 inner width, `mamba_num_heads * mamba_head_dim`."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba2_d_xbc(self) -> int:
        """Width of the Mamba-2 conv input `x | B | C`."""
        return self.mamba2_d_inner + 2 * self.n_groups * self.ssm_state_size

    @property
    def mamba2_in_proj_size(self) -> int:
        """Width of the Mamba-2 in_proj output `z | xBC | dt`."""
        return self.mamba2_d_inner + self.mamba2_d_xbc + self.mamba_num_heads

    @property
    def ssm_qkvz_size(self) -> int:
        """Width of the gated-delta-net QKVZ projection (Q, K, V and the Z gate)."""
        return (
            2 * self.linear_num_key_heads * self.linear_key_head_dim
            + 2 * self.linear_num_value_heads * self.linear_value_head_dim
        )

    @property
    def ssm_ba_size(self) -> int:
        """Width of the gated-delta-net beta/alpha projection (two per value head)."""
        return self.linear_num_value_heads * 2

    @property
    def num_attention_layers(self) -> int:
        """Layers that run attention (full, sliding, chunked or sparse)."""
        if self.layer_types:
            return sum(1 for k in self.layer_types if k in ATTENTION_KINDS)
        if self.full_attention_interval == 0:
            return self.num_hidden_layers
        return self.num_hidden_layers // self.full_attention_interval

    @property
    def num_ssm_layers(self) -> int:
        """Layers that run a state-space mixer (gated delta net or Mamba-2)."""
        if self.layer_types:
            return sum(1 for k in self.layer_types if k in SSM_KINDS)
        return self.num_hidden_layers - self.num_attention_layers

    @property
    def num_mamba_layers(self) -> int:
        """SSM layers that are Mamba-2 (the model has Mamba heads), else 0."""
        return self.num_ssm_layers if self.mamba_num_heads > 0 else 0

    @property
    def is_moe(self) -> bool:
        """True when the model has routed experts."""
        return self.num_experts > 0


