"""Routed experts stored fused, as transformers 5.x's expert modules hold them: per MoE
module `experts.gate_up_proj` `[E, 2 * inter, hidden]` (the gate rows first, then the up
rows: `Qwen3_5MoeExperts.forward` splits its output with `chunk(2, dim=-1)`) and
`experts.down_proj` `[E, hidden, inter]`, instead of the per-expert
`experts.{j}.{gate,up,down}_proj.weight` that `save_pretrained` writes for Qwen2-MoE-style
models. `FusedExpertsReader` lets the MoE block read either layout unchanged.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from jaxarena.models.checkpoint import FLOAT_DTYPES, Reader

__all__ = ["FusedExpertsReader"]

_EXPERT = re.compile(r"^(?P<moe>.+)\.experts\.(?P<j>\d+)\.(?P<name>gate_proj|up_proj|down_proj)$")


class FusedExpertsReader:
    """A `Reader` whose `linear` also serves `{moe}.experts.{j}.{gate,up,down}_proj` from
    the fused `{moe}.experts.gate_up_proj` / `{moe}.experts.down_proj` when the checkpoint
    stores those (checked against `[num_experts, ...]`); everything else, and per-expert
    checkpoints, go to the wrapped reader.
    """

    def __init__(self, reader: Reader, num_experts: int) -> None:
        self._reader, self._num_experts = reader, num_experts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    def linear(self, module: str, out: int, inp: int) -> Any:
        """`Reader.linear`, per-expert slices of the fused tensors included (`[in, out]`).

        Raises:
          NotImplementedError: fused experts in an FP8 checkpoint.
          CheckpointError: a fused tensor whose shape does not match config.json.
        """
        m = _EXPERT.match(module)
        gate_up = f"{m['moe']}.experts.gate_up_proj" if m else ""
        if m is None or gate_up not in self._reader.ckpt:
            return self._reader.linear(module, out, inp)
        if self._reader.fp8 is not None and self._reader.fp8.quantized(module):
            raise NotImplementedError(f"{self._reader.ckpt.path}: FP8 experts stored fused "
                                      f"({gate_up}) are not implemented")  # fmt: skip
        e, j = self._num_experts, int(m["j"])
        if m["name"] == "down_proj":
            w = self._reader.raw(f"{m['moe']}.experts.down_proj", (e, out, inp), FLOAT_DTYPES)
            return np.ascontiguousarray(w[j].T)
        w = self._reader.raw(gate_up, (e, 2 * out, inp), FLOAT_DTYPES)
        rows = slice(0, out) if m["name"] == "gate_proj" else slice(out, 2 * out)
        return np.ascontiguousarray(w[j, rows].T)
