"""`jaxarena serve --tp 2`: the engine over two of the session's 8 CPU devices
(tests/conftest.py), served through the official `openai` client.

The engine is built from serve's own options (`load_engine`), so the flags reach
`Engine.from_pretrained(tp=, ep=)` and `load_pretrained(mesh=)`. The model's numbers over a
mesh are checked against transformers in tests/models/test_tensor_parallel.py; here the served
greedy text must be the same engine's offline tokens for the prompt alone, for prompts whose
every greedy choice wins by more than 0.2 (about 7 bf16 ulps at these logits: served requests
share steps and run other executables, which may flip a closer call; test_server_lora.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from _harness import FIXTURE, client_for  # noqa: E402

from jaxarena.engine import SamplingParams  # noqa: E402
from jaxarena.server.app import create_app  # noqa: E402
from jaxarena.server.options import cmd_serve  # noqa: E402
from jaxarena.server.run import load_engine, start_in_thread  # noqa: E402
from jaxarena.server.tokenizer import ServerTokenizer  # noqa: E402

MODEL = "qwen3-tp2"
CANDIDATES = ["Numbers: 1 2 3", "Some words", "Stop here.", "abc", "The cat", "x y z", "Hello",
              "42", "日本語 🙂", "one two"]  # fmt: skip
NEW = 4
MIN_GAP = 0.2


def serve_args(**changes) -> argparse.Namespace:
    args = dict(path=str(FIXTURE), max_batch_size=4, max_seq_len=64, max_batch_tokens=32,
                kv_block_size=16, kv_pages=24, target=None, loras=None, max_lora_rank=None,
                max_loras=None, tp=2, ep=1, port=0, lora=[], memory=None)  # fmt: skip
    args.update(changes)
    return argparse.Namespace(**args)


@pytest.fixture(scope="module")
def setup():
    tok = ServerTokenizer.from_dir(FIXTURE)
    async_engine = load_engine(serve_args(), None, lambda _msg: None)
    engine = async_engine.engine
    greedy = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True, logprobs=2)
    expected = {}
    for p in CANDIDATES:
        out = engine.generate([tok.encode(p)], greedy)[0]
        if min(top[0][1] - top[1][1] for _, top in out.logprobs) > MIN_GAP:
            expected[p] = out.token_ids
        if len(expected) == 3:
            break
    assert len(expected) >= 2, "fewer than two decided prompts"
    srv = start_in_thread(create_app(async_engine, tok, model_name=MODEL))
    yield srv, tok, engine, expected
    srv.stop()


def test_the_engine_runs_over_two_devices(setup):
    _, _, engine, _ = setup
    lm = engine.runner.lm
    assert lm.mesh is not None and lm.mesh.devices.size == 2
    assert lm.model.config.num_attention_heads * 2 == lm.config.num_attention_heads
    assert {s.device for s in lm.arena.addressable_shards} == set(lm.mesh.devices.flat)


def test_concurrent_completions_over_the_mesh(setup):
    srv, tok, _, expected = setup
    client = client_for(srv.url)
    jobs = list(expected) * 3  # more requests than the 4 slots

    def one(p):
        r = client.completions.create(model=MODEL, prompt=p, max_tokens=NEW, temperature=0,
                                      extra_body={"ignore_eos": True})  # fmt: skip
        return r.choices[0].text, r.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(one, jobs))
    for p, (text, n) in zip(jobs, results, strict=True):
        assert n == NEW and text == tok.decode(expected[p]), p


def test_ep_other_than_1_or_tp_is_refused():
    with pytest.raises(RuntimeError, match="--ep 2 must be 1 or equal to --tp 1"):
        cmd_serve(serve_args(tp=1, ep=2))
    with pytest.raises(RuntimeError, match="--tp 0 must be >= 1"):
        cmd_serve(serve_args(tp=0, ep=1))
