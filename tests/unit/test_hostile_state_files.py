"""The state files and streams torchrig reads beside a run (dashboard's bench report, serve's state file,
the kept ports and host keys, torchrun's rank logs and error files, an install's constraints): a FIFO, a
link to /dev/zero or a sparse 8 GB file in place of each is refused in one line (exit 2), or passed over
with a warning where the file is optional. Never waited on, never read whole.

Each case runs in a forked child bounded in time and memory (tests/fuzzkit.py), so a hang or a runaway read
fails the case instead of the test run.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit
from torchrig.errors import TorchrigError

TIME_LIMIT_S = 20
GROWTH_LIMIT_MIB = 256  # resident memory the child may add: 8 GB read whole would be far past it
READ_LIMIT_MIB = 64  # bytes the child may read: a bounded tail is at most a few MB

KINDS: dict[str, Callable[[Path], None]] = {
    "fifo": lambda p: os.mkfifo(p),
    "dev-zero": lambda p: p.symlink_to("/dev/zero"),
    "sparse-8g": lambda p: os.truncate(p.open("wb").name, 8 << 30),
}
INVENTORY = fuzzkit.FIXTURES / "runtime" / "inventory-8xh200.json"


def bounded(tmp_path: Path, fn: Callable[[], object]) -> fuzzkit.Outcome:
    """``fn()`` in a bounded child: exit 0 with its result printed, or 2 with a TorchrigError's one line."""

    def child() -> int:
        try:
            print(repr(fn()))
        except TorchrigError as err:
            print(f"torchrig: error: {err.one_line()}", file=sys.stderr)
            return 2
        return 0

    out = fuzzkit.run_bounded(child, ["<call>"], cwd=tmp_path, time_limit_s=TIME_LIMIT_S)
    fuzzkit.check(out)  # no signal (time limit), no traceback, exit 0/1/2
    assert out.elapsed_s < TIME_LIMIT_S, out.describe()
    assert out.grew_kib is not None and out.grew_kib < GROWTH_LIMIT_MIB * 1024, out.describe()
    assert out.read_bytes is not None and out.read_bytes < READ_LIMIT_MIB << 20, out.describe()
    return out


def one_line_exit_2(out: fuzzkit.Outcome, needle: str) -> None:
    assert out.code == 2, out.describe()
    assert out.err.count("\n") == 1 and out.err.startswith("torchrig: error: "), out.describe()
    assert needle in out.err, out.describe()


def refusal(kind: str) -> str:
    return "bytes, more than" if kind == "sparse-8g" else "not a regular file"


@pytest.mark.parametrize("kind", KINDS)
def test_serve_state_file_fails_the_health_check_in_one_line(tmp_path, kind):
    from torchrig.contract import SERVE_STATE_DIR, SERVE_STATE_FILE
    from torchrig.serve import health
    from torchrig.serve.config import make_config

    home = tmp_path / "home"
    (home / SERVE_STATE_DIR).mkdir(parents=True)
    KINDS[kind](home / SERVE_STATE_DIR / SERVE_STATE_FILE)
    cfg = make_config({}, {}, home, "user")
    out = bounded(tmp_path, lambda: [(p.service, p.ok, p.detail) for p in health.check(cfg)])
    assert out.code == 0 and "('serve', False, " in out.out and "serve state file" in out.out, out.describe()
    assert refusal(kind) in out.out, out.describe()


