"""Writes the tokenizer of the serving fixture, tests/fixtures/serve/qwen3 (a copy of
tests/fixtures/checkpoints/qwen3's config and weights with tokenizer files added).

A byte-level BPE trained with the `tokenizers` package on a short text, sized to the fixture's
vocabulary (256 ids: 3 special tokens, the bytes the text holds, merges up to 256), so every id
the model can emit decodes. Characters of several UTF-8 bytes (é, 日, 🙂) are rare in the text,
left unmerged, so each spans several tokens: what the server's incremental detokenizer must
not cut in half. A ChatML chat template goes in tokenizer_config.json.

    python tools/make_tokenizer_fixture.py   # needs only `tokenizers`; deterministic
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests/fixtures/checkpoints/qwen3"
OUT = ROOT / "tests/fixtures/serve/qwen3"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TEXT = """
The quick brown fox jumps over the lazy dog. A server answers requests one token at a time,
and the clients read the tokens as they come. Hello world, hello there, hello again.
The engine keeps the pages of every running request; when a request ends its pages go back
to the pool. Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2048. Stop here. The end.
Some words of other languages: café, naïve, 日本語, and a smile 🙂 to close.
What is the capital of France? Paris is the capital of France.
"""


def _byte_of(char: str) -> int:
    """The byte GPT-2's byte-level alphabet maps to `char` (printable bytes map to themselves,
    the others to U+0100 + n in order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if ord(char) in printable:
        return ord(char)
    return [b for b in range(256) if b not in printable][ord(char) - 0x100]


def build() -> Tokenizer:
    """The fixture's tokenizer: byte-level BPE, 256 ids, special tokens first (ids 0..2)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Every printable ASCII byte and newline is in the alphabet (any English prompt encodes);
    # other bytes only where the text holds them.
    byte_chars = pre_tokenizers.ByteLevel.alphabet()  # the 256 characters bytes map to
    ascii_chars = [c for c in byte_chars if _byte_of(c) in range(0x20, 0x7F) or _byte_of(c) == 10]
    trainer = trainers.BpeTrainer(vocab_size=256, min_frequency=2, special_tokens=SPECIAL,
                                  initial_alphabet=ascii_chars, show_progress=False)  # fmt: skip
    tok.train_from_iterator([TEXT] * 4, trainer=trainer)
    return tok


def main() -> None:
    """Copies the checkpoint, writes tokenizer.json and tokenizer_config.json, checks them."""
    OUT.mkdir(parents=True, exist_ok=True)
    config = json.loads((SOURCE / "config.json").read_text())
    tok = build()
    vocab = tok.get_vocab()
    assert max(vocab.values()) < config["vocab_size"], (len(vocab), config["vocab_size"])
    for ch in "é日🙂":  # each multi-byte character spans several tokens
        assert len(tok.encode(ch).ids) > 1, ch
    config["eos_token_id"] = vocab["<|im_end|>"]
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copyfile(SOURCE / "model.safetensors", OUT / "model.safetensors")
    tok.save(str(OUT / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": config["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    print(f"wrote {OUT}: {len(vocab)} tokens")


if __name__ == "__main__":
    main()
