"""torchrig launch end to end with real torchrun and gloo: pre-flight, per-rank logs, and the failure and
planted-hang summaries within the configured timeout; docs/cluster.md's CPU launch as the page writes it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import docblocks  # tests/docblocks.py

SCRIPT = str(
    Path(__file__).resolve().parents[1] / "fixtures" / "launch" / "ok.py"
)  # MODE=fail|hang plants faults
EXITS = str(SCRIPT).replace("ok.py", "exits.py")  # MODE=exitmsg|termhandler: scripts that end themselves


# torch 2.13's gloo keeps a flight record by default; the tests say which they want, whatever a release's default.
GLOO_FR = ("--env", "TORCH_FR_BUFFER_SIZE=2000")
GLOO_NO_FR = ("--env", "TORCH_FR_BUFFER_SIZE=0")


def launch(*args: str, mode: str = "", timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    env["MODE"] = mode
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "torchrig", "--json", "launch", "--cpu", "--nproc-per-node", "2", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    return r, time.monotonic() - t0


def test_the_cluster_pages_cpu_launch_runs_as_written(tmp_path):
    """docs/cluster.md, "One box", as the page writes it: the pre-flight lines it shows (the free port, the
    times and the log folder are this run's), then each rank's logs in the folder the summary names."""
    node = "tests/integration/test_launch_run.py::test_the_cluster_pages_cpu_launch_runs_as_written"
    (block,) = docblocks.tested_by(docblocks.ROOT / "docs" / "cluster.md", node)
    ((cmd, shown),) = block.steps()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    r = docblocks.run(cmd, tmp_path, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout + r.stderr
    vary = {r"port \d+ is free": "port P is free", r"\d+\.\d s\b": "T s", r"logs: \S+": "logs: DIR"}
    assert not docblocks.missing(said, shown, vary), said[-3000:]
    run_dir = Path(re.findall(r"logs: (\S+)", said)[-1])
    for rank in (0, 1):
        assert (run_dir / "attempt_0" / str(rank) / "stdout.log").is_file()
        assert (
            f"torchrig-worker: rank={rank}" in (run_dir / "attempt_0" / str(rank) / "stderr.log").read_text()
        )
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


def test_failure_summary_names_the_rank_and_its_error(tmp_path):
    r, _ = launch("--no-preflight", "--log-dir", str(tmp_path), SCRIPT, mode="fail")
    assert r.returncode == 1
    s = json.loads(r.stdout)["result"]["summary"]
    assert s["kind"] == "failed" and s["headline"].startswith("rank 1 failed")
    assert "ValueError: planted failure" in s["likely_cause"]
    culprit = next(v for v in s["ranks"] if v["role"] == "culprit")
    assert culprit["rank"] == 1 and any("planted failure" in ln for ln in culprit["last_lines"])


def test_a_sys_exit_with_a_message_is_the_cause_with_the_line_that_exited(tmp_path):
    r, _ = launch("--no-preflight", "--log-dir", str(tmp_path), EXITS, mode="exitmsg")
    assert r.returncode == 1
    s = json.loads(r.stdout)["result"]["summary"]
    assert s["headline"].startswith("rank 1 failed (exit 1)"), s
    assert (
        s["likely_cause"]
        == "the script ended itself with sys.exit and the message: bad config: lr must be positive"
    )
    culprit = next(v for v in s["ranks"] if v["role"] == "culprit")
    assert culprit["rank"] == 1 and culprit["where"] == f"{EXITS}:10 in <module>", culprit


def test_a_rank_whose_sigterm_handler_exits_is_a_victim_not_a_second_culprit(tmp_path):
    """torchrun stops the other ranks with SIGTERM after rank 1 fails; rank 0's handler then calls
    sys.exit(1). That exit status is torchrun's stop, not a failure of rank 0's own."""
    r, _ = launch("--no-preflight", "--log-dir", str(tmp_path), EXITS, mode="termhandler")
    assert r.returncode == 1
    s = json.loads(r.stdout)["result"]["summary"]
    assert s["headline"].startswith("rank 1 failed"), s
    assert "ValueError: planted failure" in s["likely_cause"]
    roles = {v["rank"]: (v["role"], v["cause"]) for v in s["ranks"]}
    assert roles[1][0] == "culprit" and roles[0] == (
        "victim",
        "stopped by torchrun after another rank failed: the script's SIGTERM handler ended it with sys.exit(1)",
    ), roles


def test_planted_hang_is_summarised_within_the_collective_timeout(tmp_path):
    r, took = launch(
        "--no-preflight", "--collective-timeout", "10", "--log-dir", str(tmp_path), SCRIPT, mode="hang"
    )
    assert r.returncode == 1
    s = json.loads(r.stdout)["result"]["summary"]
    assert s["headline"] == "rank 0 timed out in a collective that rank 1 never joined"
    culprit = next(v for v in s["ranks"] if v["role"] == "culprit")
    assert culprit["rank"] == 1 and culprit["where"].endswith("ok.py:6 in <module>")
    assert took < 10 + 60  # the timeout plus start-up and teardown on a loaded 2-core machine


def test_hang_watchdog_dumps_stacks_and_stops_the_job(tmp_path):
    r, took = launch(
        "--no-preflight", "--hang-timeout", "30", *GLOO_FR, "--log-dir", str(tmp_path), SCRIPT, mode="hang"
    )
    assert r.returncode == 1
    res = json.loads(r.stdout)["result"]
    assert res["hung"] and res["summary"]["kind"] == "hang"
    # the flight records name the culprit first (the rank that never called the collective)
    assert res["summary"]["headline"] == "hang: rank 1 never arrived at the collective that rank 0 wait(s) in"
    assert res["summary"]["evidence"].startswith(
        "no rank wrote to its log for 30 s (--hang-timeout, as asked)"
    )
    # Asked by the launcher, both gloo ranks (recorder on) wrote their flight records, naming the missed call.
    assert [Path(p).name for p in res["flight_records"]] == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    assert res["flight"]["culprits"] == [1]
    assert res["flight"]["headline"].startswith(
        "rank 1 never called collective #2 (gloo:all_reduce Float[3]) of process group 0 (default_pg), "
        "which rank 0 waits in at "
    )
    assert took < 30 + 60


def test_a_desync_is_named_by_the_flight_records(tmp_path):
    """Rank 1 broadcasts where rank 0 all-reduces: both wait forever in a collective, and only the flight
    records tell that the two calls differ."""
    r, took = launch(
        "--no-preflight", "--hang-timeout", "15", *GLOO_FR, "--log-dir", str(tmp_path), SCRIPT, mode="desync"
    )
    assert r.returncode == 1
    res = json.loads(r.stdout)["result"]
    assert res["stopped_by"] == "hang-timeout"
    assert res["summary"]["headline"] == "hang: every rank waits in a collective (rank 0, rank 1)"
    h = res["flight"]["headline"]
    assert h.startswith("the ranks called collective #2 of process group 0 (default_pg) differently")
    assert "rank 0: gloo:all_reduce Float[3]" in h and "rank 1: gloo:broadcast Float[5]" in h
    assert took < 15 + 60


def test_nccl_watchdog_timeout_stops_a_job_pytorch_leaves_running(tmp_path):
    """Rank 0 logs NCCL's watchdog timeout (lines recorded on 2x H200, where torch 2.11 then kept the process
    alive) and waits in a collective rank 1 never joins: the job ends the grace after that line, without a
    hang timeout, and the summary quotes the watchdog."""
    r, took = launch(
        "--no-preflight",
        "--nccl-timeout-grace",
        "5",
        *GLOO_NO_FR,
        "--log-dir",
        str(tmp_path),
        SCRIPT,
        mode="nccl",
    )
    assert r.returncode == 1, r.stderr[-2000:]
    res = json.loads(r.stdout)["result"]
    assert res["hung"] and res["stopped_by"] == "nccl-timeout"
    # torchrig asked the ranks for their records, but their recorder was off: none written, no verdict.
    assert res["flight_records"] == [] and res["flight"] is None
    assert res["stop_reason"].startswith("rank 0's NCCL watchdog caught a collective timeout")
    s = res["summary"]
    assert s["headline"] == "hang: rank 1 never joined the collective that rank 0 wait(s) in"
    assert (
        "ALLREDUCE #11 timed out after 15 s (NCCL watchdog), but the process did not end by itself"
        in s["likely_cause"]
    )
    assert (
        took < 5 + 60
    )  # the grace plus start-up and teardown on a loaded 2-core machine (collective timeout 600)


def test_port_in_use_stops_before_the_script_runs(tmp_path):
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        r, _ = launch("--rdzv-endpoint", f"localhost:{port}", "--log-dir", str(tmp_path), SCRIPT)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    rep = json.loads(r.stdout)
    port_check = next(f for f in rep["preflight"] if f["id"] == "port")
    assert port_check["severity"] == "error" and str(port) in port_check["summary"]
    assert rep["result"] is None and not list(tmp_path.iterdir())  # nothing was started


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"]
)
def test_a_signal_to_the_launcher_cancels_the_job_with_a_summary(tmp_path, sig, code):
    """A scheduler cancelling the job (Slurm's scancel: SIGTERM) or Ctrl-C: the launcher stops torchrun and the
    ranks, says the job was cancelled, and exits 128 + the signal's number."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    env["MODE"] = "hang"  # rank 1 sleeps after the first all_reduce: the job runs until it is stopped
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchrig", "--json", "launch", "--cpu", "--nproc-per-node", "2", "--no-preflight",
         "--log-dir", str(tmp_path), SCRIPT],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any("sum [2.0" in p.read_text() for p in tmp_path.glob("*/attempt_0/*/stdout.log")):
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.5)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err[-3000:]
    res = json.loads(out)["result"]
    assert res["cancelled_by"] == sig.name and res["stopped_by"] == "cancelled" and res["summary"] is None
    reason = "interrupted (SIGINT, Ctrl-C)" if sig == signal.SIGINT else "SIGTERM from outside the job"
    assert res["stop_reason"].startswith(reason)
    assert f"torchrig launch: cancelled: {reason}" in err
    pids = [
        int(m)
        for p in tmp_path.glob("*/attempt_0/*/stderr.log")
        for m in re.findall(r" pid=(\d+)", p.read_text())
    ]
    assert len(pids) == 2
    for pid in pids:  # no rank left: gone, or at most a zombie its reaper has not collected yet
        with contextlib.suppress(FileNotFoundError):
            assert Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z", (
                f"rank pid {pid} still runs"
            )


