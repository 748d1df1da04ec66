"""The docs stay true to the tool: the CLI reference is generated from the parsers and current, no test hook
shows in --help, the README stays short, every relative link in the docs points at a file, and every option
a doc or a help example gives a command is one that command takes."""

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


# `torchrig CMD ...` up to the end of the command: a pipe, `;`, `&`, a comment, the end of a code span or line
COMMAND_USE = re.compile(r"torchrig[ \t]+([a-z]+)([^|;&#`\n]*)")


def _options_of(cmd: str, cache: dict[str, set[str]]) -> set[str]:
    """Every option string of a command's parser, its subcommands' included."""
    if cmd not in cache:
        from torchrig.cli import build_parser

        found: set[str] = set()

        def walk(parser) -> None:
            for action in parser._actions:
                found.update(action.option_strings)
                if isinstance(getattr(action, "choices", None), dict):
                    for sub in action.choices.values():
                        walk(sub)

        walk(build_parser(cmd)[0])
        cache[cmd] = found
    return cache[cmd]


def _unknown_options(text: str, cache: dict[str, set[str]]) -> list[str]:
    """``cmd --option`` pairs in ``text`` that the command's parser does not take. The options of a launched
    script (after ``--``, ``-m MODULE`` or ``SCRIPT.py``) belong to the script, not to torchrig."""
    from torchrig.cli import COMMANDS

    bad = []
    for m in COMMAND_USE.finditer(text):
        cmd, rest = m.group(1), m.group(2)
        if cmd not in COMMANDS:
            continue
        for tok in rest.split():
            if tok == "--" or tok in ("-m", "--module") or tok.endswith(".py"):
                break
            name = tok.split("=")[0].rstrip(",.)'\"")
            if name.startswith("--") and len(name) > 2 and name not in _options_of(cmd, cache):
                bad.append(f"torchrig {cmd} {name}")
    return bad


def test_docs_and_help_examples_give_each_command_only_options_it_takes():
    from torchrig.cli import COMMANDS

    cache: dict[str, set[str]] = {}
    bad = []
    for doc in DOCS:
        if doc.parts[-2:] == ("reference", "cli.md") or "results" in doc.parts:
            continue  # generated from the parsers; archived runs quote the options of their day
        text = doc.read_text()
        lines = re.findall(r"`([^`\n]+)`", text)
        lines += [
            ln for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S) for ln in block.splitlines()
        ]
        bad += [f"{doc.relative_to(ROOT)}: {b}" for ln in lines for b in _unknown_options(ln, cache)]
    for name, (module, *_) in COMMANDS.items():
        doc = importlib.import_module(f"torchrig.cli.{module}").__doc__ or ""
        bad += [f"torchrig {name} --help: {b}" for b in _unknown_options(doc, cache)]
    assert not bad, bad


def test_an_option_no_command_takes_is_caught():
    cache: dict[str, set[str]] = {}
    assert _unknown_options("torchrig train --gpus 2 --lr-schedule cosine train.py", cache) == [
        "torchrig train --lr-schedule"
    ]
    assert _unknown_options("torchrig launch --gpus 2 train.py --lr-schedule cosine", cache) == []
    assert _unknown_options("torchrig launch --gpus 2 -m torchrig.train --size tiny", cache) == []
