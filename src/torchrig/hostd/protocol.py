"""The host daemon's wire protocol: one JSON object per line over a Unix stream socket, strictly checked.

A client sends one request line, ``{"v": 1, "verb": "ps", "args": {...}}``, and reads answer lines until
the last one. Streamed output (``exec``, ``logs``) comes as ``{"out": BASE64}`` / ``{"err": BASE64}`` lines;
the last line is ``{"ok": true, "data": {...}}`` or ``{"ok": false, "error": {"type", "message",
"exit_code"}}``. A request line is at most :data:`MAX_REQUEST_BYTES`, must arrive within
:data:`REQUEST_TIMEOUT_S` and may carry only the fields its verb declares, each of its declared type;
anything else is refused with a one-line error (exit 2). Nothing in a request says who the caller is: the
daemon asks the kernel (``SO_PEERCRED``).
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator
from typing import Any

from torchrig.errors import UsageError

VERSION = 1
MAX_REQUEST_BYTES = 256 * 1024
MAX_ANSWER_LINE_BYTES = 4 * 1024 * 1024  # a ps of many environments; chunks of output are far smaller
REQUEST_TIMEOUT_S = 10.0
CHUNK_BYTES = 64 * 1024

_STR, _BOOL, _INT, _NUM = "str", "bool", "int", "num"
_OPT_STR, _OPT_INT = "str?", "int?"
_STRS, _PAIRS = "[str]", "[[str,str]]"

# verb -> {field: type}; every field is required (the client sends its defaults)
VERBS: dict[str, dict[str, str]] = {
    "whoami": {},
    "ps": {"mine": _BOOL},
    "gpus": {"free": _BOOL},
    "volumes": {},
    "down": {"names": _STRS, "force": _BOOL, "timeout_s": _INT, "volumes": _BOOL},
    "logs": {"name": _STR, "tail": _OPT_INT, "follow": _BOOL, "timestamps": _BOOL},
    "exec": {"name": _STR, "argv": _STRS, "root": _BOOL, "workdir": _OPT_STR},
    "up": {
        "image": _STR,
        "name": _OPT_STR,
        "user": _OPT_STR,
        "gpus": _OPT_STR,
        "share": _BOOL,
        "volumes": _STRS,
        "memory": _OPT_STR,
        "cpus": _OPT_STR,
        "shm_size": _OPT_STR,
        "ulimits": _STRS,
        "pids_limit": _OPT_INT,
        "jupyter": _BOOL,
        "ssh": _BOOL,
        "ssh_key": _OPT_STR,
        "public": _BOOL,
        "dry_run": _BOOL,
        "create_only": _BOOL,
        "wait_s": _NUM,
        "labels": _PAIRS,
    },
}
CHANGES = frozenset({"up", "down"})  # verbs that change leases: reality is checked first
MAX_LIST = 256
MAX_TEXT = 16 * 1024


def _is(kind: str, value: Any) -> bool:
    if kind == _STR:
        return isinstance(value, str) and len(value) <= MAX_TEXT
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63
    if kind == _NUM:
        return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 2**31
    if kind.endswith("?"):
        return value is None or _is(kind[:-1], value)
    if kind == _STRS:
        return isinstance(value, list) and len(value) <= MAX_LIST and all(_is(_STR, v) for v in value)
    if kind == _PAIRS:
        return (
            isinstance(value, list)
            and len(value) <= MAX_LIST
            and all(isinstance(p, list) and len(p) == 2 and all(_is(_STR, x) for x in p) for p in value)
        )
    raise AssertionError(kind)


def check_request(obj: Any) -> tuple[str, dict[str, Any]]:
    """(verb, args) of a decoded request; :class:`UsageError` naming the first thing that is wrong."""
    if not isinstance(obj, dict) or set(obj) != {"v", "verb", "args"}:
        raise UsageError("malformed request: expected exactly the fields v, verb, args")
    if obj["v"] != VERSION:
        raise UsageError(f"protocol version {obj['v']!r} is not {VERSION}", hint="use the daemon's torchrig")
    verb, args = obj["verb"], obj["args"]
    if not isinstance(verb, str) or verb not in VERBS:
        raise UsageError(f"unknown verb {str(verb)[:40]!r}", hint=f"one of {', '.join(VERBS)}")
    spec = VERBS[verb]
    if not isinstance(args, dict):
        raise UsageError(f"{verb}: args must be an object")
    unknown = sorted(set(args) - set(spec))
    if unknown:
        raise UsageError(f"{verb}: unknown field {unknown[0][:40]!r} (the caller is known from the socket)")
    for key, kind in spec.items():
        if key not in args:
            raise UsageError(f"{verb}: missing field {key!r}")
        if not _is(kind, args[key]):
            raise UsageError(f"{verb}: field {key!r} must be {kind}")
    return verb, args


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def read_line(sock: socket.socket, limit: int, buf: bytearray) -> bytes | None:
    """One line (without its newline) from ``sock``; None at a clean end; UsageError past ``limit`` bytes.
    ``buf`` keeps what came after the line."""
    while True:
        i = buf.find(b"\n")
        if i >= 0:
            line = bytes(buf[:i])
            del buf[: i + 1]
            return line
        if len(buf) > limit:
            raise UsageError(f"message longer than {limit} bytes: refused")
        chunk = sock.recv(CHUNK_BYTES)
        if not chunk:
            if buf:
                raise UsageError("message cut short (no newline)")
            return None
        buf.extend(chunk)


def decode(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise UsageError("malformed request: not one line of UTF-8 JSON") from None


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def chunk(stream: str, data: bytes) -> bytes:
    return encode({stream: base64.b64encode(data).decode()})


def frames(sock: socket.socket) -> Iterator[dict[str, Any]]:
    """The answer lines the daemon sends, decoded (client side)."""
    buf = bytearray()
    while True:
        line = read_line(sock, MAX_ANSWER_LINE_BYTES, buf)
        if line is None:
            return
        obj = json.loads(line.decode())
        if not isinstance(obj, dict):
            raise UsageError("the host daemon sent a malformed answer")
        yield obj
