"""The launch API and the summary's pure parts added for scripts nobody here wrote: the script's FILE:LINE from
a traceback, last lines from the merged stream, signals from outside, hang verdicts from the collectives'
evidence, the GPU probe's cache, and the seams (no CLI import in train, no test hooks in --help)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from torchrig.launch import flightrec, probe
from torchrig.launch.ranklog import Frame, RankLog, parse_traceback, tail, where_of
from torchrig.launch.summary import render, summarize_failure, summarize_hang

TRACEBACK = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/job/train.py", line 79, in <module>
[rank1]:     exec(open('configurator.py').read())
[rank1]:   File "<string>", line 47, in <module>
[rank1]: ValueError: Unknown config key: nonsense
"""


def test_the_scripts_own_line_comes_from_the_traceback():
    assert parse_traceback(TRACEBACK) == (
        Frame("<string>", 47, "<module>"),
        Frame("/job/train.py", 79, "<module>"),
    )
    log = RankLog(global_rank=1, local_rank=1, host=None, pid=1, attempt=0, text=TRACEBACK, exit_code=1)
    assert str(where_of(log)) == "/job/train.py:79 in <module>"  # exec'd code has no file of its own
    # without the log's traceback, the error file's
    bare = RankLog(global_rank=1, local_rank=1, host=None, pid=1, attempt=0, text="", error_trace=TRACEBACK)
    assert str(where_of(bare)) == "/job/train.py:79 in <module>"
    chained = TRACEBACK + "\nDuring handling...\n\nTraceback (most recent call last):\n"
    chained += '  File "/job/b.py", line 3, in f\nKeyError: 1\n'
    assert parse_traceback(chained) == (Frame("/job/b.py", 3, "f"),)


def test_last_lines_keep_the_order_written_and_the_time_stamps():
    merged = (
        "16:00:01.000 err| torchrig-worker: rank=0 local_rank=0 world_size=2 restart=0 pid=5 host=h\n"
        "16:00:02.000 err| UserWarning: something early\n"
        "16:00:03.000 out| step 7 loss 2.5\n"
        "16:00:04.000 out| step 8 loss 2.4\n"
    )
    assert tail(merged) == (
        "16:00:02.000 UserWarning: something early",
        "16:00:03.000 step 7 loss 2.5",
        "16:00:04.000 step 8 loss 2.4",
    )


def test_last_lines_leave_out_a_stack_dump_taken_while_the_rank_was_exiting():
    """A rank stopped by torchrun while its interpreter shuts down dumps its threads (faulthandler): "Garbage-
    collecting" and the thread header are the dump's, not the script's; its exception stays the last line."""
    merged = (
        "16:00:03.000 err| ValueError: Unknown config key: no_such_key\n"
        "16:00:04.000 err| Current thread 0x00007f0000000000 (most recent call first):\n"
        "16:00:04.001 err|   Garbage-collecting\n"
        "16:00:04.002 err|   <no Python frame>\n"
    )
    assert tail(merged) == ("16:00:03.000 ValueError: Unknown config key: no_such_key",)


def _log(rank: int, **kw) -> RankLog:
    return RankLog(global_rank=rank, local_rank=rank, host="h", pid=100 + rank, attempt=0, text="", **kw)


def test_a_sigterm_torchrun_did_not_send_is_from_outside():
    s = summarize_failure([_log(0, exit_code=-15, closed_by_agent=True), _log(1, exit_code=-15)], 0)
    v = {r.rank: r for r in s.ranks}
    assert (
        s.headline
        == "rank 1 failed (killed by SIGTERM from outside the job: neither torchrun nor torchrig sent it)"
    )
    assert s.likely_cause.startswith("the rank was terminated with SIGTERM from outside the job")
    assert (v[1].role, v[0].role) == ("culprit", "bystander")
    assert v[0].status == "stopped by torchrun (SIGTERM) because rank 1 failed first"
    # SIGSEGV is the process's own crash: nobody is said to have sent it
    assert summarize_failure([_log(0, exit_code=-11)], 0).ranks[0].status == "killed by SIGSEGV"


DIVERGED = "torchrig: error: training diverged: NaN/inf loss or gradient at step 5"


