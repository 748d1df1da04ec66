"""The shim every rank starts in: ``python -m torchrig.launch.worker [--module] SCRIPT [ARGS...]``.

torchrun starts it once per rank. It (1) prints one header line naming the rank, so a log file can be
traced to its rank and host; (2) makes the rank dump every thread's Python stack into its log on SIGUSR1
(the launcher's hang watchdog sends it) and on SIGTERM (what torchrun sends the surviving ranks when one
fails), so the failure summary can say where each rank was; (3) runs the script as ``python SCRIPT`` would,
under torchelastic's ``record`` so an uncaught exception lands in the rank's error file.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import socket
import sys

HEADER = "torchrig-worker:"


def header() -> str:
    e = os.environ
    return (
        f"{HEADER} rank={e.get('RANK', '?')} local_rank={e.get('LOCAL_RANK', '?')} "
        f"world_size={e.get('WORLD_SIZE', '?')} restart={e.get('TORCHELASTIC_RESTART_COUNT', '0')} "
        f"pid={os.getpid()} host={socket.gethostname()}"
    )


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
