"""The shim every rank starts in: ``python -m torchrig.launch.worker [--module] SCRIPT [ARGS...]``.

torchrun starts it once per rank. It (1) prints one header line naming the rank, so a log file can be
traced to its rank and host; (2) makes the rank dump every thread's Python stack into its log on SIGUSR1
(the launcher's hang watchdog sends it) and on SIGTERM (what torchrun sends the surviving ranks when one
fails), so the failure summary can say where each rank was; (3) writes the rank's PyTorch flight record
(its last collectives) next to the logs when the launcher asks for it by creating the file
``$TORCHRIG_FR_REQUEST.<attempt>``, and again each time the launcher touches that file (a daemon thread
looks for it twice a second; a rank blocked inside a collective still answers, since PyTorch releases the GIL
while it waits); (4) keeps one merged, timestamped copy of the rank's stdout and stderr in the order they
were written (``output.log`` next to torchrun's ``stdout.log``/``stderr.log``), written by a small process
forked before the script starts, so the last lines survive a SIGKILL of the rank; (5) runs the script as
``python SCRIPT`` would (``__file__`` absolute, as under plain ``python``), and writes an uncaught
exception to the rank's error file as torchelastic's ``record`` does (and so, too, the exception a script
caught itself before it exited with a failing status, as Hydra's ``@hydra.main`` does, and a failing
``sys.exit``'s message or status with the line that called it). Nothing here imports torch before the
script's first line: the script starts as soon as under plain torchrun.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import select
import signal
import socket
import sys
import threading
import time

from torchrig.launch.flightrec import PREFIX, loads
from torchrig.launch.logs import EXIT_CODE_KEY, OUTPUT_LOG
from torchrig.launch.ranklog import SYS_EXIT_PREFIX

HEADER = "torchrig-worker:"


def header() -> str:
    e = os.environ
    return (
        f"{HEADER} rank={e.get('RANK', '?')} local_rank={e.get('LOCAL_RANK', '?')} "
        f"world_size={e.get('WORLD_SIZE', '?')} restart={e.get('TORCHELASTIC_RESTART_COUNT', '0')} "
        f"pid={os.getpid()} host={socket.gethostname()}"
    )


OUTPUT_TAGS = {1: "out", 2: "err"}


def output_line(stamp_s: float, fd: int, text: str) -> str:
    """One line of ``output.log``: ``16:01:02.345 err| text`` (UTC)."""
    t = time.gmtime(stamp_s)
    return f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{int(stamp_s * 1000) % 1000:03d} {OUTPUT_TAGS[fd]}| {text}"


def _pump_output(sources: dict[int, int], path: str) -> None:
    """Copy each pipe to its original stream (``{pipe fd: original fd}``) and every line, stamped, to ``path``,
    until every writer has closed its end."""
    rest = {fd: b"" for fd in sources}
    with open(path, "a", encoding="utf-8", errors="replace") as merged:
        while rest:
            ready, _, _ = select.select(list(rest), [], [])
            now = time.time()
            for fd in ready:
                data = os.read(fd, 65536)
                if data:
                    os.write(sources[fd], data)
                lines = (rest[fd] + data).split(b"\n")
                rest[fd] = lines.pop() if data else b""
                if not data and lines[-1:] == [b""]:
                    lines.pop()
                for ln in lines:
                    merged.write(output_line(now, sources[fd], ln.decode(errors="replace")) + "\n")
                if not data:
                    os.close(fd)
                    del rest[fd]
            merged.flush()


def start_output_log() -> str | None:
    """Route fds 1 and 2 through pipes to a forked pump that writes them on and keeps ``output.log``; the path,
    or None when stdout/stderr are not torchrun's per-rank files (then nothing changes)."""
    try:
        target = os.readlink("/proc/self/fd/2")
    except OSError:
        return None
    if os.path.basename(target) != "stderr.log":
        return None
    path = os.path.join(os.path.dirname(target), OUTPUT_LOG)
    pipes = {1: os.pipe(), 2: os.pipe()}
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:  # the pump: outlives the rank until every writer (the rank, its children) is gone
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
                signal.signal(sig, signal.SIG_IGN)
            os.setpgid(0, 0)  # out of the rank's process group: a group-wide stop leaves the pump to drain
            for _, w in pipes.values():
                os.close(w)
            _pump_output({r: fd for fd, (r, _) in pipes.items()}, path)
        finally:
            os._exit(0)
    for fd, (r, w) in pipes.items():
        os.dup2(w, fd)
        os.close(r)
        os.close(w)
    return path


