"""Reference models that are not checkpoints: the random-weight hybrid (`hybrid.HybridModel`,
a case of `ArenaLM`), the tensor-parallel attention block over a sharded arena
(`tp_attention`), and what `jaxarena demo` runs (`demo`)."""
