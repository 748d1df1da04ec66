"""Following a Slurm job: `scontrol` answers recorded from the test cluster (tools/ci/slurm-cluster.sh,
Slurm 22.05.8 from Debian bookworm), read into records and a summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrig.cluster import slurmjob

SCONTROL = Path(__file__).resolve().parents[1] / "fixtures" / "cluster" / "scontrol"


def fixture(name: str) -> str:
    return (SCONTROL / name).read_text()


def test_parse_job_states():
    done = slurmjob.parse_job(fixture("job-completed.txt"))
    assert (done.job_id, done.state, done.exit_code, done.restarts, done.nodes) == (
        "2", "COMPLETED", "0:0", 0, "node[0-1]",
    )  # fmt: skip
    assert done.stdout == "/tmp/cc/job/torchrig-train-2.out"
    cancelled = slurmjob.parse_job(fixture("job-cancelled.txt"))
    assert (cancelled.state, cancelled.exit_code) == ("CANCELLED", "0:15")
    requeued = slurmjob.parse_job(fixture("job-requeued-after-node-failure.txt"))
    assert (requeued.state, requeued.reason, requeued.restarts, requeued.nodes) == (
        "PENDING", "BeginTime", 1, None,
    )  # fmt: skip


def test_parse_node_down():
    node = slurmjob.parse_node(fixture("node-down-not-responding.txt"))
    assert (node.name, node.state, node.addr) == ("node1", "DOWN+NOT_RESPONDING", "10.232.7.11")
    assert node.reason == "Not responding [root@2026-12-01T16:13:53]" and node.lost


@pytest.mark.parametrize("text", ["", "slurm_load_jobs error: Invalid job id specified", "JobId=3"])
def test_parse_job_refuses_other_text(text):
    with pytest.raises(ValueError):
        slurmjob.parse_job(text)


class FakeScontrol:
    """Replays recorded `scontrol show job` answers in order (the last one repeats), as the controller gave
    them during one job's life; node queries get the recorded answer for node1 (down) and node0 (idle)."""

    def __init__(self, jobs: list[str]) -> None:
        self.jobs = list(jobs)

    def __call__(self, args: list[str]) -> str:
        if args[:2] == ["show", "job"]:
            return self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]
        if args[:2] == ["show", "hostnames"]:
            assert args[2] == "node[0-1]"
            return "node0\nnode1\n"
        if args[:3] == ["show", "node", "-o"]:
            down = fixture("node-down-not-responding.txt")
            if args[3] == "node1":
                return down
            return down.replace("node1", "node0").replace("State=DOWN+NOT_RESPONDING", "State=IDLE")
        raise AssertionError(args)


def test_wait_names_the_lost_node_of_a_requeued_job():
    running = fixture("job-running-after-requeue.txt")
    fake = FakeScontrol([
        running.replace("Restarts=1", "Restarts=0"),  # the first run, before node1 failed
        fixture("job-requeued-after-node-failure.txt"),
        running,
        fixture("job-completed.txt").replace("Restarts=0", "Restarts=1"),
    ])  # fmt: skip
    out = slurmjob.wait("4", scontrol=fake, poll_s=0, sleep=lambda s: None)
    assert out.finished and out.state == "COMPLETED" and out.ok
    assert out.lost_nodes == ("node1",) and out.nodes == ("node0", "node1")
    assert out.events[0] == "RUNNING on node[0-1]"
    assert out.events[1].startswith("requeued by Slurm (restart 1), now PENDING (BeginTime); lost: node1")
    assert "lost node(s): node1 (DOWN+NOT_RESPONDING: Not responding" in out.headline()


def test_wait_timeout_says_where_the_job_stands():
    clock = iter(range(0, 100, 10))
    fake = FakeScontrol([fixture("job-requeued-after-node-failure.txt")])
    out = slurmjob.wait(
        "4", scontrol=fake, timeout_s=25, poll_s=0, sleep=lambda s: None, clock=lambda: next(clock)
    )
    assert not out.finished and not out.ok and out.state == "PENDING"
    head = out.headline()
    assert head.startswith("job 4 is still PENDING after 30 s of waiting (it goes on)"), head
    assert "squeue -j 4" in head and "scancel 4" in head and head.endswith(", requeued 1 time(s)")


