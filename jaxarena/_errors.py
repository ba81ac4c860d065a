"""The errors every stage raises, and the one formatter for "every problem at once" messages.

A leaf: imports nothing from jaxarena.
"""

from __future__ import annotations

__all__ = ["ConfigError", "ConfigWarning", "ArenaError", "GuardError", "join_problems"]


class ConfigError(ValueError):
    """A model config (or a serve limit) is invalid.

    Raised for a missing or mistyped JSON key, an unreadable file, a negative dimension, an
    inconsistent head count and every other rule `ModelConfig` enforces. The message names the
    field (and the file, when the config came from one).
    """


class ConfigWarning(UserWarning):
    """A config was read, but with a guess the user should know about: an unknown family read
    with the generic rule, a sequence past the model's context that RoPE scaling may extend.
    The command line prints each as one `jaxarena: warning:` line."""


class ArenaError(ValueError):
    """A plan is invalid, or a view/write does not fit the plan (raised at trace time)."""


class GuardError(AssertionError):
    """A guard band was overwritten: some kernel wrote past the end of its region."""


def join_problems(head: str, problems: list[str]) -> str:
    """`head:` followed by one `  - problem` line per problem."""
    return head + ":\n  - " + "\n  - ".join(problems)
