"""Nemotron-H: Mamba-2, attention (no RoPE) and relu^2 MLP blocks as `layer_types` lists
them, in Mamba-2's `backbone.*` layout; MoE layers (`E`) are `MoE` blocks with transformers'
`NemotronHTopkRouter` (sigmoid, group-limited), non-gated relu^2 experts, the shared expert
and, when the config has `moe_latent_size`, the latent projections (`NemotronHMoE`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.blocks.attention import Attention
from jaxarena.models.blocks.mamba2 import Mamba2
from jaxarena.models.blocks.mlp import MLP
from jaxarena.models.blocks.moe import MoE
from jaxarena.models.blocks.registry import block_kind
from jaxarena.models.families.base import unsupported
from jaxarena.models.families.mamba2 import Mamba2Family
from jaxarena.models.stack import Arch

__all__ = ["NemotronH"]


class NemotronH(Mamba2Family):
    """`nemotron_h` (Mamba-2, attention, relu^2 MLP and MoE layers)."""

    model_types = ("nemotron_h",)

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """One block per entry of `layer_types`."""
        self.check_mamba(config, path)
        act = raw.get("mlp_hidden_act", "relu2")
        if act != "relu2":
            raise unsupported(path, f"mlp_hidden_act={act!r}; only relu2 is implemented")
        kinds = [block_kind(lt, {"moe": "moe"}) for lt in config.layer_types]
        other = sorted({lt for lt, k in zip(config.layer_types, kinds, strict=True) if k is None})
        if other:
            raise unsupported(path, f"Nemotron-H blocks {other} are not implemented")
        eps = float(raw.get("layer_norm_epsilon", 1e-5))
        make = {"attention": Attention(rope=False, rms_eps=eps), "mamba": Mamba2(rms_eps=eps),
                "mlp": MLP(act="relu2")}  # fmt: skip
        if "moe" in kinds:
            make["moe"] = self.moe_block(raw, config, path)
        return Arch(blocks=tuple(make[k] for k in kinds), rms_eps=eps,
                    tie_embeddings=config.tie_word_embeddings)  # fmt: skip

    def moe_block(self, raw: dict[str, Any], config: ModelConfig, path: Path) -> MoE:
        """The `MoE` block of the `E` layers (`NemotronHMoE`).

        Raises:
          NotImplementedError: MoE blocks of different widths (Puzzle `block_configs`), or
            no shared expert (transformers always builds one).
        """
        if len(set(config.moe_layer_widths)) > 1:
            raise unsupported(path, f"MoE layers of different widths {config.moe_layer_widths}")
        if config.shared_expert_intermediate_size < 1:
            raise unsupported(path, "a Nemotron-H MoE without a shared expert")
        return MoE(router="sigmoid_group", norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
                   n_group=int(raw.get("n_group") or 1), topk_group=int(raw.get("topk_group") or 1),
                   routed_scaling_factor=float(raw.get("routed_scaling_factor") or 1.0),
                   act="relu2", expert_names=("", "up_proj", "down_proj"),
                   shared="shared_experts", latent=config.moe_latent_size > 0)  # fmt: skip
