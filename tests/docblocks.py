"""The shell blocks of README.md and docs/**/*.md, and the mark that says who runs each one.

A fenced ``console``, ``sh``, ``bash`` or ``shell`` block is a shell block. In a ``console`` block the
commands are the ``$ `` lines (a line ending in ``\\`` goes on to the next one); the other lines are what the
commands print. In the other fences every line that is not blank or a ``#`` comment is a command.

Every shell block with a command carries one mark, an HTML comment on the line right before its fence:

``<!-- doctest -->``
    run by tests/integration/test_docs_tutorials.py, in order, in one scratch folder per document; the
    lines a ``$ `` command shows after it are its key lines, asserted in its output (see
    :func:`shown_lines`). ``<!-- doctest: slurm-login -->`` runs the lines on the Slurm cluster's login node;
    ``<!-- doctest: gpu -->`` on the GPU machine, by tests/gpu/test_docs_gpu.py (skipped without CUDA).
``<!-- tested-by: tests/PATH.py::test_name -->``
    run by that test (several nodes: separated by spaces), which reads the block from this document.
``<!-- not-run: why -->``
    not run by the suite, and why (a registry, a kubeconfig, a file made on another machine, ...). A block
    that needs a GPU names what runs it on the GPU machine: a ``tests/gpu/...::test`` node or a
    ``tools/gpu/`` script.

``tests/unit/test_docs_blocks_covered.py`` holds every document to this.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL_FENCES = ("console", "sh", "bash", "shell")
_FENCE = re.compile(
    r"^(?:<!--\s*(?P<mark>[^\n]*?)\s*-->[ \t]*\n)?```(?P<lang>[a-z]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    doc: Path  # relative to the repository root (a page outside it: as given)
    line: int  # of the opening fence, 1-based
    lang: str
    mark: str  # the comment's text before the fence, "" when none
    body: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def kind(self) -> str:
        """``doctest``, ``tested-by``, ``not-run`` or ``""``."""
        return re.split(r"[:\s]", self.mark, maxsplit=1)[0] if self.mark else ""

    @property
    def detail(self) -> str:
        return self.mark.partition(":")[2].strip()

    def commands(self) -> list[str]:
        return [cmd for cmd, _ in self.steps()]

    def steps(self) -> list[tuple[str, list[str]]]:
        """``(command, the lines shown after it)`` in order."""
        lines = self.body.splitlines()
        if self.lang != "console":
            joined = _join_continued([ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")])
            return [(cmd, []) for cmd in joined]
        out: list[tuple[str, list[str]]] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.startswith("$ "):
                if out:
                    out[-1][1].append(line)
                continue
            cmd = line[2:]
            while cmd.endswith("\\") and i < len(lines):
                cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
                i += 1
            out.append((cmd.strip(), []))
        return out


def _join_continued(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line.strip()
        else:
            out.append(line.strip())
    return out


def documents() -> list[Path]:
    return sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of ``doc`` (all of them; :func:`shell_blocks` keeps the shell ones)."""
    text = doc.read_text()
    rel = doc.resolve().relative_to(ROOT) if doc.resolve().is_relative_to(ROOT) else doc
    out = []
    for m in _FENCE.finditer(text):
        fence_line = text.count("\n", 0, m.start("lang")) + 1
        out.append(Block(rel, fence_line, m.group("lang"), (m.group("mark") or "").strip(), m.group("body")))
    return out


def shell_blocks(doc: Path) -> list[Block]:
    return [b for b in blocks(doc) if b.lang in SHELL_FENCES]


def marked(doc: Path, mark: str) -> list[Block]:
    """``doc``'s shell blocks whose mark is exactly ``mark`` (``tested-by: tests/x.py::test_y``)."""
    return [b for b in shell_blocks(doc) if re.sub(r"\s+", " ", b.mark) == mark]


def tested_by(doc: Path, node: str) -> list[Block]:
    """The blocks of ``doc`` that name ``node`` (``tests/x.py::test_y``) as the test that runs them."""
    return [b for b in shell_blocks(doc) if b.kind == "tested-by" and node in b.detail.split()]


def shown_lines(shown: list[str]) -> list[str]:
    """The key lines a command's shown output promises, whitespace folded: blank lines, ``...`` and lines
    that are only an ellipsis are left out; a line ending in ``…`` (cut for the page) promises its start."""
    keep = []
    for line in shown:
        folded = " ".join(line.split())
        if folded and folded not in ("...", "…"):
            keep.append(folded)
    return keep


def output_has(output: str, line: str) -> bool:
    """Whether ``output`` (whitespace folded per line) has the shown ``line`` (a trailing ``…``: its start)."""
    folded = [" ".join(ln.split()) for ln in output.splitlines()]
    if line.endswith("…"):
        start = line[:-1].rstrip()
        return any(start in ln for ln in folded)
    return any(line in ln for ln in folded)


def run(command: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600):
    """``command`` as a user types it: through bash, in ``cwd``, with this interpreter's ``torchrig`` first
    on PATH (its PYTHONPATH, when set, is this checkout's ``src``)."""
    full = dict(os.environ if env is None else env)
    full["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{full.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout
    )


def missing(output: str, shown: list[str], vary: dict[str, str] | None = None) -> list[str]:
    """The key lines of ``shown`` that ``output`` lacks; ``vary`` maps a pattern of what differs between
    machines and runs (a path, a time) to what stands in for it on both sides."""

    def fold(text: str) -> str:
        for pattern, stand_in in (vary or {}).items():
            text = re.sub(pattern, stand_in, text)
        return text

    said = fold(output)
    return [line for line in shown_lines([fold(s) for s in shown]) if not output_has(said, line)]
