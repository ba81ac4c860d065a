"""Qwen3-Next: Qwen3.5's decoder (Gated DeltaNet / gated attention mixers, SwiGLU MLP,
`(1 + w)` norms) with the GDN's fused, per-key-head interleaved `in_proj_qkvz` /
`in_proj_ba`, under `model.layers.{i}`. Its MoE layers (every released checkpoint's) need the
MoE block with a sigmoid-gated shared expert, which is not implemented: only configs without
experts (`num_experts = 0`) load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxarena import ModelConfig
from jaxarena.models.families.base import unsupported
from jaxarena.models.families.qwen3_5 import Qwen3_5
from jaxarena.models.stack import Arch

__all__ = ["Qwen3Next"]


class Qwen3Next(Qwen3_5):
    """`qwen3_next` with dense MLPs only."""

    model_types = ("qwen3_next",)
    interleaved = True

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """Qwen3.5's blocks with the interleaved GDN projections.

        Raises:
          NotImplementedError: MoE layers (`num_experts > 0`), and what Qwen3.5 refuses.
        """
        if config.num_experts > 0:
            raise unsupported(path, f"num_experts={config.num_experts}: Qwen3-Next MoE layers "
                              "(sigmoid-gated shared expert) are not implemented")  # fmt: skip
        return super().arch(model_type, raw, config, path, max_seq_len)
