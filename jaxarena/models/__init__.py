"""Small reference models that run on the arena: plain JAX blocks whose intermediates live in
the arena's regions.

- `hybrid`: a hybrid (Mamba-2 / attention / MLP) language model whose prefill and decode run
  on one donated arena through the three Pallas kernels (`HybridModel`).
- `tp_attention`: a tensor-parallel attention block over a sharded arena, one arena per
  device.
- `demo`: what `jaxarena demo` runs.
"""