@pytest.mark.parametrize("kind", KINDS)
def test_serve_lock_holder_with_a_hostile_state_file_is_still_one_line(tmp_path, kind):
    import fcntl

    from torchrig.contract import SERVE_STATE_FILE
    from torchrig.serve.supervisor import hold_serve_lock

    state = tmp_path / "state"
    state.mkdir()
    KINDS[kind](state / SERVE_STATE_FILE)
    held = os.open(state / "serve.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the running serve; the child's own open is refused
        one_line_exit_2(bounded(tmp_path, lambda: hold_serve_lock(state)), "already running")
    finally:
        os.close(held)


@pytest.mark.parametrize("kind", KINDS)
def test_dashboard_bench_report_is_passed_over_with_the_reason(tmp_path, kind):
    out = fuzzkit.call(
        ["dashboard", "--once", "--json", "--no-doctor", "--inventory", str(INVENTORY), "--bench", "b"],
        prepare=lambda work: (work / "b").mkdir() or KINDS[kind](work / "b" / "bench.json"),
    )
    fuzzkit.check(out)
    assert out.code == 0 and "no readable bench report" in out.out and refusal(kind) in out.out, (
        out.describe()
    )


@pytest.mark.parametrize("kind", KINDS)
def test_dashboard_bench_plot_is_not_served(tmp_path, kind):
    from torchrig.dashboard.server import _bench_png

    KINDS[kind](tmp_path / "bench.png")
    out = bounded(tmp_path, lambda: _bench_png(str(tmp_path)))
    assert out.code == 0 and out.out.strip() == "None", out.describe()


@pytest.mark.parametrize("kind", KINDS)
def test_kept_ports_record_is_passed_over_with_a_warning(tmp_path, kind):
    from torchrig.runtime import ports

    (tmp_path / "ports").mkdir()
    KINDS[kind](tmp_path / "ports" / "env1.json")
    out = bounded(tmp_path, lambda: ports.remembered("env1", tmp_path))
    assert out.code == 0 and out.out.strip() == "{}", out.describe()
    assert out.err.startswith("torchrig: warning: ports record") and out.err.count("\n") == 1, out.describe()


@pytest.mark.parametrize("kind", KINDS)
def test_kept_host_key_is_refused_in_one_line(tmp_path, kind):
    from torchrig.contract import SSH_HOST_KEY_NAME
    from torchrig.runtime import hostkey

    d = tmp_path / "hostkeys" / "env1"
    d.mkdir(parents=True)
    KINDS[kind](d / SSH_HOST_KEY_NAME)
    (d / f"{SSH_HOST_KEY_NAME}.pub").write_text("ssh-ed25519 AAAA torchrig-env1\n")
    one_line_exit_2(bounded(tmp_path, lambda: hostkey.ensure("env1", tmp_path)), "host key")


@pytest.mark.parametrize("kind", KINDS)
def test_ssh_public_key_given_is_refused_in_one_line(tmp_path, kind):
    from torchrig.runtime.up import find_ssh_key

    KINDS[kind](tmp_path / "k.pub")
    one_line_exit_2(bounded(tmp_path, lambda: find_ssh_key(str(tmp_path / "k.pub"))), "SSH public key")


@pytest.mark.parametrize("kind", KINDS)
def test_install_constraint_file_is_exit_2(kind):
    out = fuzzkit.call(
        ["install", "--dry-run", "--constraint", "k.txt"], prepare=lambda w: KINDS[kind](w / "k.txt")
    )
    fuzzkit.check(out)
    assert out.elapsed_s < TIME_LIMIT_S, out.describe()
    one_line_exit_2(out, "--constraint file")


@pytest.mark.parametrize("kind", KINDS)
def test_ca_cert_is_refused_in_one_line(tmp_path, kind):
    from torchrig.image.context import certificates

    KINDS[kind](tmp_path / "ca.pem")
    one_line_exit_2(bounded(tmp_path, lambda: certificates(tmp_path / "ca.pem")), "--ca-cert file")


# ---------------------------------------------------------------- torchrun's rank logs (streams)


def _attempt(tmp_path: Path, kind: str, name: str) -> Path:
    """An attempt folder of one rank whose ``name`` is replaced by ``kind`` (the other logs are real)."""
    rank = tmp_path / "run_x" / "attempt_0" / "0"
    rank.mkdir(parents=True)
    (rank / "stdout.log").write_text("step 1\n")
    (rank / "stderr.log").write_text(
        "torchrig-worker: rank=0 local_rank=0 world_size=1 restart=0 pid=4242 host=h\nTraceback: boom\n"
    )
    target = rank / name
    target.unlink(missing_ok=True)
    KINDS[kind](target)
    return rank.parent


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["stdout.log", "stderr.log", "output.log", "error.json"])
def test_a_rank_log_is_read_bounded_or_passed_over(tmp_path, kind, name):
    from torchrig.launch import logs

    attempt = _attempt(tmp_path, kind, name)

    def read() -> object:
        ranks = logs.read_attempt(attempt, {})
        tail = logs.LogTail()
        return (
            [len(r.text) + len(r.output) for r in ranks],
            logs.rank_pids(attempt),
            tail.find(attempt, "boom"),
        )

    out = bounded(tmp_path, read)
    assert out.code == 0, out.describe()
    sizes, pids, _found = ast.literal_eval(out.out.strip())
    assert max(sizes) < 2 * (logs.LOG_HEAD_BYTES + logs.LOG_TAIL_BYTES) + 1024, out.describe()  # ends only
    if name == "stderr.log":  # the header is gone with the log: the rank's pid is unknown, not a hang
        assert pids == {}, out.describe()
    else:
        assert pids == {4242: 0}, out.describe()


