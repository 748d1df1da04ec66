"""The shim every rank starts in: ``python -m torchrig.launch.worker [--module] SCRIPT [ARGS...]``.

torchrun starts it once per rank. It (1) prints one header line naming the rank, so a log file can be
traced to its rank and host; (2) makes the rank dump every thread's Python stack into its log on SIGUSR1
(the launcher's hang watchdog sends it) and on SIGTERM (what torchrun sends the surviving ranks when one
fails), so the failure summary can say where each rank was; (3) writes the rank's PyTorch flight record
(its last collectives) next to the logs when the launcher asks for it by creating the file
``$TORCHRIG_FR_REQUEST.<attempt>`` (a daemon thread looks for it twice a second; a rank blocked inside a
collective still answers, since PyTorch releases the GIL while it waits); (4) runs the script as
``python SCRIPT`` would, under torchelastic's ``record`` so an uncaught exception lands in the rank's error
file.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import socket
import sys
import threading
import time

from torchrig.launch.flightrec import PREFIX, loads

HEADER = "torchrig-worker:"


def header() -> str:
    e = os.environ
    return (
        f"{HEADER} rank={e.get('RANK', '?')} local_rank={e.get('LOCAL_RANK', '?')} "
        f"world_size={e.get('WORLD_SIZE', '?')} restart={e.get('TORCHELASTIC_RESTART_COUNT', '0')} "
        f"pid={os.getpid()} host={socket.gethostname()}"
    )


SYMBOLIZING = ".symbolizing"  # + on a record's path: the rank is still writing the record with its stacks


def _dump_flight_record(path: str, started: float) -> None:
    """Write this rank's flight record to ``path``, unless NCCL's watchdog already wrote one there for this
    process (its dump at the timeout comes first). The record without Python stacks comes first: on an H200
    with torch 2.11 it took 0.0 s where the first one with stacks took 4.4-5.8 s (their symbolisation);
    the one with stacks then replaces it, while a ``.symbolizing`` marker tells the launcher to wait."""
    try:
        if os.stat(path).st_mtime >= started:
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
    while not os.path.exists(request):
        time.sleep(every_s)
    try:
        _dump_flight_record(path, started)
    except Exception as e:  # the dump is a diagnosis aid: never let it disturb the rank
        print(f"torchrig-worker: could not write the flight record: {e}", file=sys.stderr, flush=True)


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


def main(argv: list[str]) -> None:
    module = False
    if argv and argv[0] == "--module":
        module, argv = True, argv[1:]
    if not argv:
        print("usage: python -m torchrig.launch.worker [--module] SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    target, args = argv[0], argv[1:]
    print(header(), file=sys.stderr, flush=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)
    serve_flight_record()

    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def run() -> None:
        if module:
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")

    run()


if __name__ == "__main__":
    main(sys.argv[1:])
