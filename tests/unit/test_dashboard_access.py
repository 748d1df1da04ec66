"""The dashboard's ways in work as printed: the ssh command is the one ``up`` prints (host key alias and
known_hosts file), one ``ssh -L`` makes every link work from a laptop, a 63-character name wraps, and a
key that is not ASCII is a 403, not a traceback."""

from __future__ import annotations

import shlex
import threading
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from torchrig.dashboard import page, state
from torchrig.dashboard.server import Dashboard, handler_for
from torchrig.runtime import hostkey
from torchrig.runtime.up import urls

LONG = "a" * 63


def _env(ports):
    return SimpleNamespace(
        name=LONG, id="c1", ports=ports, container_user="torch", owned_by=lambda uid: True, alive=True
    )


class _Engine:
    def get_file(self, cid, path):
        return b"tok\n"


def test_the_dashboard_ssh_command_is_the_one_up_prints(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    known = hostkey.known_hosts_file()
    known.parent.mkdir(parents=True)
    known.write_text(f"{LONG} ssh-ed25519 AAAA\n")
    access = state._access(_Engine(), _env({"ssh": ("127.0.0.1", 49154), "jupyter": ("127.0.0.1", 49153)}))
    plan = SimpleNamespace(name=LONG, container_user="torch", ports=())
    _, printed = urls(plan, {"ssh": 49154}, "box", None, known)
    assert access["ssh"] == printed
    argv = shlex.split(access["ssh"])
    assert f"UserKnownHostsFile={known}" in argv and f"HostKeyAlias={LONG}" in argv
    assert access["jupyter"] == "http://127.0.0.1:49153/lab?token=tok"


def test_one_ssh_forward_makes_every_link_work():
    line = page.forward_command(8265, [49154, 49153, 8265], "alice", "gpu1.example")
    assert shlex.split(line) == [
        "ssh", "-N", "-L", "8265:127.0.0.1:8265", "-L", "49153:127.0.0.1:49153",
        "-L", "49154:127.0.0.1:49154", "alice@gpu1.example",
    ]  # fmt: skip
    s = {
        "viewer": "alice",
        "environments": [{"name": LONG, "ports": [49153, 49154]}, {"name": "b", "ports": []}],
    }
    html = page._forward(s, (8265, "gpu1.example"))
    assert "-L 49153:127.0.0.1:49153" in html and 'id="forward"' in html
    assert page._forward(s, None) == ""


def test_a_long_name_wraps_instead_of_pushing_the_column_off():
    assert "overflow-wrap:anywhere" in page.STYLE and "white-space:pre-wrap" in page.STYLE


@pytest.fixture
def served():
    import http.server

    board = Dashboard(lambda doctor: {"viewer": "v"}, None, 5.0, None)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_for(board))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("key", ["%C3%A9t%C3%A9", "%FF%FE", "\u00e9".encode().decode("latin-1")])
def test_a_key_that_is_not_ascii_is_refused_not_crashed_on(served, key):
    quoted = key if "%" in key else urllib.request.quote(key)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{served}/?key={quoted}", timeout=10)
    assert err.value.code == 403
    req = urllib.request.Request(
        f"{served}/", headers={"Cookie": "torchrig_dashboard=\u00e9t\u00e9".encode().decode("latin-1")}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 403
