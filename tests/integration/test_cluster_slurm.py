"""A real Slurm cluster: the sbatch script `torchrig cluster slurm` renders, submitted with the real `sbatch`.

The cluster is Debian's Slurm (slurmctld, two slurmd, munge) that ``tools/ci/slurm-cluster.sh up`` starts on
this machine: each node a network namespace with its own hostname (node0, node1), the controller and login
node a third (ctl). CI starts it in ``.ci/run``; without it every test here is skipped, saying how to start it.

- two nodes x 2 CPU processes (gloo): submitted with ``--submit --wait`` from the login node, ``srun``
  starts ``torchrig launch`` on both nodes, pre-flight and the c10d rendezvous form across them, and the
  losses equal, step by step, those of one node running all 4 processes;
- ``scancel`` mid-run: within a bounded time no process of the job is left on either node, each node's
  launcher says the job was cancelled by Slurm and exits 143, and the wait's summary says CANCELLED;
- node1 lost mid-run (its slurmd, launcher and ranks SIGKILLed: the machine is gone): Slurm marks node1 down
  and requeues the job, the summary names node1 as lost; node1 back, the requeued job resumes from its last
  checkpoint and finishes with no lost or repeated steps, and the same losses as the run that never failed;
- ``scontrol requeue`` mid-run (preemption, an admin): the job is stopped and queued again, and its next run
  resumes the same way.

Every wait here has a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

# one Slurm cluster for the whole run (tools/ci/slurm-cluster.sh): its jobs, a node lost and restarted and
# the fixed rendezvous ports below must not meet another worker's job on it
pytestmark = pytest.mark.xdist_group("slurm-cluster")

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_ENV = Path("/run/torchrig-slurm/cluster.env")
SCRIPT = ROOT / "tools" / "ci" / "slurm-cluster.sh"
STEPS = 20
CKPT_EVERY = 5
JOB_TIMEOUT_S = 420  # no job in this file may run longer (the machine may be slow)
TRAIN = [
    "-m", "torchrig.train",
    "--model", "gpt", "--size", "tiny", "--data", "synthetic", "--seed", "0",
    "--micro-batch", "8", "--steps", str(STEPS), "--log-every", "1", "--ckpt-every", str(CKPT_EVERY),
    "--workers", "0", "--device", "cpu", "--no-tensorboard", "--resume-if-possible",
]  # fmt: skip
# The worktree's torchrig on the nodes: sbatch hands the submitter's environment to the job, PATH included.
# One OpenMP thread per rank everywhere, so the two-node and one-node runs do the same arithmetic.
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}


def _cluster() -> dict[str, str]:
    if os.geteuid() != 0:
        pytest.skip("needs root (the cluster's namespaces)")
    if not CLUSTER_ENV.is_file():
        pytest.skip(f"no Slurm cluster running: start it with {SCRIPT.relative_to(ROOT)} up")
    info = dict(line.split("=", 1) for line in CLUSTER_ENV.read_text().split())
    proc = subprocess.run(["ip", "netns", "exec", info["LOGIN_NS"], "sinfo", "-h", "-N", "-o", "%N %T"],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"the Slurm cluster does not answer ({proc.stderr.strip()}); restart it: {SCRIPT} up")
    return info


@pytest.fixture(scope="module")
def cluster():
    info = _cluster()
    info["node_ns"] = info["NODE_NS"].split(",")
    return info


def login(cluster, *argv: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A command on the login node (the controller's namespace), as a user would type it there."""
    return subprocess.run(["ip", "netns", "exec", cluster["LOGIN_NS"], *argv], capture_output=True, text=True,
                          cwd=cwd, env=ENV, timeout=timeout)  # fmt: skip


def submit(cluster, work: Path, *extra: str, port: int) -> subprocess.Popen[str]:
    """`torchrig cluster slurm ... --submit --wait --json`, running in the background on the login node."""
    argv = ["ip", "netns", "exec", cluster["LOGIN_NS"], sys.executable, "-m", "torchrig", "cluster", "slurm",
            "--json", "--nodes", "2", "--gpus-per-node", "0", "--nproc-per-node", "2", "--rdzv-port", str(port),
            "--rdzv-timeout", "120", *extra, "-o", "job.sbatch", "--submit", "--wait",
            "--wait-timeout", str(JOB_TIMEOUT_S), "--", *TRAIN, "--out", str(work / "run")]  # fmt: skip
    with open(work / "cli.out", "w") as so, open(work / "cli.err", "w") as se:
        return subprocess.Popen(argv, cwd=work, env=ENV, stdout=so, stderr=se, text=True)


