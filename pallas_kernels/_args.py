"""Backend choice shared by every kernel wrapper."""

from __future__ import annotations

import jax

__all__ = ["resolve_interpret"]


def resolve_interpret(interpret: bool | None) -> bool:
    """`interpret=None` means interpret mode on a CPU backend and compiled on a GPU.

    Pallas has no compiled CPU backend, so a CPU run must interpret; on a GPU the kernel is
    compiled unless the caller asks for the interpreter explicitly (useful for debugging).
    """
    if interpret is None:
        return jax.default_backend() == "cpu"
    if not isinstance(interpret, bool):
        raise TypeError(f"interpret={interpret!r} must be None, True or False")
    return interpret
