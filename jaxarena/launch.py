"""Run one program as several JAX processes on this machine (multi-controller mode).

    python -m jaxarena.launch --processes 2 --devices-per-process 4 [--timeout 120] \\
        -- python script.py args...

starts `--processes` copies of the command on localhost, each in its own process group, with
an environment that tells it its process id, the process count, the coordinator address
(`127.0.0.1:<free port>`) and how many CPU devices to create
(`--xla_force_host_platform_device_count`, `JAX_PLATFORMS=cpu`). The script makes ONE call
before any other JAX work:

    import jaxarena.launch
    jaxarena.launch.initialize()   # jax.distributed.initialize from the launcher's environment

after which `jax.devices()` lists the devices of every process and a `Mesh` over them spans
processes. Each line a child prints is forwarded with a `[p0] `, `[p1] `... prefix (stdout to
stdout, stderr to stderr). The launcher waits for every child and exits 0 only if all exit 0.
When a child fails (non-zero exit or a signal) or the timeout passes, every child's process
group gets SIGTERM, then SIGKILL after a grace period, so nothing is left behind; one line on
stderr says which process failed and how.

From Python (tests), `launch(command, processes=..., devices_per_process=...)` does the same
and returns a `LaunchResult` with every process's exit status and output.

This module imports only the standard library (`initialize` imports JAX when called), so the
launcher never starts a JAX backend itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import queue
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

__all__ = [
    "DEFAULT_GRACE_S",
    "ENV_COORDINATOR",
    "ENV_DEVICES_PER_PROCESS",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "LaunchInfo",
    "LaunchResult",
    "ProcessResult",
    "TIMEOUT_EXIT",
    "child_environment",
    "free_port",
    "initialize",
    "launch",
    "launch_info",
    "main",
]

# The environment a launched child reads (see `initialize`).
ENV_COORDINATOR = "JAXARENA_COORDINATOR"
ENV_NUM_PROCESSES = "JAXARENA_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXARENA_PROCESS_ID"
ENV_DEVICES_PER_PROCESS = "JAXARENA_DEVICES_PER_PROCESS"

_DEVICE_FLAG = "--xla_force_host_platform_device_count"
# Exit status of the launcher when the timeout ended the run (as coreutils' `timeout`).
TIMEOUT_EXIT = 124
# Seconds between SIGTERM and SIGKILL when the launcher ends its children.
DEFAULT_GRACE_S = 3.0


# -- the parent side ------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago (the OS picks it; bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def child_environment(
    base: Mapping[str, str],
    *,
    process_id: int,
    num_processes: int,
    coordinator: str,
    devices_per_process: int,
) -> dict[str, str]:
    """The environment of child `process_id`: `base` plus the launch variables.

    Sets `JAXARENA_COORDINATOR`, `JAXARENA_NUM_PROCESSES`, `JAXARENA_PROCESS_ID`,
    `JAXARENA_DEVICES_PER_PROCESS` and `JAX_PLATFORMS=cpu`, and appends
    `--xla_force_host_platform_device_count=<devices_per_process>` to `XLA_FLAGS` after removing
    any device-count flag already there (the launcher's count is the one that applies).
    """
    env = dict(base)
    kept = [f for f in shlex.split(env.get("XLA_FLAGS", "")) if not f.startswith(_DEVICE_FLAG)]
    env["XLA_FLAGS"] = " ".join([*kept, f"{_DEVICE_FLAG}={devices_per_process}"])
    env["JAX_PLATFORMS"] = "cpu"
    env[ENV_COORDINATOR] = coordinator
    env[ENV_NUM_PROCESSES] = str(num_processes)
    env[ENV_PROCESS_ID] = str(process_id)
    env[ENV_DEVICES_PER_PROCESS] = str(devices_per_process)
    return env


@dataclasses.dataclass
class ProcessResult:
    """How one child ended.

    Attributes:
      process_id: its JAX process id (0 is the coordinator).
      pid: its OS process id (also its process group id).
      returncode: as `subprocess.Popen.returncode`: the exit code, or `-signal` when a signal
        ended it; None if it never ended (cannot happen after `launch` returns).
      ended_by_launcher: True when the launcher signalled it (another child failed, or timeout).
      stdout, stderr: its output lines, without the prefix or the newline.
    """

    process_id: int
    pid: int
    returncode: int | None = None
    ended_by_launcher: bool = False
    stdout: list[str] = dataclasses.field(default_factory=list)
    stderr: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def how(self) -> str:
        """`'exited with code 3'`, `'was killed by SIGKILL'`, `'exited with code 0'`."""
        rc = self.returncode
        if rc is None:
            return "is still running"
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return f"was killed by {name}"
        return f"exited with code {rc}"


@dataclasses.dataclass
class LaunchResult:
    """The outcome of `launch`.

    Attributes:
      processes: one `ProcessResult` per child, by process id.
      failed: the process id of the FIRST child that failed on its own (not ended by the
        launcher), or None.
      timed_out: True when the timeout ended the run.
      message: one line saying what happened (empty when every child exited 0).
      wall_s: seconds from the first start to the last exit.
    """

    processes: list[ProcessResult]
    failed: int | None
    timed_out: bool
    message: str
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.failed is None and not self.timed_out

    @property
    def returncode(self) -> int:
        """0 if all exited 0; 124 on timeout; else the failed child's code (128 + signal)."""
        if self.timed_out:
            return TIMEOUT_EXIT
        if self.failed is None:
            return 0
        rc = self.processes[self.failed].returncode or 1
        return rc if rc > 0 else 128 - rc

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]


