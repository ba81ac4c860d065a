"""A child for the launcher's own tests (run by tests/distributed/), one behaviour per mode.

    python tests/distributed/workers/launch_worker.py MODE OUT_DIR

Modes (every process writes `OUT_DIR/pid_p<id>` with its OS pid once it is set up; a
process that fails on purpose first waits for what the test will look at, so a slow start on a
loaded machine changes nothing):
  ok      prints two stdout lines and one stderr line, and the launch environment as JSON.
  exit    process 1 exits with code 3 once every process is up; the others sleep (they never
          finish on their own).
  kill    process 1 kills itself with SIGKILL once every process is up; the others sleep.
  hang    every process sleeps (only the timeout ends the run).
  stubborn  process 0 ignores SIGTERM and sleeps; process 1 exits with code 2 once process 0
          ignores SIGTERM.
  jax     JAX across processes: every process joins the launch and runs one cross-process
          psum; process 0 then starts a grandchild (`sleep`, pid in OUT_DIR/grandchild) and
          enters a second psum, while process 1 crashes (`os._exit(3)`) instead: process 0 is
          left blocked in a collective that can never complete.
  raise   JAX across processes: process 1 raises an uncaught exception after the first psum,
          process 0 enters the second; `initialize`'s fail-fast hook must end process 1 at
          once (exit code 1) instead of letting it wait in JAX's shutdown barrier.
Only the `jax` mode imports JAX; the others stay fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

LONG_S = 600  # "forever" for a test: far longer than any timeout the tests use


def _mark(out: str, name: str, text: str) -> None:
    """Writes `OUT_DIR/name` atomically (a reader never sees it half written)."""
    tmp = os.path.join(out, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(out, name))


def _wait_for(out: str, *names: str, timeout_s: float = 60.0) -> None:
    stop = time.monotonic() + timeout_s
    while not all(os.path.exists(os.path.join(out, n)) for n in names):
        if time.monotonic() > stop:
            raise SystemExit(f"waited {timeout_s} s for {names} in {out}")
        time.sleep(0.02)


def main(mode: str, out: str) -> None:
    me = int(os.environ["JAXARENA_PROCESS_ID"])
    n = int(os.environ["JAXARENA_NUM_PROCESSES"])
    if mode == "stubborn" and me == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _mark(out, f"pid_p{me}", str(os.getpid()))
    if mode == "ok":
        print(f"hello from {me}", flush=True)
        print(f"second line from {me}", flush=True)
        print(f"an error line from {me}", file=sys.stderr, flush=True)
        keys = ("JAXARENA_COORDINATOR", "JAXARENA_NUM_PROCESSES", "JAXARENA_PROCESS_ID",
                "JAXARENA_DEVICES_PER_PROCESS", "JAX_PLATFORMS", "XLA_FLAGS")  # fmt: skip
        with open(os.path.join(out, f"env_p{me}.json"), "w") as f:
            json.dump({k: os.environ.get(k) for k in keys}, f)
    elif mode in ("exit", "kill"):
        if me == 1:
            _wait_for(out, *(f"pid_p{i}" for i in range(n)))
            if mode == "exit":
                sys.exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(LONG_S)
    elif mode == "hang":
        time.sleep(LONG_S)
    elif mode == "stubborn":
        if me == 0:
            time.sleep(LONG_S)  # SIGTERM is ignored (above)
        _wait_for(out, "pid_p0")
        sys.exit(2)
    elif mode in ("jax", "raise"):
        _jax_dies_mid_run(me, out, mode)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


def _jax_dies_mid_run(me: int, out: str, mode: str) -> None:
    import jaxarena.launch

    jaxarena.launch.initialize()
    import jax
    import jax.numpy as jnp
    import numpy as np

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    spec = jax.sharding.PartitionSpec("x")
    total = jax.jit(
        jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=spec, out_specs=spec)
    )
    n = len(jax.devices())
    ones = jax.make_array_from_callback(
        (n,), jax.sharding.NamedSharding(mesh, spec), lambda idx: np.ones((1,), np.float32)
    )
    first = total(ones)
    assert float(np.asarray(first.addressable_shards[0].data)[0]) == n
    print(f"process {me}: first psum over {n} devices done", flush=True)
    if me == 1:
        _wait_for(out, "grandchild")  # process 0 is past the psum and has its grandchild
    if me == 1 and mode == "raise":
        raise RuntimeError("process 1 fails on purpose")
    if me == 1:
        os._exit(3)  # crashes mid-run (no clean-up), before the second collective
    child = subprocess.Popen(["sleep", str(LONG_S)])
    _mark(out, "grandchild", str(child.pid))
    second = total(ones * jnp.float32(2))  # blocks: process 1 never joins
    second.block_until_ready()
    print(f"process {me}: the second psum returned, which it must not", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
