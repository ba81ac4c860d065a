"""Running the app: `serve` (what `jaxarena serve` runs: bind first, load and compile, print
the address, serve until SIGTERM / Ctrl-C, drain, exit 0) and `start_in_thread` (an in-process
server on loopback for tests and benchmarks).

Across JAX processes (started by `python -m jaxarena.launch ... -- jaxarena serve ...`, or on
several hosts with the launcher's `JAXARENA_*` variables set by hand) every process loads the
engine over the devices of them all; process 0 binds the port and serves, the others follow
its device operations (`jaxarena.engine.multiprocess`) until its drain ends them.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from jaxarena.server.app import create_app
from jaxarena.server.tokenizer import ServerTokenizer

__all__ = ["DRAIN_SECONDS", "ThreadedServer", "bind", "load_engine", "serve", "start_in_thread"]

DRAIN_SECONDS = 30.0
"""At SIGTERM / Ctrl-C, how long running requests may take to finish before they are cut."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one). Raises OSError with the
    address in its message (port taken, host unknown)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, but a caught SIGTERM / SIGINT ends in exit 0 (uvicorn re-raises the
    signal after its graceful shutdown) and first marks the app draining."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]):
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.should_exit:
            self._on_exit()
        super().handle_exit(sig, frame)
        getattr(self, "_captured_signals", []).clear()


# Idle keep-alive connections are closed after this many seconds. uvicorn's default, 5 s, lost
# 1 request in 400 in 2 of 6 loopback load tests on a starved 2-core machine: a client reused
# a connection the server was closing (the client sees a reset). Clients' pools keep idle
# connections longer (httpx 5 s, with the race on its side too), so the server waits longer.
KEEP_ALIVE_SECONDS = 75


def _uvicorn_config(app: Any) -> uvicorn.Config:
    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                          timeout_keep_alive=KEEP_ALIVE_SECONDS,
                          timeout_graceful_shutdown=int(DRAIN_SECONDS))  # fmt: skip


def load_engine(args: argparse.Namespace, memory: int | None, log: Callable[[str], None]):
    """The `AsyncEngine` of `jaxarena serve`'s options: `Engine.from_pretrained` loads the
    checkpoint, sizes the page pool and compiles every executable, logging each stage."""
    from jaxarena.engine.async_engine import AsyncEngine
    from jaxarena.engine.engine import Engine

    engine = Engine.from_pretrained(
        args.path, max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len,
        max_batch_tokens=args.max_batch_tokens, kv_block_size=args.kv_block_size,
        memory=memory, kv_pages=args.kv_pages, target=args.target, log=log,
        loras=getattr(args, "loras", None) or None,
        max_lora_rank=getattr(args, "max_lora_rank", None),
        max_loras=getattr(args, "max_loras", None),
        tp=getattr(args, "tp", 1), ep=getattr(args, "ep", 1),
    )  # fmt: skip
    return AsyncEngine(engine)


def serve(args: argparse.Namespace, error: type[Exception] = RuntimeError,
          log: Callable[[str], None] = print,
          engine_factory: Callable | None = None) -> int:  # fmt: skip
    """`jaxarena serve PATH ...`: binds host:port (a taken port fails before any loading),
    reads the tokenizer, loads the checkpoint and compiles the engine (progress lines via
    `log`), serves until SIGTERM or Ctrl-C, then stops admitting, lets running requests
    finish (at most `DRAIN_SECONDS`) and returns 0. A failure to start raises `error` with
    one line. `engine_factory(args, memory, log)` replaces `load_engine` (tests).

    Under `jaxarena.launch` (or its variables set on each host) it first joins the other
    processes (`jaxarena.launch.initialize`); process 0 then serves as above, the others load
    the same engine and follow process 0's device operations until its drain, then return
    0. There a failure prints one line and ends the process (status 2, or 1 for a bug)."""
    launched = _join_processes(error, log)
    if launched is None:
        return _serve(args, error, log, engine_factory)
    return _serve_in_process(launched, args, error, log, engine_factory)


