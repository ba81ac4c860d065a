"""Mamba-2: `num_hidden_layers` Mamba-2 blocks, tensors under `backbone.layers.{i}.mixer`
with the pre-norm `backbone.layers.{i}.norm`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.blocks.mamba2 import CONV_KERNEL, Mamba2
from jaxarena.models.families.base import Family, TensorNames, unsupported
from jaxarena.models.stack import Arch

__all__ = ["Mamba2Family"]


class Mamba2Family(Family):
    """`mamba2` (and the shared checks and tensor names of the `backbone.*` families)."""

    model_types = ("mamba2",)

    def check_mamba(self, config: ModelConfig, path: Path) -> None:
        """Raises NotImplementedError for Mamba options the `Mamba2` block does not run."""
        if config.conv_kernel != CONV_KERNEL:
            raise unsupported(path, f"conv_kernel={config.conv_kernel}; only {CONV_KERNEL} is "
                              "implemented")  # fmt: skip
        if config.mamba_proj_bias:
            raise unsupported(path, "Mamba projection biases are not implemented")

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """One `Mamba2` block per layer."""
        self.check_mamba(config, path)
        if raw.get("hidden_act", "silu") != "silu":
            raise unsupported(path, f"hidden_act={raw['hidden_act']!r}; only silu")
        eps = float(raw.get("layer_norm_epsilon", 1e-5))
        return Arch(blocks=(Mamba2(rms_eps=eps),) * config.num_hidden_layers, rms_eps=eps,
                    tie_embeddings=config.tie_word_embeddings)  # fmt: skip

    def tensor_names(self, config: ModelConfig, arch: Arch) -> TensorNames:
        """`backbone.layers.{i}.mixer` and `.norm`; `backbone.embeddings`, `backbone.norm_f`."""
        blocks = tuple((f"backbone.layers.{i}.mixer", f"backbone.layers.{i}.norm.weight")
                       for i in range(len(arch.blocks)))  # fmt: skip
        return TensorNames(blocks=blocks, embed="backbone.embeddings.weight",
                           final_norm="backbone.norm_f.weight")  # fmt: skip
