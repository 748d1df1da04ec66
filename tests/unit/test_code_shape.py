"""The shape of the code: no function over 60 lines and no module over 600 in launch/ and train/ (a longer one
is asking to be split by the questions it answers; docs/design.md)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "torchrig"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 600


def too_long(package: str, root: Path = SRC) -> list[str]:
    """Every function (methods and nested ones too) over ``MAX_FUNCTION_LINES`` lines, from its ``def`` to its
    last line, and every module over ``MAX_MODULE_LINES`` lines, under ``root/<package>``."""
    found = []
    files = sorted((root / package).rglob("*.py"))
    assert files, f"no module under {root / package}"
    for path in files:
        text = path.read_text()
        name = path.relative_to(root)
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}: {node.name} {length} lines (line {node.lineno})")
    return found


def test_the_counter_sees_a_long_function_and_a_long_module(tmp_path):
    (tmp_path / "demo").mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))  # a method, 61 lines
    (tmp_path / "demo" / "long.py").write_text(
        f"class C:\n    def f(self):\n{body}\n\n\ndef g():\n    return 1\n"
    )
    (tmp_path / "demo" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert too_long("demo", tmp_path) == [
        f"demo/big.py: {MAX_MODULE_LINES + 1} lines",
        f"demo/long.py: f {MAX_FUNCTION_LINES + 1} lines (line 2)",
    ]
    (tmp_path / "demo" / "big.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert too_long("demo", tmp_path) == [f"demo/long.py: f {MAX_FUNCTION_LINES + 1} lines (line 2)"]


def test_launch_has_no_long_function_or_module():
    assert too_long("launch") == []


def test_train_has_no_long_function_or_module():
    assert too_long("train") == []
