"""Failure and hang summaries from real torchrun logs (recorded from gloo runs, tests/fixtures/launch/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from torchrig.launch import logs
from torchrig.launch.ranklog import Frame, RankLog, in_collective, parse_stack, user_frame
from torchrig.launch.summary import render, summarize_failure, summarize_hang

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "launch"


def read(case):
    d = FIX / case
    agent = (d / "torchrun.txt").read_text()
    return logs.read_attempt(d / "attempt_0", logs.exit_codes_by_pid(agent), logs.closed_by_agent(agent))


def by_rank(summary):
    return {v.rank: v for v in summary.ranks}


def test_exception_names_the_rank_and_its_error():
    s = summarize_failure(read("gloo-2rank-rank1-raises"), 0)
    v = by_rank(s)
    assert v[1].role == "culprit" and v[1].status == "exit 1"
    assert "ValueError: planted failure" in s.likely_cause
    assert any("planted failure" in ln for ln in v[1].last_lines)
    assert "rank 1" in s.headline
    text = render(s)
    assert "rank 1" in text and "culprit" in text


def test_collective_timeout_blames_the_rank_that_never_joined():
    ranks = read("gloo-2rank-rank1-sleeps-collective-timeout")
    assert {r.global_rank: r.exit_code for r in ranks} == {0: 1, 1: -15}
    s = summarize_failure(ranks, 0)
    v = by_rank(s)
    assert v[0].role == "victim" and "timed out" in v[0].cause
    assert v[1].role == "culprit" and v[1].where and v[1].where.endswith("ok.py:6 in <module>")
    assert s.headline == "rank 0 timed out in a collective that rank 1 never joined"


def test_hang_watchdog_stacks():
    ranks = read("gloo-2rank-rank1-sleeps-hang-watchdog")
    assert in_collective(ranks[0].stack) and not in_collective(ranks[1].stack)
    s = summarize_hang(ranks, 0, 4)
    assert s.kind == "hang"
    assert s.headline == "hang: rank 1 never joined the collective that rank 0 wait(s) in"
    assert by_rank(s)[1].where.endswith("ok.py:6 in <module>")


def test_sigkill_is_named():
    log = RankLog(global_rank=3, local_rank=1, host="n1", pid=9, attempt=0, text="step 5\n", exit_code=-9)
    s = summarize_failure([log], 0)
    assert (
        s.ranks[0].status == "killed by SIGKILL from outside the job: neither torchrun nor torchrig sent it"
    )
    assert "OOM killer" in s.likely_cause


def test_oom_and_nccl_watchdog_patterns():
    oom = RankLog(
        0,
        0,
        None,
        1,
        0,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        exit_code=1,
    )
    assert "out of memory" in summarize_failure([oom], 0).likely_cause
    wd = RankLog(
        0,
        0,
        None,
        1,
        0,
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
        "OpType=ALLREDUCE, Timeout(ms)=20000) ran for 20001 milliseconds",
        exit_code=-6,
    )
    other = RankLog(
        1,
        1,
        None,
        2,
        0,
        "",
        exit_code=-15,
        stack=(Frame("/job/train.py", 40, "step"), Frame("/x/torchrig/launch/worker.py", 50, "run")),
    )
    s = summarize_failure([wd, other], 0)
    assert by_rank(s)[1].role == "culprit" and by_rank(s)[0].role == "victim"


def test_parse_stack_picks_the_main_thread_of_the_last_dump():
    text = """noise
Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f00 (most recent call first):
  File "/job/a.py", line 3 in old
  File "/src/torchrig/launch/worker.py", line 50 in run
later output
Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f00 (most recent call first):
  File "/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/job/a.py", line 9 in new
  File "/src/torchrig/launch/worker.py", line 50 in run
