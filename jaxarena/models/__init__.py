"""Models that run on the arena: plain JAX blocks whose intermediates live in the arena's
regions (see README.md in this folder for the layout and how to add a block or a family).

- `core`: arena access (`put` / `get` / `linear`, FP8 block-scaled weights), RMSNorm, RoPE.
- `blocks`: the residual blocks (`Attention`, `MLP`, `Mamba2`, `GatedDeltaNet`), each
  owning its parameters, its cache and its prefill / decode; `blocks.registry` names them by
  kind.
- `stack`: `ArenaLM` (and its `Arch`), the one decoder over a tuple of blocks that every model
  below runs on.
- `families`: `config.json` -> blocks and tensor names (Llama, Mistral, Qwen3, Mamba-2,
  Nemotron-H, Qwen3.5, Qwen3-Next); `families.registry` maps `model_type` to its family.
- `checkpoint`: the safetensors reader (`open_checkpoint`, `CheckpointError`, `Reader`).
- `runtime`: `load_pretrained(path, ...)` -> `CausalLM`, with `prefill_logits` and greedy
  `generate` (bf16 or FP8 block-quantized checkpoints).
- `lora`: PEFT LoRA adapters in device slots (`CausalLM.load_lora`, `LoraError`).
- `reference`: the random-weight hybrid (`HybridModel`), the tensor-parallel attention block,
  and what `jaxarena demo` runs.
- `generate_cli`: what `jaxarena generate` runs.
"""

from jaxarena.models.checkpoint import CheckpointError
from jaxarena.models.lora import LoraError
from jaxarena.models.reference.hybrid import HybridModel
from jaxarena.models.runtime import CausalLM, load_pretrained
from jaxarena.models.stack import Arch, ArenaLM

__all__ = [
    "Arch",
    "ArenaLM",
    "CausalLM",
    "CheckpointError",
    "HybridModel",
    "LoraError",
    "load_pretrained",
]
