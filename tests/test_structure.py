"""The package's structure: no import cycle among the modules of `jaxarena` and
`pallas_kernels` (imports inside functions and `if TYPE_CHECKING:` blocks included), and no
module longer than about 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("jaxarena", "pallas_kernels")
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _resolve(name: str, current: str, is_pkg: bool, level: int) -> str:
    if level == 0:
        return name
    base = current.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph() -> dict[str, set[str]]:
    """`{module: modules of the two packages it imports}`, anywhere in its source.

    `from a.b import c` is an edge to `a.b.c` when that is a module, else to `a.b`. Parent
    packages imported implicitly (Python runs `a/__init__.py` before `a.b`) are not edges:
    they are not a circle the code wrote.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module or "", mod, is_pkg, node.level)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for t in targets:
                if t in modules and t != mod:
                    graph[mod].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as `[a, b, ..., a]`, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "jaxarena._arena.plan" in graph["jaxarena._arena.report"]
    assert "jaxarena.workspaces" in graph["pallas_kernels.ssd_chunked_scan.ops"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# Modules known to be over the limit, each with the reason; strict xfail, so a module that
# gets split makes its entry fail until it is removed here.
OVER_LIMIT: dict[str, str] = {}


@pytest.mark.parametrize(
    "module",
    [
        pytest.param(m, marks=pytest.mark.xfail(reason=OVER_LIMIT[m], strict=True))
        if m in OVER_LIMIT
        else m
        for m in sorted(_modules())
    ],
)
def test_no_module_over_600_lines(module):
    lines = len(_modules()[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (> {MAX_LINES}): split it by concept"


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(ROOT).as_posix() for d in ("examples", "benchmarks")
                   for p in (ROOT / d).glob("*.py"))  # fmt: skip
)
def test_examples_and_benchmarks_import_only_public_names(path):
    private = []
    for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] in PACKAGES and any(p.startswith("_") for p in parts[1:]):
                private.append(name)
    assert not private, f"{path} imports private names: {private}"