SYMBOLIZING = ".symbolizing"  # + on a record's path: the rank is still writing the record with its stacks


_OURS: set[int] = set()  # st_mtime_ns of the records this process wrote itself


def _dump_flight_record(path: str, started: float) -> None:
    """Write this rank's flight record to ``path``, unless NCCL's watchdog already wrote one there for this
    process (its dump at the timeout comes first; a record this process wrote before is replaced).
    The record without Python stacks comes first: on an H200
    with torch 2.11 it took 0.0 s where the first one with stacks took 4.4-5.8 s (their symbolisation);
    the one with stacks then replaces it, while a ``.symbolizing`` marker tells the launcher to wait."""
    try:
        st = os.stat(path)
        if st.st_mtime >= started and st.st_mtime_ns not in _OURS:
            return
    except OSError:
        pass
    quick = _flight_record(stacks=False)
    if quick is None:  # no flight recorder, or it was off (gloo without a buffer size)
        return
    _write(path, quick)
    marker = path + SYMBOLIZING
    open(marker, "w").close()
    try:
        full = _flight_record(stacks=True)
        if full is not None:
            _write(path, full)
    finally:
        os.unlink(marker)


def _write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    _OURS.add(os.stat(tmp).st_mtime_ns)
    os.replace(tmp, path)  # torchfrtrace and the launcher never see half a file


def _flight_record(stacks: bool) -> bytes | None:
    """This process's flight record, or None when there is nothing to write (no recorder, or it was off: then
    a dump holds no entries and no process group). torch 2.11 (measured on an H200) keeps NCCL's collectives
    in a recorder of their own, dumped by ``_dump_nccl_trace``, apart from the generic one (gloo's) that
    ``_dump_fr_trace`` dumps: the first of the two that holds collectives is the record, else the first that
    knows a process group."""
    from torch._C import _distributed_c10d as c10d

    groups_only = None
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            data = dump(includeCollectives=True, includeStackTraces=stacks, onlyActive=False)
        except TypeError:  # a release without these options
            data = dump()
        try:
            record = loads(data)
        except ValueError:
            continue
        if record.get("entries"):
            return data
        if record.get("pg_status") and groups_only is None:
            groups_only = data
    return groups_only


def _serve_flight_record(request: str, path: str, started: float, every_s: float = 0.5) -> None:
    """Write the record each time the launcher creates or touches ``request``."""
    served = None
    while True:
        try:
            asked = os.stat(request).st_mtime_ns
        except OSError:
            asked = None
        if asked is not None and asked != served:
            served = asked
            try:
                _dump_flight_record(path, started)
            except Exception as e:  # the dump is a diagnosis aid: never let it disturb the rank
                print(f"torchrig-worker: could not write the flight record: {e}", file=sys.stderr, flush=True)
        time.sleep(every_s)


def serve_flight_record(env: dict[str, str] | None = None) -> threading.Thread | None:
    """Start the thread that writes the flight record on the launcher's request (None when not launched so)."""
    e = os.environ if env is None else env
    request, logs, rank = e.get("TORCHRIG_FR_REQUEST"), e.get("TORCHRIG_LOG_DIR"), e.get("RANK")
    if not (request and logs and rank):
        return None
    restart = e.get("TORCHELASTIC_RESTART_COUNT", "0")
    t = threading.Thread(
        target=_serve_flight_record,
        args=(f"{request}.{restart}", os.path.join(logs, f"{PREFIX}{rank}"), time.time()),
        name="torchrig-flight-record",
        daemon=True,
    )
    t.start()
    return t


_SHIM_FILES = (
    os.path.abspath(__file__),
    "runpy.py",
    "<frozen runpy>",
    os.path.join("torch", "distributed", "elastic", "multiprocessing", "errors", "__init__.py"),
)


