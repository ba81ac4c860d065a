"""The table `jaxarena budget` prints: weights, arena, reserve, free memory, KV per token,
state per sequence, one sequence, and the answers (max KV tokens, sequences, fits)."""

from __future__ import annotations

from jaxarena._sizing.budget import MemoryBudget
from jaxarena._units import format_bytes, plural

__all__ = ["budget_table"]


def _reserve_note(b: MemoryBudget) -> str:
    if b.reserve_source == "given":
        return "--reserve"
    hint = ", see --compiled" if b.reserve_source == "estimated" else ""
    return f"runtime 1 GiB + XLA temp {format_bytes(b.step_temp_bytes)} ({b.reserve_source}{hint})"


def _mesh(tp: int, ep: int) -> str:
    """`tp=4, ep=4: 4 devices` (experts are split over the same devices as the heads)."""
    return f"tp={tp}, ep={ep}: {plural(max(tp, ep), 'device')}"


def _weights_note(b: MemoryBudget) -> str:
    stored = b.config.quant_method
    if b.weights in ("fp8", "mxfp4") or not stored or stored == b.weights:
        return {"mxfp4": "mxfp4 experts (4-bit + e8m0 scale per 32)"}.get(b.weights, b.weights)
    return f"{b.weights}, not the {stored!r} the checkpoint stores (quantization_config)"


def budget_table(b: MemoryBudget, name: str) -> str:
    """The `budget` subcommand's text: one row per part, then the answers and the verdict."""
    rows = [
        ("weights", b.weight_bytes, f"{b.param_count:,} parameters, {_weights_note(b)}"),
        ("arena", b.arena_bytes, f"{b.arena} plan"),
        ("reserve", b.reserve_bytes, _reserve_note(b)),
        ("free for KV + state", b.free_bytes, ""),
        ("KV per token", b.kv_bytes_per_token, f"{b.kv_dtype}, full-attention layers"),
        ("state per sequence", b.state_bytes_per_sequence, "SSM / GDN / sliding-window"),
        ("one sequence", b.sequence_bytes, f"{plural(b.max_seq_len, 'token')} + state"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [
        f"{name} [{b.config.model_type or 'custom'}], per device ({_mesh(b.tp, b.ep)}), "
        f"memory {format_bytes(b.memory_bytes)} ({b.memory_bytes:,} bytes)",
        f"limits: max_batch_tokens={b.max_batch_tokens}, max_seq_len={b.max_seq_len}, "
        f"kv_block_size={b.kv_block_size}, max_batch_size={b.max_batch_size}",
    ]
    for label, nbytes, note in rows:
        shown = format_bytes(nbytes) if nbytes >= 0 else "-" + format_bytes(-nbytes)
        lines.append(f"  {label.ljust(width)}  {nbytes:>20,}  {shown:>11}  {note}".rstrip())

    def opt(v):
        return "unbounded (no growing KV cache)" if v is None else f"{v:,}"

    lines.append(f"max_kv_tokens {opt(b.max_kv_tokens)}, max_kv_blocks {opt(b.max_kv_blocks)}"
                 f", max_sequences {b.max_sequences:,} (of {plural(b.max_seq_len, 'token')})")  # fmt: skip
    if b.mtp_param_count:
        lines.append(f"not loaded: {b.mtp_param_count:,} MTP parameters")
    lines.append(b.message())
    return "\n".join(lines)
