"""The team flow through the host daemon, with three real Unix users made for the test (useradd; removed
after): two members and one admin, none in the docker group. The daemon is started by the test (foreground,
temporary socket and state folder, the real dockerd). Each member ``up``s, works and ``down``s; every
attempt on the other's things is refused with exit 2 and one line, and nothing of the victim's changes.
docs/threat-model.md names the test proving each line of the model."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import userpython  # tests/userpython.py

ROOT = Path(__file__).resolve().parents[2]
BASE = "torchrig-test/debian:bookworm"
INVENTORY = ROOT / "tests/fixtures/runtime/driver-535-2xa100-pcie.json"
SYSTEM_PYTHON = "/usr/bin/python3"

# a raw client: sends one request line as the calling user and prints the answer lines (forgery attempts)
RAW = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
print(s.makefile("rb").read().decode())
"""


def _image(engine, tag: str, labels: dict[str, str]) -> str:
    """A small image with a user of its own (what 'torchrig image build' gives) on the local base image."""
    dockerfile = (
        f"FROM {BASE}\n"
        "RUN useradd -m -u 4242 -s /bin/sh dev\n"
        'LABEL org.torchrig.user="dev:4242:4242"\n'
        "USER dev\n"
    )
    ref = f"trh-img-{tag}:latest"
    engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=ref, labels=labels, rm=True, pull=False)
    return ref


