"""The README's commands and Python example work as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_opens_with_plan_and_test_commands():
    bash = _blocks("bash")
    assert len(bash) >= 2
    assert "jaxarena plan" in bash[0] and "pip install" in bash[0]
    assert "pytest" in bash[1] and "pip install" in bash[1]


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    test_cmd = _blocks("bash")[1].strip().split("&& ", 2)[-1]  # pip install ... && pytest
    assert test_cmd in ci


def test_readme_python_example_runs():
    # The first Python block is the API example; later ones (the engine, the server's client)
    # need a checkpoint or a running server of the reader's.
    example = _blocks("python")[0]
    namespace: dict = {}
    exec(compile(example, str(README), "exec"), namespace)  # noqa: S102
    assert namespace["plan"].check_guards(namespace["arena"]) == []


def test_readme_says_what_the_tool_does_first_and_ci_further_down():
    # Issue 40: a newcomer reads what jaxarena does, then the commands; CI timings come later.
    text = README.read_text()
    before_commands = text[: text.index("```bash")]
    assert "budget" in before_commands and "one" in before_commands.lower()
    opening = text[: text.index("\n## ")]
    assert ".ci/run" not in opening and "CI" not in opening
    assert "dense model" in opening and "--packed" in opening  # why its plan has MoE buffers
    assert ".ci/run" in text[text.index("## Tests and CI") :]