"""
    stack = parse_stack(text)
    assert stack[0].func == "all_reduce" and in_collective(stack)
    assert str(user_frame(stack)) == "/job/a.py:9 in new"


def test_lost_peer_named_in_both_gloo_forms():
    from torchrig.launch.ranklog import lost_peers

    # Seen in the two-namespace run: which form gloo prints depends on which side saw the reset first.
    assert lost_peers(
        "RuntimeError: [pair.cc:537] Read error [10.231.4.2]:47325: Connection reset by peer."
    ) == ["10.231.4.2"]
    assert lost_peers("RuntimeError: [pair.cc:598] Connection closed by peer [10.231.4.2]:47325") == [
        "10.231.4.2"
    ]
    assert lost_peers("no addresses here") == []


# The planted hang on 2 H200 ranks with NCCL (torch 2.11, --collective-timeout 15 --hang-timeout 40):
# rank 1 sleeps at step 5; rank 0's all-reduces are queued on the GPU and it blocks at the next host sync.
NCCL_HANG = "nccl-2rank-h200-rank1-sleeps-hang-watchdog"
# The two stack lines as they were in loop.py when the run was recorded.
RECORDED = {333: "        gn = float(full.item())", 83: "            time.sleep(3600)"}


def recorded_source(path, line):
    return RECORDED.get(line, "") if path.endswith("torchrig/train/loop.py") else ""


def test_nccl_hang_names_the_rank_that_never_joined_not_user_code():
    ranks = read(NCCL_HANG)
    assert not any(in_collective(r.stack) for r in ranks)  # no Python frame inside a collective call
    s = summarize_hang(ranks, 0, 40, source=recorded_source)
    v = by_rank(s)
    assert s.headline == "hang: rank 1 never joined the collective that rank 0 wait(s) in"
    assert v[1].role == "culprit" and v[1].where.endswith("loop.py:83 in _test_hooks")
    assert v[0].role == "victim" and v[0].status.startswith("hung: blocked in .item()")
    assert "rank 0: ALLREDUCE #11 timed out after 15 s (NCCL watchdog)" in s.likely_cause
    assert not any("<no Python frame>" in ln for r in s.ranks for ln in r.last_lines)


def test_nccl_watchdog_line_alone_marks_the_waiting_rank():
    ranks = read(NCCL_HANG)  # the source line unknown (file changed or on another host): the log decides
    s = summarize_hang(ranks, 0, 40, source=lambda path, line: "")
    v = by_rank(s)
    assert v[0].role == "victim" and "timed out on the GPU" in v[0].status
    assert v[1].role == "culprit"


# One NCCL rank on 1 H200 whose all_reduce waits behind a 60 s kernel (tests/fixtures/launch/nccl_kernel_ahead.py
# under torchrig launch --gpus 1 --collective-timeout 10; the launcher stopped it 30 s after the watchdog's line).
NCCL_ALONE = "nccl-1rank-h200-kernel-ahead-launch"


def test_one_rank_waiting_for_its_own_collective_blames_the_work_ahead_not_a_desync():
    ranks = read(NCCL_ALONE)
    assert [(r.global_rank, r.world_size) for r in ranks] == [(0, 1)]
    s = summarize_hang(ranks, 0, 0, source=lambda path, line: "    print(x[0].item())")
    assert s.headline == "hang: the only rank waits for its own collective (rank 0)"
    assert "work queued on the GPU ahead of the collective has not finished" in s.likely_cause
    assert "rank 0: ALLREDUCE #2 timed out after 10 s (NCCL watchdog)" in s.likely_cause
    assert by_rank(s)[0].status.startswith("hung: blocked in .item()")


def test_host_sync_without_watchdog_line_is_still_a_wait():
    ranks = [dataclasses.replace(r, text=r.text.replace("Watchdog caught", "x")) for r in read(NCCL_HANG)]
    s = summarize_hang(ranks, 0, 40, source=recorded_source)
    assert by_rank(s)[0].role == "victim" and by_rank(s)[1].role == "culprit"
    assert "NCCL watchdog" not in s.likely_cause


def test_no_sync_and_no_watchdog_is_user_code():
    ranks = [dataclasses.replace(r, text=r.text.replace("Watchdog caught", "x")) for r in read(NCCL_HANG)]
    s = summarize_hang(ranks, 0, 40, source=lambda path, line: "")
    assert s.headline == "hang: no rank is in a collective (rank 0, rank 1)"


def test_flight_records_of_this_job_only(tmp_path):
    import os
    import time

    from torchrig.launch.supervise import flight_records

    old = tmp_path / "nccl_trace_rank_0"
    old.write_bytes(b"x")
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # an earlier job's dump in the same folder
    start = time.time()
    for r in (1, 0):
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(b"pickle")
    (tmp_path / "stderr.log").write_text("not a dump")
    found = flight_records(tmp_path, start)
    assert [os.path.basename(f) for f in found] == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    assert flight_records(tmp_path / "missing", start) == ()


def test_report_points_at_the_flight_records():
    from torchrig.launch.run import LaunchReport
    from torchrig.launch.summary import FailureSummary
    from torchrig.launch.supervise import LaunchResult

    summary = FailureSummary("hang", "hang: rank 1 never joined", "cause", "fix", (), 0)
    result = LaunchResult(
        1, 1, True, 20.0, "/l/job_x", summary, (), ("/l/nccl_trace_rank_0", "/l/nccl_trace_rank_1")
    )
    text = LaunchReport(plan=None, findings=(), result=result, dry_run=False).render_text()
    assert "flight records: nccl_trace_rank_0, nccl_trace_rank_1 in /l" in text
    assert "torchfrtrace /l --prefix nccl_trace_rank_" in text
    assert LaunchReport(None, (), result, False).to_json()["result"]["flight_records"] == list(
        result.flight_records
    )


def test_report_gives_the_flight_records_verdict_before_the_files():
    from torchrig.launch.flightrec import FlightVerdict
    from torchrig.launch.run import LaunchReport
    from torchrig.launch.summary import FailureSummary
    from torchrig.launch.supervise import LaunchResult

    summary = FailureSummary("hang", "hang: rank 1 never joined", "cause", "fix", (), 0)
    verdict = FlightVerdict(
        "rank 1 never called collective #2", (1,), ("process group 0: rank 0: called #2",)
    )
    result = LaunchResult(
        1, 1, True, 20.0, "/l/job_x", summary, (), ("/l/nccl_trace_rank_0",), flight=verdict
    )
    lines = LaunchReport(plan=None, findings=(), result=result, dry_run=False).render_text().splitlines()
    at = lines.index("flight record: rank 1 never called collective #2")
    assert lines[at + 1] == "  process group 0: rank 0: called #2"
    assert lines[at + 2].startswith("flight records: nccl_trace_rank_0 in /l")
    assert LaunchReport(None, (), result, False).to_json()["result"]["flight"]["culprits"] == [1]


def test_report_says_finished_or_failed_once_whatever_the_flight_records():
    from torchrig.launch.run import LaunchReport
    from torchrig.launch.supervise import LaunchResult

    def text(code, records=()):
        result = LaunchResult(code, 1, False, 3.0, "/l/job_x", None, (), records)
        return LaunchReport(plan=None, findings=(), result=result, dry_run=False).render_text()

    ok = text(0)
    assert "job finished in 3.0 s" in ok and "failed" not in ok
    failed = text(1)
    assert "job failed: torchrun exit 1; logs: /l/job_x" in failed and "finished" not in failed
    both = text(1, ("/l/nccl_trace_rank_0",))
    assert "job failed: torchrun exit 1" in both and "flight records: nccl_trace_rank_0" in both


def test_abort_after_an_uncaught_exception_blames_the_exception():
    """Under load a gloo rank that raised can abort (SIGABRT) in a destructor on its way out: seen in CI."""
    import dataclasses

    ranks = [
        dataclasses.replace(r, exit_code=-6) if r.global_rank == 1 else r
        for r in read("gloo-2rank-rank1-raises")
    ]
    s = summarize_failure(ranks, 0)
    assert by_rank(s)[1].role == "culprit" and by_rank(s)[1].status == "killed by SIGABRT"
    assert "ValueError: planted failure" in s.likely_cause and "aborted while shutting down" in s.likely_cause
    bare = RankLog(global_rank=0, local_rank=0, host=None, pid=1, attempt=0, text="step 5\n", exit_code=-6)
    assert "native assertion" in summarize_failure([bare], 0).likely_cause  # no traceback: the abort itself


def test_log_tail_finds_a_marker_once_even_when_a_read_cuts_its_line(tmp_path):
    att = tmp_path / "attempt_0"
    for r in ("0", "1"):
        (att / r).mkdir(parents=True)
        (att / r / "stderr.log").write_text("")
    tail = logs.LogTail()
    assert tail.find(att, logs.NCCL_WATCHDOG_TIMEOUT) is None
    line = (FIX / "nccl-2rank-h200-rank1-sleeps-hang-watchdog/attempt_0/0/stderr.log").read_text()
    line = line.splitlines()[2]  # the watchdog's timeout line, recorded on 2x H200
    with (att / "1" / "stderr.log").open("a") as f:
        f.write("step 5\n" + line[:40])
    assert tail.find(att, logs.NCCL_WATCHDOG_TIMEOUT) is None  # the line is not complete yet
    with (att / "1" / "stderr.log").open("a") as f:
        f.write(line[40:] + "\n")
    assert tail.find(att, logs.NCCL_WATCHDOG_TIMEOUT) == (1, line.strip())
    assert tail.find(att, logs.NCCL_WATCHDOG_TIMEOUT) is None  # already read


# a script that catches its own exception, prints one line and exits failing, as Hydra's @hydra.main does
_HANDLES_ITS_ERROR = """import sys

