"""No raw read outside the bounded reader: every file torchrig reads goes through src/torchrig/inputfiles.py.

A raw read (``Path.read_text``/``read_bytes``, ``open`` or ``Path.open`` for reading, ``json.load``,
``pickle.load``, ``tomllib.load``) trusts the file: a FIFO hangs it, ``/dev/zero`` or a sparse file exhausts
memory. This test scans the source with ``ast`` and fails on any raw read whose lines do not carry a
``# raw-read: <reason>`` comment (a package data file shipped inside torchrig, a file the process itself has
just written), so a new unbounded read cannot slip in.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "torchrig"
READER = SRC / "inputfiles.py"
REASON = re.compile(r"#\s*raw-read:\s*\S")
LOADERS = {"json", "pickle", "tomllib", "tomli", "marshal"}  # module.load(fh) reads a whole stream
BOUNDED_MODULES = {"inputfiles"}  # inputfiles.read_text(...) is the bounded reader itself
# (file, function) whose raw reads are known and handled elsewhere, each with the reason
PENDING: dict[tuple[str, str], str] = {}  # (module, function): why its raw read is not converted yet


def _mode(call: ast.Call, position: int) -> str | None:
    """The call's mode argument if it is a literal; '' if absent; None if it is not a literal."""
    node = call.args[position] if len(call.args) > position else None
    for kw in call.keywords:
        if kw.arg == "mode":
            node = kw.value
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _reads(mode: str | None) -> bool:
    if mode is None:
        return True  # a computed mode may read
    return mode == "" or "r" in mode or "+" in mode


def raw_read(call: ast.Call) -> str | None:
    """What raw read ``call`` is, or None."""
    fn = call.func
    if isinstance(fn, ast.Name) and fn.id == "open":  # builtin open(path, mode)
        return "open() for reading" if _reads(_mode(call, 1)) else None
    if not isinstance(fn, ast.Attribute):
        return None
    owner = fn.value.id if isinstance(fn.value, ast.Name) else None
    if fn.attr in ("read_text", "read_bytes") and owner not in BOUNDED_MODULES:
        return f".{fn.attr}()"
    if fn.attr == "load" and owner in LOADERS:
        return f"{owner}.load()"
    if fn.attr == "open" and owner in ("io", "codecs", "gzip", "bz2", "lzma"):
        return f"{owner}.open()" if _reads(_mode(call, 1)) else None
    if fn.attr == "open" and owner not in ("os", "tarfile", "zipfile", "Image", "socket"):
        # Path.open(mode): a literal mode as the first argument ("rb", "r") or no argument at all on a path
        mode = _mode(call, 0)
        if call.args and mode is None:
            return None  # X.open(something) with a non-literal first argument: not Path.open
        if not call.args and not call.keywords and owner is not None and owner[:1].isupper():
            return None  # Class.open(): a constructor (Ledger.open(), GpuWatch.open(...))
        return ".open() for reading" if _reads(mode) else None
    return None


def findings(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")  # raw-read: the test reads the project's own source
    lines = text.splitlines()
    where = path.relative_to(SRC.parent) if path.is_relative_to(SRC.parent) else path
    tree = ast.parse(text, filename=str(path))
    pending = [
        (fn.lineno, fn.end_lineno or fn.lineno)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef) and (str(where), fn.name) in PENDING
    ]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if any(lo <= node.lineno <= hi for lo, hi in pending):
            continue
        what = raw_read(node)
        if what is None:
            continue
        span = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
        if any(REASON.search(line) for line in span):
            continue
        found.append(f"{where}:{node.lineno}: {what}: {lines[node.lineno - 1].strip()}")
    return found


def test_no_raw_read_outside_the_bounded_reader():
    found = [f for p in sorted(SRC.rglob("*.py")) if p != READER for f in findings(p)]
    assert not found, (
        "raw reads outside src/torchrig/inputfiles.py (use inputfiles.read_bytes/read_text/read_json/"
        "read_toml/read_head/read_from/read_proc, or add '# raw-read: <reason>' where the file is torchrig's "
        "own package data):\n" + "\n".join(found)
    )


def _calls(src: str) -> list[str | None]:
    return [raw_read(n) for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)]


def test_the_scanner_sees_each_kind_of_raw_read():
    hits = [
        "Path(p).read_text()",
        "p.read_bytes()",
        "open(p)",
        "open(p, 'rb')",
        "open(p, mode='r+')",
        "open(p, m)",
        "p.open('rb')",
        "p.open()",
        "json.load(fh)",
        "pickle.load(fh)",
        "tomllib.load(fh)",
        "io.open(p)",
        "resources.files('x').joinpath('y').read_text()",
    ]
    for src in hits:
        assert any(_calls(src)), src
    misses = [
        "open(p, 'w')",
        "open(p, 'ab')",
        "p.open('w')",
        "inputfiles.read_text(p, 'x')",
        "read_text(p, 'x')",
        "json.loads(s)",
        "os.open(p, os.O_RDONLY)",
        "tarfile.open(fileobj=b)",
        "Ledger.open()",
        "Image.open(p)",
    ]
    for src in misses:
        assert not any(_calls(src)), src


def test_a_reason_comment_admits_a_read(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("a = p.read_text()\nb = p.read_text()  # raw-read: package data\n")
    found = findings(f)
    assert len(found) == 1 and ":1:" in found[0]
