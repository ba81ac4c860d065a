"""Qwen3: Llama's layout with per-head q/k RMSNorm; its `sliding_window` applies only with
`use_sliding_window`."""

from __future__ import annotations

from typing import Any

from jaxarena.models.families.llama import Llama

__all__ = ["Qwen3"]


class Qwen3(Llama):
    """`qwen3` (dense; bf16 or FP8 block-quantized)."""

    model_types = ("qwen3",)
    qk_norm = True

    def uses_sliding_window(self, raw: dict[str, Any]) -> bool:
        """Qwen3 configs carry a `sliding_window` that applies only with `use_sliding_window`."""
        return bool(raw.get("use_sliding_window"))