def _exited(rank: int, exit_code: int, **kw) -> RankLog:
    """A rank that ended itself with ``sys.exit(1)`` after printing its error (the worker wrote its error file);
    ``exit_code`` -15 with ``closed_by_agent``: torchrun's SIGTERM reached it while it was exiting."""
    return _log(rank, exit_code=exit_code, error_message="SystemExit: 1", error_handled=True, **kw)


def test_a_rank_stopped_while_exiting_with_its_own_error_failed_as_well_after_the_first():
    """Both ranks diverge at one step and call sys.exit(1); torchrun sees rank 1's exit first and sends its
    SIGTERM to rank 0, already exiting (seen in CI under load): rank 0's status -15 is torchrun's stop, not its
    own exit status. Both are culprits with their own cause; the headline and cause come from rank 1."""
    both = [
        _exited(0, 1, output=f"16:08:14.726 err| {DIVERGED}\n"),
        _exited(1, 1, output=f"16:08:14.667 err| {DIVERGED}\n"),
    ]
    s = summarize_failure(both, 0)
    assert s.headline == "rank 0, rank 1 failed (exit 1)"
    stopped = [_exited(0, -15, closed_by_agent=True, output=f"16:08:14.726 err| {DIVERGED}\n"), both[1]]
    s = summarize_failure(stopped, 0)
    v = {r.rank: r for r in s.ranks}
    assert s.headline == "rank 1 failed (exit 1); rank 0 failed as well, stopped by torchrun while exiting"
    assert s.likely_cause == f"the script ended itself with sys.exit(1) after printing: {DIVERGED}"
    assert (v[0].role, v[1].role) == ("culprit", "culprit")
    assert v[0].status == (
        "failed by itself, then stopped by torchrun (SIGTERM) while exiting because rank 1 failed first"
    )
    assert v[0].cause == s.likely_cause and v[1].status == "exit 1"
    assert "-15" not in render(s)
    # stopped before its error file was written: a bystander, not listed in the report
    early = _log(0, exit_code=-15, closed_by_agent=True, output=f"16:08:14.726 err| {DIVERGED}\n")
    s = summarize_failure([early, both[1]], 0)
    assert s.headline == "rank 1 failed (exit 1)"
    assert {r.rank: (r.role, r.status) for r in s.ranks}[0] == (
        "bystander",
        "stopped by torchrun (SIGTERM) because rank 1 failed first",
    )


def test_a_caught_exception_cut_short_by_torchruns_stop_has_no_exit_status_of_its_own():
    """Hydra catches the exception, prints it and exits 1; torchrun's SIGTERM may reach the second rank while it
    exits: its cause is the caught exception, with no made-up "status -15"."""
    exc = "TypeError(\"MySQLConnection.__init__() got an unexpected keyword argument 'port'\")"
    caught = {"error_message": exc, "error_handled": True}
    ranks = [_log(0, exit_code=-15, closed_by_agent=True, **caught), _log(1, exit_code=1, **caught)]
    s = summarize_failure(ranks, 0)
    v = {r.rank: r for r in s.ranks}
    caught_by = (
        "an exception in the script, which the script (or a framework it uses) caught before it exited"
    )
    assert s.likely_cause == f"{caught_by} with status 1: {exc}"
    assert v[0].cause == f"{caught_by}: {exc}" and v[0].role == "culprit"
    # a SIGTERM handler's own sys.exit(1) (exit status 1, not -15) is still torchrun's stop
    handler = _log(0, exit_code=1, closed_by_agent=True, error_message="SystemExit: 1", error_handled=True)
    s = summarize_failure([handler, _log(1, exit_code=1, error_message="ValueError: planted")], 0)
    assert {r.rank: r for r in s.ranks}[0].cause.startswith("stopped by torchrun after another rank failed")


