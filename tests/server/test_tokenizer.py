"""The server's text layer on the fixture tokenizer (tools/make_tokenizer_fixture.py): the
incremental detokenizer's deltas add up to the full decode and never split a character; stop
strings cut the text and a stream holds back max(len(stop)) - 1 characters; the chat template
renders as transformers renders it."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from _harness import FIXTURE  # noqa: E402

from jaxarena.server.tokenizer import (  # noqa: E402
    ChatTemplateError,
    IncrementalDetokenizer,
    ServerTokenizer,
)


@pytest.fixture(scope="module")
def tok():
    return ServerTokenizer.from_dir(FIXTURE)


def _stream(tok, prompt, out, stop=()):
    d = IncrementalDetokenizer(tok, prompt, stop)
    parts = []
    for t in out:
        stopped = d.add(t)
        parts.append(d.take())
        if stopped:
            break
    d.flush()
    parts.append(d.take(final=True))
    return parts, d


def test_fixture_vocabulary_fits_the_model():
    import json

    config = json.loads((FIXTURE / "config.json").read_text())
    t = ServerTokenizer.from_dir(FIXTURE)
    assert t.vocab_size <= config["vocab_size"]
    assert config["eos_token_id"] == t.tokenizer.token_to_id("<|im_end|>")


def test_random_ids_deltas_concatenate_to_the_full_decode(tok):
    # Random ids make invalid UTF-8 too (lone continuation bytes, cut characters): the
    # deltas still add up to exactly what tokenizers' own decode gives.
    rng = random.Random(0)
    for _ in range(300):
        prompt = [rng.randrange(256) for _ in range(rng.randrange(1, 8))]
        out = [rng.randrange(256) for _ in range(rng.randrange(1, 24))]
        parts, _ = _stream(tok, prompt, out)
        assert "".join(parts) == tok.decode(out), (prompt, out)


def test_multibyte_characters_are_never_split(tok):
    text = "café 日本 🙂 naïve"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # the characters do span several tokens
    parts, _ = _stream(tok, tok.encode("Hello"), ids)
    assert "".join(parts) == text
    assert not any("\ufffd" in p for p in parts), parts
    assert sum(1 for p in parts if p) < len(ids)  # some tokens emitted nothing (held back)


def test_stop_string_cuts_the_text_and_the_stream_holds_back(tok):
    text = "Hello world, hello there. Stop here. The end."
    ids = tok.encode(text)
    parts, d = _stream(tok, [], ids, stop=("Stop here", "zzz"))
    assert d.stopped and d.text == "Hello world, hello there. "
    assert "".join(parts) == d.text
    # Before the end no delta reaches within len("Stop here") - 1 chars of the text's end.
    d2 = IncrementalDetokenizer(tok, [], ("Stop here",))
    for t in ids[:5]:
        d2.add(t)
    assert d2.take() == d2.text[: len(d2.text) - (len("Stop here") - 1)]


def test_stop_string_spanning_tokens_matches(tok):
    text = "the capital of France"
    ids = tok.encode(text)
    parts, d = _stream(tok, [], ids, stop=("al of F",))
    assert d.text == "the capit" and "".join(parts) == "the capit"


def test_chat_template_renders_like_transformers(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    out = tok.apply_chat_template(msgs)
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                   "<|im_start|>assistant\n")  # fmt: skip
    assert not tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("assistant\n")
    ids = tok.encode(out, add_special_tokens=False)
    assert ids.count(tok.tokenizer.token_to_id("<|im_start|>")) == 3


def test_chat_template_raise_exception_is_a_request_error(tmp_path):
    import shutil

    shutil.copy(FIXTURE / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    t = ServerTokenizer.from_dir(tmp_path)
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == "x"
    with pytest.raises(ChatTemplateError, match="user first"):
        t.apply_chat_template([{"role": "system", "content": "x"}])


def test_missing_tokenizer_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        ServerTokenizer.from_dir(tmp_path)
