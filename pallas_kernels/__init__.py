"""Pallas kernels that take their workspace from a jaxarena arena.

One folder per kernel: `kernel.py` (the kernel body), `ops.py` (the validating wrapper and the
arena form) and `reference.py` (an independent plain-`jnp` reference). With `interpret=None`
every kernel runs in interpret mode on a CPU backend and compiled on a GPU.

The arena regions each arena form uses and their geometry are in `jaxarena.workspaces`; the
kernel folders export further helpers (e.g. `splitk_decode_attention.splitk_num_splits`,
`ssd_chunked_scan.ssd_sequential_reference`,
`ssd_state_update.ssd_state_update_reference`, `prefill_attention.prefill_blocks`,
`grouped_gemm.work_list`).
`ssd_state_update` (the Mamba-2 decode step) and `gdn_state_update` (the Gated DeltaNet one)
need no workspace: their in-place operand is the caller's state cache.
`paged_prefill_attention` (prefill and chunked prefill over the paged KV cache) needs none
either: its arena form writes only `attn_output`. `qk_rope_kv_write` (decode's q/k norm, RoPE
and K/V page write in one launch) writes the caller's KV cache in place and returns q. `lora_bgmv` (`lora_shrink`, `lora_expand`:
batched LoRA, each token with its own adapter) returns values and needs none.
"""

from pallas_kernels.fp8_block_quant import (
    fp8_block_quant,
    fp8_block_quant_into,
    fp8_block_quant_reference,
)
from pallas_kernels.gdn_chunked import gdn_chunked, gdn_chunked_into, gdn_sequential_reference
from pallas_kernels.gdn_state_update import gdn_state_update
from pallas_kernels.grouped_gemm import (
    fp8_moe_reference,
    grouped_gemm,
    grouped_gemm_fp8,
    grouped_gemm_reference,
)
from pallas_kernels.lora_bgmv import lora_bgmv, lora_bgmv_reference, lora_expand, lora_shrink
from pallas_kernels.prefill_attention import (
    paged_prefill_attention,
    paged_prefill_attention_into,
    paged_prefill_attention_reference,
)
from pallas_kernels.qk_rope_kv_write import qk_rope_kv_write, qk_rope_kv_write_reference
from pallas_kernels.splitk_decode_attention import (
    paged_decode_attention_reference,
    splitk_decode_attention,
    splitk_decode_attention_into,
)
from pallas_kernels.ssd_chunked_scan import (
    ssd_chunked_reference,
    ssd_chunked_scan,
    ssd_chunked_scan_into,
)
from pallas_kernels.ssd_state_update import ssd_state_update

__all__ = [
    "fp8_block_quant",
    "fp8_block_quant_into",
    "fp8_block_quant_reference",
    "fp8_moe_reference",
    "gdn_chunked",
    "gdn_chunked_into",
    "gdn_sequential_reference",
    "gdn_state_update",
    "grouped_gemm",
    "grouped_gemm_fp8",
    "grouped_gemm_reference",
    "lora_bgmv",
    "lora_bgmv_reference",
    "lora_expand",
    "lora_shrink",
    "paged_decode_attention_reference",
    "paged_prefill_attention",
    "paged_prefill_attention_into",
    "paged_prefill_attention_reference",
    "qk_rope_kv_write",
    "qk_rope_kv_write_reference",
    "splitk_decode_attention",
    "splitk_decode_attention_into",
    "ssd_chunked_reference",
    "ssd_chunked_scan",
    "ssd_chunked_scan_into",
    "ssd_state_update",
]