def test_a_runaway_log_keeps_its_head_and_its_tail(tmp_path):
    from torchrig.launch import logs

    log = tmp_path / "stderr.log"
    with log.open("wb") as f:
        f.write(b"HEADER\n")
        f.truncate(1 << 30)  # 1 GiB of zeros, sparse
        f.seek(0, os.SEEK_END)
        f.write(b"\nTraceback (most recent call last):\nRuntimeError: the end\n")
    text = logs._read(log)
    assert text.startswith("HEADER") and text.endswith("RuntimeError: the end\n")
    assert "bytes left out]" in text
    assert len(text) <= logs.LOG_HEAD_BYTES + logs.LOG_TAIL_BYTES + 100


def test_a_log_tail_reads_in_bounded_steps(tmp_path):
    from torchrig.launch import logs

    attempt = tmp_path / "attempt_0"
    (attempt / "0").mkdir(parents=True)
    log = attempt / "0" / "stderr.log"
    with log.open("wb") as f:
        f.truncate(3 * logs.LOG_TAIL_BYTES)
        f.seek(0, os.SEEK_END)
        f.write(b"\nWatchdog caught collective operation timeout\n")
    tail = logs.LogTail()
    found = [tail.find(attempt, "Watchdog") for _ in range(4)]
    assert found[:3] == [None, None, None]  # one bounded step a look
    assert found[3] == (0, "Watchdog caught collective operation timeout")


# ---------------------------------------------------------------- the bounded readers themselves


def test_read_head_reads_kernel_files_whatever_their_size_says():
    from torchrig import inputfiles

    assert os.stat("/proc/self/status").st_size == 0
    text = inputfiles.read_head("/proc/self/status", "kernel file", max_bytes=1 << 20).decode()
    assert text.startswith("Name:") and "Pid:" in text
    assert len(inputfiles.read_head("/proc/self/status", "kernel file", max_bytes=10)) == 10
    assert inputfiles.read_proc("/proc/self/no-such-file") is None
    assert "Pid:" in (inputfiles.read_proc("/proc/self/status") or "")


@pytest.mark.parametrize("kind", KINDS)
def test_the_readers_refuse_or_bound_each_kind_at_once(tmp_path, kind):
    from torchrig import inputfiles

    p = tmp_path / "f"
    KINDS[kind](p)
    if kind == "sparse-8g":  # a regular file: read in bounded steps, never whole
        assert inputfiles.read_head(p, "f", max_bytes=100) == b"\0" * 100
        assert inputfiles.read_from(p, "f", -100, max_bytes=100) == b"\0" * 100
        assert len(inputfiles.read_from(p, "f", 5, max_bytes=1 << 20)) == 1 << 20
        with pytest.raises(inputfiles.InputError, match="bytes, more than"):
            inputfiles.read_bytes(p, "f")
    else:
        for read in (
            lambda: inputfiles.read_head(p, "f", max_bytes=100),
            lambda: inputfiles.read_from(p, "f", 0, max_bytes=100),
        ):
            with pytest.raises(inputfiles.InputError, match="not a regular file"):
                read()
        assert inputfiles.read_proc(p) is None


def test_read_from_a_negative_offset_is_the_tail(tmp_path):
    from torchrig import inputfiles

    p = tmp_path / "log"
    p.write_bytes(b"0123456789")
    assert inputfiles.read_from(p, "log", -4, max_bytes=4) == b"6789"
    assert inputfiles.read_from(p, "log", -40, max_bytes=40) == b"0123456789"
    assert inputfiles.read_from(p, "log", 8, max_bytes=40) == b"89"
