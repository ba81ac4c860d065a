"""What a family is: the map from a `config.json` (`model_type`) to the decoder's blocks
(`Arch`) and to the HuggingFace tensor names of each block.

A `Family` answers two questions:
- `arch(raw, config, path, max_seq_len)`: the blocks and their options, raising
  `NotImplementedError` for what the blocks do not run;
- `tensor_names(config, arch)`: where each block's tensors live (`TensorNames`).
`read_params` (shared) then asks each block to read its own tensors under those names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from jaxarena import ModelConfig
from jaxarena.models.checkpoint import Reader
from jaxarena.models.stack import Arch

__all__ = ["Family", "TensorNames", "unsupported"]


def unsupported(path: Path, what: str) -> NotImplementedError:
    """The error for a valid config this implementation does not run (names the file)."""
    return NotImplementedError(f"{path / 'config.json'}: {what}")


@dataclasses.dataclass(frozen=True)
class TensorNames:
    """Where a checkpoint keeps a model's tensors.

    Attributes:
      blocks: per block, `(prefix, norm)`: the mixer's module path and its pre-norm weight.
      embed: the embedding matrix `[vocab, hidden]`.
      final_norm: the final norm's weight `[hidden]`.
      lm_head: the LM head `[vocab, hidden]` (read only when the embeddings are not tied).
    """

    blocks: tuple[tuple[str, str], ...]
    embed: str
    final_norm: str
    lm_head: str = "lm_head.weight"


class Family:
    """A checkpoint family; subclasses set `model_types` and implement `arch` and
    `tensor_names`."""

    model_types: tuple[str, ...] = ()

    def arch(self, model_type: str, raw: dict[str, Any], config: ModelConfig, path: Path,
             max_seq_len: int) -> Arch:  # fmt: skip
        """The decoder's blocks for this config.

        Raises:
          NotImplementedError: a feature the blocks do not implement.
        """
        raise NotImplementedError

    def tensor_names(self, config: ModelConfig, arch: Arch) -> TensorNames:
        """The checkpoint names of every block's tensors, the embeddings and the head."""
        raise NotImplementedError

    def read_params(self, reader: Reader, config: ModelConfig, arch: Arch) -> dict[str, Any]:
        """The host weights: `{"embed", "layers": [per block], "final_norm"[, "lm_head"]}`."""
        return self.read_named(reader, config, arch, self.tensor_names(config, arch))

    def read_named(self, reader: Reader, config: ModelConfig, arch: Arch,
                   names: TensorNames) -> dict[str, Any]:  # fmt: skip
        """`read_params` with the tensor names given (a family whose names depend on the
        checkpoint picks them first)."""
        h, v = config.hidden_size, config.vocab_size
        layers = [block.read_params(reader, config, prefix, norm)
                  for block, (prefix, norm) in zip(arch.blocks, names.blocks, strict=True)]  # fmt: skip
        params: dict[str, Any] = {"embed": reader.matrix(names.embed, v, h), "layers": layers,
                                  "final_norm": reader.vector(names.final_norm, h)}  # fmt: skip
        if arch.tie_embeddings:
            if names.lm_head in reader.ckpt:  # some exports store the tied copy as well
                reader.matrix(names.lm_head, v, h)
        else:
            params["lm_head"] = np.ascontiguousarray(reader.matrix(names.lm_head, v, h).T)
        return params
