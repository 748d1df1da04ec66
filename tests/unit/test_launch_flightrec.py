"""Reading the ranks' flight records: recorded dumps (gloo on this machine, NCCL on an H200) in, a verdict out."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import pytest

from torchrig.launch import flightrec

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "launch"


def records(folder: str) -> tuple[dict, tuple[str, ...]]:
    return flightrec.load_all(sorted(str(p) for p in (FIX / folder).glob(f"{flightrec.PREFIX}*")))


def test_a_rank_that_never_called_the_collective_is_named_with_the_call_it_missed():
    recs, problems = records("gloo-2rank-rank1-sleeps-flight-record")
    v = flightrec.analyze(recs, problems)
    assert v is not None and v.culprits == (1,)
    assert v.headline.startswith(
        "rank 1 never called collective #2 (gloo:all_reduce Float[3]) of process group 0 (default_pg), "
        "which rank 0 waits in at tests/fixtures/launch/ok.py:14 in <module>"
    )
    assert v.headline.endswith("(rank 1 last called #1)")
    assert v.details == (
        "process group 0 (default_pg): rank 0: called #2, completed #1; rank 1: called #1, completed #1",
    )


def test_ranks_calling_different_collectives_are_a_desync_with_both_call_sites():
    v = flightrec.analyze(*records("gloo-2rank-desync-flight-record"))
    assert v is not None and v.culprits == ()
    assert "called collective #2 of process group 0 (default_pg) differently" in v.headline
    assert "rank 0: gloo:all_reduce Float[3] at tests/fixtures/launch/ok.py:14" in v.headline
    assert "rank 1: gloo:broadcast Float[5] at tests/fixtures/launch/ok.py:8" in v.headline


def test_a_lone_nccl_rank_whose_collective_never_started_points_at_the_gpu_work_ahead():
    v = flightrec.analyze(*records("nccl-1rank-h200-kernel-ahead-launch"))
    assert v is not None
    assert v.headline == (
        "collective #2 (nccl:all_reduce Float[1048576]) of process group 0 (default_pg) at "
        "tests/fixtures/launch/nccl_kernel_ahead.py:31 in <module> is pending on rank 0: it never started on "
        "the GPU: the work queued ahead of it there has not finished"
    )


def test_the_record_the_rank_shim_wrote_on_an_h200_reads_the_same():
    """Written by the shim on request during a hang (no NCCL timeout): the NCCL recorder's own dump."""
    v = flightrec.analyze(*records("nccl-1rank-h200-kernel-ahead-hang-record"))
    assert v is not None and v.headline.startswith("collective #2 (nccl:all_reduce Float[1048576])")
    assert v.headline.endswith(
        "it never started on the GPU: the work queued ahead of it there has not finished"
    )


def test_a_rank_without_a_record_is_the_suspect_when_the_others_wait():
    recs, _ = records("gloo-2rank-rank1-sleeps-flight-record")
    v = flightrec.analyze({0: recs[0]})
    assert v is not None and v.culprits == (1,)
    assert "rank 0 waits in collective #2 (gloo:all_reduce Float[3])" in v.headline
    assert "rank 1 left no flight record" in v.headline
    assert v.details[0].endswith("; no record from rank 1")


def test_a_rank_of_another_node_is_not_taken_for_one_that_left_no_record():
    recs, _ = records("gloo-2rank-rank1-sleeps-flight-record")
    v = flightrec.analyze({0: recs[0]}, present={0})  # rank 1 ran on another node: its record is there
    assert v is not None and v.culprits == () and "left no flight record" not in v.headline
    assert v.headline.startswith("collective #2 (gloo:all_reduce Float[3]) of process group 0 (default_pg)")
    assert "a peer outside the records" in v.headline


def test_nothing_pending_means_the_hang_is_outside_communication():
    recs, _ = records("gloo-2rank-rank1-sleeps-flight-record")
    done = {
        r: {**rec, "pg_status": {"0": {**rec["pg_status"]["0"], "last_completed_collective": 2}}}
        for r, rec in recs.items()
    }
    done[1]["pg_status"]["0"]["last_enqueued_collective"] = 2
    v = flightrec.analyze(done)
    assert v is not None and "no collective is pending" in v.headline and v.culprits == ()
    assert flightrec.analyze({}) is None


def test_json_dumps_are_read_too(tmp_path):
    recs, _ = records("gloo-2rank-rank1-sleeps-flight-record")
    for r, rec in recs.items():
        (tmp_path / f"{flightrec.PREFIX}{r}").write_text(json.dumps(rec))
    v = flightrec.analyze(*flightrec.load_all([str(p) for p in tmp_path.iterdir()]))
    assert v is not None and v.culprits == (1,)


class Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/torchrig-flightrec-pwned",))


def test_a_pickle_with_a_class_or_callable_is_refused_without_running_it(tmp_path):
    bad = tmp_path / f"{flightrec.PREFIX}0"
    bad.write_bytes(pickle.dumps({"entries": [], "x": Boom()}))
    with pytest.raises(ValueError, match=r"plain data only, not posix\.system"):
        flightrec.load(bad)
    assert not Path("/tmp/torchrig-flightrec-pwned").exists()


