"""Models that run on the arena: plain JAX blocks whose intermediates live in the arena's
regions.

- `arena_lm`: `ArenaLM`, the one decoder implementation (attention / Mamba-2 / MLP blocks,
  float or FP8 block-scaled weights) that every model below runs on.
- `pretrained`: `load_pretrained(path, ...)` -> `CausalLM` for a local HuggingFace checkpoint
  (Llama, Mistral, Qwen3, Mamba-2, Nemotron-H; bf16 or FP8 block-quantized), with
  `prefill_logits` and greedy `generate`.
- `checkpoint`: the safetensors reader (`open_checkpoint`, `CheckpointError`).
- `hybrid`: the random-weight reference hybrid (`HybridModel`), a case of `ArenaLM`.
- `tp_attention`: a tensor-parallel attention block over a sharded arena, one arena per
  device.
- `demo`: what `jaxarena demo` runs.
"""

from jaxarena.models.checkpoint import CheckpointError
from jaxarena.models.pretrained import CausalLM, load_pretrained

__all__ = ["CausalLM", "CheckpointError", "load_pretrained"]
