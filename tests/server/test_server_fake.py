"""`jaxarena serve`'s HTTP API on a test double of the engine (fake_engine.py: the engine's
interface, deterministic tokens, no jax), talked to with the official `openai` client: one
server per module, on 127.0.0.1 and a free port."""

from __future__ import annotations

import concurrent.futures
import json
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from _harness import FIXTURE, client_for, metric, sse_chunks  # noqa: E402
from fake_engine import EOS_TRIGGER, FakeAsyncEngine, FakeEngine  # noqa: E402

from jaxarena.server.app import create_app  # noqa: E402
from jaxarena.server.run import start_in_thread  # noqa: E402
from jaxarena.server.tokenizer import ServerTokenizer  # noqa: E402

MODEL = "fixture-qwen3"
MAX_BATCH = 4


@pytest.fixture(scope="module")
def tok():
    return ServerTokenizer.from_dir(FIXTURE)


@pytest.fixture(scope="module")
def server(tok):
    engine = FakeAsyncEngine(FakeEngine(max_batch_size=MAX_BATCH, max_seq_len=128))
    srv = start_in_thread(create_app(engine, tok, model_name=MODEL))
    srv.engine = engine
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return client_for(server.url)


def _greedy(prompt: list[int], n: int) -> list[int]:
    return [FakeEngine.greedy_token(prompt, i) for i in range(n)]


def test_completion_greedy_is_the_engines_tokens(client, tok):
    prompt = tok.encode("Hello world")
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert r.choices[0].text == tok.decode(_greedy(prompt, 12))
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), 12)
    r2 = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=12,
                                   temperature=0)  # fmt: skip
    assert r2.choices[0].text == r.choices[0].text  # string prompt = its token ids


def test_completion_stream_equals_non_stream(client, tok):
    kw = dict(model=MODEL, prompt="The quick brown fox", max_tokens=20, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == len(tok.encode("The quick brown fox"))


def test_completion_list_of_prompts(client, tok):
    prompts = [[5, 6, 7], [40, 41]]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0)
    by_index = {c.index: c.text for c in r.choices}
    assert by_index == {i: tok.decode(_greedy(p, 4)) for i, p in enumerate(prompts)}
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 8
    r = client.completions.create(model=MODEL, prompt=["Hello", "world"], max_tokens=3,
                                  temperature=0, stream=True)  # fmt: skip
    texts = {0: "", 1: ""}
    for c in r:
        texts[c.choices[0].index] += c.choices[0].text
    assert texts == {0: tok.decode(_greedy(tok.encode("Hello"), 3)),
                     1: tok.decode(_greedy(tok.encode("world"), 3))}  # fmt: skip


def test_chat_stream_and_not(client, tok):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                       temperature=0)  # fmt: skip
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == tok.decode(_greedy(ids, 10))
    assert r.usage.prompt_tokens == len(ids)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                                 temperature=0, stream=True))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_eos_finishes_with_stop(client, tok):
    r = client.completions.create(model=MODEL, prompt=[EOS_TRIGGER, 9], max_tokens=10,
                                  temperature=0)  # fmt: skip
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 3
    assert r.choices[0].text == tok.decode(_greedy([EOS_TRIGGER, 9], 2))  # EOS not in the text


def test_stop_token_ids_end_without_their_text(client, tok):
    prompt = [50, 51]
    ids = _greedy(prompt, 10)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0,
                                  extra_body={"stop_token_ids": [ids[3]]})  # fmt: skip
    first = ids.index(ids[3])  # the id's first occurrence ends the request
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == first + 1
    assert r.choices[0].text == tok.decode(ids[:first])


def test_stop_strings(client, tok):
    prompt = [11, 12, 13]
    full = tok.decode(_greedy(prompt, 30))
    stop = full[10:13]
    assert full.find(stop) == 10, "pick a stop string that first occurs at 10"
    kw = dict(model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[stop, "@@@@"])
    r = client.completions.create(**kw)
    assert r.choices[0].text == full[:10] and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 30
    streamed = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == full[:10]
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_seed_reproducible(client):
    kw = dict(model=MODEL, prompt="Hello", max_tokens=16, temperature=1.0)
    a = client.completions.create(**kw, seed=1234).choices[0].text
    b = client.completions.create(**kw, seed=1234).choices[0].text
    c = client.completions.create(**kw, seed=99).choices[0].text
    assert a == b and a != c


