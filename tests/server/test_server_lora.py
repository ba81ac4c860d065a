"""`jaxarena serve --lora NAME=PATH`: two PEFT adapters and the base model served at once
through the official `openai` client (a request's `model` names the adapter, as in vLLM).

The fixture checkpoint (tests/fixtures/serve/qwen3) has the shapes of tests/fixtures/checkpoints/
qwen3, so that checkpoint's adapters (tests/fixtures/lora/qwen3) load on it. Served greedy text
must be the engine's offline tokens of the same prompt and adapter alone (the engine's tests
hold those equal to `CausalLM.generate`'s and to peft's). Served requests share steps with
other adapters and run other executables (decode beside a mixed prefill), which may flip a
near-tie (the paths differ by an ulp or two of bf16 logits, ~0.03 at |logit| ~ 4); so the
prompts are chosen per model, from a fixed list, as the first two whose every greedy choice
wins by more than 0.2 (about 7 ulps: the engine's top-2 logprobs, whose difference is the
logit gap).
"""

from __future__ import annotations

import concurrent.futures

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from _harness import FIXTURE, client_for  # noqa: E402

from jaxarena.engine import SamplingParams  # noqa: E402
from jaxarena.server.app import create_app  # noqa: E402
from jaxarena.server.options import parse_loras  # noqa: E402
from jaxarena.server.run import start_in_thread  # noqa: E402
from jaxarena.server.tokenizer import ServerTokenizer  # noqa: E402

LORA = FIXTURE.parents[1] / "lora" / "qwen3"
MODEL = "qwen3-fixture"
ADAPTERS = {"alpha": LORA / "attn", "beta": LORA / "all"}
CANDIDATES = ["Numbers: 1 2 3", "Some words", "Stop here.", "abc", "The cat", "x y z", "Hello",
              "42", "日本語 🙂", "one two"]  # fmt: skip
NEW = 4
MIN_GAP = 0.2
FAST_CPU_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@pytest.fixture(scope="module")
def setup():
    from jaxarena.engine.async_engine import AsyncEngine
    from jaxarena.engine.engine import Engine

    tok = ServerTokenizer.from_dir(FIXTURE)
    engine = Engine.from_pretrained(str(FIXTURE), max_batch_size=4, max_seq_len=64,
                                    max_batch_tokens=32, kv_block_size=16, kv_pages=24,
                                    compiler_options=FAST_CPU_COMPILE, log=None,
                                    loras=ADAPTERS, max_loras=2)  # fmt: skip
    greedy = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True, logprobs=2)
    expected = {}  # (prompt, model): tokens, for the first two decided prompts of each model
    for m in (None, *ADAPTERS):
        for p in CANDIDATES:
            out = engine.generate([tok.encode(p)], greedy, m)[0]
            if min(top[0][1] - top[1][1] for _, top in out.logprobs) > MIN_GAP:
                expected[(p, m)] = out.token_ids
            if sum(k[1] == m for k in expected) == 2:
                break
        assert sum(k[1] == m for k in expected) == 2, f"{m}: fewer than two decided prompts"
    # The adapters change what the model says (else the test could not tell them apart).
    for p, m in [k for k in expected if k[1] is not None]:
        assert engine.generate([tok.encode(p)], greedy)[0].token_ids != expected[(p, m)], (p, m)
    srv = start_in_thread(create_app(AsyncEngine(engine), tok, model_name=MODEL))
    yield srv, tok, expected
    srv.stop()


def test_two_adapters_and_the_base_model_concurrently(setup):
    srv, tok, expected = setup
    client = client_for(srv.url)
    jobs = list(expected) * 2  # 12 requests (2 prompts x 3 models, twice) on 4 slots

    def one(job):
        p, m = job
        r = client.completions.create(model=m or MODEL, prompt=p, max_tokens=NEW,
                                      temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
        return r.model, r.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(one, jobs))
    for (p, m), (model, text) in zip(jobs, results, strict=True):
        assert model == (m or MODEL)
        assert text == tok.decode(expected[(p, m)]), (p, m)
    # Chat names an adapter the same way.
    chat = client.chat.completions.create(model="beta", max_tokens=2, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert chat.model == "beta" and chat.choices[0].finish_reason in ("length", "stop")


def test_models_lists_the_adapters_and_unknown_names_are_404(setup):
    srv, *_ = setup
    client = client_for(srv.url)
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {MODEL, *ADAPTERS}
    assert all(cards[a].model_extra["parent"] == MODEL for a in ADAPTERS)
    with pytest.raises(openai.NotFoundError, match="gamma"):
        client.completions.create(model="gamma", prompt="hi", max_tokens=2)
    # The server still serves the others.
    r = client.completions.create(model="alpha", prompt="hi", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_lora_flags_are_parsed_and_checked():
    assert parse_loras(["a=/x", "b=/y=z"]) == {"a": "/x", "b": "/y=z"}
    for bad, msg in ((["a"], "NAME=PATH"), (["=p"], "NAME=PATH"), (["a=p", "a=q"], "twice")):
        with pytest.raises(ValueError, match=msg):
            parse_loras(bad)
