"""The docs stay true to the tool: the CLI reference is generated from the parsers and current, no test hook
shows in --help, the README stays short, and every relative link in the docs points at a file."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_cli_reference", ROOT / "tools" / "gen_cli_reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_generated_and_current(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    gen = _generator()
    assert (ROOT / "docs" / "reference" / "cli.md").read_text() == gen.render(), (
        "docs/reference/cli.md is out of date: run python tools/gen_cli_reference.py"
    )


def test_no_test_hook_in_any_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    text = _generator().render()
    assert "--test-" not in text and "TEST HOOK" not in text


def test_the_readme_is_a_five_minute_read():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert "hyperfine" not in "\n".join(lines) and "load average" not in "\n".join(lines)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # links inside code blocks are not links
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{doc.relative_to(ROOT)} links to {target}, which does not exist"
