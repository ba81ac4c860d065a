"""`jaxarena serve` as a command: a failure to start is one line and exit status 2 (port taken,
no tokenizer, bad --memory); `plan` imports no web framework; a SIGTERM lets the running
request finish, refuses new ones and exits 0 (a subprocess on the fake engine)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("tokenizers")
httpx = pytest.importorskip("httpx")

from _harness import FIXTURE  # noqa: E402

from jaxarena.cli import main  # noqa: E402
from jaxarena.server.run import bind  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_port_taken_is_one_line(capsys):
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    try:
        err = _one_line_error(capsys, ["serve", str(FIXTURE), "--port", str(port)])
    finally:
        sock.close()
    assert f"cannot listen on 127.0.0.1:{port}" in err


def test_no_tokenizer_is_one_line(capsys, tmp_path):
    err = _one_line_error(capsys, ["serve", str(tmp_path), "--port", "0"])
    assert "tokenizer.json" in err


def test_bad_options_are_one_line(capsys):
    assert "--memory" in _one_line_error(capsys, ["serve", str(FIXTURE), "--memory", "lots"])
    assert "--port" in _one_line_error(capsys, ["serve", str(FIXTURE), "--port", "70000"])
    assert main(["serve", str(FIXTURE), "--memory", "1GB", "--kv-pages", "4"]) == 2


def test_plan_imports_no_web_framework():
    heavy = {"fastapi", "uvicorn", "starlette", "tokenizers", "jinja2", "jax", "pydantic"}
    code = ("import sys, io, contextlib; from jaxarena.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['plan', '--json'])\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy!r}))")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


SERVE_ON_FAKE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from fake_engine import FakeAsyncEngine, FakeEngine
    from jaxarena.cli import build_parser
    from jaxarena.server.run import serve
    args = build_parser().parse_args(["serve", {fixture!r}, "--port", "0"])
    sys.exit(serve(args, engine_factory=lambda a, m, log: FakeAsyncEngine(FakeEngine(), 0.01)))
""")


def test_sigterm_drains_and_exits_0():
    script = SERVE_ON_FAKE.format(tests=str(Path(__file__).parent), fixture=str(FIXTURE))
    proc = subprocess.Popen([sys.executable, "-u", "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            m = re.search(r"on (http://\S+) ", line)
            if m:
                url = m.group(1)
                break
        else:
            raise AssertionError("no address line:\n" + "".join(lines))
        assert "starting the engine" in lines[0]
        body = {"prompt": [5, 6], "max_tokens": 60, "temperature": 0, "stream": True}
        got: list[str] = []
        verdict: list[str] = []
        with httpx.Client(base_url=url, timeout=30) as http:
            # The model's name defaults to PATH as given.
            assert http.get("/v1/models").json()["data"][0]["id"] == str(FIXTURE)
            with http.stream("POST", "/v1/completions", json=body) as r:
                it = r.iter_lines()
                got.append(next(it))
                proc.send_signal(signal.SIGTERM)
                refused = threading.Thread(target=_expect_refused, args=(url, verdict))
                refused.start()
                got += list(it)
                refused.join()
        chunks = [json.loads(x[6:]) for x in got if x.startswith("data: {")]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert [x for x in got if x][-1] == "data: [DONE]"
        assert verdict == ["refused"]  # a new request during the drain
        assert proc.wait(timeout=60) == 0
        rest = proc.stdout.read()
        assert "stopping" in rest and "stopped" in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()


def _expect_refused(url: str, got: list[str]) -> None:
    import time

    time.sleep(0.2)  # the signal handled
    try:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, timeout=5)
        got.append("refused" if r.status_code == 503 else f"answered {r.status_code}")
    except httpx.TransportError:
        got.append("refused")
