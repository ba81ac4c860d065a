"""Qwen2 (and Qwen2.5): Llama's layout with q/k/v projection biases (no o bias); its
`sliding_window` applies only with `use_sliding_window`, from layer `max_window_layers` on."""

from __future__ import annotations

from jaxarena.models.families.qwen3 import Qwen3

__all__ = ["Qwen2"]


class Qwen2(Qwen3):
    """`qwen2` (dense)."""

    model_types = ("qwen2",)
    qk_norm = False
    qkv_bias = True
