"""The dashboard's HTTP server: the standard library's threading server, read-only, one access key.

The state is collected by one background thread every ``interval`` seconds (page views never touch the
engine or NVML themselves); doctor runs in another every ``doctor_every`` seconds. Every request must carry
the access key printed at start, as ``?key=`` once (it becomes an HttpOnly, SameSite=Strict cookie) or as
that cookie: on a shared server, other local users can reach 127.0.0.1 too, and the page shows the viewer's
own Jupyter tokens.
"""

from __future__ import annotations

import hmac
import http.server
import json
import secrets
import threading
from collections.abc import Callable
from http import cookies
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from torchrig.dashboard import page
from torchrig.errors import InputError
from torchrig.inputfiles import read_bytes

COOKIE = "torchrig_dashboard"
HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src 'self'; frame-ancestors 'none'",
}


class Dashboard:
    """The shared state between the collector threads and the request handlers."""

    def __init__(
        self,
        collect: Callable[[dict[str, Any] | None], dict[str, Any]],
        doctor: Callable[[], dict[str, Any]] | None,
        interval_s: float,
        bench_dir: str | None,
        doctor_every_s: float = 300.0,
    ) -> None:
        self.key = secrets.token_urlsafe(24)
        self._collect, self._doctor = collect, doctor
        self.interval_s, self.doctor_every_s, self.bench_dir = interval_s, doctor_every_s, bench_dir
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._doctor_result: dict[str, Any] | None = None
        self._state: dict[str, Any] = collect(None)
        self.forward: tuple[int, str] | None = None  # (its port, this host's name) for the ssh -L line

    @property
    def state(self) -> dict[str, Any]:
        with self._lock:
            return self._state

    def _collector(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                fresh = self._collect(self._doctor_result)
            except Exception as err:  # the engine went away, a ledger was locked: keep the last state
                fresh = dict(self.state, notes=[f"last refresh failed: {type(err).__name__}: {err}"])
            with self._lock:
                self._state = fresh

    def _doctor_loop(self) -> None:
        while not self._stop.is_set():
            assert self._doctor is not None
            self._doctor_result = self._doctor()
            with self._lock:
                self._state = dict(self._state, doctor=self._doctor_result)
            if self._stop.wait(self.doctor_every_s):
                return

    def start_threads(self) -> None:
        threading.Thread(target=self._collector, daemon=True, name="dashboard-collect").start()
        if self._doctor is not None:
            threading.Thread(target=self._doctor_loop, daemon=True, name="dashboard-doctor").start()

    def stop(self) -> None:
        self._stop.set()

    def authorised(self, query_key: str | None, cookie_key: str | None) -> bool:
        """Whether either carries the key (compared in constant time; a non-ASCII one is simply wrong:
        ``hmac.compare_digest`` refuses non-ASCII strings with a TypeError)."""
        return any(
            k is not None and k.isascii() and hmac.compare_digest(k, self.key)
            for k in (query_key, cookie_key)
        )


MAX_PNG_BYTES = 32 * 2**20  # bench's plot is ~100 KB


def _bench_png(bench_dir: str) -> bytes | None:
    """bench's plot beside its report, or None (missing, or not a regular file of at most MAX_PNG_BYTES)."""
    path = Path(bench_dir) / "bench.png"
    if not path.is_file():
        return None
    try:
        return read_bytes(path, "bench plot", max_bytes=MAX_PNG_BYTES)
    except InputError:
        return None


def handler_for(board: Dashboard) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "torchrig-dashboard"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # quiet: no access log on the terminal
            pass

        def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
            try:
                self.send_response(code)
                for k, v in {**HEADERS, "Content-Type": ctype, **(extra or {})}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                # the browser went away before the answer (a closed tab, a reload): nothing to tell the
                # owner's terminal (socketserver would print a traceback there)
                self.close_connection = True

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            keys = parse_qs(url.query).get("key")
            key = keys[0] if keys else None
            jar = cookies.SimpleCookie(self.headers.get("Cookie") or "")
            cookie = jar[COOKIE].value if COOKIE in jar else None
            if not board.authorised(key, cookie):
                msg = b"403: open the URL that 'torchrig dashboard' printed (it carries the access key)\n"
                self._send(403, msg, "text/plain; charset=utf-8")
                return
            if key is not None:  # the key moves into a cookie and out of the address bar
                flags = f"{COOKIE}={board.key}; HttpOnly; SameSite=Strict; Path=/"
                self._send(303, b"", "text/plain", {"Location": url.path or "/", "Set-Cookie": flags})
                return
            state = board.state
            if url.path == "/":
                self._send(
                    200,
                    page.page(state, board.interval_s, board.forward).encode(),
                    "text/html; charset=utf-8",
                )
            elif url.path == "/fragment":
                self._send(200, page.fragment(state, board.forward).encode(), "text/html; charset=utf-8")
            elif url.path == "/state.json":
                self._send(200, json.dumps(state).encode(), "application/json")
            elif url.path == "/bench.png" and board.bench_dir and (png := _bench_png(board.bench_dir)):
                self._send(200, png, "image/png")
            else:
                self._send(404, b"404: not here\n", "text/plain; charset=utf-8")

        def do_POST(self) -> None:
            self._send(405, b"405: the dashboard is read-only\n", "text/plain; charset=utf-8")

    return Handler
