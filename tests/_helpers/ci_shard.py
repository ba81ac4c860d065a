"""CI's split of the heaviest test folders between its two full jobs (`.ci/run`).

With `JAXARENA_CI_SHARD=k/n` a job runs the test files of each folder in `SHARDED_FOLDERS`
(tests/models: a compile per fixture; tests/gpu: a GPU compile per test; tests/kernels: the
Pallas interpreter's full grids) whose index in that folder's sorted list is k-1 modulo n
(every other file of each, for n = 2), and every other test. Each such file still runs on
one of the two JAX versions (and tests/kernels' functions once more on the lowest JAX, job 3);
a plain `pytest` (no variable) runs everything. Used by tests/conftest.py.
"""

from __future__ import annotations

import os

SHARDED_FOLDERS = ("models", "gpu", "kernels")


def shard(items):
    """`(kept, dropped)` test items for `JAXARENA_CI_SHARD` (all kept without it)."""
    value = os.environ.get("JAXARENA_CI_SHARD", "")
    if not value:
        return items, []
    k, n = (int(x) for x in value.split("/"))
    if not 1 <= k <= n:
        raise ValueError(f"JAXARENA_CI_SHARD={value!r} must be k/n with 1 <= k <= n")
    mine = set()
    for folder in SHARDED_FOLDERS:
        files = sorted({str(i.path) for i in items if i.path.parent.name == folder})
        mine |= {f for j, f in enumerate(files) if j % n == k - 1}

    def kept(item) -> bool:
        return item.path.parent.name not in SHARDED_FOLDERS or str(item.path) in mine

    return [i for i in items if kept(i)], [i for i in items if not kept(i)]
