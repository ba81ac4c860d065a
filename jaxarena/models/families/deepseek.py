"""DeepSeek-V2 and DeepSeek-V3 (and Kimi-K2, a DeepSeek-V3 checkpoint): per decoder layer an
MLA block (`jaxarena.models.blocks.mla`) then an MLP, tensors under
`model.layers.{i}.{self_attn,mlp}` with `input_layernorm` / `post_attention_layernorm`.

The first `first_k_dense_replace` layers have a dense SwiGLU MLP; the later ones are routed
`MoE` blocks (`jaxarena/models/blocks/moe.py`) with SwiGLU experts under `mlp.experts.{j}`, the
router `mlp.gate` and a shared expert `mlp.shared_experts` of width `n_shared_experts *
moe_intermediate_size` (`ModelConfig.shared_expert_intermediate_size`), as transformers'
`DeepseekV2Moe` / `DeepseekV3MoE` build them:

- V2 (`DeepseekV2TopkRouter`): softmax scores, `topk_method` `greedy` or
  `group_limited_greedy`, weights times `routed_scaling_factor`, never renormalised
  (`MoE.router="softmax_group"`). transformers reads no `norm_topk_prob` here while DeepSeek's
  own code renormalises instead of scaling when it is set; every released V2 config has it
  false, and a config with it true is refused (NotImplementedError) rather than guessed.
- V3 / Kimi-K2 (`DeepseekV3TopkRouter`): sigmoid scores with `e_score_correction_bias` for the
  choice (`topk_method: noaux_tc`), group-limited, `norm_topk_prob`, `routed_scaling_factor`
  (`MoE.router="sigmoid_group"`).

A layer `i` is routed when `i >= first_k_dense_replace` and `i % moe_layer_freq == 0`
(DeepSeek's rule, which `ModelConfig.ffn_layer_types` sizes; transformers ignores
`moe_layer_freq`, which is 1 in every released config). The
multi-token-prediction layers that DeepSeek-V3 checkpoints carry after the last decoder layer
(`model.layers.{num_hidden_layers + j}`, `num_nextn_predict_layers` of them) are skipped at
load: their tensors are accepted and not read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jaxarena import ConfigError, ModelConfig
from jaxarena.models.blocks.mla import MLA
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.blocks.moe import MoE
from jaxarena.models.blocks.moe_routing import DEEPSEEK_V2_TOPK_METHODS
from jaxarena.models.checkpoint import Reader
from jaxarena.models.core.mla_rope import Yarn
from jaxarena.models.families.base import Family, TensorNames, unsupported
from jaxarena.models.stack import Arch

__all__ = ["DeepseekV2", "DeepseekV3", "mla_rope_options"]

_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def _groups(raw: dict[str, Any], config: ModelConfig, path: Path, min_size: int) -> dict[str, int]:
    """`n_group` / `topk_group` of a group-limited router (absent: 1).

    Raises:
      ConfigError: `n_group` does not divide `n_routed_experts` into groups of at least
        `min_size` experts, or `topk_group` is not in [1, n_group].
    """
    g, kg, e = int(raw.get("n_group") or 1), int(raw.get("topk_group") or 1), config.num_experts
    if g < 1 or e % g or e // g < min_size or not 1 <= kg <= g:
        raise ConfigError(f"{path}: n_group={g}, topk_group={kg}: n_group must divide "
                          f"n_routed_experts={e} into groups of at least {min_size} experts and "
                          "1 <= topk_group <= n_group")  # fmt: skip
    return {"n_group": g, "topk_group": kg}


def mla_rope_options(raw: dict[str, Any], path: Path) -> tuple[float, Yarn | None]:
    """`(rope_theta, yarn)` of a DeepSeek `config.json` (`rope_parameters` or the released
    `rope_scaling` plus a top-level `rope_theta`).

    Raises:
      NotImplementedError: a RoPE type other than the default or `yarn`.
    """
    rp = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rp = rp if isinstance(rp, dict) else {}
    kind = rp.get("rope_type", rp.get("type", "default"))
    theta = float(rp.get("rope_theta") or raw.get("rope_theta") or 10000.0)
    if kind == "default":
        return theta, None
    if kind != "yarn":
        raise unsupported(path, f"rope_type={kind!r}; MLA implements the default RoPE and yarn")
    try:
        return theta, Yarn.from_config(rp, int(raw.get("max_position_embeddings") or 0))
    except ValueError as e:
        raise unsupported(path, str(e)) from None


class DeepseekV2(Family):
    """`deepseek_v2` (V2, V2-Lite): MLA with or without a q LoRA, interleaved RoPE pairs."""

    model_types: tuple[str, ...] = ("deepseek_v2",)

    def rope_interleave(self, raw: dict[str, Any]) -> bool:
        """V2 rotates adjacent pairs (its complex-number RoPE) always."""
        return True

    def moe_block(self, raw: dict[str, Any], config: ModelConfig, path: Path) -> MoE:
        """The routed layers' block: softmax scores, greedy or group-limited greedy top-k."""
        method = raw.get("topk_method") or "greedy"
        if method not in DEEPSEEK_V2_TOPK_METHODS:
            raise unsupported(path, f"topk_method={method!r}; DeepSeek-V2 routing implements "
                              f"{DEEPSEEK_V2_TOPK_METHODS}")  # fmt: skip
        if (raw.get("scoring_func") or "softmax") != "softmax":
            raise unsupported(path, f"scoring_func={raw['scoring_func']!r} with deepseek_v2; "
                              "transformers' DeepseekV2TopkRouter scores with softmax")  # fmt: skip
        if raw.get("norm_topk_prob"):
            raise unsupported(path, "norm_topk_prob=true with deepseek_v2: transformers ignores "
                              "it and DeepSeek's code renormalises without routed_scaling_factor;"
                              " no released V2 config sets it")  # fmt: skip
        groups = {"n_group": 1, "topk_group": 1}  # greedy reads neither
        if method == "group_limited_greedy":
            groups = _groups(raw, config, path, min_size=1)
        return MoE(router="softmax_group", topk_method=method, norm_topk_prob=False, **groups,
                   routed_scaling_factor=float(raw.get("routed_scaling_factor") or 1.0),
                   shared="shared_experts")  # fmt: skip

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """MLA then a dense MLP or a routed `MoE` per layer (see the module docstring)."""
        if raw.get("hidden_act", "silu") != "silu":
            raise unsupported(path, f"hidden_act={raw['hidden_act']!r}; only silu is implemented")
        if raw.get("attention_bias"):
            raise unsupported(path, "attention_bias=true; biased MLA projections are not "
                              "implemented")  # fmt: skip
        if config.kv_lora_rank <= 0 or config.qk_rope_head_dim <= 0:
            raise unsupported(path, "kv_lora_rank and qk_rope_head_dim must be > 0 for MLA")
        n = config.num_hidden_layers
        routed = [t == "moe" for t in config.ffn_layer_types] or [False] * n
        ffn: dict[bool, Any] = {False: MLP(act="swiglu")}
        if any(routed):
            if config.shared_expert_intermediate_size < 1:
                raise unsupported(path, "n_shared_experts=0: DeepSeek MoE layers without a "
                                  "shared expert are not implemented")  # fmt: skip
            ffn[True] = self.moe_block(raw, config, path)
        theta, yarn = mla_rope_options(raw, path)
        eps = float(raw.get("rms_norm_eps", 1e-6))
        mla = MLA(rope_theta=theta, rope_interleave=self.rope_interleave(raw), yarn=yarn,
                  rms_eps=eps)  # fmt: skip
        blocks = tuple(b for r in routed for b in (mla, ffn[r]))
        return Arch(blocks=blocks, rms_eps=eps, tie_embeddings=config.tie_word_embeddings)

    def tensor_names(self, config: ModelConfig, arch: Arch) -> TensorNames:
        """`model.layers.{i}.self_attn` / `.mlp` with their layer norms."""
        blocks = []
        for i in range(config.num_hidden_layers):
            pre = f"model.layers.{i}"
            blocks.append((f"{pre}.self_attn", f"{pre}.input_layernorm.weight"))
            blocks.append((f"{pre}.mlp", f"{pre}.post_attention_layernorm.weight"))
        return TensorNames(blocks=tuple(blocks), embed="model.embed_tokens.weight",
                           final_norm="model.norm.weight")  # fmt: skip

    def read_params(self, reader: Reader, config: ModelConfig, arch: Arch) -> dict[str, Any]:
        """The decoder's weights; the MTP layers' tensors (past the last layer) are skipped."""
        params = super().read_params(reader, config, arch)
        n = config.num_hidden_layers
        for name in reader.ckpt:
            m = _LAYER.match(name)
            if m and int(m.group(1)) >= n:
                reader.used.add(name)
        return params


