"""Text in and out of the server: the checkpoint's HF tokenizer (`tokenizer.json` through the
`tokenizers` package), its chat template (rendered with jinja2 the way transformers renders
it), and an incremental detokenizer with stop strings.

The detokenizer decodes a short window of tokens per step (vLLM's prefix/read offsets): the
text of the window since the last emitted boundary, minus the text before the newest tokens.
While the window's text ends in U+FFFD (a multi-byte character cut by a token boundary) it
emits nothing, so no half character is ever sent; the concatenated deltas are the text of the
whole output. Stop strings are matched on that text and cut it; a stream holds back the
longest stop string's length minus one character until the request ends.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jaxarena.engine.types import RequestError

__all__ = ["ChatTemplateError", "IncrementalDetokenizer", "ServerTokenizer"]

# Prompt tokens the detokenizer decodes before the output's first token, so a tokenizer that
# drops the leading space of a decoded text's first word (SentencePiece's Metaspace) keeps
# the space of the output's first word.
PRIME_TOKENS = 5
REPLACEMENT = "\ufffd"


class ChatTemplateError(RequestError):
    """A chat template that does not render these messages (raise_exception in the template,
    or a missing template): the request's fault or the checkpoint's, answered 400."""


def _token_text(value: Any) -> str | None:
    """A special token of tokenizer_config.json: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class ServerTokenizer:
    """A checkpoint's tokenizer and chat template.

    Attributes:
      tokenizer: the `tokenizers.Tokenizer` of tokenizer.json.
      chat_template: the jinja2 source, or None (chat completions are then refused).
      special: the special tokens the template may use (bos_token, eos_token, ...).
    """

    def __init__(self, tokenizer: Any, config: dict[str, Any], chat_template: str | None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.special = {
            k: _token_text(config.get(k)) or ""
            for k in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        self._template = None

    @classmethod
    def from_dir(cls, path: str | Path) -> ServerTokenizer:
        """Reads `tokenizer.json`, `tokenizer_config.json` (optional) and the chat template
        (`chat_template` in tokenizer_config.json, else `chat_template.jinja`) from `path`.
        Raises FileNotFoundError naming the file when tokenizer.json is missing."""
        from tokenizers import Tokenizer

        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{tok_file}: no tokenizer.json (the server needs the "
                                    "checkpoint's HF fast tokenizer)")  # fmt: skip
        config: dict[str, Any] = {}
        cfg_file = path / "tokenizer_config.json"
        if cfg_file.is_file():
            config = json.loads(cfg_file.read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if isinstance(template, list):  # transformers' named templates: take "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = path / "chat_template.jinja"
        if not template and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        return cls(Tokenizer.from_file(str(tok_file)), config, template or None)

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows (added tokens included)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (the tokenizer's post-processor adds BOS where it does)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of `ids` (special tokens left out by default)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token's own text (for logprobs; a piece of a multi-byte character shows as
        U+FFFD), special tokens included."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def apply_chat_template(self, messages: list[dict[str, Any]], *,
                            add_generation_prompt: bool = True) -> str:  # fmt: skip
        """The chat prompt text: the template rendered with `messages`, the special tokens
        and `add_generation_prompt`, as transformers' `apply_chat_template` renders it
        (sandboxed jinja2, trim_blocks, lstrip_blocks, `raise_exception`, `tojson`)."""
        if self.chat_template is None:
            raise ChatTemplateError("this model has no chat template (tokenizer_config.json's "
                                    "chat_template or chat_template.jinja); use "
                                    "/v1/completions", "messages")  # fmt: skip
        import jinja2

        if self._template is None:
            self._template = _environment().from_string(self.chat_template)
        try:
            return self._template.render(messages=messages,
                                         add_generation_prompt=add_generation_prompt,
                                         **self.special)  # fmt: skip
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template failed on these messages: {e}",
                                    "messages") from None  # fmt: skip


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise ChatTemplateError(f"the chat template refused the messages: {message}",
                                "messages")  # fmt: skip

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)  # fmt: skip

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])  # fmt: skip
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


class IncrementalDetokenizer:
    """One request's output text, built token by token.

    `add(token_id)` decodes the new token; `text` is the output so far (cut before a stop
    string once one matched, then `stopped` is True); `take(final)` returns the text not yet
    handed out, holding back `max(len(stop)) - 1` characters unless `final` (a stop string
    could still begin there). The concatenation of every `take` with the last one final is
    `text`, which is `tokenizer.decode(output ids)` up to the stop string.
    """

    def __init__(self, tokenizer: ServerTokenizer, prompt_ids: Sequence[int],
                 stop: Sequence[str] = (), *, skip_special_tokens: bool = True):  # fmt: skip
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(prompt_ids[-PRIME_TOKENS:])
        # The context tokens must decode to a whole text: a prompt ending inside a character
        # would make the window's first output character differ from the output's own.
        while self._ids and self._decode(self._ids).endswith(REPLACEMENT):
            self._ids.pop(0)
        self._prefix = 0
        self._read = len(self._ids)
        self.stop = tuple(s for s in stop if s)
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""
        self.stopped = False
        self._taken = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def add(self, token_id: int) -> bool:
        """Decodes one more token; True when a stop string matched (the text is cut before
        it and later tokens are ignored)."""
        if self.stopped:
            return True
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            self._append(new_text[len(prefix_text) :])
            self._prefix, self._read = self._read, len(self._ids)
        return self.stopped

    def flush(self) -> None:
        """At the end: the text of tokens held back for an unfinished character (it stays
        U+FFFD: the output ended inside a character)."""
        if self.stopped or self._read == len(self._ids):
            return
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._append(new_text[len(prefix_text) :])
        self._prefix, self._read = self._read, len(self._ids)

    def _append(self, delta: str) -> None:
        start = max(0, len(self.text) - self.holdback)
        self.text += delta
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True

    def take(self, final: bool = False) -> str:
        """The text not handed out yet, less the hold-back unless `final` or stopped."""
        end = len(self.text) if final or self.stopped else len(self.text) - self.holdback
        if end <= self._taken:
            return ""
        out = self.text[self._taken : end]
        self._taken = end
        return out