def test_a_stopped_rank_is_the_culprit_and_the_rank_in_backward_a_victim():
    in_backward = (
        Frame("/venv/lib/python3.12/site-packages/torch/autograd/graph.py", 829, "_engine_run_backward"),
        Frame("/venv/lib/python3.12/site-packages/torch/_tensor.py", 626, "backward"),
        Frame("/job/train.py", 40, "step"),
    )
    flight = flightrec.FlightVerdict("rank 0 waits in collective #9 ...", (1,), (), waiting=(0,))
    ranks = [_log(0, stack=in_backward), _log(1, state="T")]
    s = summarize_hang(ranks, 0, 0, flight=flight, evidence="rank 1 (pid 101) stopped ...")
    v = {r.rank: r for r in s.ranks}
    assert s.headline == (
        "hang: rank 1 never arrived at the collective that rank 0 wait(s) in (rank 1 stopped by a signal)"
    )
    assert v[1].role == "culprit" and v[1].status.startswith("stopped by a signal")
    assert v[0].role == "victim" and v[0].where == "/job/train.py:40 in step"
    assert v[0].status == "hung: waiting in a collective inside backward() (DDP's gradient all-reduce)"
    assert s.evidence == "rank 1 (pid 101) stopped ..."
    # the flight records alone name the culprit too: the rank that never called the collective
    s = summarize_hang(
        [_log(0, stack=in_backward), _log(1, stack=(Frame("/job/train.py", 12, "load"),))],
        0,
        0,
        flight=flight,
    )
    assert [(r.rank, r.role) for r in s.ranks] == [(1, "culprit"), (0, "victim")]


def test_the_gpu_probe_is_reused_until_something_it_depends_on_changes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setenv("TORCHRIG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(
        probe,
        "probe_gpus",
        lambda timeout_s=60.0: calls.append(1) or probe.GpuProbe(2, ("H200", "H200"), ((0, 1),)),
    )
    first = probe.probe_gpus_cached()
    again = probe.probe_gpus_cached()
    assert first == again == probe.GpuProbe(2, ("H200", "H200"), ((0, 1),)) and len(calls) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # a change the answer depends on: probe again
    probe.probe_gpus_cached()
    assert len(calls) == 2
    saved = json.loads((tmp_path / "launch-gpu-probe.json").read_text())
    assert saved["key"]["env"]["CUDA_VISIBLE_DEVICES"] == "1"


def test_the_api_plans_with_absolute_paths(tmp_path, monkeypatch):
    from torchrig.launch import LaunchRequest, launch

    monkeypatch.chdir(tmp_path)
    report = launch(LaunchRequest(script="train.py", cpu=True, nproc_per_node=2), dry_run=True)
    p = report.plan
    assert p.log_dir == str(tmp_path / "torchrig-logs")
    assert p.env["TORCHRIG_LOG_DIR"] == str(tmp_path / "torchrig-logs")
    assert Path(p.env["TORCHRIG_FR_REQUEST"]).is_absolute()
    rdzv = [a for a in p.argv if a.startswith("--rdzv-endpoint=")]
    pre = [a for a in p.preflight_argv if a.startswith("--rdzv-endpoint=")]
    assert rdzv != pre  # the pre-flight runs beside the job, on a port of its own
    assert report.exit_code == 0 and report.to_json()["dry_run"] is True


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout


def test_the_rank_entry_point_imports_no_cli_module():
    out = _run(
        "import sys, torchrig.train.__main__ as m, argparse\n"
        "from torchrig.train.options import add_train_options\n"
        "add_train_options(argparse.ArgumentParser())\n"
        "print(sorted(n for n in sys.modules if n.startswith('torchrig.cli')))"
    )
    assert out.strip() == "[]"


def test_test_hooks_stay_out_of_help_but_still_parse():
    for cmd in ("train", "launch"):
        r = subprocess.run([sys.executable, "-m", "torchrig", cmd, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "--test-" not in r.stdout and "TEST HOOK" not in r.stdout
    import argparse

    from torchrig.train.options import add_train_options, config_from_args

    parser = argparse.ArgumentParser()
    add_train_options(parser)
    cfg = config_from_args(parser.parse_args(["--test-kill-at-step", "3"]))
    assert cfg.test_kill_at_step == 3


def test_passed_pre_flight_checks_are_printed_once(tmp_path, monkeypatch):
    """They go to stderr while the job starts; the final report lists only those that did not pass."""
    import dataclasses

    from torchrig.findings import Finding, Severity
    from torchrig.launch import LaunchRequest, launch

    monkeypatch.chdir(tmp_path)
    report = launch(LaunchRequest(script="train.py", cpu=True), dry_run=True)
    ok = Finding("port", Severity.OK, "rendezvous port 1 is free")
    warn = Finding("p2p", Severity.WARNING, "P2P is not available", fix=("expect lower bandwidth",))
    ran = dataclasses.replace(report, findings=(ok, warn), dry_run=False)
    assert ran.render_text().splitlines() == [
        "pre-flight p2p: warning: P2P is not available — fix: expect lower bandwidth"
    ]