def _serve(args: argparse.Namespace, error: type[Exception], log: Callable[[str], None],
           engine_factory: Callable | None) -> int:  # fmt: skip
    from jaxarena import parse_memory

    try:
        tokenizer = ServerTokenizer.from_dir(args.path)
    except (OSError, ValueError) as e:
        raise error(f"{args.path}: cannot read the tokenizer: {e}") from None
    try:
        memory = parse_memory(args.memory) if args.memory else None
    except ValueError as e:
        raise error(f"--memory {args.memory!r}: {e}") from None
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        raise error(str(e)) from None
    try:
        host, port = sock.getsockname()[:2]
        log(f"jaxarena serve: tokenizer read, {_url_host(host)}:{port} reserved; "
            "starting the engine")  # fmt: skip
        t0 = time.monotonic()
        try:
            engine = (engine_factory or load_engine)(args, memory, log)
        except ValueError as e:  # a limit the checkpoint or the device refuses
            raise error(f"cannot start: {e}") from None
        log(f"jaxarena serve: ready in {time.monotonic() - t0:.1f} s")
        app = create_app(engine, tokenizer,
                         model_name=args.served_model_name or args.path,
                         shutdown_timeout=DRAIN_SECONDS)  # fmt: skip
        state = app.state.server

        def on_exit() -> None:
            state.draining = True
            log("jaxarena serve: stopping: no new requests; finishing the running ones")

        server = _Server(_uvicorn_config(app), on_exit)
        log(f"jaxarena serve: serving {state.model_name!r} on http://{_url_host(host)}:{port}"
            " (OpenAI API at /v1, /health, /metrics)")  # fmt: skip
        sys.stdout.flush()
        server.run(sockets=[sock])
        if not server.started:  # the app's start-up failed; uvicorn logged why
            raise error("the server did not start (see the lines above)")
    finally:
        sock.close()
    log("jaxarena serve: stopped")
    return 0


def _join_processes(error: type[Exception], log: Callable[[str], None]) -> Any:
    """Under `jaxarena.launch` (its variables set): joins the launch (`jax.distributed`) and
    returns its `LaunchInfo`; else None."""
    from jaxarena import launch

    try:
        info = launch.launch_info()
    except ValueError as e:
        raise error(str(e)) from None
    if info is not None:
        launch.initialize()
        log(f"jaxarena serve: process {info.process_id} of {info.num_processes} "
            f"(pid {os.getpid()}), {info.devices_per_process} devices")  # fmt: skip
    return info


def _serve_in_process(info: Any, args: argparse.Namespace, error: type[Exception],
                      log: Callable[[str], None], engine_factory: Callable | None) -> int:  # fmt: skip
    """`serve` in one process of several: process 0 serves, the others follow. A failure
    prints one line and ends the process at once (`os._exit`): a normal exit would wait for
    the other processes in JAX's distributed shutdown."""
    me = info.process_id
    try:
        if me == 0:
            loaded = []

            def factory(*a: Any) -> Any:
                loaded.append((engine_factory or load_engine)(*a))
                return loaded[-1]

            try:
                return _serve(args, error, log, factory)
            finally:  # the followers stop (no step runs any more: the engine thread ended)
                for async_engine in loaded:
                    async_engine.engine.close()
        from jaxarena import parse_memory

        try:
            memory = parse_memory(args.memory) if args.memory else None
            engine = (engine_factory or load_engine)(args, memory, log).engine
        except ValueError as e:
            raise error(f"cannot start: {e}") from None
        log(f"jaxarena serve: process {me} follows process 0")
        engine.follow(log=lambda msg: log(f"jaxarena serve: process {me} {msg}"))
        log(f"jaxarena serve: process {me} stopped")
        return 0
    except Exception as e:  # noqa: BLE001 - any failure: one line, then out
        print(f"jaxarena serve: process {me}: {e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2 if isinstance(e, error) else 1)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class ThreadedServer:
    """An app served by uvicorn in a background thread (tests, benchmarks).

    Attributes:
      url: `http://127.0.0.1:PORT`.
      server: the `uvicorn.Server`.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0):
        self._sock = bind(host, port)
        self.url = f"http://{_url_host(host)}:{self._sock.getsockname()[1]}"
        self.server = uvicorn.Server(_uvicorn_config(app))
        self._thread = threading.Thread(target=self.server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)  # fmt: skip

    def start(self, timeout: float = 30.0) -> ThreadedServer:
        """Starts serving; returns once the app's start-up ran (or raises TimeoutError)."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise TimeoutError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Graceful shutdown (running requests finish, the engine stops), then the thread."""
        self.server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()


def start_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> ThreadedServer:
    """Serves `app` on host:port (0: a free port) in a daemon thread; returns once started."""
    return ThreadedServer(app, host, port).start()
