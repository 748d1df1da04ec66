"""torchrig's modules import each other without circles.

The graph is built from the source (``ast``), counting every ``import torchrig...`` and ``from torchrig...
import ...``, at module level and inside functions alike: an import deferred into a function still ties the two
modules together, it only hides the circle until that function runs. ``from pkg import name`` counts as an
edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "torchrig"

# Known circles still to untangle, each a set of modules. Keep this list shrinking.
KNOWN_CYCLES: list[frozenset[str]] = []


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    files = {_module_name(p, src): p for p in src.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from . import x / from ..a import b
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in files:
                        deps.add(sub)
                    elif target in files:
                        deps.add(target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in files)
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert new == [], f"import circles: {new}"


def test_known_cycles_still_exist() -> None:
    """An entry for a circle that is gone must be removed, so the list cannot hide a new one."""
    found = cycles(import_graph())
    assert [sorted(c) for c in KNOWN_CYCLES if c not in found] == []


def test_the_graph_sees_function_level_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "torchrig"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from torchrig.sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from torchrig.sub import a\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("import torchrig.sub.a\n")
    graph = import_graph(pkg)
    assert graph["torchrig.sub.b"] == {"torchrig.sub.a", "torchrig.sub.c"}
    assert cycles(graph) == [frozenset({"torchrig.sub.a", "torchrig.sub.b", "torchrig.sub.c"})]


# Modules outside cli/ allowed to import it: the ``python -m torchrig`` entry point.
CLI_ENTRY_POINTS = {"torchrig.__main__"}
# Known to import cli/ still; remove the entry once it no longer does.
KNOWN_CLI_IMPORTERS: set[str] = set()


def _cli_importers() -> set[str]:
    return {
        m
        for m, deps in import_graph().items()
        if not (m == "torchrig.cli" or m.startswith("torchrig.cli."))
        and any(d == "torchrig.cli" or d.startswith("torchrig.cli.") for d in deps)
    }


def test_nothing_outside_cli_imports_cli() -> None:
    assert sorted(_cli_importers() - CLI_ENTRY_POINTS - KNOWN_CLI_IMPORTERS) == []


def test_known_cli_importers_still_import_it() -> None:
    assert sorted(KNOWN_CLI_IMPORTERS - _cli_importers()) == []