def test_cli_wait_needs_submit(cli):
    r = cli("cluster", "slurm", "--wait", "--", "t.py")
    assert r.code == 2 and "--wait follows a submitted job; add --submit" in r.err and r.err.count("\n") == 1


def test_cli_wait_timeout_must_be_positive(cli):
    r = cli("cluster", "slurm", "-o", "/dev/null", "--submit", "--wait-timeout", "0", "--", "t.py")
    assert r.code == 2 and "--wait-timeout must be at least 1, got 0" in r.err


def test_wait_says_a_cancelled_job_was_cancelled_with_scancel():
    idle = fixture("node-down-not-responding.txt").replace("State=DOWN+NOT_RESPONDING", "State=IDLE")

    def scontrol(args: list[str]) -> str:
        if args[:2] == ["show", "hostnames"]:
            return "node0\nnode1\n"
        return fixture("job-cancelled.txt") if args[:2] == ["show", "job"] else idle

    out = slurmjob.wait("3", scontrol=scontrol, poll_s=0, sleep=lambda s: None)
    assert out.finished and not out.ok and out.state == "CANCELLED" and out.lost_nodes == ()
    # (the recorded job had been requeued once before it was cancelled)
    assert (
        out.headline()
        == "job 3 CANCELLED (scancel, by its user or an admin; exit code 0:15), requeued 1 time(s)"
    )


def _pending(reason: str | None = None) -> str:
    """The recorded 3-node job on the 2-node test cluster, with another reason where a test asks."""
    text = fixture("job-pending-partition-node-limit.txt")
    return text if reason is None else text.replace("Reason=PartitionNodeLimit", f"Reason={reason}")


def _scontrol(job: str):
    def answer(args: list[str]) -> str:
        if args[:2] == ["show", "job"]:
            return job
        if args[:2] == ["show", "partition"]:
            assert args[-1] == "debug"
            return fixture("partition-debug-2-nodes.txt")
        raise AssertionError(args)

    return answer


def test_a_job_wanting_more_nodes_than_the_partition_has_fails_at_once():
    rec = slurmjob.parse_job(_pending())
    assert (rec.num_nodes, rec.partition, rec.reason) == (3, "debug", "PartitionNodeLimit")
    out = slurmjob.wait("1", scontrol=_scontrol(_pending()), timeout_s=None, poll_s=0, sleep=lambda s: None)
    assert out.blocked and not out.ok and out.state == "PENDING"
    head = out.headline()
    assert "can never start" in head and "PartitionNodeLimit (3 nodes asked, partition debug has 2)" in head
    assert "scancel 1" in head


def test_partition_node_limit_with_nodes_that_fit_is_waited_for():
    fits = _pending().replace("NumNodes=3-3", "NumNodes=2-2")  # 2 of 2 nodes, some down or drained
    assert slurmjob.blocked_reason(slurmjob.parse_job(fits), _scontrol(fits)) is None


@pytest.mark.parametrize(
    "reason", ["PartitionConfig", "PartitionTimeLimit", "BadConstraints", "InvalidAccount", "AssocMaxNodePerJobLimit",
               "QOSMaxWallDurationPerJobLimit", "MaxCpuPerAccount"],
)  # fmt: skip
def test_reasons_that_never_clear_fail_with_the_reason(reason):
    out = slurmjob.wait("1", scontrol=_scontrol(_pending(reason)), poll_s=0, sleep=lambda s: None)
    assert out.blocked and f"Slurm says {reason}" in out.headline()


@pytest.mark.parametrize(
    "reason", ["Resources", "Priority", "AssocMaxJobsLimit", "QOSMaxJobsPerUserLimit", "AssocGrpCpuLimit",
               "ReqNodeNotAvail", "BeginTime", "Dependency"],
)  # fmt: skip
def test_reasons_that_clear_by_themselves_are_waited_for(reason):
    assert not slurmjob.never_clears(reason)
    clock = iter(range(0, 100, 10))
    out = slurmjob.wait("1", scontrol=_scontrol(_pending(reason)), timeout_s=15, poll_s=0,
                        sleep=lambda s: None, clock=lambda: next(clock))  # fmt: skip
    assert out.blocked is None and not out.finished and f"PENDING ({reason})" in out.events[0]
