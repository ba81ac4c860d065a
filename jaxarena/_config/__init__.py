"""Everything the caller states: the model config (from HuggingFace files, dicts, hub ids or
bundled presets), its per-device shard, the levers and the hardware target."""