def finish(proc: subprocess.Popen[str], work: Path) -> tuple[int, dict]:
    try:
        code = proc.wait(timeout=JOB_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"torchrig cluster slurm --wait still running after {JOB_TIMEOUT_S + 60} s\n{tail(work)}")
    return code, json.loads((work / "cli.out").read_text())


def finish_or_cancel(proc: subprocess.Popen[str], cluster, job_id: str, work: Path) -> tuple[int, dict]:
    """:func:`finish`, and a job that did not complete is cancelled: the next test needs the nodes."""
    try:
        code, report = finish(proc, work)
    except BaseException:
        login(cluster, "scancel", job_id, cwd=work)
        raise
    if code != 0:
        login(cluster, "scancel", job_id, cwd=work)
    return code, report


def tail(work: Path, n: int = 3000) -> str:
    parts = []
    for p in [work / "cli.err", *sorted(work.glob("torchrig-train-*.out"))]:
        if p.exists():
            parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-n:]}")
    return "\n".join(parts)


def job_id_of(work: Path, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in (work / "cli.err").read_text().splitlines() if (work / "cli.err").exists() else []:
            if line.startswith("torchrig cluster: submitted job "):
                return line.split()[4].rstrip(";")
        time.sleep(0.2)
    pytest.fail(f"no job submitted after {timeout_s} s\n{tail(work)}")


def wait_for(predicate, what: str, work: Path, timeout_s: float = JOB_TIMEOUT_S, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    pytest.fail(f"{what}: not after {timeout_s:.0f} s\n{tail(work)}")


def read_metrics(out: Path) -> tuple[dict[int, float], list[dict]]:
    """Loss by step (a step logged twice fails the test) and the events."""
    losses: dict[int, float] = {}
    events = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "event" in rec:
            events.append(rec)
            continue
        assert rec["step"] not in losses, f"step {rec['step']} logged twice"
        losses[rec["step"]] = rec["loss"]
    return losses, events


def job_pids(cluster) -> dict[str, list[int]]:
    """Per node, every process in its namespace except its slurmd (what a job may leave behind)."""
    left = {}
    for ns in cluster["node_ns"]:
        node = ns.rsplit("-", 1)[1]
        slurmd = Path(f"/run/torchrig-slurm/{node}/slurmd.pid")
        keep = {int(slurmd.read_text())} if slurmd.is_file() else set()
        proc = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
        left[node] = [int(p) for p in proc.stdout.split() if int(p) not in keep]
    return left


def describe(pids: list[int]) -> str:
    if not pids:
        return "(none)"
    proc = subprocess.run(["ps", "-o", "pid,ppid,stat,etimes,args", "-p", ",".join(map(str, pids))],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    return proc.stdout


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """The single-node run: one machine, 4 processes (the two-node job's world size and global batch)."""
    work = tmp_path_factory.mktemp("slurm-reference")
    proc = subprocess.run(
        [sys.executable, "-m", "torchrig", "launch", "--cpu", "--nproc-per-node", "4", "--rdzv-id", "reference",
         "--log-dir", "logs", "--no-preflight", *TRAIN, "--out", str(work / "run")],
        cwd=work, env=ENV, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_metrics(work / "run")[0]


def assert_same_losses(losses: dict[int, float], reference: dict[int, float]) -> None:
    assert sorted(losses) == list(range(1, STEPS + 1)), "lost or repeated steps"
    worst = max(abs(losses[s] - reference[s]) for s in losses)
    assert worst <= 1e-6, f"losses differ from the single-node run by up to {worst}"


def test_submitted_job_runs_on_both_nodes_with_the_single_node_losses(cluster, reference, tmp_path):
    proc = submit(cluster, tmp_path, port=29511)
    code, report = finish(proc, tmp_path)
    outcome = report["outcome"]
    assert code == 0 and outcome["state"] == "COMPLETED", tail(tmp_path)
    assert outcome["nodes"] == ["node0", "node1"] and outcome["restarts"] == 0
    assert report["submitted"] == f"job {outcome['job_id']}"
    assert report["job_output"]["output"] == outcome["output"], "--submit says where the output goes"
    output = Path(outcome["output"]).read_text()
    # each node's launcher lines carry the node's name
    for node in ("node0", "node1"):
        assert any(
            line.startswith(f"[{node}] ") and "job finished in" in line for line in output.splitlines()
        ), output
    # Pre-flight across the two nodes, then the ranks: two on each node, all in one c10d rendezvous.
    assert "pre-flight process-group: ok: 4 rank(s) created a gloo process group" in output, output
    for rank, host in ((0, "node0"), (1, "node0"), (2, "node1"), (3, "node1")):
        assert (
            f"rank={rank} local_rank={rank % 2} world_size=4 restart=0" in output and f"host={host}" in output
        )
    assert output.count("job finished in") == 2, output
    losses, events = read_metrics(tmp_path / "run")
    assert_same_losses(losses, reference)
    (start,) = [e for e in events if e["event"] == "start"]
    assert start["world_size"] == 4 and start["global_batch"] == 32


def test_scancel_leaves_no_process_on_either_node(cluster, tmp_path):
    proc = submit(cluster, tmp_path, "--no-preflight", port=29512)
    job_id = job_id_of(tmp_path)
    latest = tmp_path / "run" / "checkpoints" / "latest"
    wait_for(lambda: latest.is_file() or proc.poll() is not None, "first checkpoint", tmp_path)
    assert proc.poll() is None, f"the job ended before it could be cancelled: raise STEPS\n{tail(tmp_path)}"
    assert all(job_pids(cluster).values()), "the job has no process on one of the nodes"
    r = login(cluster, "scancel", job_id, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cancelled_at = time.monotonic()
    # Slurm signals the job's steps (SIGTERM, SIGKILL after KillWait=10 s); torchrig launch stops torchrun and
    # the ranks. Bound: KillWait + 20 s.
    wait_for(
        lambda: not any(job_pids(cluster).values()), "no job process on the nodes", tmp_path, timeout_s=30
    )
    gone_after_s = time.monotonic() - cancelled_at
    code, report = finish(proc, tmp_path)
    assert code == 1 and report["outcome"]["state"] == "CANCELLED", tail(tmp_path)
    # Each node's launcher said why it stopped, then its summary, and exited 143 (128 + SIGTERM), not killed.
    output = Path(report["outcome"]["output"]).read_text()
    said = f"torchrig launch: cancelled: SIGTERM from Slurm (job {job_id}, step 0): scancel, the time limit"
    assert output.count(said) == 2 and output.count("job cancelled after") == 2, output[-3000:]
    for task, node in enumerate(("node0", "node1")):
        assert f"srun: error: {node}: task {task}: Exited with exit code 143" in output, output[-3000:]
    print(f"scancel: every job process gone from both nodes {gone_after_s:.1f} s after scancel")


def test_job_requeued_by_the_scheduler_resumes_without_lost_or_repeated_steps(cluster, reference, tmp_path):
    """`scontrol requeue` mid-run, as preemption or an admin does: Slurm stops the job (SIGTERM to its steps)
    and queues it again; the next run resumes from the last checkpoint."""
    proc = submit(cluster, tmp_path, "--no-preflight", port=29514)
    job_id = job_id_of(tmp_path)
    latest = tmp_path / "run" / "checkpoints" / "latest"
    wait_for(lambda: latest.is_file() or proc.poll() is not None, "first checkpoint", tmp_path)
    assert proc.poll() is None, f"the job ended before it could be requeued: raise STEPS\n{tail(tmp_path)}"
    r = login(cluster, "scontrol", "requeue", job_id, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    err = tmp_path / "cli.err"
    wait_for(lambda: "requeued by Slurm" in err.read_text(), "the job requeued", tmp_path, timeout_s=120)
    wait_for(
        lambda: not any(job_pids(cluster).values()), "the first run's processes gone", tmp_path, timeout_s=60
    )
    # Both nodes answered the stop, so nothing of the first run is still on its way to them: as the cluster's
    # admin, release Slurm's requeue hold at once (not after a lost node: see the next test). Only once the job
    # is PENDING: Slurm sets the hold when the job leaves COMPLETING, over a release given before.
    wait_for(
        lambda: (
            "JobState=PENDING" in login(cluster, "scontrol", "show", "job", "-o", job_id, cwd=tmp_path).stdout
        ),
        "the job queued again",
        tmp_path,
        timeout_s=60,
    )
    r = login(cluster, "scontrol", "update", f"JobId={job_id}", "StartTime=now", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    code, report = finish_or_cancel(proc, cluster, job_id, tmp_path)
    outcome = report["outcome"]
    assert code == 0 and outcome["state"] == "COMPLETED" and outcome["restarts"] == 1, tail(tmp_path)
    assert outcome["lost_nodes"] == []
    output = Path(outcome["output"]).read_text()
    assert f"=== torchrig: job {job_id} was requeued by Slurm: run 2 starts here" in output, output[-3000:]
    losses, events = read_metrics(tmp_path / "run")
    resumes = [e for e in events if e["event"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] % CKPT_EVERY == 0 and resumes[0]["step"] >= CKPT_EVERY
    assert_same_losses(losses, reference)


def test_lost_node_is_named_and_the_requeued_job_resumes(cluster, reference, tmp_path):
    proc = submit(cluster, tmp_path, "--no-preflight", port=29513)
    job_id = job_id_of(tmp_path)
    latest = tmp_path / "run" / "checkpoints" / "latest"
    wait_for(lambda: latest.is_file() or proc.poll() is not None, "first checkpoint", tmp_path)
    assert proc.poll() is None, f"the job ended before node1 could be lost: raise STEPS\n{tail(tmp_path)}"
    ckpt_step = int(latest.read_text().strip().split("-")[1])
    node1_ns = cluster["node_ns"][1]
    try:
        # node1 is gone: its slurmd, slurmstepd, launcher and ranks, all at once.
        for pid in subprocess.run(["ip", "netns", "pids", node1_ns], capture_output=True, text=True,
                                  timeout=30).stdout.split():  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        # Slurm notices at its next ping past SlurmdTimeout (20 s; up to ~2 min on a busy machine), marks
        # node1 DOWN and requeues the job.
        err = tmp_path / "cli.err"
        wait_for(lambda: "requeued by Slurm" in err.read_text(), "the job requeued", tmp_path, timeout_s=240)
        assert "lost: node1" in err.read_text(), tail(tmp_path)
        # Slurm ends the job's steps on node0 as it requeues: nothing of the first run is left there.
        wait_for(lambda: not job_pids(cluster)["node0"], "node0's ranks gone", tmp_path, timeout_s=60)
    finally:
        subprocess.run([str(SCRIPT), "start-node", "node1"], capture_output=True, timeout=60, check=True)
    wait_for(lambda: "idle" in login(cluster, "sinfo", "-h", "-n", "node1", "-o", "%T", cwd=tmp_path).stdout,
             "node1 idle again", tmp_path, timeout_s=60)  # fmt: skip
    # The requeued job starts when Slurm's requeue hold ends (Reason=BeginTime, AuthInfo=cred_expire + 1 s),
    # not earlier: until then the first run's messages to node1 may still arrive, and the next run has the same
    # job and step ids (tools/ci/slurm-cluster.sh says which messages).
    code, report = finish_or_cancel(proc, cluster, job_id, tmp_path)
    outcome = report["outcome"]
    assert code == 0 and outcome["state"] == "COMPLETED" and outcome["restarts"] == 1, tail(tmp_path)
    assert outcome["lost_nodes"] == ["node1"] and "Not responding" in outcome["lost_detail"]["node1"]
    losses, events = read_metrics(tmp_path / "run")
    resumes = [e for e in events if e["event"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] >= ckpt_step and resumes[0]["step"] % CKPT_EVERY == 0
    assert_same_losses(losses, reference)


def test_a_job_that_can_never_start_fails_at_once_with_slurms_reason(cluster, tmp_path):
    """Three nodes on a two-node partition: PENDING (PartitionNodeLimit) forever; --wait says so at once."""
    argv = [sys.executable, "-m", "torchrig", "cluster", "slurm", "--nodes", "3", "--gpus-per-node", "0",
            "--nproc-per-node", "1", "-o", "job.sbatch", "--submit", "--wait", "--", "train.py"]  # fmt: skip
    started = time.monotonic()
    r = login(cluster, *argv, cwd=tmp_path, timeout=120)
    job_id = next(
        (
            line.split()[4].rstrip(";")
            for line in r.stderr.splitlines()
            if line.startswith("torchrig cluster: submitted job ")
        ),
        None,
    )
    try:
        assert r.returncode == 1, r.stdout + r.stderr
        # Slurm 22.05 says PartitionConfig for an --exclusive job, PartitionNodeLimit otherwise
        assert (
            "can never start: Slurm says PartitionNodeLimit (3 nodes asked, partition debug has 2)"
            in r.stdout
            or "can never start: Slurm says PartitionConfig: the partition's configuration" in r.stdout
        ), r.stdout
        assert f"scancel {job_id}" in r.stdout and time.monotonic() - started < 60
    finally:
        if job_id:
            login(cluster, "scancel", job_id, cwd=tmp_path)