def app():
    raise ValueError("bad config value")  # line 4


try:
    app()
except Exception as e:
    print(f"Error: {e}", file=sys.stderr)
    sys.exit({code})
"""


def _run_worker(tmp_path: Path, code: str):
    import os
    import subprocess
    import sys

    script = tmp_path / "app.py"
    script.write_text(_HANDLES_ITS_ERROR.replace("{code}", code))
    error_file = tmp_path / "error.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)}
    cmd = [sys.executable, "-m", "torchrig.launch.worker", str(script)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    return done, script, error_file


def test_an_exception_the_script_caught_before_it_exited_failing_is_recorded_with_its_line(tmp_path):
    done, script, error_file = _run_worker(tmp_path, "1")
    assert done.returncode == 1 and done.stderr.strip().endswith(
        "Error: bad config value"
    )  # output unchanged
    message, trace, handled = logs._error_file(error_file)
    assert message == "ValueError: bad config value" and handled
    log = RankLog(0, 0, "h", 5, 0, done.stderr, message, 1, error_trace=trace, error_handled=handled)
    s = summarize_failure([log], 0)
    assert s.likely_cause == (
        "an exception in the script, which the script (or a framework it uses) caught before it exited with "
        "status 1: ValueError: bad config value"
    )
    assert s.ranks[0].where == f"{script}:4 in app"


def test_a_clean_exit_from_a_handler_writes_no_error_file(tmp_path):
    done, _, error_file = _run_worker(tmp_path, "0")
    assert done.returncode == 0 and not error_file.exists()


@pytest.mark.parametrize(
    "call, status, cause",
    [
        (
            'sys.exit("no data in /data")',
            1,
            "the script ended itself with sys.exit and the message: no data in /data",
        ),
        ("sys.exit(3)", 3, "the script ended itself with sys.exit(3)"),
        (
            'sys.exit("0 files in /data\\n$(see the docs)")',
            1,
            "the script ended itself with sys.exit and the message: 0 files in /data",
        ),
        ("raise SystemExit(4)", 4, "the script ended itself with sys.exit(4)"),
        (
            'print("0 files in /data", file=sys.stderr); sys.exit(5)',
            5,
            "the script ended itself with sys.exit(5) after printing: 0 files in /data",
        ),
    ],
)
def test_a_failing_sys_exit_is_recorded_with_its_message_and_the_line_that_exited(
    tmp_path, call, status, cause
):
    """Before, the summary said "the rank exited with an error and no message" and named no line."""
    import os
    import subprocess
    import sys

    script = tmp_path / "s.py"
    script.write_text(f"import sys\n\ndef check():\n    {call}\n\ncheck()\n")
    error_file = tmp_path / "error.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)}
    cmd = [sys.executable, "-m", "torchrig.launch.worker", str(script)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == status  # the exit itself is unchanged
    message, trace, handled = logs._error_file(error_file)
    log = RankLog(0, 0, "h", 5, 0, done.stderr, message, status, error_trace=trace, error_handled=handled)
    s = summarize_failure([log], 0)
    assert s.likely_cause == cause and s.ranks[0].role == "culprit"
    assert s.ranks[0].where == f"{script}:4 in check"


def test_sys_exit_0_and_a_plain_end_write_no_error_file(tmp_path):
    import os
    import subprocess
    import sys

    for body in ("import sys; sys.exit(0)", "import sys; sys.exit()", "x = 1"):
        script = tmp_path / "s.py"
        script.write_text(body + "\n")
        error_file = tmp_path / "error.json"
        env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)}
        cmd = [sys.executable, "-m", "torchrig.launch.worker", str(script)]
        assert subprocess.run(cmd, env=env, capture_output=True, timeout=60).returncode == 0
        assert not error_file.exists(), body


def test_argparse_rejecting_an_argument_names_the_scripts_parse_line(tmp_path):
    """argparse calls sys.exit(2) while it handles its ArgumentError, whose frames are all argparse's: the
    script's line is the one that called parse_args (from the exit's own traceback in the error file)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "s.py"
    script.write_text(
        'import argparse\np = argparse.ArgumentParser()\np.add_argument("--steps", type=int)\np.parse_args()\n'
    )
    error_file = tmp_path / "error.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)}
    cmd = [sys.executable, "-m", "torchrig.launch.worker", str(script), "--steps", "x"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().endswith(
        "error: argument --steps: invalid int value: 'x'"
    )
    message, trace, handled = logs._error_file(error_file)
    log = RankLog(0, 0, "h", 5, 0, done.stderr, message, 2, error_trace=trace, error_handled=handled)
    s = summarize_failure([log], 0)
    assert s.likely_cause.endswith(
        "exited with status 2: ArgumentError: argument --steps: invalid int value: 'x'"
    )
    assert s.ranks[0].where == f"{script}:4 in <module>"


def test_a_cancelled_job_says_who_stopped_it_and_exits_with_the_signal():
    from torchrig.launch.run import LaunchReport
    from torchrig.launch.supervise import LaunchResult, cancel_reason

    reason = cancel_reason("SIGTERM", {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"})
    assert reason == (
        "SIGTERM from Slurm (job 7, step 0): scancel, the time limit, a requeue, preemption or a lost node; "
        "`scontrol show job 7` says which"
    )
    assert cancel_reason("SIGTERM", {}) == "SIGTERM from outside the job (a scheduler, or kill)"
    assert cancel_reason("SIGINT", {"SLURM_JOB_ID": "7"}) == "interrupted (SIGINT, Ctrl-C)"
    result = LaunchResult(
        143,
        1,
        False,
        12.0,
        "/l/job_x",
        None,
        (),
        stopped_by="cancelled",
        stop_reason=reason,
        cancelled_by="SIGTERM",
    )
    report = LaunchReport(plan=None, findings=(), result=result, dry_run=False)
    assert report.exit_code == 143
    assert report.render_text().splitlines() == [
        f"job cancelled after 12.0 s: {reason}; torchrun and the ranks stopped",
        "logs: /l/job_x",
    ]
