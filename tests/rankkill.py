"""Kill one bench rank mid-run, from outside, as the OOM killer or a user would: shared by the CPU (gloo) and
GPU (NCCL) tests that check the launcher's failure summary names it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _rank_pid(tmp_path: Path, root: int, rank: int) -> int | None:
    """The bench worker of ``rank``, once launch's shim has written its header (it is known by its rank
    then); the pre-flight's own ranks, which log beside it, are left alone."""
    from torchrig.launch.guard import descendants

    logs = [p for p in tmp_path.rglob(f"{rank}/stderr.log") if "-preflight_" not in str(p)]
    if not any(f"torchrig-worker: rank={rank} " in p.read_text() for p in logs):
        return None
    for pid in descendants(root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"torchrig.bench.worker" in cmd and f"\0RANK={rank}\0".encode() in environ:
            return pid
    return None


def bench_with_a_killed_rank(tmp_path: Path, *options: str, rank: int = 1) -> tuple[int, str, str]:
    """Run ``torchrig bench OPTIONS --json`` with its temporary folders (the logs kept after a failure) in
    ``tmp_path``, SIGKILL ``rank``'s worker once it runs, and return (exit status, stdout, stderr)."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    argv = [sys.executable, "-m", "torchrig", "bench", *options, "--json"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    deadline, victim = time.monotonic() + 180, None
    try:
        while victim is None:
            assert proc.poll() is None, f"bench exited early: {proc.communicate()[1][-2000:]}"
            assert time.monotonic() < deadline, f"bench never started its rank {rank}"
            time.sleep(0.2)
            victim = _rank_pid(tmp_path, proc.pid, rank)
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def check_the_summary_names_it(tmp_path: Path, code: int, out: str, err: str) -> None:
    """The failure is launch's summary: the rank, how it ended, the likely cause, where its logs are kept."""
    import json

    assert code == 1, err[-3000:]
    message = json.loads(out)["error"]["message"]
    assert message.startswith("bench workers failed: rank 1 failed (killed by SIGKILL"), message
    assert "likely cause: the process was killed with SIGKILL" in message
    assert "rank 1 (local 1" in err and "culprit: killed by SIGKILL from outside the job" in err, err[-3000:]
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("torchrig-bench-logs-")]
    assert len(kept) == 1 and str(kept[0]) in message
    assert any(kept[0].rglob("stderr.log")), "the ranks' logs are kept after the failure"
