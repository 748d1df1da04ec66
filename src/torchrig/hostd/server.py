"""The host daemon's socket: a threaded Unix stream server, one request per connection.

The socket (default ``/run/torchrig/torchrig.sock``) is mode 0666 in a root-owned 0755 folder: anyone may
*ask*; the answer depends on who the kernel says asked. At most :data:`MAX_CLIENTS` requests run at once;
a request line must arrive within the protocol's timeout and size; every outcome (allowed, refused,
failed) goes to the audit log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import socketserver
import stat
import sys
import threading
from pathlib import Path
from typing import Any

from torchrig.errors import EXIT_INTERNAL, TorchrigError, UsageError
from torchrig.hostd import protocol
from torchrig.hostd.policy import Caller, caller_of, peer_ids
from torchrig.hostd.service import HostService
from torchrig.safefs import UnsafePath, check_dir, refuse_link

MAX_CLIENTS = 32
MAX_PER_USER = 8  # one user's logs --follow cannot take every slot
DEFAULT_SOCKET = Path("/run/torchrig/torchrig.sock")
DEFAULT_STATE_DIR = Path("/var/lib/torchrig-host")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    service: HostService
    slots: threading.BoundedSemaphore
    per_user: dict[int, int]
    per_user_lock: threading.Lock

    def enter(self, uid: int) -> bool:
        with self.per_user_lock:
            if self.per_user.get(uid, 0) >= MAX_PER_USER:
                return False
            self.per_user[uid] = self.per_user.get(uid, 0) + 1
            return True

    def leave(self, uid: int) -> None:
        with self.per_user_lock:
            self.per_user[uid] -= 1


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        uid = peer_ids(sock)[1]
        if not self.server.slots.acquire(blocking=False):
            _answer(sock, UsageError("the host daemon is busy", hint="try again in a moment"))
            return
        try:
            if not self.server.enter(uid):
                _answer(sock, UsageError(f"you have {MAX_PER_USER} requests running already", hint="end one"))
                return
            try:
                self._serve(sock)
            finally:
                self.server.leave(uid)
        finally:
            self.server.slots.release()

    def _serve(self, sock: socket.socket) -> None:
        service = self.server.service
        pid, uid, gid = peer_ids(sock)
        caller = caller_of(pid, uid, gid, service.admin_gid)
        verb = "?"
        try:
            sock.settimeout(protocol.REQUEST_TIMEOUT_S)
            line = protocol.read_line(sock, protocol.MAX_REQUEST_BYTES, bytearray())
            if line is None:
                return
            verb, args = protocol.check_request(protocol.decode(line))
            sock.settimeout(None)  # an up waits for its services; logs --follow runs until the client ends

            def send(stream: str, data: bytes) -> None:
                for i in range(0, len(data), protocol.CHUNK_BYTES):
                    sock.sendall(protocol.chunk(stream, data[i : i + protocol.CHUNK_BYTES]))

            data = getattr(service, verb)(caller, args, send)
            sock.sendall(protocol.encode({"ok": True, "data": data}))
        except (BrokenPipeError, ConnectionResetError):
            return  # the client went away (Ctrl-C on logs --follow)
        except TimeoutError:
            _answer(sock, UsageError(f"no request within {protocol.REQUEST_TIMEOUT_S:.0f}s"))
        except TorchrigError as err:
            _log(service, caller, verb, err)
            _answer(sock, err)
        except Exception as err:  # a bug: the client gets one line, the daemon's log the traceback
            import traceback

            traceback.print_exc(file=sys.stderr)
            service.audit(caller, verb, "", "failed", f"internal error: {type(err).__name__}")
            with contextlib.suppress(OSError):
                sock.sendall(
                    protocol.encode(
                        {
                            "ok": False,
                            "error": {
                                "type": "InternalError",
                                "message": f"the host daemon failed: {type(err).__name__}: {err}"[:300]
                                + " (see its log: journalctl -u torchrig-host)",
                                "exit_code": EXIT_INTERNAL,
                            },
                        }
                    )
                )


def _log(service: HostService, caller: Caller, verb: str, err: TorchrigError) -> None:
    from torchrig.hostd.policy import Refused

    if not isinstance(err, Refused):  # refusals were logged where they were decided, with their target
        service.audit(caller, verb, "", "failed", err.one_line())


def _error(err: TorchrigError) -> bytes:
    return protocol.encode(
        {
            "ok": False,
            "error": {"type": type(err).__name__, "message": err.one_line(), "exit_code": err.exit_code},
        }
    )


def _answer(sock: socket.socket, err: TorchrigError) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(_error(err))


def prepare_socket(path: Path) -> None:
    """The socket's folder made (root's, 0755) and a stale socket removed; anything else there, or a
    link on the way, is refused rather than deleted."""
    folder = path.parent
    if not os.path.lexists(folder):
        os.makedirs(folder, mode=0o755)
    check_dir(folder, private=False)
    st = os.lstat(folder)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UnsafePath(
            f"the socket's folder {folder} must be {os.geteuid()}'s and writable by nobody else "
            f"(mode {st.st_mode & 0o7777:o})",
            hint="give --socket a path in a folder of your own, e.g. /run/torchrig/torchrig.sock",
        )
    if os.path.lexists(path):
        pst = os.lstat(path)
        refuse_link(path, pst)
        if not stat.S_ISSOCK(pst.st_mode):
            raise UnsafePath(
                f"{path} exists and is not a socket", hint="move it away, or give another --socket"
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            raise UsageError(f"a host daemon already answers on {path}", hint="stop it first")
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)
        finally:
            probe.close()


def make_server(socket_path: Path, service: HostService) -> _Server:
    """The listening server (not yet serving): the socket made 0666 in its checked folder."""
    prepare_socket(socket_path)
    old = os.umask(0o111)  # the socket file: 0666, anyone may connect
    try:
        server = _Server(str(socket_path), _Handler)
    finally:
        os.umask(old)
    server.service = service
    server.slots = threading.BoundedSemaphore(MAX_CLIENTS)
    server.per_user, server.per_user_lock = {}, threading.Lock()
    return server


def serve(socket_path: Path, state_dir: Path, admin_gid: int | None, inventory_path: str | None) -> None:
    """Run the daemon in the foreground until SIGTERM/SIGINT."""
    server = make_server(socket_path, HostService(state_dir, admin_gid, inventory_path))

    def stop(_sig: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        f"torchrig host daemon: listening on {socket_path}, state in {state_dir}", file=sys.stderr, flush=True
    )
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