class DeepseekV3(DeepseekV2):
    """`deepseek_v3` and `kimi_k2`: V2's layout with a q LoRA, YaRN and `rope_interleave`
    (default true; false: rotate-half pairs)."""

    model_types = ("deepseek_v3", "kimi_k2")

    def rope_interleave(self, raw: dict[str, Any]) -> bool:
        """`rope_interleave` of the config (transformers' default: true)."""
        return bool(raw.get("rope_interleave", True))

    def moe_block(self, raw: dict[str, Any], config: ModelConfig, path: Path) -> MoE:
        """The routed layers' block: sigmoid scores, correction bias, group-limited top-k."""
        method = raw.get("topk_method") or "noaux_tc"
        if method != "noaux_tc" or (raw.get("scoring_func") or "sigmoid") != "sigmoid":
            raise unsupported(path, f"topk_method={method!r}, scoring_func="
                              f"{raw.get('scoring_func')!r}; transformers' DeepseekV3TopkRouter "
                              "implements noaux_tc with sigmoid scores")  # fmt: skip
        return MoE(router="sigmoid_group", norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
                   **_groups(raw, config, path, min_size=2),  # a group scores its top 2
                   routed_scaling_factor=float(raw.get("routed_scaling_factor") or 1.0),
                   shared="shared_experts")  # fmt: skip