def _forward(
    stream: Any, prefix: str, lines: list[str], out: TextIO | None, lock: threading.Lock
) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        lines.append(line)
        if out is not None:
            with lock:
                out.write(f"{prefix}{line}\n")
                out.flush()
    stream.close()


def _wait_child(p: subprocess.Popen[bytes], res: ProcessResult, exits: queue.Queue[int]) -> None:
    res.returncode = p.wait()
    exits.put(res.process_id)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def launch(
    command: Sequence[str],
    *,
    processes: int,
    devices_per_process: int,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> LaunchResult:
    """Runs `command` as `processes` JAX processes on localhost and waits for all of them.

    Every child starts in a new session (its own process group), with
    `child_environment(env or os.environ, ...)`. On the first failure (a non-zero exit or a
    signal) or when `timeout` passes, every still-running child's process group gets SIGTERM,
    then SIGKILL after `grace_s`; all groups are signalled once more at the end, so no
    grandchild outlives the launch either.

    Args:
      command: the program and its arguments (no shell), e.g. `[sys.executable, "script.py"]`.
      processes: how many processes (>= 1).
      devices_per_process: CPU devices each process creates (>= 1).
      timeout: seconds for the whole run (None: no limit).
      env: the base environment (default `os.environ`).
      cwd: working directory of the children.
      stdout, stderr: where prefixed output lines go (None: not forwarded, only collected).
      grace_s: seconds between SIGTERM and SIGKILL.

    Returns:
      A `LaunchResult`; `result.ok` is True only if every child exited 0.

    Raises:
      ValueError: empty command, or `processes`/`devices_per_process`/`timeout` out of range.
    """
    command = list(command)
    if not command:
        raise ValueError(
            "launch: command is empty; pass the program to run, e.g. ['python', 's.py']"
        )
    for name, value in (("processes", processes), ("devices_per_process", devices_per_process)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"launch: {name}={value!r} must be an int >= 1")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"launch: timeout={timeout!r} must be > 0 seconds (or None)")
    base = os.environ if env is None else env
    coordinator = f"127.0.0.1:{free_port()}"
    lock = threading.Lock()
    results: list[ProcessResult] = []
    popens: list[subprocess.Popen[bytes]] = []
    threads: list[threading.Thread] = []
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    exits: queue.Queue[int] = queue.Queue()
    failed: int | None = None
    timed_out = False
    message = ""
    try:
        for pid_ in range(processes):
            child_env = child_environment(
                base, process_id=pid_, num_processes=processes, coordinator=coordinator,
                devices_per_process=devices_per_process,
            )  # fmt: skip
            p = subprocess.Popen(
                command, env=child_env, cwd=cwd, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
            popens.append(p)
            res = ProcessResult(pid_, p.pid)
            results.append(res)
            for stream, lines, out in (
                (p.stdout, res.stdout, stdout),
                (p.stderr, res.stderr, stderr),
            ):
                t = threading.Thread(
                    target=_forward, args=(stream, f"[p{pid_}] ", lines, out, lock), daemon=True
                )
                t.start()
                threads.append(t)
        # Wait: stop at the first failure or at the deadline. One waiter thread per child
        # queues its process id when it exits, so failures are seen in the order they happened.
        for res in results:
            t = threading.Thread(target=_wait_child, args=(popens[res.process_id], res, exits),
                                 daemon=True)  # fmt: skip
            t.start()
            threads.append(t)
        remaining = processes
        while remaining:
            wait_s = None if deadline is None else deadline - time.monotonic()
            if wait_s is not None and wait_s <= 0:
                timed_out = True
                break
            try:
                done = exits.get(timeout=wait_s)
            except queue.Empty:
                timed_out = True
                break
            remaining -= 1
            if results[done].returncode != 0:
                failed = done
                break
    finally:
        # Ends whatever still runs (also on KeyboardInterrupt or an error starting a child).
        _end_all(popens, results, grace_s)
        for t in threads:
            t.join(timeout=5.0)
    wall = time.monotonic() - start
    ended = [f"p{r.process_id}" for r in results if r.ended_by_launcher]
    if timed_out:
        message = f"jaxarena.launch: timed out after {timeout:g} s; ended " + (
            f"the processes still running: {', '.join(ended)}" if ended else "none (all had exited)"
        )
    elif failed is not None:
        bad = results[failed]
        message = f"jaxarena.launch: process {failed} (pid {bad.pid}) {bad.how()}; " + (
            f"ended the other processes still running: {', '.join(ended)}"
            if ended
            else "no other process was running"
        )
    return LaunchResult(results, failed, timed_out, message, wall)


def _end_all(
    popens: list[subprocess.Popen[bytes]], results: list[ProcessResult], grace_s: float
) -> None:
    """SIGTERM every live child's group, SIGKILL after `grace_s`, reap every child."""
    live = [(r, p) for r, p in zip(results, popens, strict=True) if p.poll() is None]
    for r, p in live:
        r.ended_by_launcher = True
        _signal_group(p.pid, signal.SIGTERM)
    stop = time.monotonic() + grace_s
    while live and time.monotonic() < stop:
        if all(p.poll() is not None for _, p in live):
            break
        time.sleep(0.05)
    # SIGKILL every group, also of children that exited: a grandchild may remain in it.
    for p in popens:
        _signal_group(p.pid, signal.SIGKILL)
    for r, p in zip(results, popens, strict=True):
        rc = p.wait()
        if r.returncode is None:
            r.returncode = rc


# -- the child side -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """What the launcher told this process (from its environment)."""

    coordinator: str
    num_processes: int
    process_id: int
    devices_per_process: int


def launch_info(environ: Mapping[str, str] | None = None) -> LaunchInfo | None:
    """This process's `LaunchInfo`, or None when it was not started by `jaxarena.launch`.

    Raises:
      ValueError: the variables are present but incomplete or malformed.
    """
    environ = os.environ if environ is None else environ
    names = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID, ENV_DEVICES_PER_PROCESS)
    present = [n for n in names if n in environ]
    if not present:
        return None
    if len(present) != len(names):
        missing = [n for n in names if n not in environ]
        raise ValueError(
            f"launch environment incomplete: {', '.join(missing)} unset (set all of "
            f"{', '.join(names)}, or none; python -m jaxarena.launch sets them)"
        )
    try:
        info = LaunchInfo(
            environ[ENV_COORDINATOR],
            int(environ[ENV_NUM_PROCESSES]),
            int(environ[ENV_PROCESS_ID]),
            int(environ[ENV_DEVICES_PER_PROCESS]),
        )
    except ValueError:
        raise ValueError(
            f"launch environment malformed: {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID} and "
            f"{ENV_DEVICES_PER_PROCESS} must be integers, got "
            f"{[environ[n] for n in names[1:]]}"
        ) from None
    if not 0 <= info.process_id < info.num_processes or info.devices_per_process < 1:
        raise ValueError(
            f"launch environment inconsistent: process id {info.process_id} of "
            f"{info.num_processes} processes, {info.devices_per_process} devices each"
        )
    return info


