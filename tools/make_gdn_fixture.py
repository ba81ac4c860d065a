"""Generate tests/fixtures/gdn_transformers.npz: transformers' chunked gated delta rule.

Run with the torch environment (torch is not a test dependency; the .npz is committed):

    /work/venv-torch/bin/python tools/make_gdn_fixture.py

Inputs: two sequences of 70 tokens (batch 2 for transformers, packed with
`cu_seqlens = [0, 70, 140]` for the kernel), one key head and two value heads (GVA) of
dim 32, q/k/v rounded to bfloat16 (so the kernel sees the same values), initial states,
q/k L2 norm in the kernel. Outputs: `torch_chunk_gated_delta_rule`'s `o` and final states in
float32, from `transformers/models/qwen3_next/modeling_qwen3_next.py`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gdn_transformers.npz"


def main() -> None:
    gen = torch.Generator().manual_seed(26)
    B, T, H, HV, K, V = 2, 70, 1, 2, 32, 32

    def bf16(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).to(torch.float32)

    q, k, v = bf16(B, T, H, K), bf16(B, T, H, K), bf16(B, T, HV, V)
    g = torch.log(torch.rand(B, T, HV, generator=gen) * 0.1 + 0.9)  # decay in (0.9, 1)
    beta = torch.rand(B, T, HV, generator=gen)
    h0 = torch.randn(B, HV, K, V, generator=gen) * 0.5
    o, final = torch_chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        chunk_size=64,
        initial_state=h0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )

    def packed(x):
        return x.reshape(B * T, *x.shape[2:]).numpy().astype(np.float32)

    np.savez_compressed(
        OUT,
        q=packed(q),
        k=packed(k),
        v=packed(v),
        g=packed(g),
        beta=packed(beta),
        initial_states=h0.numpy(),
        cu_seqlens=np.array([0, T, 2 * T], np.int32),
        o=packed(o.float()),
        final_states=final.float().numpy(),
    )
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
