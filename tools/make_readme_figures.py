"""Regenerates the pictures the README shows, with the `jaxarena` command line itself.

    python tools/make_readme_figures.py          # -> docs/packed_map.png

`docs/packed_map.png` is `jaxarena plan qwen3-next-80b-a3b --packed --target hopper --plot
docs/packed_map.png` at the default limits (max_batch_tokens 8192, max_seq_len 32768,
kv_block_size 16, max_batch_size 64), run with the sizing levers off (their environment
variables removed), so the picture depends on the code only. Needs matplotlib
(`pip install -e ".[plot]"`); no torch.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "packed_map.png"
PRESET = "qwen3-next-80b-a3b"
MAX_BYTES = 300 * 1024  # keep the repository small


def main() -> int:
    from jaxarena._config import levers
    from jaxarena.cli import main as cli

    for name in (levers.ENV_GGUF_NATIVE_Q2, levers.ENV_GGUF_NATIVE_Q2_MMQ,
                 levers.ENV_FP8_ROWWISE, levers.ENV_ATTN_DECODE_SPLITK):  # fmt: skip
        os.environ.pop(name, None)
    OUT.parent.mkdir(exist_ok=True)
    os.chdir(ROOT)
    argv = ["plan", PRESET, "--packed", "--target", "hopper", "--plot", str(OUT.relative_to(ROOT))]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli(argv)
    if code != 0:
        print(err.getvalue(), file=sys.stderr)
        return code
    size = OUT.stat().st_size
    print(f"wrote {OUT.relative_to(ROOT)} ({size / 1024:.0f} KiB): jaxarena {' '.join(argv)}")
    if size > MAX_BYTES:
        print(f"{OUT.name} is over {MAX_BYTES // 1024} KiB: shrink the figure", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
