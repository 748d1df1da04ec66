"""The guard between ``torchrig launch`` and torchrun, with real processes and real signals.

torchrun's elastic agent does not survive a second SIGTERM: it interrupts the agent's shutdown before its log
tailers stop, and torchrun then waits for them forever at exit. A SIGKILLed launcher with several threads
delivers its PR_SET_PDEATHSIG once per thread the child is handed to, so two or three SIGTERMs were common
(torchrun left behind after 9 of 46 launcher kills on this 2-core machine). Here a small Python child stands in
for torchrun and writes down every SIGTERM it gets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from torchrig.launch import guard

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux's")

# Stands in for torchrun: records each SIGTERM; exits 7 one second after the first unless told to ignore it;
# with SPAWN, first starts a grandchild in a session of its own (as torchrun starts its ranks).
CHILD = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    log, mode = sys.argv[1], sys.argv[2]
    first = []
    def on_term(*_):
        with open(log, "a") as f:
            f.write(f"{time.monotonic()}\\n")
        first.append(time.monotonic())
    signal.signal(signal.SIGTERM, on_term)
    def mark(path, text):  # whole or absent: the test polls for the file and reads it at once
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    if "spawn" in mode:
        kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        mark(log + ".kid", str(kid.pid))
    mark(log + ".ready", str(os.getpid()))
    if "die" in mode:
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if first and "ignore" not in mode and time.monotonic() - first[0] > 1.0:
            sys.exit(7)
        time.sleep(0.05)
    """
)


def _start(tmp_path: Path, mode: str, grace_s: float = 3.0) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "child.py").write_text(CHILD)
    log = tmp_path / "terms.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchrig.launch.guard", str(grace_s), "--",
         sys.executable, str(tmp_path / "child.py"), str(log), mode],
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not Path(f"{log}.ready").exists() or ("spawn" in mode and not Path(f"{log}.kid").exists()):
        assert proc.poll() is None or "die" in mode, f"guard exited early ({proc.returncode})"
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    return proc, log


def _terms(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_three_stop_signals_reach_the_child_once_and_its_status_comes_back(tmp_path):
    """Spaced out, so that each is handled on its own (signals sent all at once would merge while pending)."""
    proc, log = _start(tmp_path, "plain")
    for _ in range(3):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
    assert proc.wait(timeout=30) == 7
    assert _terms(log) == 1


def test_a_child_that_ignores_the_stop_is_killed_after_the_grace_with_its_own_session_grandchild(
    tmp_path, alive
):
    proc, log = _start(tmp_path, "ignore+spawn", grace_s=2.0)
    child, kid = int(Path(f"{log}.ready").read_text()), int(Path(f"{log}.kid").read_text())
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
    took = time.monotonic() - t0
    assert code == 128 + signal.SIGKILL
    assert 2.0 <= took < 15, f"stopped after {took:.1f} s with a grace of 2 s"
    assert _terms(log) == 1
    assert not alive(child) and not alive(kid), "the child or its grandchild outlived the guard"


def test_ranks_orphaned_by_a_dead_torchrun_are_killed(tmp_path, alive):
    proc, log = _start(tmp_path, "die+spawn")
    kid = int(Path(f"{log}.kid").read_text())
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL
    assert not alive(kid), "the grandchild orphaned by its SIGKILLed parent was left running"


def test_a_multithreaded_launcher_sigkilled_gives_the_child_one_sigterm(tmp_path, alive):
    """The real case: the launcher's own code (guard.die_with_parent) arms PDEATHSIG on the guard, the
    launcher has several threads (its output pumps), and SIGKILL takes it. The child must see one SIGTERM,
    stop, and nothing may be left."""
    (tmp_path / "child.py").write_text(CHILD)
    log = tmp_path / "terms.log"
    launcher = tmp_path / "launcher.py"
    launcher.write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys, threading, time
            from torchrig.launch.guard import die_with_parent
            for _ in range(4):
                threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
            g = subprocess.Popen([sys.executable, "-m", "torchrig.launch.guard", "5", "--", sys.executable,
                                  {str(tmp_path / "child.py")!r}, {str(log)!r}, "plain"],
                                 start_new_session=True, preexec_fn=die_with_parent)
            print(g.pid, flush=True)
            time.sleep(600)
            """
        )
    )
    lp = subprocess.Popen([sys.executable, str(launcher)], stdout=subprocess.PIPE, text=True)
    guard_pid = int(lp.stdout.readline())
    deadline = time.monotonic() + 60
    while not Path(f"{log}.ready").exists():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    child = int(Path(f"{log}.ready").read_text())
    lp.kill()
    lp.wait(timeout=30)
    deadline = time.monotonic() + 20
    while (alive(guard_pid) or alive(child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(guard_pid) and not alive(child), "the guard or its child outlived the SIGKILLed launcher"
    assert _terms(log) == 1


def test_usage_errors_are_one_line_and_exit_2():
    for args in ([], ["x", "--", "true"], ["5", "true"], ["5", "--"], ["-1", "--", "true"]):
        proc = subprocess.run(
            [sys.executable, "-m", "torchrig.launch.guard", *args], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2, args
        assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("usage:"), proc.stderr


def test_a_command_that_cannot_start_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "torchrig.launch.guard", "5", "--", str(tmp_path / "missing")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 127
    assert proc.stderr.strip().count("\n") == 0 and "cannot start" in proc.stderr, proc.stderr


def test_descendants_reads_the_tree_from_proc(tmp_path):
    """Parents before children; zombies skipped; a process name with spaces and parentheses parsed."""

    def stat(pid: int, comm: str, state: str, ppid: int) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 4194560\n")

    stat(10, "guard", "S", 1)
    stat(11, "torchrun", "S", 10)
    stat(12, "py (rank) 0", "R", 11)
    stat(13, "dead", "Z", 11)
    stat(14, "loader", "S", 12)
    stat(20, "other", "S", 1)
    (tmp_path / "self").mkdir()
    assert guard.descendants(10, str(tmp_path)) == [11, 12, 14]
    assert guard.descendants(14, str(tmp_path)) == []
    # The real /proc: a child started here is found under this process, and is gone once reaped. (Not "this
    # process has no children": after a compiling test, Inductor's compile workers are children of pytest.)
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert kid.pid in guard.descendants(os.getpid())
    finally:
        kid.kill()
        kid.wait()
    assert kid.pid not in guard.descendants(os.getpid())
