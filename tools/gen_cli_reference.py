#!/usr/bin/env python3
"""Write docs/reference/cli.md from the command-line parsers themselves: every command's and sub-command's
``--help``, exactly as ``torchrig COMMAND --help`` prints it (at 100 columns).

Usage: python tools/gen_cli_reference.py            # rewrite docs/reference/cli.md
       python tools/gen_cli_reference.py --check    # exit 1 if the file is out of date (the test does this)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "reference" / "cli.md"
WIDTH = "100"


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases share one parser
                    seen.add(id(sub))
                    out.append((name, sub))
    return out


def _section(title: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines = [f"{'#' * level} `{title}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subparsers(parser):
        lines += _section(f"{title} {name}", sub, level + 1)
    return lines


def render() -> str:
    os.environ["COLUMNS"] = WIDTH  # argparse wraps help text at the terminal's width
    from torchrig.cli import COMMANDS, build_parser, top_help

    lines = [
        "# Command-line reference",
        "",
        "Generated from the parsers by `python tools/gen_cli_reference.py`; a test fails when it is out of date.",
        "Every command also takes `--json` and `--debug`. Exit status: 0 ok, 1 problems found, 2 bad usage or input.",
        "",
        "```text",
        top_help().rstrip(),
        "```",
        "",
    ]
    for name in COMMANDS:
        parser, _module = build_parser(name)
        lines += _section(f"torchrig {name}", parser, 2)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    check = "--check" in sys.argv[1:]
    text = render()
    if check:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current != text:
            print(
                f"{TARGET.relative_to(ROOT)} is out of date: run python tools/gen_cli_reference.py",
                file=sys.stderr,
            )
            return 1
        return 0
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
