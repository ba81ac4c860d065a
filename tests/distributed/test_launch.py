"""The launcher for several JAX processes on one machine (`jaxarena.launch`): environment,
prefixed output, exit statuses, timeouts, and that no child outlives a failed launch.

The children are tests/distributed/workers/launch_worker.py, one behaviour per mode; they write their
pids to a temporary folder so the tests can check that every one of them has ended.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers.launch import GRACE_S, JAX_TIMEOUT_S, WORKERS
from _helpers.launch import explain as _explain

from jaxarena import launch as L

PROCESSES, DEVICES = 2, 4


def _launch(args: list[str], tmp_path: Path, **kw) -> L.LaunchResult:
    kw.setdefault("processes", PROCESSES)
    kw.setdefault("devices_per_process", DEVICES)
    kw.setdefault("grace_s", GRACE_S)
    return L.launch([sys.executable, *args, str(tmp_path)], **kw)


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """Whether process `pid` has ended (or is a zombie waiting for init to reap it)."""
    stop = time.monotonic() + wait_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return True
        if state == "Z":
            return True
        if time.monotonic() > stop:
            return False
        time.sleep(0.05)


def _assert_all_gone(result: L.LaunchResult, tmp_path: Path) -> None:
    for i, pid in enumerate(result.pids):
        mark = tmp_path / f"pid_p{i}"
        if mark.exists():  # the worker ran as the process the launcher started
            assert int(mark.read_text()) == pid
    alive = [pid for pid in result.pids if not _gone(pid)]
    assert not alive, f"children still running after the launch: {alive}"


def test_every_public_name_exists_and_has_a_docstring():
    assert len(set(L.__all__)) == len(L.__all__)
    missing = []
    for name in L.__all__:
        obj = getattr(L, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            members = vars(obj).items() if inspect.isclass(obj) else []
            for label, member in [(name, obj)] + [
                (f"{name}.{a}", m) for a, m in members if not a.startswith("_") and callable(m)
            ]:
                if not (getattr(member, "__doc__", "") or "").strip():
                    missing.append(label)
    assert not missing, f"public names without a docstring: {missing}"


# -- the launcher -----------------------------------------------------------------------------


def test_child_environment_sets_the_launch_and_replaces_the_device_count():
    base = {"XLA_FLAGS": "--xla_cpu_foo=1 --xla_force_host_platform_device_count=8", "A": "b"}
    env = L.child_environment(base, process_id=1, num_processes=3,
                              coordinator="127.0.0.1:1234", devices_per_process=4)  # fmt: skip
    assert env["XLA_FLAGS"] == "--xla_cpu_foo=1 --xla_force_host_platform_device_count=4"
    assert env["JAX_PLATFORMS"] == "cpu" and env["A"] == "b"
    info = L.launch_info(env)
    assert info == L.LaunchInfo("127.0.0.1:1234", 3, 1, 4)
    assert base["XLA_FLAGS"].endswith("=8")  # the caller's mapping is not changed


def test_launch_info_outside_a_launch_and_on_bad_environments():
    assert L.launch_info({}) is None
    with pytest.raises(ValueError, match="JAXARENA_PROCESS_ID.*unset"):
        L.launch_info({L.ENV_COORDINATOR: "127.0.0.1:1", L.ENV_NUM_PROCESSES: "2",
                       L.ENV_DEVICES_PER_PROCESS: "4"})  # fmt: skip
    good = L.child_environment({}, process_id=0, num_processes=2, coordinator="127.0.0.1:1",
                               devices_per_process=4)  # fmt: skip
    with pytest.raises(ValueError, match="must be integers"):
        L.launch_info({**good, L.ENV_PROCESS_ID: "first"})
    with pytest.raises(ValueError, match="process id 2 of 2 processes"):
        L.launch_info({**good, L.ENV_PROCESS_ID: "2"})


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(processes=0), "processes=0 must be an int >= 1"),
        (dict(devices_per_process=True), "devices_per_process=True"),
        (dict(timeout=0), "timeout=0 must be > 0"),
    ],
)
def test_launch_rejects_bad_arguments(kw, match):
    args = dict(processes=2, devices_per_process=1) | kw
    with pytest.raises(ValueError, match=match):
        L.launch(["true"], **args)
    with pytest.raises(ValueError, match="command is empty"):
        L.launch([], processes=1, devices_per_process=1)


def test_launch_forwards_prefixed_output_and_tells_each_child_its_place(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    worker = str(WORKERS / "launch_worker.py")
    result = _launch([worker, "ok"], tmp_path, processes=3, stdout=out, stderr=err, timeout=60)
    assert result.ok and result.returncode == 0 and result.message == "", _explain(result)
    for i in range(3):
        assert result.processes[i].stdout == [f"hello from {i}", f"second line from {i}"]
        assert result.processes[i].stderr == [f"an error line from {i}"]
        # Forwarded in order per process, with its prefix, to the matching stream.
        lines = [s for s in out.getvalue().splitlines() if s.startswith(f"[p{i}] ")]
        assert lines == [f"[p{i}] hello from {i}", f"[p{i}] second line from {i}"]
        assert f"[p{i}] an error line from {i}\n" in err.getvalue()
    envs = [json.loads((tmp_path / f"env_p{i}.json").read_text()) for i in range(3)]
    host, port = envs[0]["JAXARENA_COORDINATOR"].split(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert {e["JAXARENA_COORDINATOR"] for e in envs} == {envs[0]["JAXARENA_COORDINATOR"]}
    assert [e["JAXARENA_PROCESS_ID"] for e in envs] == ["0", "1", "2"]
    for e in envs:
        assert e["JAXARENA_NUM_PROCESSES"] == "3" and e["JAXARENA_DEVICES_PER_PROCESS"] == "4"
        assert e["JAX_PLATFORMS"] == "cpu"
        # conftest.py asked this process for 8 devices; the children get the launcher's 4 only.
        counts = [f for f in e["XLA_FLAGS"].split() if "device_count" in f]
        assert counts == ["--xla_force_host_platform_device_count=4"]
    _assert_all_gone(result, tmp_path)


@pytest.mark.parametrize(
    "mode, how, returncode",
    [("exit", "exited with code 3", 3), ("kill", "was killed by SIGKILL", 128 + signal.SIGKILL)],
)
def test_a_failing_child_ends_the_launch_at_once(tmp_path, mode, how, returncode):
    worker = str(WORKERS / "launch_worker.py")
    result = _launch([worker, mode], tmp_path, processes=3, timeout=60)
    assert not result.ok and result.failed == 1 and not result.timed_out
    assert result.returncode == returncode
    assert result.processes[1].how() == how
    assert result.message == (
        f"jaxarena.launch: process 1 (pid {result.pids[1]}) {how}; "
        "ended the other processes still running: p0, p2"
    )
    # The sleepers (600 s) were ended by the launcher, by SIGTERM, within the grace period.
    for i in (0, 2):
        p = result.processes[i]
        assert p.ended_by_launcher and p.returncode == -signal.SIGTERM
    assert result.wall_s < 30, result.wall_s  # the child fails at once; not the 60 s timeout
    _assert_all_gone(result, tmp_path)


def test_the_timeout_ends_every_child(tmp_path):
    worker = str(WORKERS / "launch_worker.py")
    result = _launch([worker, "hang"], tmp_path, timeout=2.0)
    assert result.timed_out and result.failed is None and result.returncode == L.TIMEOUT_EXIT
    assert result.message == (
        "jaxarena.launch: timed out after 2 s; ended the processes still running: p0, p1"
    )
    assert all(p.ended_by_launcher and p.returncode == -signal.SIGTERM for p in result.processes)
    assert 2.0 <= result.wall_s < 2.0 + GRACE_S + 10
    _assert_all_gone(result, tmp_path)


def test_a_child_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    worker = str(WORKERS / "launch_worker.py")
    result = _launch([worker, "stubborn"], tmp_path, timeout=60)
    assert result.failed == 1 and result.processes[1].returncode == 2
    assert result.processes[0].returncode == -signal.SIGKILL
    assert "process 1" in result.message and "exited with code 2" in result.message
    _assert_all_gone(result, tmp_path)


def test_command_line_prefixes_output_and_exits_with_the_failure(tmp_path, capsys):
    worker = str(WORKERS / "launch_worker.py")
    args = ["--processes", "2", "--timeout", "60", "--grace", "1", "--", sys.executable, worker]
    ok_dir, kill_dir = tmp_path / "ok", tmp_path / "kill"  # fresh pid files for each run
    ok_dir.mkdir()
    kill_dir.mkdir()
    assert L.main([*args, "ok", str(ok_dir)]) == 0
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == [
        "[p0] hello from 0", "[p0] second line from 0", "[p1] hello from 1",
        "[p1] second line from 1",
    ]  # fmt: skip
    assert sorted(err.splitlines()) == ["[p0] an error line from 0", "[p1] an error line from 1"]
    with pytest.raises(SystemExit) as usage:
        L.main(args[:4])
    assert usage.value.code == 2 and "no command given" in capsys.readouterr().err
    # The module entry point, in a process of its own: the failed child's code, one last line.
    bad = subprocess.run([sys.executable, "-m", "jaxarena.launch", *args, "kill", str(kill_dir)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 128 + signal.SIGKILL, bad.stderr
    last = bad.stderr.strip().splitlines()[-1]
    assert last == (
        f"jaxarena.launch: process 1 (pid {(kill_dir / 'pid_p1').read_text()}) was killed by "
        "SIGKILL; ended the other processes still running: p0"
    )
    assert _gone(int((kill_dir / "pid_p0").read_text()))


# -- JAX across processes -------------------------------------------------------------------------


@pytest.mark.parametrize("mode, code", [("jax", 3), ("raise", 1)])
def test_a_jax_process_dying_mid_run_fails_the_launch_within_its_timeout(tmp_path, mode, code):
    # Process 1 crashes (or raises) after a first cross-process psum; process 0 is then stuck
    # in a second psum that cannot complete, and has started a grandchild.
    worker = str(WORKERS / "launch_worker.py")
    result = _launch([worker, mode], tmp_path, timeout=JAX_TIMEOUT_S)
    assert result.failed == 1 and not result.timed_out, _explain(result)
    assert result.returncode == code
    assert f"process 1 (pid {result.pids[1]}) exited with code {code}" in result.message
    assert result.processes[0].ended_by_launcher
    assert "process 0: first psum over 8 devices done" in result.processes[0].stdout
    assert not any("second psum returned" in line for line in result.processes[0].stdout)
    if mode == "raise":  # the traceback reached the launcher before the fast exit
        assert "RuntimeError: process 1 fails on purpose" in result.processes[1].stderr
    assert result.wall_s < JAX_TIMEOUT_S
    _assert_all_gone(result, tmp_path)
    assert _gone(int((tmp_path / "grandchild").read_text())), "process 0's grandchild survived"