def test_gpus_torch_cannot_use_stop_the_job_that_started_on_nvmls_word(tmp_path):
    """No cached GPU probe: the plan comes from NVML (the recorded 1x H200's answers, replayed at the pynvml
    boundary in the launcher only) and the job starts at once; this host's torch, probed for real beside
    it, cannot use that GPU, so the job is stopped with torch's finding, and nothing is cached."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host's torch can use a GPU: the finding would be ok")
    pytest.importorskip("pynvml")  # the replay keeps pynvml's own constants and errors
    tests = str(Path(__file__).resolve().parents[1])
    script = tmp_path / "job.py"
    script.write_text("import time\nprint('job started', flush=True)\ntime.sleep(300)\n")
    launcher = (
        f"import sys; sys.path.insert(0, {tests!r}); import nvmlreplay; "
        "nvmlreplay.install('h200x1-driver580-cu130'); from torchrig.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "CUDA_VISIBLE_DEVICES")}
    env["TORCHRIG_CACHE_DIR"] = str(tmp_path / "cache")
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            launcher,
            "--json",
            "launch",
            "--log-dir",
            str(tmp_path / "logs"),
            str(script),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["plan"]["backend"] == "nccl" and rep["plan"]["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    found = {f["id"]: f for f in rep["preflight"]}
    assert list(found) == ["gpus", "port", "p2p", "cuda", "process-group"]
    assert found["gpus"]["summary"] == "1 GPU(s) selected: 0 (NVIDIA H200)"
    assert found["cuda"]["severity"] == "error"
    assert re.fullmatch(
        r"torch \S+ sees no CUDA device( \(a CPU build\))?; the job was given GPU\(s\) 0",
        found["cuda"]["summary"],
    )
    assert found["process-group"]["summary"] == "skipped: an earlier pre-flight check failed"
    res = rep["result"]
    assert (
        res["stopped_by"] == "preflight" and not res["hung"] and res["summary"] is None
    )  # not the job's fault
    assert "the pre-flight cuda check failed beside the job" in res["stop_reason"]
    run_dir = Path(res["run_dir"])
    assert "job started" in (run_dir / "attempt_0" / "0" / "stdout.log").read_text()  # it ran beside
    assert not (tmp_path / "cache" / "launch-gpu-probe.json").exists()  # the next launch checks again
    assert took < 120, took
    assert "pre-flight cuda: error: torch" in r.stderr