def initialize(*, fail_fast: bool = True, **distributed_kwargs: Any) -> LaunchInfo | None:
    """Joins the launch this process belongs to: call once, before any other JAX work.

    Reads the launcher's environment (`launch_info`), selects gloo for CPU collectives
    (`jax_cpu_collectives_implementation`) and calls `jax.distributed.initialize` with the
    coordinator address (bound on 127.0.0.1 only), the process count and this process's id.
    Afterwards `jax.devices()` holds every process's devices and `jax.local_devices()` this
    process's `devices_per_process`.

    Outside a launch (no launcher variables) it does nothing and returns None, so the same
    script also runs as a single process.

    With `fail_fast` (the default) an uncaught exception prints its traceback and ends the
    process at once with exit code 1. Without it, Python's exit runs JAX's distributed
    shutdown, which waits (up to `shutdown_timeout_seconds`, 5 minutes by default) for every
    other process to shut down too; a process stuck in a collective with the failed one never
    does, so the failure would only surface at the launcher's timeout. The launcher sees the
    exit at once and ends the others. `sys.exit(n)` is not an uncaught exception and still
    waits in that shutdown: to fail fast on purpose, raise, or call `os._exit(n)`.

    Args:
      fail_fast: install the exception hook described above.
      **distributed_kwargs: passed on to `jax.distributed.initialize`
        (`heartbeat_timeout_seconds`, `shutdown_timeout_seconds`, `initialization_timeout`).

    Returns:
      The `LaunchInfo`, or None when not launched.
    """
    info = launch_info()
    if info is None:
        return None
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=info.coordinator,
        num_processes=info.num_processes,
        process_id=info.process_id,
        coordinator_bind_address=info.coordinator,
        **distributed_kwargs,
    )
    if fail_fast:
        sys.excepthook = _exit_on_uncaught
    found = len(jax.local_devices())
    if found != info.devices_per_process:
        raise RuntimeError(
            f"process {info.process_id}: {found} local devices, the launcher asked for "
            f"{info.devices_per_process} (was JAX imported and its backend started before "
            f"XLA_FLAGS was set, or is JAX_PLATFORMS not cpu?)"
        )
    return info


