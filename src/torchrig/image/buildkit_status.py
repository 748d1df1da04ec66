"""Decode BuildKit's build progress: the ``moby.buildkit.v1.StatusResponse`` protobuf messages the engine sends.

A BuildKit build through the Engine API (``POST /build?version=2``) streams JSON lines; progress arrives as
``{"id": "moby.buildkit.trace", "aux": "<base64>"}`` where the payload is one ``StatusResponse``. Only four
messages are needed, so this is a small pure decoder of the protobuf wire format rather than a generated
module. Field numbers, from moby/buildkit ``api/services/control/control.proto``
(https://github.com/moby/buildkit/blob/master/api/services/control/control.proto)::

    message StatusResponse { repeated Vertex vertexes = 1; repeated VertexStatus statuses = 2;
                             repeated VertexLog logs = 3; repeated VertexWarning warnings = 4; }
    message Vertex { string digest = 1; repeated string inputs = 2; string name = 3; bool cached = 4;
                     Timestamp started = 5; Timestamp completed = 6; string error = 7; ... }
    message VertexStatus { string ID = 1; string vertex = 2; string name = 3; int64 current = 4;
                           int64 total = 5; Timestamp timestamp = 6; Timestamp started = 7;
                           Timestamp completed = 8; }
    message VertexLog { string vertex = 1; Timestamp timestamp = 2; int64 stream = 3; bytes msg = 4; }

and ``google.protobuf.Timestamp { int64 seconds = 1; int32 nanos = 2; }``. Wire format:
https://protobuf.dev/programming-guides/encoding/ (varint = 0, i64 = 1, LEN = 2, i32 = 5). Unknown fields
(warnings, progress groups, fields added later) are skipped, as protobuf readers do.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class ProtobufError(ValueError):
    """The bytes are not a well-formed protobuf message."""


@dataclass(frozen=True)
class Vertex:
    """One node of the build graph: a Dockerfile instruction ("[build 3/7] RUN ...") or an internal step."""

    digest: str
    inputs: tuple[str, ...]
    name: str
    cached: bool
    started_s: float | None  # Unix time in seconds; None where not started (in this update)
    completed_s: float | None
    error: str


@dataclass(frozen=True)
class VertexStatus:
    """Progress of a sub-task of a vertex (a layer pulled, a file transferred), in bytes or items."""

    id: str
    vertex: str
    name: str
    current: int
    total: int
    completed_s: float | None


@dataclass(frozen=True)
class VertexLog:
    """A chunk of a vertex's output; ``stream`` 1 is stdout, 2 stderr."""

    vertex: str
    stream: int
    data: bytes
    timestamp_s: float | None


@dataclass(frozen=True)
class StatusResponse:
    vertexes: tuple[Vertex, ...] = ()
    statuses: tuple[VertexStatus, ...] = ()
    logs: tuple[VertexLog, ...] = ()


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise ProtobufError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint longer than 10 bytes")


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) for each field of one message: ints for varint/fixed, bytes for LEN."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtobufError("field number 0")
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ProtobufError(f"field {number}: length {size} runs past the message")
            value, pos = buf[pos : pos + size], pos + size
        elif wire in (_I64, _I32):
            width = 8 if wire == _I64 else 4
            if pos + width > len(buf):
                raise ProtobufError(f"field {number}: truncated fixed-width value")
            value, pos = int.from_bytes(buf[pos : pos + width], "little"), pos + width
        else:
            raise ProtobufError(f"field {number}: unsupported wire type {wire}")
        yield number, value


def _signed(value: int) -> int:
    """int64/int32 as two's complement in a 64-bit varint."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise ProtobufError("expected a length-delimited field")
    return value


def _int(value: int | bytes) -> int:
    if isinstance(value, bytes):
        raise ProtobufError("expected a varint field")
    return _signed(value)


def _text(value: int | bytes) -> str:
    return _bytes(value).decode("utf-8", "replace")


def timestamp(buf: bytes) -> float:
    """google.protobuf.Timestamp -> Unix seconds."""
    seconds = nanos = 0
    for number, value in fields(buf):
        if number == 1:
            seconds = _int(value)
        elif number == 2:
            nanos = _int(value)
    return seconds + nanos / 1e9


def _vertex(buf: bytes) -> Vertex:
    digest, name, error, cached = "", "", "", False
    inputs: list[str] = []
    started = completed = None
    for number, value in fields(buf):
        if number == 1:
            digest = _text(value)
        elif number == 2:
            inputs.append(_text(value))
        elif number == 3:
            name = _text(value)
        elif number == 4:
            cached = bool(_int(value))
        elif number == 5:
            started = timestamp(_bytes(value))
        elif number == 6:
            completed = timestamp(_bytes(value))
        elif number == 7:
            error = _text(value)
    return Vertex(digest, tuple(inputs), name, cached, started, completed, error)


def _status(buf: bytes) -> VertexStatus:
    id_, vertex, name, current, total = "", "", "", 0, 0
    completed = None
    for number, value in fields(buf):
        if number == 1:
            id_ = _text(value)
        elif number == 2:
            vertex = _text(value)
        elif number == 3:
            name = _text(value)
        elif number == 4:
            current = _int(value)
        elif number == 5:
            total = _int(value)
        elif number == 8:
            completed = timestamp(_bytes(value))
    return VertexStatus(id_, vertex, name, current, total, completed)


def _log(buf: bytes) -> VertexLog:
    vertex, stream, data = "", 0, b""
    stamp = None
    for number, value in fields(buf):
        if number == 1:
            vertex = _text(value)
        elif number == 2:
            stamp = timestamp(_bytes(value))
        elif number == 3:
            stream = _int(value)
        elif number == 4:
            data = _bytes(value)
    return VertexLog(vertex, stream, data, stamp)


def decode_status(buf: bytes) -> StatusResponse:
    """One ``StatusResponse`` from its wire bytes (ProtobufError if malformed)."""
    vertexes: list[Vertex] = []
    statuses: list[VertexStatus] = []
    logs: list[VertexLog] = []
    for number, value in fields(buf):
        if number == 1:
            vertexes.append(_vertex(_bytes(value)))
        elif number == 2:
            statuses.append(_status(_bytes(value)))
        elif number == 3:
            logs.append(_log(_bytes(value)))
    return StatusResponse(tuple(vertexes), tuple(statuses), tuple(logs))


def decode_trace(aux: str) -> StatusResponse:
    """The ``aux`` of a ``moby.buildkit.trace`` line (base64 of a StatusResponse)."""
    try:
        raw = base64.b64decode(aux, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ProtobufError(f"trace is not base64: {err}") from None
    return decode_status(raw)