def test_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0,
                                  logprobs=3)  # fmt: skip
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(len(t) <= 3 for t in lp.top_logprobs) and lp.token_logprobs[0] == -0.25
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2)  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 for c in content)


def test_more_clients_than_the_batch_all_served(client, tok):
    prompts = [[20 + i, 3, 4] for i in range(3 * MAX_BATCH)]

    def one(p):
        return client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0)

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    for p, r in zip(prompts, results, strict=True):
        assert r.choices[0].text == tok.decode(_greedy(p, 8))


BAD = [  # (body, status, param)
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "n": 2}, 400, "n"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "logprobs": 99}, 400, "logprobs"),
    ({"prompt": [1, 2, 999]}, 400, "prompt"),
    ({"prompt": [5] * 200}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": "x", "stop_token_ids": [-3]}, 400, "stop_token_ids"),
    ({}, 400, "prompt"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
]


def test_bad_requests_are_400_while_good_ones_finish(server, tok):
    good_prompt = [30, 31, 32]
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            good = [pool.submit(http.post, "/v1/completions", json={
                "model": MODEL, "prompt": good_prompt, "max_tokens": 40, "temperature": 0})
                for _ in range(3)]  # fmt: skip
            for body, status, param in BAD:
                r = http.post("/v1/completions", json={"model": MODEL, **body})
                assert r.status_code == status, (body, r.text)
                err = r.json()["error"]
                assert set(err) == {"message", "type", "param", "code"}
                assert err["param"] == param, (body, err)
            r = http.post("/v1/completions", content=b"{not json",
                          headers={"content-type": "application/json"})  # fmt: skip
            assert r.status_code == 400 and "error" in r.json()
            r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": []})
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
            want = tok.decode(_greedy(good_prompt, 40))
            for f in good:
                assert f.result().status_code == 200
                assert f.result().json()["choices"][0]["text"] == want


def test_openai_client_sees_bad_request_error(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="x", temperature=-2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


def _wait_idle(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        in_use = metric(url, "jaxarena_kv_pages_in_use")
        if in_use == 0 and metric(url, "jaxarena_requests_running") == 0:
            return
        time.sleep(0.02)
    raise AssertionError("pages still in use")


def test_disconnect_mid_stream_frees_pages(server):
    before = len(server.engine.aborted)
    body = {"model": MODEL, "prompt": [40, 41], "max_tokens": 100, "temperature": 0,
            "stream": True, "ignore_eos": True}  # fmt: skip
    with httpx.Client(base_url=server.url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
            assert metric(server.url, "jaxarena_kv_pages_in_use") > 0
    _wait_idle(server.url)
    assert len(server.engine.aborted) == before + 1


def test_disconnect_non_streaming_aborts(server):
    import socket
    import urllib.parse

    before = len(server.engine.aborted)
    body = json.dumps({"model": MODEL, "prompt": [42], "max_tokens": 120, "temperature": 0})
    url = urllib.parse.urlsplit(server.url)
    # A raw socket: the request is sent, seen running, then the client goes away.
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  f"\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())  # fmt: skip
        deadline = time.monotonic() + 10
        while metric(server.url, "jaxarena_requests_running") == 0:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.01)
    _wait_idle(server.url)
    assert len(server.engine.aborted) == before + 1


def test_stream_ends_with_done(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "stream": True}  # fmt: skip
    with httpx.Client(base_url=server.url, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            data = sse_chunks(r.iter_lines())
    assert data[-1] == "[DONE]" and all(json.loads(d)["object"] == "chat.completion.chunk"
                                        for d in data[:-1])  # fmt: skip


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.url}/health").status_code == 200
    _wait_idle(server.url)
    prompt0 = metric(server.url, "jaxarena_prompt_tokens_total")
    gen0 = metric(server.url, "jaxarena_generation_tokens_total")
    ttft0 = metric(server.url, "jaxarena_time_to_first_token_seconds_count")
    client.completions.create(model=MODEL, prompt=[1, 2, 3, 4], max_tokens=7, temperature=0)
    assert metric(server.url, "jaxarena_prompt_tokens_total") == prompt0 + 4
    assert metric(server.url, "jaxarena_generation_tokens_total") == gen0 + 7
    assert metric(server.url, "jaxarena_time_to_first_token_seconds_count") == ttft0 + 1
    assert metric(server.url, "jaxarena_kv_pages_total") == 64
    assert metric(server.url, "jaxarena_kv_pages_in_use") == 0
    assert metric(server.url, "jaxarena_requests_waiting") == 0
