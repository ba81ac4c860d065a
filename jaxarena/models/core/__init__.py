"""What every block is built from: arena access (`arena`: store / load a region, the linear
layer over float or FP8 block-scaled weights), `norms` (RMSNorm) and `rope` (rotary
embeddings). Nothing here knows which block or family it serves."""
