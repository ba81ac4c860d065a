"""Checks and output habits every `jaxarena` subcommand shares: the KV block size the kernels
accept, memory sizes with a unit, negative option values, one-line warnings, a closed stdout
pipe, the CUDA plugin's start-up noise on a machine without a GPU, the version, and why
`--target auto` fell back to gb10. (The model's context is `ModelConfig.check_context`.)

Imports no jax at module level: `plan`, `budget` and `fit` use it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence

from jaxarena._errors import ConfigWarning
from jaxarena._units import is_pow2, parse_memory

__all__ = [
    "BLOCK_RULE",
    "check_kv_block_size",
    "memory_option",
    "join_negative_values",
    "cli_output",
    "stdout_closed",
    "version",
    "auto_fallback_note",
]

# The paged KV cache's block (page) size: `pallas_kernels/splitk_decode_attention/checks.py`
# refuses a `block_size` that is not a power of two (its Triton tiles are powers of two); the
# prefill kernel takes any page size >= 1. So the rule the kernels need is a power of two.
BLOCK_RULE = "a power of two (the split-K decode kernel tiles a page in powers of two)"
# Commands that run or compile the kernels: no unpaged (0) cache there.
KERNEL_COMMANDS = frozenset({"generate", "step-report"})

# A bare number below this is not a device's memory in bytes: the user meant a unit.
_SMALLEST_BARE_BYTES = 1 << 20
_VALUE_FLAGS = ("--memory", "--reserve")


def check_kv_block_size(args: argparse.Namespace, error: type[Exception]) -> None:
    """`--kv-block-size` by the kernels' rule: a power of two; 0 (the seed's unpaged cache)
    only for the commands that size without running a kernel (plan, budget, fit)."""
    block = getattr(args, "kv_block_size", None)
    if block is None:
        return
    unpaged_ok = args.command not in KERNEL_COMMANDS
    if block == 0 and unpaged_ok:
        return
    if not is_pow2(block):
        zero = ", or 0 for an unpaged cache" if unpaged_ok else ""
        close = 1 << (block - 1).bit_length() if block > 1 else 16
        raise error(
            f"--kv-block-size {block} must be {BLOCK_RULE}{zero}; e.g. --kv-block-size {close}"
        )


def memory_option(text: str, flag: str, error: type[Exception], *, zero: bool = False) -> int:
    """The bytes of `--memory` / `--reserve`: a size with a unit (`80GB`, `24GiB`, `80e9`).
    A bare number below 1 MiB is refused with the unit it likely meant (`--memory 80` is not
    80 bytes of device memory); `zero` accepts 0 (`--reserve 0`)."""
    stripped = text.strip()
    if zero and stripped in ("0", "0B", "0b"):
        return 0
    try:
        value = parse_memory(text)
    except ValueError as e:  # "memory '8XB' is not a size; ..." -> "--memory '8XB' is ..."
        raise error(str(e).replace("memory", flag, 1)) from None
    if re.fullmatch(r"[0-9]+", stripped) and value < _SMALLEST_BARE_BYTES:
        raise error(
            f"{flag} {stripped} has no unit, so it reads as {value} bytes; did you mean "
            f"{flag} {stripped}GB (or {stripped}GiB)?"
        )
    return value


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """`--memory -80GB` as `--memory=-80GB`: argparse takes a value that starts with `-` for
    an option and says only "expected one argument"; joined, the size check says what is
    wrong with it."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if item in _VALUE_FLAGS and i + 1 < len(items) and re.fullmatch(r"-[0-9.].*", items[i + 1]):
            out.append(f"{item}={items[i + 1]}")
            i += 2
            continue
        out.append(item)
        i += 1
    return out


class _QuietPluginErrors(logging.Filter):
    """Drops the CUDA plugin's start-up traceback ("Jax plugin configuration error: ...
    Unable to load cuPTI / cuDNN") on a machine without a GPU: jax falls back to the CPU, and
    the GPU commands (step-report) say themselves what they miss."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Jax plugin configuration error"):
            if os.environ.get("JAXARENA_TRACEBACK", "0") not in ("", "0"):
                return True
            return not _no_gpu()
        return True


def _no_gpu() -> bool:
    """True when this machine shows no NVIDIA GPU (no /dev/nvidia0 and no /proc driver)."""
    return not (os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia"))


@contextlib.contextmanager
def cli_output() -> Iterator[None]:
    """While a command runs: jaxarena's `ConfigWarning`s print as one `jaxarena: warning:`
    line each (others as Python prints them), and the CUDA plugin's start-up traceback is
    dropped when there is no GPU."""
    quiet = _QuietPluginErrors()
    logger = logging.getLogger("jax._src.xla_bridge")
    logger.addFilter(quiet)
    with warnings.catch_warnings():
        original = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
            if issubclass(category, ConfigWarning):
                print("jaxarena: warning: " + " ".join(str(message).split()), file=sys.stderr)
            else:
                original(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        warnings.simplefilter("always", ConfigWarning)
        try:
            yield
        finally:
            logger.removeFilter(quiet)


def stdout_closed() -> None:
    """After a `BrokenPipeError` (`jaxarena plan | head -3`): point stdout at /dev/null so
    Python's exit flush does not raise again ("Exception ignored ... BrokenPipeError")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured or replaced stdout
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def version() -> str:
    """jaxarena's version (`jaxarena --version`): the installed distribution's."""
    from importlib import metadata

    try:
        return metadata.version("jaxarena")
    except metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        return "0.1.0 (not installed)"


def auto_fallback_note() -> str:
    """Why `--target auto` gave the baseline gb10: no GPU, or one no preset names."""
    import jax  # `auto` is the one target spelling that imports jax

    device = jax.devices()[0]
    if device.platform in ("gpu", "cuda", "rocm"):
        what = f"an unrecognised GPU ({getattr(device, 'device_kind', '?')})"
    else:
        what = f"no GPU (jax's default device is {device.platform})"
    return (f"--target auto found {what}; sizing for gb10, the seed's baseline build (name a "
            f"target: --target h200, b200, ...)")  # fmt: skip