@pytest.fixture(scope="module")
def host(engine, test_labels):
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root, useradd and runuser")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("no system python for the test users")
    tag = secrets.token_hex(3)
    names = {"alice": f"trh-a-{tag}", "bob": f"trh-b-{tag}", "carol": f"trh-c-{tag}"}
    admin_group = f"trh-adm-{tag}"
    scratch = Path(tempfile.mkdtemp(prefix="trh-"))
    os.chmod(scratch, 0o755)
    made_users: list[str] = []
    daemon = None
    image = None
    try:
        subprocess.run(["groupadd", admin_group], check=True)
        for who, name in names.items():
            extra = ["-G", admin_group] if who == "carol" else []
            subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", *extra, name], check=True)
            made_users.append(name)
            home = scratch / who
            home.mkdir(mode=0o700)
            shutil.chown(home, name)
            os.chmod(home, 0o700)
        image = _image(engine, tag, test_labels)
        # the users' system python gets torchrig's own dependencies (this interpreter's are under /root)
        userpython.copy_packages(userpython.runtime_modules(), scratch / "deps")
        # GPUs of this test's own: the daemon counts every torchrig container on the engine as a holder
        # (its reality check), and other tests on this engine lease the fixture's UUIDs
        inventory = json.loads(INVENTORY.read_text())
        for g in inventory["nvml"]["gpus"]:
            g["uuid"] = g["uuid"][: -len(tag)] + tag
        (scratch / "inventory.json").write_text(json.dumps(inventory))
        (scratch / "run").mkdir(mode=0o755)
        sock = scratch / "run" / "torchrig.sock"
        state = scratch / "state"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(ROOT / "src"),
            "HOME": "/root",
        }
        log = open(scratch / "daemon.log", "w")  # noqa: SIM115 (closed with the daemon)
        daemon = subprocess.Popen(
            [sys.executable, "-m", "torchrig", "host", "serve", "--socket", str(sock), "--state-dir", str(state),
             "--admin-group", admin_group, "--inventory", str(scratch / "inventory.json")],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert daemon.poll() is None, (scratch / "daemon.log").read_text()
            assert time.monotonic() < deadline, "the daemon did not open its socket"
            time.sleep(0.2)
        yield {
            "names": names,
            "tag": tag,
            "scratch": scratch,
            "socket": sock,
            "state": state,
            "image": image,
            "log": scratch / "daemon.log",
        }
    finally:
        if daemon is not None:
            daemon.terminate()
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
        for c in engine.containers.list(all=True, filters={"name": f"trh-{tag}"}, ignore_removed=True):
            c.remove(force=True)
        for v in engine.volumes.list(filters={"name": f"trh-{tag}"}):
            v.remove(force=True)
        if image is not None:
            engine.images.remove(image, force=True)
        for name in made_users:
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", admin_group], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


def as_user(host, who: str, *argv: str, extra_env: dict[str, str] | None = None, timeout: float = 240):
    """``argv`` run as ``who`` with a clean environment (no docker group, no access to /root)."""
    env = {
        "HOME": str(host["scratch"] / who),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{ROOT / 'src'}:{host['scratch'] / 'deps'}",
        "TORCHRIG_HOST_SOCKET": str(host["socket"]),
        "TORCHRIG_LABELS": os.environ.get("TORCHRIG_LABELS", ""),
        **(extra_env or {}),
    }
    cmd = [
        "runuser",
        "-u",
        host["names"][who],
        "--",
        "env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        *argv,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(host["scratch"]))


def tr(host, who: str, *args: str, **kw):
    return as_user(host, who, SYSTEM_PYTHON, "-m", "torchrig", *args, **kw)


def raw(host, who: str, request: dict) -> list[dict]:
    r = as_user(host, who, SYSTEM_PYTHON, "-c", RAW, str(host["socket"]), json.dumps(request))
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def refused(r, *words: str) -> None:
    """Exit 2 and exactly one line on stderr that says why."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("torchrig: error: "), r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def audit(host) -> list[dict]:
    return [json.loads(x) for x in (host["state"] / "audit.log").read_text().splitlines()]


def up_args(host, name: str, *extra: str) -> list[str]:
    return ["up", "--image", host["image"], "--no-jupyter", "--no-ssh", "--name", name, "--wait", "0", *extra]


def test_team_flow_through_the_daemon(host, engine):
    import pwd

    t, names = host["tag"], host["names"]
    uid = {who: pwd.getpwnam(n).pw_uid for who, n in names.items()}
    a_run, a_gpu, b_gpu = f"trh-{t}-a", f"trh-{t}-ag", f"trh-{t}-bg"
    a_vol = f"trh-{t}-avol"
    # alice's private folder, a secret in it, and a work folder she mounts
    a_home = host["scratch"] / "alice"
    (a_home / "work").mkdir()
    (a_home / "secret.txt").write_text("alice's secret\n")
    for p in (a_home / "work", a_home / "secret.txt"):
        shutil.chown(p, names["alice"])
    (a_home / "secret.txt").chmod(0o600)

    # the daemon says who each one is, from the kernel
    who = json.loads(tr(host, "alice", "host", "whoami", "--json").stdout)
    assert (who["uid"], who["admin"]) == (uid["alice"], False)
    assert json.loads(tr(host, "carol", "host", "whoami", "--json").stdout)["admin"] is True

    # each member ups: alice a running environment with her volume and folder, and one GPU each
    r = tr(host, "alice", *up_args(host, a_run, "-v", f"{a_vol}:/data", "-v", f"{a_home / 'work'}:/work"))
    assert r.returncode == 0, r.stderr
    r = tr(host, "alice", *up_args(host, a_gpu, "--gpus", "1", "--create-only"), "--json")
    assert r.returncode == 0, r.stderr
    a_gpu_index = json.loads(r.stdout)["plan"]["gpus"][0]["label"]
    r = tr(host, "bob", *up_args(host, b_gpu, "--gpus", "1", "--create-only"))
    assert r.returncode == 0, r.stderr

    # alice works: her commands run as her (not root), her files land as hers
    r = tr(
        host, "alice", "exec", a_run, "--", "sh", "-c", "id -u; echo kept > /data/note; echo w > /work/out"
    )
    assert r.returncode == 0 and r.stdout.split() == [str(uid["alice"])], (r.stdout, r.stderr)
    assert (a_home / "work" / "out").stat().st_uid == uid["alice"]
    r = tr(host, "alice", "exec", a_run, "--", "sh", "-c", "echo out; echo err >&2; exit 5")
    assert (r.returncode, r.stdout, r.stderr) == (5, "out\n", "err\n")  # streamed back, each to its own
    refused(tr(host, "alice", "exec", "--root", a_run, "--", "id"), "admin")
    r = tr(host, "alice", "logs", a_run)
    assert r.returncode == 0, r.stderr

    # ps: members see their own; the admin sees all
    mine = json.loads(tr(host, "bob", "ps", "--json").stdout)["environments"]
    assert [e["name"] for e in mine] == [b_gpu]
    everyone = {e["name"] for e in json.loads(tr(host, "carol", "ps", "--json").stdout)["environments"]}
    assert {a_run, a_gpu, b_gpu} <= everyone

    # the dashboard's data through the daemon: the board, and the viewer's own environments only
    snippet = (
        "import json; from torchrig.dashboard.state import Viewer, collect; "
        "print(json.dumps(collect(Viewer.current(), None, None, None)))"
    )
    r = as_user(host, "bob", SYSTEM_PYTHON, "-c", snippet)
    assert r.returncode == 0, r.stderr
    page = json.loads(r.stdout)
    assert [e["name"] for e in page["environments"]] == [b_gpu] and len(page["gpus"]) == 2

    # every cross-user attempt by bob is refused with exit 2 and one line
    refused(tr(host, "bob", "exec", a_run, "--", "cat", "/data/note"), "belongs to", names["alice"])
    refused(tr(host, "bob", "logs", a_run), "belongs to")
    for extra in ([], ["--force"]):
        refused(tr(host, "bob", "down", a_run, *extra), "belongs to")
    refused(tr(host, "bob", *up_args(host, f"trh-{t}-b2", "-v", f"{a_vol}:/steal")), "volume", "belongs to")
    refused(tr(host, "bob", "up", "--image", host["image"], "--user", names["alice"], "--no-ssh",
               "--no-jupyter", "--name", f"trh-{t}-b3"), "only an admin")  # fmt: skip
    # a path bob cannot read, asked for directly and through a link he planted in his own folder
    link = host["scratch"] / "bob" / "innocent"
    as_user(host, "bob", "/bin/ln", "-s", str(a_home / "secret.txt"), str(link))
    for path in (str(a_home / "secret.txt"), str(link)):
        answer = raw(
            host, "bob", {"v": 1, "verb": "up", "args": _raw_up(host, f"trh-{t}-b4", [f"{path}:/x:ro"])}
        )
        assert answer[-1]["ok"] is False and answer[-1]["error"]["exit_code"] == 2, answer
        assert (
            "may not read" in answer[-1]["error"]["message"] or "Permission" in answer[-1]["error"]["message"]
        )
    # a forged identity in the request: refused, the kernel decides who asks
    answer = raw(host, "bob", {"v": 1, "verb": "down", "args": {"names": [a_run], "force": True, "timeout_s": 1,
                                                                 "volumes": False, "uid": uid["alice"]}})  # fmt: skip
    assert answer[-1]["error"]["exit_code"] == 2 and "unknown field" in answer[-1]["error"]["message"]
    # the ledger and the audit log are root's: bob can neither read nor forge them
    r = as_user(
        host,
        "bob",
        SYSTEM_PYTHON,
        "-c",
        f"import sqlite3; sqlite3.connect('file:{host['state']}/leases.sqlite3?mode=rw', uri=True).execute('DELETE FROM leases')",
    )
    assert r.returncode != 0 and ("unable to open" in r.stderr or "Permission" in r.stderr), r.stderr
    assert oct(host["state"].stat().st_mode & 0o777) == "0o700"

    # a lease lost from the ledger (deleted by hand): the container's labels still hold the GPU
    with sqlite3.connect(host["state"] / "leases.sqlite3") as db:
        db.execute("DELETE FROM leases WHERE container=?", (a_gpu,))
    r = tr(host, "bob", *up_args(host, f"trh-{t}-b5", "--gpus", f"device={a_gpu_index}", "--create-only"))
    assert r.returncode == 2 and "held by" in r.stderr and "(no lease)" in r.stderr and a_gpu in r.stderr, (
        r.stderr
    )
    board = json.loads(tr(host, "bob", "gpus", "--json").stdout)
    assert any("holds no lease" in n for n in board["notes"])
    assert any(e["verb"] == "reality" and e["target"].startswith(f"container {a_gpu}") for e in audit(host))

    # nothing of alice's changed
    assert engine.containers.get(a_run).status == "running"
    assert engine.containers.get(a_gpu).status == "created"
    r = tr(host, "alice", "exec", a_run, "--", "cat", "/data/note")
    assert r.stdout == "kept\n", r.stderr
    assert (a_home / "secret.txt").read_text() == "alice's secret\n"
    assert not engine.containers.list(all=True, filters={"name": f"trh-{t}-b2"}, ignore_removed=True)
    assert not engine.containers.list(all=True, filters={"name": f"trh-{t}-b5"}, ignore_removed=True)

    # the admin may stop someone else's environment (with --force), and the audit log says whose
    refused(tr(host, "carol", "down", b_gpu), "belongs to")
    r = tr(host, "carol", "down", "--force", b_gpu)
    assert r.returncode == 0, r.stderr
    log = audit(host)
    assert any(e["verb"] == "down" and e["target"] == b_gpu and e["user"] == names["carol"]
               and e["outcome"] == "allowed" and names["bob"] in e["reason"] for e in log)  # fmt: skip
    refusals = [e for e in log if e["outcome"] == "refused" and e["user"] == names["bob"]]
    assert {e["verb"] for e in refusals} >= {"exec", "logs", "down", "up"}

    # alice downs hers; the ledger is empty again
    r = tr(host, "alice", "down", "--volumes", a_run, a_gpu)
    assert r.returncode == 0, r.stderr
    assert "deleted volume" in r.stdout, r.stdout  # through the daemon too, --volumes deletes her /workspace
    with sqlite3.connect(host["state"] / "leases.sqlite3") as db:
        assert db.execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0
    assert tr(host, "alice", "host", "volumes", "--json").returncode == 0


def _raw_up(host, name: str, volumes: list[str]) -> dict:
    return {
        "image": host["image"], "name": name, "user": None, "gpus": None, "share": False, "volumes": volumes,
        "memory": None, "cpus": None, "shm_size": None, "ulimits": [], "pids_limit": None, "jupyter": False,
        "ssh": False, "ssh_key": None, "public": False, "dry_run": False, "create_only": True, "wait_s": 0,
        "labels": [],
    }  # fmt: skip


def test_an_image_without_a_user_of_its_own_is_refused_through_the_daemon(host):
    r = tr(
        host, "bob", "up", "--image", BASE, "--no-jupyter", "--no-ssh", "--name", f"trh-{host['tag']}-root"
    )
    refused(r, "names no user of its own")


def test_a_link_planted_in_a_shared_ledger_folder_is_refused_by_root(host, tmp_path):
    """The single-user mode's shared ledger folder (group-writable): a member plants a link as the ledger;
    root's next command refuses it in one line and the link's target is untouched."""
    shared = host["scratch"] / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # the worst case: anyone may write the folder
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    victim.chmod(0o600)
    as_user(host, "bob", "/bin/ln", "-s", str(victim), str(shared / "leases.sqlite3"))
    assert (shared / "leases.sqlite3").is_symlink()
    env = dict(
        os.environ, TORCHRIG_STATE_DIR=str(shared), TORCHRIG_HOST_SOCKET="", PYTHONPATH=str(ROOT / "src")
    )
    r = subprocess.run([sys.executable, "-m", "torchrig", "gpus", "--inventory", str(INVENTORY)],
                       capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    refused(r, "symbolic link", "leases.sqlite3")
    assert victim.read_text() == "root's\n" and victim.stat().st_mode & 0o777 == 0o600


def test_a_raw_request_that_is_too_long_or_not_json_is_refused(host):
    for payload in (b"x" * 300_000 + b"\n", b"\xff\xfe not json\n", b'{"v": 1}\n'):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(host["socket"]))
            with contextlib.suppress(BrokenPipeError):
                s.sendall(payload)
            answer = json.loads(s.makefile("rb").readline())
        assert answer["ok"] is False and answer["error"]["exit_code"] == 2, answer


def test_an_environment_keeps_its_ssh_host_key_through_the_daemon(host):
    """Through the daemon the host key is kept across down/up of a name, in root's state, never in a folder
    a user can write; the daemon sends the line and 'up' records it in the user's own known_hosts, which the
    printed ssh command names."""
    t = host["tag"]
    name = f"trh-{t}-key"
    home = host["scratch"] / "alice"
    key = host["scratch"] / f"alice-{t}.pub"  # a public key alice can read (she has no ~/.ssh)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)[:-4]], check=True)
    os.chmod(key, 0o644)
    argv = ["up", "--image", host["image"], "--no-jupyter", "--name", name, "--ssh-key", str(key)]
    lines = []
    try:
        for _ in range(2):
            r = tr(host, "alice", *argv, "--create-only", "--json")
            assert r.returncode == 0, r.stderr
            lines.append(json.loads(r.stdout)["known_hosts_line"])
            assert tr(host, "alice", "down", name).returncode == 0
    finally:
        tr(host, "alice", "down", "--volumes", name)
    assert lines[0] and lines[0] == lines[1] and lines[0].startswith(f"{name} ssh-ed25519 ")
    known = home / ".local" / "state" / "torchrig" / "known_hosts"
    assert known.read_text().splitlines() == [lines[0]] and known.stat().st_uid == pwd_uid(host, "alice")
    kept = host["state"] / "users"
    assert kept.stat().st_uid == 0 and kept.stat().st_mode & 0o077 == 0  # root's, private
    assert not list(home.rglob("ssh_host_ed25519_key"))  # the private key never in her folders


def pwd_uid(host, who: str) -> int:
    import pwd

    return pwd.getpwnam(host["names"][who]).pw_uid
