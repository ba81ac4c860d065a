"""Load test of `jaxarena serve` on loopback: N concurrent streaming clients send a few hundred
completions of random prompt and output lengths; checks that none is lost, duplicated or mixed
with another's tokens, and prints throughput and latency percentiles.

    python benchmarks/bench_serve.py                      # the fake engine (tests/server)
    python benchmarks/bench_serve.py --engine real        # the engine on the fixture checkpoint
    python benchmarks/bench_serve.py --clients 64 --requests 400 --json

Every request is greedy with `ignore_eos`, `logprobs=5` and token-id prompts unique to it. A
request is "mixed" when its streamed tokens (read from the logprobs) are not the ones the
engine gives its prompt alone: the fake engine's token function, or for the real engine a
replay of a sample of requests one at a time after the load (`--replay`), where a token on
the other side of a near-tie (within TIE_NATS of the replay's top token) counts as a tie.
Bounded: every request has a timeout and the whole run a deadline (`--deadline`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

from jaxarena.server.app import create_app
from jaxarena.server.run import start_in_thread
from jaxarena.server.tokenizer import ServerTokenizer

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "serve" / "qwen3"


def _engine(args: argparse.Namespace):
    if args.engine == "fake":
        sys.path.insert(0, str(ROOT / "tests" / "server"))
        from fake_engine import FakeAsyncEngine, FakeEngine

        return FakeAsyncEngine(FakeEngine(max_batch_size=args.max_batch_size,
                                          max_seq_len=args.max_seq_len, kv_pages=4096),
                               step_s=args.fake_step_s)  # fmt: skip
    from jaxarena.engine.async_engine import AsyncEngine
    from jaxarena.engine.engine import Engine

    engine = Engine.from_pretrained(str(args.path), max_batch_size=args.max_batch_size,
                                    max_seq_len=args.max_seq_len,
                                    max_batch_tokens=args.max_batch_tokens,
                                    log=lambda s: print(s, file=sys.stderr))  # fmt: skip
    return AsyncEngine(engine)


def _requests(args: argparse.Namespace, vocab: int) -> list[dict]:
    rng = random.Random(args.seed)
    reqs = []
    for i in range(args.requests):
        n = rng.randint(1, args.max_prompt)
        # A tag of two ids makes every prompt distinct; the rest random (no special ids 0..2).
        prompt = [3 + i % 200, 3 + i // 200] + [rng.randrange(3, vocab) for _ in range(n - 1)]
        reqs.append({"prompt": prompt, "max_tokens": rng.randint(1, args.max_output),
                     "temperature": 0, "ignore_eos": True, "logprobs": TOP_N, "stream": True,
                     "stream_options": {"include_usage": True}})  # fmt: skip
    return reqs


async def _one(http: httpx.AsyncClient, body: dict, timeout: float) -> dict:
    t0 = time.perf_counter()
    stamps, tokens, tops, text, finish, usage, ids = [], [], [], "", None, None, set()
    async with http.stream("POST", "/v1/completions", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {await r.aread()}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            ids.add(chunk["id"])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                n = len((c.get("logprobs") or {}).get("tokens") or ())
                if n:
                    stamps += [time.perf_counter()] * n
                    tokens += c["logprobs"]["tokens"]
                    tops += c["logprobs"]["top_logprobs"]
                text += c["text"]
                finish = c["finish_reason"] or finish
    return {"t0": t0, "end": time.perf_counter(), "stamps": stamps, "tokens": tokens,
            "tops": tops, "text": text, "finish": finish, "usage": usage, "ids": ids}  # fmt: skip


async def _load(url: str, reqs: list[dict], clients: int, deadline: float) -> list[dict | None]:
    results: list[dict | None] = [None] * len(reqs)
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(len(reqs)):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            try:
                results[i] = await _one(http, reqs[i], timeout=deadline)
            except Exception as e:  # a lost request: counted, not fatal
                results[i] = {"error": repr(e)}

    async with httpx.AsyncClient(base_url=url, limits=limits) as http:
        await asyncio.wait_for(asyncio.gather(*(client(http) for _ in range(clients))), deadline)
    return results


# Two executables' logits for the same tokens differ by up to 2 x 0.25 (the fixtures' bf16
# bound, tests/models/test_engine_serving.py), so an argmax is decided only where the top two
# are more than 4 x 0.25 apart: the engine's own tests' near-tie rule, in log-probabilities
# (the same logits less one logsumexp).
TIE_NATS = 1.0
TOP_N = 5  # logprobs asked for: a near-tie may hold more than two tokens


def _near_tie(loaded: dict, alone: dict) -> bool:
    k = next(k for k, (a, b) in enumerate(zip(loaded["tokens"], alone["tokens"], strict=False)) if a != b)
    top = alone["tops"][k]
    return loaded["tokens"][k] in top and max(top.values()) - top[loaded["tokens"][k]] < TIE_NATS


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else (xs[0] if xs else 0.0)


def main(argv: list[str] | None = None) -> int:
    """Runs the load test; exit status 1 when a request was lost, duplicated or mixed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("fake", "real"), default="fake")
    p.add_argument("--path", default=FIXTURE, help="checkpoint with tokenizer (real engine)")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--max-prompt", type=int, default=48)
    p.add_argument("--max-output", type=int, default=48)
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--max-batch-tokens", type=int, default=256)
    p.add_argument("--fake-step-s", type=float, default=0.005)
    p.add_argument("--replay", type=int, default=16, help="requests replayed alone (real)")
    p.add_argument("--deadline", type=float, default=300.0, help="seconds for the whole load")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    tok = ServerTokenizer.from_dir(args.path)
    engine = _engine(args)
    srv = start_in_thread(create_app(engine, tok, model_name="bench"))
    try:
        reqs = _requests(args, engine.engine.vocab_size)
        t0 = time.perf_counter()
        results = asyncio.run(_load(srv.url, reqs, args.clients, args.deadline))
        wall = time.perf_counter() - t0
        expected: dict[int, list[str]] = {}
        replays: dict[int, dict] = {}
        if args.engine == "fake":
            from fake_engine import FakeEngine

            for i, r in enumerate(reqs):
                expected[i] = [tok.token_text(FakeEngine.greedy_token(r["prompt"], k))
                               for k in range(r["max_tokens"])]  # fmt: skip
        else:
            for i in random.Random(1).sample(range(len(reqs)), min(args.replay, len(reqs))):
                replays[i] = asyncio.run(_load(srv.url, [reqs[i]], 1, args.deadline))[0]
                expected[i] = replays[i].get("tokens", [])
        pages = httpx.get(f"{srv.url}/metrics").text
    finally:
        srv.stop()

    lost = [i for i, r in enumerate(results) if r is None or "error" in r
            or r["finish"] != "length" or len(r["tokens"]) != reqs[i]["max_tokens"]]  # fmt: skip
    ok = [r for r in results if r is not None and "error" not in r]
    all_ids = [next(iter(r["ids"])) for r in ok if len(r["ids"]) == 1]
    duplicated = len(all_ids) - len(set(all_ids)) + sum(len(r["ids"]) != 1 for r in ok)
    differ = [i for i, toks in expected.items() if results[i] and "tokens" in results[i]
              and results[i]["tokens"] != toks]  # fmt: skip
    # Real engine: a replay alone may pick the other side of a bf16 near-tie (the batch's
    # make-up changes the executable); that is a near-tie, not mixing, when at the first
    # differing token the loaded run's token is in the replay's top TOP_N within TIE_NATS.
    ties = [i for i in differ if i in replays and _near_tie(results[i], replays[i])]
    mixed = [i for i in differ if i not in ties]
    in_use = [line for line in pages.splitlines() if line.startswith("jaxarena_kv_pages_in_use ")]
    ttft = [r["stamps"][0] - r["t0"] for r in ok if r["stamps"]]
    itl = [b - a for r in ok for a, b in zip(r["stamps"], r["stamps"][1:], strict=False) if b > a]
    e2e = [r["end"] - r["t0"] for r in ok]
    gen = sum(len(r["tokens"]) for r in ok)
    report = {
        "engine": args.engine, "clients": args.clients, "requests": len(reqs),
        "completed": len(ok), "lost": len(lost), "duplicated": duplicated,
        "mixed": len(mixed), "checked_for_mixing": len(expected), "near_ties": len(ties),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(ok) / wall, 2), "output_tokens_per_s": round(gen / wall, 1),
        "ttft_ms": {q: round(1e3 * _pct(ttft, q), 2) for q in (50, 90, 99)},
        "itl_ms": {q: round(1e3 * _pct(itl, q), 2) for q in (50, 90, 99)},
        "latency_ms": {q: round(1e3 * _pct(e2e, q), 1) for q in (50, 90, 99)},
        "kv_pages_in_use_after": in_use[0].split()[-1] if in_use else None,
    }  # fmt: skip
    for i in mixed[:5]:
        a, b = results[i], replays[i]
        k = next(k for k, (x, y) in enumerate(zip(a["tokens"], b["tokens"], strict=False)) if x != y)
        print(f"mixed request {i}: token {k}: {a['tokens'][k]!r} under load, {b['tokens'][k]!r} "
              f"alone; alone's top {TOP_N}: {b['tops'][k]}", file=sys.stderr)
    for i in lost[:5]:
        r = results[i] or {}
        why = r.get("error") or (f"finish_reason {r.get('finish')}, {len(r.get('tokens', ()))} of "
                                 f"{reqs[i]['max_tokens']} tokens, usage {r.get('usage')}")
        print(f"lost request {i}: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:>22}: {v}")
    return 1 if lost or duplicated or mixed else 0


if __name__ == "__main__":
    sys.exit(main())
