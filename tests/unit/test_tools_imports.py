"""The GPU machine's scripts (tools/, their Python files and the Python heredocs in their shell scripts) import
only names torchrig has: such a script runs only on a GPU, where a renamed function costs a device call."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEREDOC = re.compile(r"<<-?\s*'?(\w+)'?[^\n]*\n(.*?)\n\s*\1\s*$", re.S | re.M)


def _sources() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "tools").rglob("*")):
        rel = str(path.relative_to(ROOT))
        if path.suffix == ".py":
            found.append((rel, path.read_text()))
        elif path.suffix == ".sh":
            for i, m in enumerate(HEREDOC.finditer(path.read_text())):
                if "import " in m.group(2):
                    found.append((f"{rel} heredoc {i + 1}", m.group(2)))
    return found


def _imports(source: str) -> list[tuple[str, str | None]]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # not Python (another language's heredoc)
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchrig"):
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("torchrig")]
    return out


SOURCES = _sources()


@pytest.mark.parametrize(("where", "source"), SOURCES, ids=[where for where, _ in SOURCES])
def test_every_torchrig_name_a_tool_imports_exists(where, source):
    for module, name in _imports(source):
        mod = importlib.import_module(module)
        if name is not None and not hasattr(mod, name):
            importlib.import_module(f"{module}.{name}")  # a submodule: raises if missing
