"""compat/ stays split by concern: no module over 600 lines, no function over 60 (issue 36's limits)."""

from __future__ import annotations

import ast
from pathlib import Path

COMPAT = Path(__file__).resolve().parents[2] / "src" / "torchrig" / "compat"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def test_no_module_over_600_lines_and_no_function_over_60():
    too_long = []
    for path in sorted(COMPAT.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{path.name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines")
    assert not too_long, too_long