def _script_excepthook(exc_type: type[BaseException], exc: BaseException, tb: object) -> None:
    """Print an uncaught exception as plain ``python SCRIPT`` would: from the script's first frame on, without
    the shim's and runpy's frames in front of it."""
    t = tb
    while t is not None and t.tb_frame.f_code.co_filename.endswith(_SHIM_FILES):  # type: ignore[attr-defined]
        t = t.tb_next  # type: ignore[attr-defined]
    if t is not None:
        exc.__traceback__ = t  # type: ignore[assignment]  # what the printer reads (3.12 ignores ``tb``)
    sys.__excepthook__(exc_type, exc, t or tb)  # type: ignore[arg-type]


def main(argv: list[str]) -> None:
    module = False
    if argv and argv[0] == "--module":
        module, argv = True, argv[1:]
    if not argv:
        print("usage: python -m torchrig.launch.worker [--module] SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    given, args = argv[0], argv[1:]
    # absolute, as plain ``python SCRIPT`` sets ``__file__``: a script that changes directory changes nothing
    target = given if module else os.path.abspath(given)
    start_output_log()
    print(header(), file=sys.stderr, flush=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)
    serve_flight_record()

    sys.excepthook = _script_excepthook  # the script may set its own, which then prints
    faulthandler.enable(all_threads=True)  # what torchelastic's ``record`` sets up, without importing torch
    sys.argv = [given, *args]
    if not module:
        sys.path[0] = os.path.dirname(target)
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except Exception as e:
        _record(e)
        raise
    except SystemExit as e:
        handled = exited_on(e)
        if handled is not None:
            _record_handled(handled, e)
        elif e.code not in (None, 0):
            _record_exit(e)
        raise


def exited_on(e: SystemExit) -> BaseException | None:
    """The exception a failing ``sys.exit`` was called while handling, if any: frameworks that catch the
    script's exception, print a short message and ``sys.exit(1)`` (Hydra's ``@hydra.main`` does, unless
    ``HYDRA_FULL_ERROR=1``) leave it as the ``SystemExit``'s context, with its traceback into the script."""
    if e.code in (None, 0):
        return None
    ctx = e.__context__
    return ctx if isinstance(ctx, Exception) else None


def _record_handled(exc: BaseException, exit_: SystemExit) -> None:
    """Write the rank's error file (torchelastic's format) for an exception the script caught itself before it
    exited failing: the ``SystemExit``'s own traceback (to the script's line that called the code that
    exited), then that exception's, last (to where it was raised)."""
    import traceback

    _write_error_file(
        f"{type(exc).__name__}: {exc}",
        "".join(
            traceback.format_exception(type(exit_), exit_, exit_.__traceback__, chain=False)
            + traceback.format_exception(type(exc), exc, exc.__traceback__)
        ),
        exit_.code,
    )


def _record_exit(exit_: SystemExit) -> None:
    """Write the rank's error file for a failing ``sys.exit`` that handled no exception: its message (a
    string's, printed to stderr by Python, or the status), and its traceback, so the summary can name the
    script's line that exited."""
    import traceback

    code = exit_.code
    status = code if isinstance(code, int) and not isinstance(code, bool) else 1
    _write_error_file(
        f"{SYS_EXIT_PREFIX}{code}",
        "".join(traceback.format_exception(type(exit_), exit_, exit_.__traceback__, chain=False)),
        status,
    )


def _write_error_file(message: str, callstack: str, status: object) -> None:
    """torchelastic's error-file format, marked as written by this worker (``EXIT_CODE_KEY``: the status)."""
    import json

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": message,
            "extraInfo": {
                "py_callstack": callstack,
                "timestamp": str(int(time.time())),
                EXIT_CODE_KEY: str(status),
            },
        }
    }
    try:
        with open(path, "w") as fp:
            json.dump(data, fp)
    except OSError as err:  # a diagnosis aid: the script's own exit comes first
        print(f"torchrig-worker: could not write the error file: {err}", file=sys.stderr, flush=True)


def _record(e: Exception) -> None:
    """Write the rank's error file as torchelastic's ``record`` does (``$TORCHELASTIC_ERROR_FILE``). torch is
    imported only here, after a failure: the script's first line runs before any torch import, as under plain
    torchrun (where ``record`` wraps torchrun's own entry point, not the script)."""
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(e)
    except Exception as err:  # the error file is a diagnosis aid: the script's own exception comes first
        print(f"torchrig-worker: could not write the error file: {err}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
