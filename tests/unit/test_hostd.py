"""The host daemon's pure parts: the wire protocol's checks, the ownership decisions, the reality check of
leases against container labels and NVML's process lists (recorded records), and the systemd unit."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from torchrig.errors import UsageError
from torchrig.hostd import protocol
from torchrig.hostd.policy import Caller, audit_line, may_act_on
from torchrig.hostd.reality import unaccounted
from torchrig.hw.nvml_records import NvmlProcess
from torchrig.runtime.engine import EnvRecord
from torchrig.runtime.ledger import Lease

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runtime"
GPU0, GPU1 = "GPU-a1b2c3d4-0000-4e5f-8a9b-0c1d2e3f4a00", "GPU-a1b2c3d4-0001-4e5f-8a9b-0c1d2e3f4a01"
ALICE = Caller(pid=10, uid=1001, gid=1001, name="alice", groups=(1001,), admin=False)
ADMIN = Caller(pid=11, uid=1003, gid=1003, name="carol", groups=(1003, 990), admin=True)


# ---- protocol --------------------------------------------------------------------------------------------
def _ps(**args):
    return {"v": 1, "verb": "ps", "args": {"mine": False, **args}}


def test_a_well_formed_request_passes():
    assert protocol.check_request(_ps()) == ("ps", {"mine": False})


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        ({"v": 1, "verb": "ps"}, "exactly the fields"),
        ({"v": 2, "verb": "ps", "args": {"mine": False}}, "protocol version"),
        ({"v": 1, "verb": "rm -rf", "args": {}}, "unknown verb"),
        (_ps(uid=0), "unknown field 'uid'"),
        ({"v": 1, "verb": "ps", "args": {}}, "missing field"),
        ({"v": 1, "verb": "ps", "args": {"mine": 1}}, "must be bool"),
        ({"v": 1, "verb": "down", "args": {"names": ["a"], "force": True, "timeout_s": True}}, "must be int"),
        ({"v": 1, "verb": "down", "args": {"names": "a", "force": True, "timeout_s": 1}}, "must be [str]"),
        (
            {
                "v": 1,
                "verb": "exec",
                "args": {"name": "a", "argv": ["x" * 20000], "root": False, "workdir": None},
            },
            "[str]",
        ),
        ([1, 2], "exactly the fields"),
    ],
)
def test_a_malformed_request_is_refused_in_one_line(request_, words):
    with pytest.raises(UsageError) as err:
        protocol.check_request(request_)
    assert words in err.value.one_line() and "\n" not in err.value.one_line()


@pytest.mark.parametrize("line", [b"\xff\xfe", b"{", b'{"v": NaN}', b"[" * 100000])
def test_a_line_that_is_not_json_is_refused(line):
    with pytest.raises(UsageError, match="not one line of UTF-8 JSON"):
        protocol.decode(line)


def test_a_line_longer_than_the_limit_is_refused_before_it_is_all_read():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x" * 5000)
        with pytest.raises(UsageError, match="longer than 1024 bytes"):
            protocol.read_line(b, 1024, bytearray())


# ---- policy ----------------------------------------------------------------------------------------------
def test_only_the_owner_acts_and_an_admin_only_with_force():
    assert may_act_on(ALICE, 1001) == "owner"
    assert may_act_on(ALICE, 1002) is None and may_act_on(ALICE, 1002, force=True) is None
    assert may_act_on(ALICE, None, force=True) is None
    assert may_act_on(ADMIN, 1001) is None and may_act_on(ADMIN, 1001, force=True) == "admin"


def test_an_audit_record_is_one_json_line_whatever_the_reason_holds():
    line = audit_line(ALICE, "down", "bob-1", "refused", "owner\nUID 1002 \x1b[31m", at_s=0)
    assert "\n" not in line
    rec = json.loads(line)
    assert rec["uid"] == 1001 and rec["outcome"] == "refused" and rec["time"] == "1970-01-01T00:00:00Z"


def test_the_caller_comes_from_the_kernel_not_from_the_request():
    from torchrig.hostd.policy import caller_of, peer_ids

    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        pid, uid, gid = peer_ids(a)
    assert (pid, uid, gid) == (os.getpid(), os.getuid(), os.getgid())
    me = caller_of(pid, uid, gid, admin_gid=None)
    assert me.admin is (uid == 0) and os.getgid() in me.groups


# ---- reality ---------------------------------------------------------------------------------------------
def _env(name: str, uuids: tuple[str, ...], state: str = "running", uid: int = 1001) -> EnvRecord:
    labels = tuple(str(i) for i, _ in enumerate(uuids))
    return EnvRecord(name, f"id-{name}", "alice", "img", state, state, uuids, labels, {}, "dev", "t", uid)


def _lease(uuid: str, container: str) -> Lease:
    return Lease(uuid, 0, "0", "alice", container, "id", False, 1, 1.0, 2.0)


def _recorded_processes() -> dict[str, list[NvmlProcess]]:
    data = json.loads((FIXTURES / "nvml-processes-2xa100-gpu1-unleased.json").read_text())
    return {k: [NvmlProcess(**p) for p in v] for k, v in data.items() if not k.startswith("_")}


def test_a_container_holding_a_gpu_without_a_lease_is_reported_and_keeps_it():
    extra, found = unaccounted([], [_env("alice-1", (GPU0,))], None, 5.0)
    assert [(x.unit_uuid, x.container) for x in extra] == [(GPU0, "alice-1")]
    assert "holds no lease" in found[0].summary and "alice-1" in found[0].summary


def test_a_leased_container_or_a_dead_one_is_not_a_discrepancy():
    envs = [_env("alice-1", (GPU0,)), _env("gone", (GPU1,), state="exited")]
    assert unaccounted([_lease(GPU0, "alice-1")], envs, None, 5.0) == ([], [])


def test_nvml_processes_on_an_unleased_gpu_hold_it_and_on_a_leased_one_do_not():
    extra, found = unaccounted(
        [_lease(GPU0, "alice-1")], [_env("alice-1", (GPU0,))], _recorded_processes(), 5.0
    )
    assert [x.unit_uuid for x in extra] == [GPU1]
    assert "pid 51777 (python3) and 1 more" in found[0].summary


def test_the_choice_of_gpus_skips_what_reality_holds():
    from torchrig.runtime.inventory import load_snapshot
    from torchrig.runtime.lease import NoFreeGpu, choose
    from torchrig.runtime.placement import GpuHeld, parse_gpus

    inv = load_snapshot(FIXTURES / "driver-535-2xa100-pcie.json")
    leased = [_lease(GPU0, "alice-1")]
    envs = [_env("alice-1", (GPU0,))]
    only_gpu0 = {GPU0: _recorded_processes()[GPU0]}  # the leased container's own process
    extra, _ = unaccounted(leased, envs, only_gpu0, 5.0)
    assert [u.uuid for u in choose(inv, parse_gpus("1"), leased + extra, share=False)] == [GPU1]
    extra, _ = unaccounted(leased, envs, _recorded_processes(), 5.0)
    with pytest.raises(NoFreeGpu, match=r"GPU 1 held by process \(no lease\)/pid 51777"):
        choose(inv, parse_gpus("1"), leased + extra, share=False)
    extra, _ = unaccounted([], envs, None, 5.0)  # the lease of alice-1 deleted from the ledger
    with pytest.raises(GpuHeld, match=r"GPU 0 held by alice \(no lease\)/alice-1"):  # named: exit 2
        choose(inv, parse_gpus("device=0"), extra, share=False)


# ---- wire ------------------------------------------------------------------------------------------------
def test_records_come_back_from_json_as_they_left():
    from torchrig.hostd.wire import from_jsonable
    from torchrig.report import jsonable

    env = _env("alice-1", (GPU0, GPU1))
    env = EnvRecord(**{**env.__dict__, "ports": {"ssh": ("127.0.0.1", 2222)}})
    assert from_jsonable(EnvRecord, json.loads(json.dumps(jsonable(env)))) == env
    lease = _lease(GPU0, "alice-1")
    assert from_jsonable(Lease, jsonable(lease)) == lease
    with pytest.raises(ValueError):
        from_jsonable(Lease, {**jsonable(lease), "gpu_index": "zero"})


# ---- safe state folders ----------------------------------------------------------------------------------
def test_a_private_state_folder_that_is_a_link_or_shared_is_refused(tmp_path):
    from torchrig.safefs import UnsafePath, append_line, ensure_private_dir

    made = ensure_private_dir(tmp_path / "state")
    assert made.stat().st_mode & 0o777 == 0o700
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(UnsafePath, match="symbolic link"):
        ensure_private_dir(tmp_path / "link")
    made.chmod(0o770)
    with pytest.raises(UnsafePath, match="must be private"):
        ensure_private_dir(made)
    made.chmod(0o700)
    target = tmp_path / "elsewhere"
    (made / "audit.log").symlink_to(target)
    with pytest.raises(UnsafePath, match="symbolic link"):
        append_line(made / "audit.log", "x")
    assert not target.exists()


# ---- bind mounts as the caller ---------------------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="checking as another user needs root")
def test_a_bind_mount_is_checked_with_the_callers_own_rights(tmp_path):
    import tempfile

    from torchrig.hostd.access import resolve_as
    from torchrig.hostd.policy import Refused

    nobody = Caller(pid=1, uid=65534, gid=65534, name="nobody", groups=(65534,), admin=False)
    top = Path(tempfile.mkdtemp(prefix="trh-access-"))
    try:
        top.chmod(0o755)
        (top / "open").mkdir(mode=0o755)
        (top / "closed").mkdir(mode=0o700)
        (top / "closed" / "f").write_text("secret")
        (top / "link").symlink_to(top / "closed")
        assert resolve_as(nobody, str(top / "open"), write=False) == str(top / "open")
        with pytest.raises(Refused, match="may not read and write"):
            resolve_as(nobody, str(top / "open"), write=True)
        for path in (top / "closed", top / "link", top / "closed" / "f"):
            with pytest.raises(Refused):
                resolve_as(nobody, str(path), write=False)
    finally:
        shutil.rmtree(top)


# ---- the socket, in-process ------------------------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's state folder is root's")
def test_the_daemon_answers_whoami_and_refuses_a_forged_field(tmp_path):
    from torchrig.hostd.client import RemoteError, call
    from torchrig.hostd.server import make_server
    from torchrig.hostd.service import HostService

    (tmp_path / "run").mkdir(mode=0o755)
    sock = tmp_path / "run" / "t.sock"
    server = make_server(sock, HostService(tmp_path / "state", None, None))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert call(sock, "whoami", {})["uid"] == 0
        with pytest.raises(RemoteError, match="unknown field 'uid'") as err:
            call(sock, "ps", {"mine": True, "uid": 1001})
        assert err.value.exit_code == 2
        assert sock.stat().st_mode & 0o777 == 0o666
        log = [json.loads(x) for x in (tmp_path / "state" / "audit.log").read_text().splitlines()]
        assert log[-1]["outcome"] == "failed" and "unknown field" in log[-1]["reason"]
    finally:
        server.shutdown()
        server.server_close()


# ---- the systemd unit ------------------------------------------------------------------------------------
def test_the_systemd_unit_is_valid(tmp_path):
    from torchrig.hostd.unit import UNIT_NAME, plan_install

    plan = plan_install(
        Path("/run/torchrig/torchrig.sock"), Path("/var/lib/torchrig-host"), "torchrig-admin", tmp_path
    )
    assert plan.path == tmp_path / UNIT_NAME
    unit = tmp_path / UNIT_NAME
    unit.write_text(plan.text)
    if shutil.which("systemd-analyze"):
        r = subprocess.run(
            ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0 and "Unknown" not in r.stderr and "nvalid" not in r.stderr, r.stderr
    import configparser

    cp = configparser.ConfigParser(strict=True, interpolation=None)
    cp.read_string(plan.text)
    argv = cp["Service"]["ExecStart"].split()
    assert argv[1:5] == ["-m", "torchrig", "host", "serve"] and Path(argv[0]).is_absolute()
    assert cp["Service"]["StateDirectoryMode"] == "0700" and cp["Install"]["WantedBy"] == "multi-user.target"


def test_a_unit_elsewhere_than_run_and_var_lib_is_refused():
    from torchrig.hostd.unit import render_unit

    with pytest.raises(UsageError, match="/run/torchrig"):
        render_unit("/usr/bin/python3", Path("/tmp/x.sock"), Path("/var/lib/t"), "torchrig-admin")
    with pytest.raises(UsageError, match="cannot be written"):
        render_unit("/usr/bin/python3", Path("/run/torchrig/t.sock"), Path("/var/lib/t"), "adm$in")


def test_every_test_the_threat_model_names_exists():
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "threat-model.md").read_text()
    files = {"U": root / "tests/unit/test_hostd.py", "H": root / "tests/integration/test_host_daemon.py"}
    named = re.findall(r"`([UH])::(test_\w+)`", text)
    assert len(named) >= 10
    for which, name in named:
        assert f"def {name}(" in files[which].read_text(), (which, name)
