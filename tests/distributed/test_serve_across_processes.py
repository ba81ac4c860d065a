"""`jaxarena serve --tp 8` across 2 processes x 4 CPU devices, started by the launcher as a
user would (`python -m jaxarena.launch ... -- python -m jaxarena.cli serve ...`): process 0
serves the OpenAI API, process 1 follows its device operations (jaxarena.engine.multiprocess),
and every step's collectives cross processes. The checkpoint is the qwen3 fixture read as 8
heads (tests/distributed/workers/model_tp_worker.py) with the serving fixture's tokenizer.

The reference is the same engine in ONE process over this session's 8 CPU devices: the same
program, only the collectives' transport differs, so a request served alone (a deterministic
schedule: its prefill chunk, then decodes) gives the reference's tokens exactly, greedy or
seeded sampling with penalties. Requests served together share steps whose mix depends on
their arrival, and another executable may round a logit the other way
(tests/server/test_server_tp.py): there greedy outputs must match where each choice wins by
more than MIN_GAP (about 7 bf16 ulps at these logits), and every request must get its tokens.
At SIGTERM the leader drains and stops its follower; every process must exit 0.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from _helpers.launch import GRACE_S, JAX_TIMEOUT_S, load_worker  # noqa: E402

import jaxarena  # noqa: E402
from jaxarena.engine import Engine, SamplingParams  # noqa: E402

TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "serve" / "qwen3"
LIMITS = dict(max_batch_size=2, max_seq_len=32, max_batch_tokens=32, kv_block_size=16, kv_pages=8)
NEW = 5
MIN_GAP = 0.2
MODEL = "qwen3-8-heads"
# (prompt length, prompt draw, sampling seed or None: greedy): lengths that mix prefill chunks
# with decodes; 5 requests > 2 slots. The greedy prompts' draws are ones whose every choice
# wins by more than MIN_GAP (checked below).
JOBS = [(13, 1, None), (3, 0, 7), (9, 2, None), (1, 0, 11), (6, 1, None)]
SAMPLED = dict(temperature=0.9, top_p=0.95, repetition_penalty=1.3)


def _prompt(n: int, draw: int, vocab: int) -> list[int]:
    return np.random.default_rng(1000 * draw + n).integers(3, vocab, n).tolist()


def _params(seed: int | None, **extra) -> SamplingParams:
    if seed is None:
        return SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True, **extra)
    return SamplingParams(max_tokens=NEW, seed=seed, ignore_eos=True, **SAMPLED, **extra)


class _Launch:
    """The launcher as a subprocess; its (prefixed) output lines collected by a thread."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"no line matching {pattern!r}; the launch's output:\n{self.output()}")

    def output(self) -> str:
        return "\n".join(line for line in self.lines if "Gloo" not in line)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("serve_mp") / "qwen3_8_heads"
    load_worker("model_tp_worker").write_checkpoint(ckpt)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, ckpt / name)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(jaxarena.__file__).parents[1]),
                                         env.get("PYTHONPATH", "")])  # fmt: skip
    # As compiler_options={"xla_backend_optimization_level": 0} in-process: quicker compiles.
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items()]
    launch = _Launch([sys.executable, "-m", "jaxarena.launch", "--processes", "2",
                      "--devices-per-process", "4", f"--timeout={3 * JAX_TIMEOUT_S}",
                      f"--grace={GRACE_S}", "--", sys.executable, "-m", "jaxarena.cli", "serve",
                      str(ckpt), "--tp=8", "--port=0", f"--served-model-name={MODEL}",
                      *flags], env)  # fmt: skip
    try:
        # The reference compiles while the two processes load.
        ref = Engine.from_pretrained(ckpt, tp=8, **LIMITS, kernels="xla", log=None,
                                     compiler_options={"xla_backend_optimization_level": 0})  # fmt: skip
        url = launch.wait_for(
            r"\[p0\] jaxarena serve: serving .* on (http://\S+)", 2 * JAX_TIMEOUT_S
        )
        yield launch, ref, url.group(1)
    finally:
        if launch.proc.poll() is None:
            launch.proc.send_signal(signal.SIGTERM)  # the launcher ends every process
            launch.proc.wait(30)


def _complete(client, prompt: list[int], seed: int | None) -> tuple[str, int]:
    extra = {"ignore_eos": True}
    if seed is not None:
        extra.update(seed=seed, repetition_penalty=SAMPLED["repetition_penalty"])
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=NEW,
                                  temperature=SAMPLED["temperature"] if seed is not None else 0,
                                  top_p=SAMPLED["top_p"] if seed is not None else 1,
                                  extra_body=extra)  # fmt: skip
    return r.choices[0].text, r.usage.completion_tokens


def test_serve_across_processes(run):
    import openai

    from jaxarena.server.tokenizer import ServerTokenizer

    launch, ref, url = run
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    tok = ServerTokenizer.from_dir(ref.path)
    vocab = ref.vocab_size
    prompts = [_prompt(n, draw, vocab) for n, draw, _ in JOBS]
    # Served together: every request gets its tokens; decided greedy ones are the reference's.
    with concurrent.futures.ThreadPoolExecutor(len(JOBS)) as pool:
        together = list(pool.map(lambda j: _complete(client, prompts[j], JOBS[j][2]),
                                 range(len(JOBS))))  # fmt: skip
    assert [n for _, n in together] == [NEW] * len(JOBS)
    for p, job, (text, _) in zip(prompts, JOBS, together, strict=True):
        if job[2] is None:
            out = ref.generate([p], _params(None, logprobs=2))[0]
            gap = min(top[0][1] - top[1][1] for _, top in out.logprobs)
            assert gap > MIN_GAP, f"{job}: a greedy choice wins by {gap} only; pick another draw"
            assert text == tok.decode(out.token_ids), job
    # Served alone: exactly the reference's tokens, greedy and seeded.
    for j in (0, 1, 3):
        p, seed = prompts[j], JOBS[j][2]
        text, _ = _complete(client, p, seed)
        assert text == tok.decode(ref.generate([p], _params(seed))[0].token_ids), JOBS[j]
    leader = int(
        launch.wait_for(r"\[p0\] jaxarena serve: process 0 of 2 \(pid (\d+)\)", 1).group(1)
    )
    os.kill(leader, signal.SIGTERM)
    rc = launch.proc.wait(JAX_TIMEOUT_S)
    launch._reader.join(10)
    out = launch.output()
    assert rc == 0, out
    followed = re.search(r"\[p1\] jaxarena serve: process 1 followed (\d+) device operations", out)
    assert followed and int(followed.group(1)) > len(JOBS), out
    assert "[p1] jaxarena serve: process 1 stopped" in out, out
