"""One run holds a run folder: OUT/.torchrig.lock, an flock that dies with its holder. Two processes that
take it at the same moment (20 rounds, real processes): exactly one gets it; the other is refused with who
holds it (host, pid, user, since), exit 2."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchrig.errors import UsageError
from torchrig.train import rundir

ROUNDS = 20


def _contender(out: str, start, tried, results) -> None:
    start.wait()
    try:
        with rundir.hold(Path(out)):
            results.put(("held", os.getpid()))
            tried.wait()  # hold it until the other one has tried
    except rundir.FolderBusy as e:
        results.put(("refused", e.one_line()))
        tried.wait()


def test_two_processes_taking_one_folder_at_once_exactly_one_holds_it(tmp_path):
    ctx = multiprocessing.get_context("fork")
    for n in range(ROUNDS):
        out = tmp_path / f"run{n}"
        start, tried, results = ctx.Barrier(2), ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_contender, args=(str(out), start, tried, results)) for _ in range(2)]
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=30) for _ in procs)
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        assert [g[0] for g in got] == ["held", "refused"], got
        holder = got[0][1]
        assert f"{out} is in use by another run (pid {holder} on {socket.gethostname()}, user " in got[1][1]
        assert "since 20" in got[1][1]


def test_the_lock_dies_with_its_holder_even_killed(tmp_path):
    out = tmp_path / "run"
    code = f"from pathlib import Path; from torchrig.train import rundir; import time\n" \
           f"with rundir.hold(Path({str(out)!r})):\n    print('held', flush=True); time.sleep(60)"  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(rundir.FolderBusy, match=f"pid {p.pid} on"), rundir.hold(out):
            pass
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    with rundir.hold(out):  # nothing left to clean up
        assert (out / rundir.LOCK_FILE).is_file()


def test_one_process_takes_it_again_and_ranks_of_the_holding_launcher_pass(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with rundir.hold(out), rundir.hold(out):  # the CLI and, in the same process, the loop
        pass
    code = (
        "from pathlib import Path; from torchrig.train import rundir\nwith rundir.hold(Path(%r)): print('ok')"
    )
    with rundir.hold(out):
        env = {**os.environ, rundir.LOCK_HOLDER_ENV: rundir.holder_token()}
        r = subprocess.run([sys.executable, "-c", code % str(out)], capture_output=True, text=True, env=env)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
        env[rundir.LOCK_HOLDER_ENV] = f"{os.getpid() + 1}@{socket.gethostname()}"  # not the holder
        r = subprocess.run([sys.executable, "-c", code % str(out)], capture_output=True, text=True, env=env)
        assert r.returncode != 0 and "is in use by another run" in r.stderr


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dir"])
def test_a_lock_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    out = tmp_path / "run"
    out.mkdir()
    lock = out / rundir.LOCK_FILE
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "symlink":
        lock.symlink_to("/dev/zero")
    else:
        lock.mkdir()
    t0 = time.monotonic()
    with pytest.raises(UsageError) as e, rundir.hold(out):
        pass
    assert time.monotonic() - t0 < 5
    assert str(lock) in e.value.one_line() and "\n" not in e.value.one_line()
