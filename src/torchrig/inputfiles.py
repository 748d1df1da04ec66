"""Reading the files a user hands torchrig (facts, inventories, specs, locks, reports) and the small files of a
run folder (``checkpoints/latest``, ``meta.json``, ``run.json``, ``summary.json``): bounded and decoded
safely. Every small file torchrig reads goes through :func:`read_bytes`; the streams (logs,
``metrics.jsonl``) are read in bounded steps by :func:`read_from`, kernel files (``st_size`` 0) by
:func:`read_head` or :func:`read_proc`. A test (tests/unit/test_raw_reads.py) refuses a raw read anywhere else.

Every reader here turns what can go wrong with a file into one ``InputError`` line that names the file and
what to do: missing, a folder or a device, unreadable, larger than the reader accepts (so ``/dev/zero`` or
a runaway log cannot exhaust memory), not UTF-8 text (binary), nested deeper than any torchrig file, not
JSON or TOML, or NaN/Infinity where JSON has no such numbers. ``field`` checks one key of a parsed mapping and
names the key when it is missing or of the wrong type.

>>> data = read_json("facts.json", "facts file")            # doctest: +SKIP
>>> gpus = field(data, "gpus", list, "facts file facts.json")  # doctest: +SKIP
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from torchrig.errors import InputError

# Far above any file torchrig writes or reads (a facts snapshot is ~50 KB, a bench report ~1 MB).
MAX_FILE_BYTES = 64 * 2**20
# Deeper than any torchrig file (facts: 5 levels) yet far from Python's recursion limit.
MAX_DEPTH = 64

T = TypeVar("T")


def open_regular(path: str | os.PathLike[str], what: str, *, follow: bool = True) -> BinaryIO:
    """``path`` opened for reading, once it is known to be a regular file: opened non-blocking (a FIFO
    neither blocks the open nor waits for a writer), then checked with ``fstat`` on the very descriptor read
    (no window between a check and the open). ``follow=False`` refuses a symbolic link (``O_NOFOLLOW``).
    A missing file, a folder, a device, a FIFO or a socket is an InputError naming ``what``."""
    p = Path(path).expanduser()
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise InputError(f"{what} {str(p)!r} does not exist", hint="check the path") from None
    except IsADirectoryError:
        raise InputError(
            f"{what} {str(p)!r} is a folder, not a file", hint="give the path of the file"
        ) from None
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise InputError(
                f"{what} {str(p)!r} is a symbolic link; torchrig reads only the file itself"
            ) from None
        raise InputError(f"cannot read {what} {str(p)!r}: {err.strerror or err}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{what} {str(p)!r} is a folder, not a file", hint="give the path of the file")
        raise InputError(f"{what} {str(p)!r} is not a regular file (a device, pipe or socket)")
    return os.fdopen(fd, "rb")


def read_bytes(
    path: str | os.PathLike[str], what: str, *, max_bytes: int = MAX_FILE_BYTES, follow: bool = True
) -> bytes:
    """The file's bytes, at most ``max_bytes`` of them ever read (:func:`open_regular`'s checks first);
    a file over ``max_bytes`` is an InputError (a sparse 8 GB file costs one ``fstat``, not 8 GB)."""
    p = Path(path).expanduser()
    with open_regular(p, what, follow=follow) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise InputError(
                f"{what} {str(p)!r} is {size:,} bytes, more than the {max_bytes:,} torchrig reads",
                hint="check that this is the right file",
            )
        try:
            data = fh.read(max_bytes + 1)
        except OSError as err:
            raise InputError(f"cannot read {what} {str(p)!r}: {err.strerror or err}") from None
    if len(data) > max_bytes:  # it grew while we read it
        raise InputError(f"{what} {str(p)!r} is larger than the {max_bytes:,} bytes torchrig reads")
    return data


def read_head(path: str | os.PathLike[str], what: str, *, max_bytes: int, follow: bool = True) -> bytes:
    """At most ``max_bytes`` from the start of a regular file, whatever its ``st_size`` says: for ``/proc``
    and ``/sys`` files (``st_size`` 0, yet they hold text) and the header of a log. What lies past
    ``max_bytes`` is left unread, not an error (:func:`open_regular`'s checks first)."""
    p = Path(path).expanduser()
    with open_regular(p, what, follow=follow) as fh:
        try:
            return fh.read(max_bytes)
        except OSError as err:
            raise InputError(f"cannot read {what} {str(p)!r}: {err.strerror or err}") from None


def read_from(
    path: str | os.PathLike[str], what: str, offset: int, *, max_bytes: int, follow: bool = True
) -> bytes:
    """At most ``max_bytes`` of a regular file from byte ``offset`` on: the new part of a growing stream (a
    log, ``metrics.jsonl``) read in bounded steps. A negative ``offset`` counts from the end, so
    ``read_from(p, w, -n, max_bytes=n)`` is the file's last ``n`` bytes (its tail), never the whole file."""
    p = Path(path).expanduser()
    with open_regular(p, what, follow=follow) as fh:
        try:
            if offset < 0:
                offset = max(0, os.fstat(fh.fileno()).st_size + offset)
            fh.seek(offset)
            return fh.read(max_bytes)
        except OSError as err:
            raise InputError(f"cannot read {what} {str(p)!r}: {err.strerror or err}") from None


def read_proc(path: str | os.PathLike[str], *, max_bytes: int = 2**20) -> str | None:
    """A ``/proc`` or ``/sys`` file's text (at most ``max_bytes``, undecodable bytes replaced), or None where
    it cannot be read (a process gone, a file this kernel lacks): the probes' view of the kernel."""
    try:
        return read_head(path, "kernel file", max_bytes=max_bytes).decode("utf-8", errors="replace")
    except InputError:
        return None


def device_nodes(patterns: tuple[str, ...], *, max_entries: int = 256) -> list[tuple[str, bool]]:
    """``ls -l /dev/nvidia*``: the entries matching ``patterns`` (folders left out), at most ``max_entries`` of
    them (a /dev holds a few dozen), each with whether this user may open it read-write by its mode bits. Nothing
    is opened or read: listing a device is safe whatever it is."""
    import glob

    found: list[tuple[str, bool]] = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            if len(found) >= max_entries:
                return found
            if not os.path.isdir(path):
                found.append((path, os.access(path, os.R_OK | os.W_OK)))
    return found


def char_device_number(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``ls -l``'s "major, minor" of the character device ``path``; None where it is none (or is absent)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.major(st.st_rdev), os.minor(st.st_rdev)) if stat.S_ISCHR(st.st_mode) else None


def device_open_error(path: str | os.PathLike[str]) -> str | None:
    """Why the character device ``path`` cannot be opened read-write (as CUDA opens ``/dev/nvidia-uvm``), or
    None where it opens: it is opened and closed at once, nothing read or written. The mode bits say only
    part of it: a container's device cgroup refuses the open itself ("Operation not permitted"). A path that
    is not a character device is refused unopened (a FIFO would block, a file is no device)."""
    try:
        st = os.stat(path)
    except OSError as err:
        return err.strerror or str(err)
    if not stat.S_ISCHR(st.st_mode):
        return "not a character device"
    try:
        fd = os.open(
            path, os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
        )
    except OSError as err:
        return err.strerror or str(err)
    os.close(fd)
    return None


def decode_text(data: bytes, what: str, where: str) -> str:
    """UTF-8 (a BOM is dropped); binary or another encoding is an InputError naming the first bad byte."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{what} {where!r} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})",
            hint="is it a binary file? save it as UTF-8",
        ) from None
    if "\x00" in text:
        raise InputError(f"{what} {where!r} holds NUL bytes: a binary file, not text")
    return text


def read_text(
    path: str | os.PathLike[str], what: str, *, max_bytes: int = MAX_FILE_BYTES, follow: bool = True
) -> str:
    data = read_bytes(path, what, max_bytes=max_bytes, follow=follow)
    return decode_text(data, what, str(Path(path).expanduser()))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def depth(value: Any) -> int:
    """How deeply lists and mappings nest in ``value`` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            return level
        stack.extend((c, level + 1) for c in children)
    return deepest


def loads_json(text: str, what: str, where: str) -> Any:
    """JSON text -> value; malformed, too deep or NaN/Infinity is an InputError naming ``where``."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        value = None
        too_deep = True
    except ValueError as err:  # JSONDecodeError, a NaN, or an integer over Python's digit limit
        raise InputError(f"{what} {where!r} is not JSON: {err}", hint="check or re-create it") from None
    else:
        too_deep = depth(value) > MAX_DEPTH
    if too_deep:
        raise InputError(f"{what} {where!r} nests deeper than {MAX_DEPTH} levels: not a torchrig file")
    return value


def read_text_or_stdin(path: str, what: str, *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """``read_text(path)``, or standard input when ``path`` is ``-``: at most ``max_bytes`` read either way,
    the same checks on the text (UTF-8, no NUL bytes)."""
    if path != "-":
        return read_text(path, what, max_bytes=max_bytes)
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise InputError(f"{what}: no standard input to read", hint="give the file's path instead of -")
    try:
        data = stream.read(max_bytes + 1)
    except (OSError, ValueError) as err:  # a closed or unreadable stdin
        raise InputError(f"cannot read {what} from standard input: {err}") from None
    if len(data) > max_bytes:
        raise InputError(
            f"{what} on standard input is more than the {max_bytes:,} bytes torchrig reads",
            hint="check that this is the right text",
        )
    return decode_text(data, what, "<stdin>")


def read_json(
    path: str | os.PathLike[str], what: str, *, max_bytes: int = MAX_FILE_BYTES, follow: bool = True
) -> Any:
    where = str(Path(path).expanduser())
    return loads_json(read_text(path, what, max_bytes=max_bytes, follow=follow), what, where)


def loads_toml(text: str, what: str, where: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        value = tomllib.loads(text)
    except RecursionError:
        raise InputError(f"{what} {where!r} nests deeper than TOML files do") from None
    except (tomllib.TOMLDecodeError, ValueError) as err:
        raise InputError(f"{what} {where!r} is not valid TOML: {err}") from None
    if depth(value) > MAX_DEPTH:
        raise InputError(f"{what} {where!r} nests deeper than {MAX_DEPTH} levels: not a torchrig file")
    return value


def read_toml(path: str | os.PathLike[str], what: str, *, max_bytes: int = MAX_FILE_BYTES) -> dict[str, Any]:
    where = str(Path(path).expanduser())
    return loads_toml(read_text(path, what, max_bytes=max_bytes), what, where)


_TYPE_NAMES = {dict: "a table/object", list: "a list", str: "a string", int: "an integer", float: "a number"}


def field(
    data: Any,
    key: str,
    kind: type[T] | tuple[type, ...],
    where: str,
    *,
    default: Any = ...,
    check: Callable[[Any], bool] | None = None,
    expected: str | None = None,
) -> T:
    """``data[key]``, checked: a missing key (without a default) or a value of another type is an InputError
    that names the key. ``None`` counts as missing (a JSON ``null`` section). Booleans are not integers."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected {_TYPE_NAMES[dict]} around {key!r}, found {type(data).__name__}")
    value = data.get(key)
    if value is None:
        if default is not ...:
            return default
        raise InputError(f"{where}: {key!r} is missing")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if ok and check is not None:
        ok = check(value)
    if not ok:
        want = expected or " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise InputError(f"{where}: {key!r} must be {want}, found {value!r:.60}")
    return value
