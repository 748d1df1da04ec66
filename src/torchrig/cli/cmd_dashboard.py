"""Serve a read-only page for this GPU server: each GPU (memory, utilisation, temperature, power, the
processes on it) and who holds it since when; the environments with their owners, state and GPUs, and for
your own ones the Jupyter link and the ssh command; the latest bench report and doctor's verdict.

It reads the same lease ledger, Docker engine and NVML inventory as 'torchrig gpus' and 'torchrig ps', and
refreshes itself every --interval seconds. It binds 127.0.0.1 (like every torchrig port) unless --public,
and prints a URL with an access key: only who has that URL sees the page. You are the user who started it:
your environments show their Jupyter token; nobody else's token is ever read. From your laptop, forward the
port over SSH (ssh -L 8265:127.0.0.1:8265 server) and open the printed URL there. No build step, no CDN.

examples:
  torchrig dashboard                                  # http://127.0.0.1:8265/?key=...
  torchrig dashboard --bench ~/bench-results --interval 10
  torchrig dashboard --port 9000 --public             # reachable from the network (still needs the key)
  torchrig dashboard --once --json                    # print what the page would show, and exit

testing hook: TORCHRIG_GPU_INVENTORY=FILE (or --inventory FILE) shows a recorded inventory instead.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from torchrig.argtypes import float_in, int_in
from torchrig.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port", type=int_in(0, 65535), default=8265, help="TCP port (8265; 0 picks a free one)"
    )
    parser.add_argument("--public", action="store_true", help="bind every address instead of 127.0.0.1")
    parser.add_argument(
        "--interval",
        type=float_in(1, 3600),
        default=5.0,
        metavar="S",
        help="refresh every S seconds (5; 1 to 3600)",
    )
    parser.add_argument("--bench", metavar="DIR", help="the folder 'torchrig bench --out DIR' wrote")
    parser.add_argument("--inventory", metavar="FILE", help="use a recorded GPU inventory (testing hook)")
    parser.add_argument("--no-doctor", action="store_true", help="leave doctor's verdict out")
    parser.add_argument("--once", action="store_true", help="print what the page shows now, and exit")


def run(args: argparse.Namespace) -> Any:
    from torchrig.dashboard import state as st
    from torchrig.report import SimpleReport

    viewer = st.Viewer.current()
    if args.once:
        doctor = None if args.no_doctor else st.doctor_verdict()
        data = st.collect(viewer, args.inventory, args.bench, doctor)
        gpus = ", ".join(
            f"{g['index']} {'held by ' + g['holders'][0]['user'] if g['holders'] else 'free'}"
            for g in data["gpus"]
        )
        return SimpleReport(data, f"GPUs: {gpus or 'none'}; environments: {len(data['environments'])}")
    return _serve(args, viewer)


def _serve(args: argparse.Namespace, viewer: Any) -> Any:
    import http.server

    from torchrig.dashboard import state as st
    from torchrig.dashboard.server import Dashboard, handler_for
    from torchrig.report import SimpleReport

    board = Dashboard(
        lambda doctor: st.collect(viewer, args.inventory, args.bench, doctor),
        None if args.no_doctor else st.doctor_verdict,
        args.interval,
        args.bench,
    )
    host = "0.0.0.0" if args.public else "127.0.0.1"
    try:
        server = http.server.ThreadingHTTPServer((host, args.port), handler_for(board))
    except OSError as err:
        raise UsageError(
            f"cannot listen on {host}:{args.port}: {err.strerror}",
            hint="pick another --port (0: any free one)",
        ) from None
    server.daemon_threads = True
    port = server.server_address[1]
    import socket

    from torchrig.dashboard.net import lan_address

    name = socket.getfqdn()
    board.forward = (port, name)
    shown = "127.0.0.1" if host == "127.0.0.1" else lan_address() or name
    print(f"torchrig dashboard for {viewer.name}: http://{shown}:{port}/?key={board.key}", flush=True)
    if args.public:
        print(
            "  warning: --public serves plain HTTP: the key (and the Jupyter tokens on the page) cross the "
            f"network unencrypted; prefer the default and 'ssh -N -L {port}:127.0.0.1:{port} "
            f"{viewer.name}@{name}'",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(
            f"  from a laptop: ssh -N -L {port}:127.0.0.1:{port} {viewer.name}@{name}, then open the URL there "
            "(the page prints the one ssh -L that also makes its Jupyter links work)",
            file=sys.stderr,
            flush=True,
        )
    print(
        "  (the key is the access: share the URL with nobody; Ctrl-C stops it)", file=sys.stderr, flush=True
    )
    board.start_threads()
    stop = threading.Event()

    def _on_term(signum: int, _frame: Any) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = signal.signal(signal.SIGTERM, _on_term)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        board.stop()
        server.server_close()
    return SimpleReport({"stopped": True, "port": port}, "dashboard stopped")