def _exit_on_uncaught(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    sys.__excepthook__(kind, value, tb)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


# -- command line ----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jaxarena.launch",
        description="Run a command as several JAX processes on localhost (CPU devices, gloo).",
        epilog="Example: python -m jaxarena.launch --processes 2 --devices-per-process 4 "
        "-- python script.py   (the script calls jaxarena.launch.initialize() first)",
    )
    p.add_argument("--processes", type=int, required=True, help="number of processes")
    p.add_argument("--devices-per-process", type=int, default=1,
                   help="CPU devices each process creates (default 1)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds for the whole run; then every process is ended (exit 124)")  # fmt: skip
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_S,
                   help="seconds between SIGTERM and SIGKILL when ending processes")  # fmt: skip
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- program args...")
    return p


class _Terminated(BaseException):
    """The launcher got SIGTERM."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (see `LaunchResult.returncode`)."""
    parser = _parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.error("no command given; put it after --, e.g. -- python script.py")
    # A SIGTERM to the launcher (a CI job cancelled, say) must still end the children: turn it
    # into an exception so `launch`'s cleanup runs. The previous handler is restored after.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        result = launch(
            command, processes=args.processes, devices_per_process=args.devices_per_process,
            timeout=args.timeout, stdout=sys.stdout, stderr=sys.stderr, grace_s=args.grace,
        )  # fmt: skip
    except ValueError as e:
        parser.error(str(e))
    except _Terminated:
        print("jaxarena.launch: got SIGTERM; ended every process", file=sys.stderr)
        return 128 + signal.SIGTERM
    except FileNotFoundError as e:
        print(f"jaxarena.launch: cannot start {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if result.message:
        print(result.message, file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
