"""Qwen3: Llama's layout with per-head q/k RMSNorm; its `sliding_window` applies only with
`use_sliding_window`, from layer `max_window_layers` on."""

from __future__ import annotations

from typing import Any

from jaxarena.models.families.llama import Llama

__all__ = ["Qwen3"]


class Qwen3(Llama):
    """`qwen3` (dense; bf16 or FP8 block-quantized)."""

    model_types = ("qwen3",)
    qk_norm = True

    def uses_sliding_window(self, raw: dict[str, Any]) -> bool:
        """Qwen configs carry a `sliding_window` that applies only with `use_sliding_window`."""
        return bool(raw.get("use_sliding_window"))

    def first_window_layer(self, raw: dict[str, Any]) -> int:
        """transformers: layers `i >= max_window_layers` (default 28) slide."""
        return int(raw.get("max_window_layers", 28))