def test_unreadable_records_are_listed_and_the_rest_still_read(tmp_path):
    recs, _ = records("gloo-2rank-rank1-sleeps-flight-record")
    (tmp_path / f"{flightrec.PREFIX}0").write_bytes(pickle.dumps(recs[0]))
    (tmp_path / f"{flightrec.PREFIX}1").write_bytes(pickle.dumps(recs[1])[:40])  # cut short
    (tmp_path / "stderr.log").write_text("not a record")
    got, problems = flightrec.load_all([str(p) for p in sorted(tmp_path.iterdir())])
    assert (
        list(got) == [0] and len(problems) == 1 and problems[0].startswith("rank 1: nccl_trace_rank_1 is not")
    )
    v = flightrec.analyze(got, problems)
    assert v is not None and v.details[-1].startswith("unreadable record: rank 1")
    only_bad = flightrec.analyze({}, problems)
    assert only_bad is not None and only_bad.headline == "no flight record could be read"


def test_the_worker_writes_its_record_when_asked_and_keeps_nccls_own(tmp_path, monkeypatch):
    from torchrig.launch import worker

    recorded = (FIX / "gloo-2rank-rank1-sleeps-flight-record" / "nccl_trace_rank_0").read_bytes()
    asked = []
    # The hardware boundary: this test process keeps no flight record, so the dump is the recorded one.
    monkeypatch.setattr(worker, "_flight_record", lambda stacks: asked.append(stacks) or recorded)
    env = {
        "TORCHRIG_FR_REQUEST": str(tmp_path / ".flight-record-request"),
        "TORCHRIG_LOG_DIR": str(tmp_path),
        "RANK": "3",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }
    t = worker.serve_flight_record(env)
    assert t is not None and t.daemon
    time.sleep(0.6)
    assert not (tmp_path / "nccl_trace_rank_3").exists()  # not before the launcher asks
    (tmp_path / ".flight-record-request.1").touch()  # another attempt's request
    time.sleep(0.6)
    assert not (tmp_path / "nccl_trace_rank_3").exists()
    (tmp_path / ".flight-record-request.2").touch()
    deadline = time.monotonic() + 10
    while len(asked) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert asked == [False, True]  # without the stacks at once, then with them

    def settled() -> bool:  # the record with stacks has replaced the quick one, no temporary file left
        left = [p.name for p in tmp_path.iterdir() if ".tmp" in p.name or p.name.endswith(".symbolizing")]
        return not left and (tmp_path / "nccl_trace_rank_3").exists()

    deadline = (
        time.monotonic() + 10
    )  # under load the writer thread may run late: wait for it, not a fixed time
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert settled()
    assert flightrec.load(tmp_path / "nccl_trace_rank_3") == pickle.loads(recorded)
    # The launcher asks again (it touches the request): the rank writes its record again.
    os.utime(tmp_path / ".flight-record-request.2", ns=(time.time_ns() + 10**9,) * 2)
    deadline = time.monotonic() + 10
    while len(asked) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert asked == [False, True, False, True]
    deadline = time.monotonic() + 10  # the rank's second write is done (asked is noted before it writes)
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert settled()
    # A record NCCL's watchdog wrote for this process stays as it is. Its time is set apart from the rank's own
    # writes: the kernel stamps files with a coarse clock, so two writes in one tick share their mtime.
    (tmp_path / "nccl_trace_rank_3").write_bytes(b"nccl's")
    os.utime(tmp_path / "nccl_trace_rank_3", ns=(time.time_ns() + 2 * 10**9,) * 2)
    worker._dump_flight_record(str(tmp_path / "nccl_trace_rank_3"), time.time() - 60)
    assert (tmp_path / "nccl_trace_rank_3").read_bytes() == b"nccl's"
    assert worker.serve_flight_record({"RANK": "0"}) is None  # not started by torchrig launch


# A fresh process: torch's flight recorder is process-wide and keeps what an earlier process group recorded,
# and other tests in this pytest process (random order, shared xdist workers) start one.
NO_GROUP = """
import json, sys, time
from torch._C import _distributed_c10d as c10d
from torchrig.launch import flightrec, worker
dump = flightrec.loads(c10d._dump_fr_trace()) | {"version": ""}
record = worker._flight_record(stacks=False)
worker._dump_flight_record(sys.argv[1], time.time())
print(json.dumps({"dump": dump, "record": record}, default=repr))
"""


def test_a_rank_whose_recorder_was_off_writes_nothing(tmp_path):
    """A process with no process group gets torch's real dump empty (as a rank's is with the recorder off),
    and no file is written: the launcher never reads an empty record as "nothing pending"."""
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", NO_GROUP, str(out / "nccl_trace_rank_0")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["dump"] == {
        "version": "",
        "pg_config": {},
        "comm_lib_version": "",
        "pg_status": {},
        "entries": [],
    }
    assert got["record"] is None
    assert list(out.iterdir()) == []


def test_parse_stack_skips_the_flight_record_thread():
    from torchrig.launch.ranklog import parse_stack, user_frame

    # Recorded: rank 0's SIGUSR1 dump in the gloo hang above, the helper thread listed first.
    text = (FIX / "gloo-2rank-rank1-sleeps-flight-record" / "stack.txt").read_text()
    stack = parse_stack(text)
    assert str(user_frame(stack)) == "tests/fixtures/launch/ok.py:14 in <module>"
