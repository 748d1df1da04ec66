"""The dashboard's access key check answers any key with 403 or a redirect, never a traceback."""

from __future__ import annotations

import http.client
import http.server
import socket
import threading

import pytest

from torchrig.dashboard.server import Dashboard, handler_for


@pytest.fixture
def board_server():
    board = Dashboard(lambda _doctor: {}, None, 60.0, None)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_for(board))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield board, server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("query", [b"key=%C3%A9t%C3%A9", b"key=%FF%FE", "key=\u00e9".encode(), b"key=%00"])
def test_a_key_that_is_not_ascii_is_refused_with_403(board_server, query):
    _board, port = board_server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /?" + query + b" HTTP/1.0\r\nHost: x\r\n\r\n")
        answer = s.recv(64)
    assert answer.startswith(b"HTTP/1.0 403"), answer


def test_a_cookie_that_is_not_ascii_is_refused_and_the_right_key_still_opens(board_server):
    board, port = board_server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/", headers={"Cookie": "torchrig_dashboard=\u00e9".encode().decode("latin-1")})
    assert conn.getresponse().status == 403
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", f"/?key={board.key}")
    assert conn.getresponse().status == 303
    assert board.authorised("\u00e9", None) is False and board.authorised(board.key, None) is True


def test_a_browser_gone_before_the_answer_is_no_traceback():
    """A closed tab or a reload resets the connection while the answer is written: the handler ends the
    connection quietly (socketserver would print a traceback on the owner's terminal)."""
    from torchrig.dashboard.server import handler_for

    class Gone:
        def write(self, data: bytes) -> int:
            raise ConnectionResetError(104, "Connection reset by peer")

        def flush(self) -> None: ...

    handler = object.__new__(handler_for(object()))  # type: ignore[arg-type]
    handler.wfile, handler.request_version, handler.requestline, handler.command = (
        Gone(),
        "HTTP/1.1",
        "GET /",
        "GET",
    )
    handler.close_connection = False
    handler._send(403, b"no", "text/plain")  # no exception
    assert handler.close_connection is True
