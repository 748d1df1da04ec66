"""The shape of the code: no function over 60 lines, none at radon's cyclomatic grade D or worse, and no module
over 600 lines in launch/ and train/ (a longer or more tangled one is asking to be split by the questions it
answers; docs/design.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


MAX_GRADE = "C"  # radon's cyclomatic-complexity grades: A (1-5) ... C (11-20), D (21-30) and worse


def too_complex(package: str, root: Path = SRC) -> list[str]:
    """Every function and method under ``root/<package>`` whose radon grade is worse than ``MAX_GRADE`` (the
    grade ``radon cc -s -n D`` lists)."""
    from radon.complexity import cc_rank, cc_visit

    found = []
    for path in sorted((root / package).rglob("*.py")):
        for block in cc_visit(path.read_text()):
            if cc_rank(block.complexity) > MAX_GRADE:
                found.append(
                    f"{path.relative_to(root)}: {block.fullname} {cc_rank(block.complexity)} ({block.complexity})"
                )
    return found


def test_the_grader_sees_a_tangled_function(tmp_path):
    pytest.importorskip("radon", reason="radon is in the dev extra")
    (tmp_path / "demo").mkdir()
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(21))
    (tmp_path / "demo" / "tangled.py").write_text(f"def f(x):\n{branches}\n    return -1\n")
    assert too_complex("demo", tmp_path) == ["demo/tangled.py: f D (22)"]


@pytest.mark.parametrize("package", ["launch", "train"])
def test_no_function_is_graded_d_or_worse(package):
    """The failure summary and the trainer stay split by the question each part answers (docs/design.md)."""
    pytest.importorskip("radon", reason="radon is in the dev extra")
    assert too_complex(package) == []
