"""Issue 17, the command line: every subcommand, given malformed arguments, exits with status 2
and ONE line on stderr (no traceback); the demo's limits are checked up front; `fit` searches
without an upper bound; `--plot` without matplotlib is one line.

The subcommands and their options are read from the parser itself, so a subcommand added
later is covered without editing this file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from jaxarena import cli
from jaxarena.cli import build_parser, main

# The smallest valid arguments of the known subcommands; others start from none.
VALID = {
    "plan": ["tiny-hybrid", "--target", "gb10"],
    "budget": ["tiny-hybrid", "--memory", "80GB", "--target", "gb10"],
    "fit": ["tiny-hybrid", "--memory", "80GB", "--target", "gb10"],
    "demo": [],
}
HUGE = "9" * 400


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _malformed() -> list[tuple[str, list[str]]]:
    cases: list[tuple[str, list[str]]] = [
        ("", []),
        ("", ["no-such-command"]),
        ("", ["--no-such-flag"]),
    ]
    for name, p in _subcommands().items():
        base = [name, *VALID.get(name, [])]
        cases.append((name, [*base, "--no-such-option"]))
        if any(a.required for a in p._actions):
            cases.append((name, [name]))  # required arguments missing
        for a in p._actions:
            if not a.option_strings or a.nargs == 0:
                continue
            flag = a.option_strings[-1]
            if a.type is int:
                cases += [(name, [*base, flag, "x"]), (name, [*base, flag, HUGE])]
            elif a.choices:
                cases.append((name, [*base, flag, "no-such-choice"]))
            elif flag in ("--memory", "--reserve"):
                cases += [(name, [*base, flag, HUGE]), (name, [*base, flag, "8XB"])]
            elif flag == "--target":
                cases.append((name, [*base, flag, "5"]))
            cases.append((name, [*base, flag]))  # the value missing
        if p._positionals._group_actions and name in VALID:
            cases.append((name, [name, "no-such-model", *VALID[name][1:]]))
    return cases


CASES = _malformed()


@pytest.mark.parametrize(("sub", "argv"), CASES, ids=[" ".join(a)[:60] for _, a in CASES])
def test_malformed_arguments_exit_2_with_one_line(capsys, sub, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv, out[-500:], err[-2000:])
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxarena"), err[-2000:]
    assert "Traceback" not in err and out == ""
    if sub:  # argparse hints name the subcommand's help
        assert "error:" in lines[0]


def test_every_subcommand_is_covered():
    covered = {sub for sub, _ in CASES}
    assert covered >= set(_subcommands()), covered


def test_the_console_script_exit_status_is_2():
    # The real process: status 2 and one line, also for argparse's own errors.
    r = subprocess.run([sys.executable, "-m", "jaxarena.cli", "plan", "--tp", "x"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "--help" in r.stderr


# -- the demo's stated limits (defect 3) -------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--steps", "1000000000000"], "--steps 1000000000000 is outside the demo's range"),
        (["--steps", "0"], "--steps 0 is outside"),
        (["--batch", "1000000"], "--batch 1000000 is outside the demo's range 1..4,096"),
        (["--seed", str(2**40)], "--seed 1099511627776 is outside"),
        (["--seed", "-1"], "--seed -1 is outside"),
    ],
)
def test_demo_limits_are_checked_before_anything_runs(capsys, argv, needle):
    code = main(["demo", *argv])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_demo_memory_estimate_is_checked(capsys, monkeypatch):
    need = cli.demo_memory_estimate(100, 8)
    # The estimate grows with both limits: KV cache and states of every sequence at full length.
    assert cli.demo_memory_estimate(200, 8) > need and cli.demo_memory_estimate(100, 16) > need
    monkeypatch.setattr(cli, "_available_memory", lambda: 2 * need - 2)
    code = main(["demo", "--steps", "100", "--batch", "8"])
    _, err = capsys.readouterr()
    assert code == 2 and "needs about" in err and err.count("\n") == 1, err


# -- fit is unbounded above (defect 7) ---------------------------------------------------------


@pytest.mark.parametrize("extra", [["--arena-only"], []])
def test_fit_reports_more_than_2_to_the_25_tokens(capsys, extra):
    # 1000 TiB holds far more than 2^25 tokens of tiny-hybrid's arena (about 8 bytes a token);
    # the old search stopped at 2^25 - 1. A fixed --reserve: the estimated prefill temp of
    # the dense attention scores grows as T^2 (jaxarena/_sizing/step_temp.py).
    code = main(["fit", "tiny-hybrid", "--memory", "1000TiB", "--target", "gb10", "--json",
                 "--reserve", "1GiB", *extra])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    m = json.loads(out)["max_batch_tokens"]
    assert m > 1 << 32


# -- --plot (defects 4 and 8) ------------------------------------------------------------------


@pytest.mark.parametrize("sub", ["plan", "budget"])
def test_plot_without_matplotlib_is_one_line_before_any_work(capsys, monkeypatch, tmp_path, sub):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises
    code = main([sub, *VALID[sub], "--plot", str(tmp_path / "x.png")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, (out, err)
    assert "jaxarena[plot]" in err
    assert not list(tmp_path.iterdir())


def test_budget_plot_reports_the_file_it_wrote(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot is an optional extra: jaxarena[plot]")
    code = main(["budget", *VALID["budget"], "--plot", str(tmp_path / "bars")])
    _, err = capsys.readouterr()
    assert code == 0
    written = tmp_path / "bars.png"
    assert sorted(tmp_path.iterdir()) == [written]
    assert err.strip().splitlines()[-1].endswith(f"written to {written}")
