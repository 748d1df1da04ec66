"""A real two-node run: two Linux network namespaces, each running ``torchrig launch --nnodes 2``.

Each "node" is a network namespace made here (``ip netns`` and a veth pair in a private /24 that exists only
inside the two namespaces), with its own hostname (a UTS namespace from ``unshare --uts``) and its own
``/etc/hosts`` (``ip netns exec`` bind-mounts ``/etc/netns/<ns>/hosts``), as two machines on one switch
would have. The c10d rendezvous is hosted by node 0's launcher; the ranks train torchrig's built-in tiny
GPT with gloo on the CPU, on synthetic data with a fixed seed, and share the run folder as a cluster's
shared filesystem would be shared.

- the node command of the sbatch script ``torchrig cluster slurm`` renders, run on each node with the
  variables srun sets there, reaches the same losses, step by step, as a single-node run with 2 processes
  (the same global batch); so does the pod command of the JobSet ``torchrig cluster k8s --kind jobset``
  renders, run on two nodes named and resolvable as the JobSet's pods are (``<jobset>-node-0-<i>``,
  ``<hostname>.<subdomain>``) with the pod's ``JOB_COMPLETION_INDEX`` and environment;
- SIGKILL to node 1's launcher (its whole process group) after a checkpoint exists: its torchrun and ranks
  go with it; starting its launcher again, the job re-rendezvous, resumes from the last checkpoint and
  finishes, with no lost or repeated steps and the same losses as the run that never failed;
- node 1 lost for good and not brought back (SIGKILL to its launcher's process group, or to every process
  in its namespace: the machine is gone): node 0 stops within the rendezvous timeout, exit 1, with a summary that says the rendezvous timed
  out and names the lost peer's address. Every wait in this file has a timeout.

Needs root, ``ip`` (iproute2), ``unshare`` and ``hostname``; skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from torchrig.cluster import k8s

pytest.importorskip("torch")

STEPS = 60  # optimizer steps per run
CKPT_EVERY = 10
RDZV_TIMEOUT_S = 20  # how long node 0 waits for a lost node to come back (fault tests)
RUN_TIMEOUT_S = 240  # no launcher in this file may run longer
TRAIN = [
    "-m", "torchrig.train",
    "--model", "gpt", "--size", "tiny", "--data", "synthetic", "--seed", "0",
    "--micro-batch", "8", "--steps", str(STEPS), "--log-every", "1", "--ckpt-every", str(CKPT_EVERY),
    "--workers", "0", "--device", "cpu", "--no-tensorboard",
    "--resume-if-possible",  # a restarted worker group continues from the last checkpoint
]  # fmt: skip


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    for tool in ("ip", "unshare", "hostname"):
        if not shutil.which(tool):
            return f"needs {tool!r} on PATH (iproute2 / util-linux / hostname)"
    return None


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


@dataclass(frozen=True)
class Node:
    ns: str
    hostname: str
    addr: str

    def command(self, argv: list[str]) -> list[str]:
        """argv run inside this node: its network namespace, /etc/hosts and hostname."""
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.hostname, *argv]  # fmt: skip

    def pids(self) -> list[int]:
        proc = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True, timeout=30)
        return [int(p) for p in proc.stdout.split()]

    def describe(self) -> str:
        """``ps`` of the node's processes, for a failure message: who is left, in what state, waiting where."""
        pids = self.pids()
        if not pids:
            return "(none)"
        proc = subprocess.run(
            ["ps", "-o", "pid,ppid,pgid,sid,stat,etimes,wchan:24,args", "-p", ",".join(map(str, pids))],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return proc.stdout.strip() or proc.stderr.strip()

    def kill_all(self) -> list[int]:
        """SIGKILL every process of the node: what losing the machine looks like to the others."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids


@contextlib.contextmanager
def _two_nodes(hostnames: tuple[str, str], subdomain: str | None = None):
    """Two namespaces joined by a veth pair, each with its hostname; with ``subdomain``, every node's
    ``/etc/hosts`` also names it ``<hostname>.<subdomain>``, as a headless service's DNS does for pods."""
    why = _why_not()
    if why:
        pytest.skip(why)
    tag = secrets.token_hex(3)
    subnet = f"10.231.{int(tag[:2], 16) % 250 + 1}"
    made: list[Node] = []
    try:
        for i in range(2):
            ns = f"torchrig-{tag}-n{i}"
            try:
                _ip("netns", "add", ns)
            except RuntimeError as err:
                pytest.skip(f"cannot create a network namespace here: {err}")
            made.append(Node(ns, hostnames[i], f"{subnet}.{i + 1}"))
        veth = [f"tr{tag}v{i}" for i in range(2)]  # interface names are at most 15 characters
        _ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        names = {n.hostname: (f"{n.hostname}.{subdomain} " if subdomain else "") + n.hostname for n in made}
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.addr} {names[n.hostname]}\n" for n in made)
        for node, dev in zip(made, veth, strict=True):
            _ip("link", "set", dev, "netns", node.ns)
            _ip("-n", node.ns, "addr", "add", f"{node.addr}/24", "dev", dev)
            _ip("-n", node.ns, "link", "set", dev, "up")
            _ip("-n", node.ns, "link", "set", "lo", "up")
            etc = Path("/etc/netns") / node.ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)
        yield made
    finally:
        for node in made:
            node.kill_all()
            subprocess.run(["ip", "netns", "del", node.ns], capture_output=True, timeout=30)
            shutil.rmtree(Path("/etc/netns") / node.ns, ignore_errors=True)


@pytest.fixture(scope="module")
def nodes():
    with _two_nodes(("node0", "node1")) as made:
        yield made


class Launcher:
    """One ``torchrig launch`` on one node, its stdout (the report) and stderr (progress, rank output) in files."""

    def __init__(
        self,
        node: Node,
        launch_args: list[str],
        out: Path,
        work: Path,
        name: str,
        *,
        argv: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.node, self.name, self.work = node, name, work
        self.stdout_path, self.stderr_path = work / f"{name}.out", work / f"{name}.err"
        if argv is None:
            argv = [sys.executable, "-m", "torchrig", "launch", *launch_args, *TRAIN, "--out", str(out)]
        # One OpenMP thread per rank in every run, so the single- and two-node runs do the same arithmetic.
        full_env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1"}
        with open(self.stdout_path, "w") as so, open(self.stderr_path, "w") as se:
            self.proc = subprocess.Popen(
                node.command(argv), stdout=so, stderr=se, cwd=work, env=full_env, start_new_session=True
            )

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.node.kill_all()
            self.proc.wait(timeout=30)
            pytest.fail(f"{self.name} still running after {timeout:.0f} s (a hang)\n{self.tail()}")

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def tail(self, n: int = 4000) -> str:
        err = self.stderr_path.read_text(errors="replace")
        return f"--- {self.name} stdout\n{self.stdout[-n:]}\n--- {self.name} stderr\n{err[-n:]}"


def rendered_slurm_node(work: Path, out: Path, port: int) -> tuple[str, dict[str, str]]:
    """`torchrig cluster slurm` for this job: the command srun runs on each node, and the script's exports."""
    script = work / "job.sbatch"
    proc = subprocess.run(
        [sys.executable, "-m", "torchrig", "cluster", "slurm", "--nodes", "2", "--gpus-per-node", "0",
         "--rdzv-port", str(port), "-o", str(script), "--", *TRAIN, "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = script.read_text()
    exports = {}
    for line in text.splitlines():
        if line.startswith("export ") and not line.startswith("export RDZV_ENDPOINT="):
            key, _, value = line.removeprefix("export ").partition("=")
            exports[key] = shlex.split(value)[0]
    srun_body = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("bash -c ")]
    assert len(srun_body) == 1, text
    return shlex.split(srun_body[0])[2], exports


def node_args(node_rank: int, endpoint: str, rdzv_id: str, *extra: str) -> list[str]:
    """One log dir per node, as on a cluster's shared filesystem (and as `torchrig cluster` renders)."""
    return ["--cpu", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(node_rank),
            "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id, "--log-dir", f"logs-{rdzv_id}/node{node_rank}",
            *extra]  # fmt: skip


def read_metrics(out: Path) -> tuple[dict[int, float], list[dict], dict]:
    """(loss by step, with a repeated step failing the test), events, the end event."""
    losses: dict[int, float] = {}
    events = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "event" in rec:
            events.append(rec)
            continue
        assert rec["step"] not in losses, f"step {rec['step']} logged twice"
        losses[rec["step"]] = rec["loss"]
    ends = [e for e in events if e["event"] == "end"]
    assert len(ends) == 1, events
    return losses, events, ends[0]


def wait_for_checkpoint(out: Path, launchers: list[Launcher], timeout_s: float = 180) -> int:
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + timeout_s
    while not latest.is_file():
        for la in launchers:
            if la.proc.poll() is not None:
                pytest.fail(
                    f"{la.name} exited ({la.proc.returncode}) before the first checkpoint\n{la.tail()}"
                )
        if time.monotonic() > deadline:
            pytest.fail(f"no checkpoint after {timeout_s:.0f} s\n{launchers[0].tail()}")
        time.sleep(0.05)
    return int(latest.read_text().strip().split("-")[1])


@pytest.fixture(scope="module")
def single_node(nodes, tmp_path_factory):
    """The reference: one node, 2 processes (the same global batch as 2 nodes x 1), no fault."""
    work = tmp_path_factory.mktemp("single-node")
    out = work / "run"
    la = Launcher(nodes[0], ["--cpu", "--nproc-per-node", "2", "--rdzv-id", "single", "--log-dir", "logs",
                             "--no-preflight"], out, work, "single")  # fmt: skip
    assert la.wait() == 0, la.tail()
    return read_metrics(out)


def test_rendered_slurm_job_on_two_nodes_reaches_the_single_node_losses(nodes, single_node, tmp_path):
    """The node command of the rendered sbatch script, run on each node with the variables srun sets there."""
    out = tmp_path / "run"
    port = 29401
    node_cmd, exports = rendered_slurm_node(tmp_path, out, port)
    launchers = []
    for i, node in enumerate(nodes):
        slurm_env = {
            **exports,
            "SLURM_NNODES": "2",
            "SLURM_NODEID": str(i),
            "SLURM_JOB_ID": "4242",
            "SLURMD_NODENAME": node.hostname,
            # What the script computes from `scontrol show hostnames`: the first node's hostname.
            "RDZV_ENDPOINT": f"{nodes[0].hostname}:{port}",
        }
        launchers.append(
            Launcher(node, [], out, tmp_path, node.hostname, argv=["bash", "-c", node_cmd], env=slurm_env)
        )
    codes = [la.wait() for la in launchers]
    assert codes == [0, 0], "\n".join(la.tail() for la in launchers)
    # Pre-flight ran across the two namespaces before training, and each rank ran on its own node.
    for i, la in enumerate(launchers):
        assert (
            "pre-flight process-group: ok: 2 rank(s) created a gloo process group"
            in la.stdout + la.stderr_path.read_text(errors="replace")
        ), la.tail()
        assert "job finished" in la.stdout and f"/torchrig-logs/4242/node{i}/" in la.stdout, la.tail()
    # the node command passes the launcher's stderr through its node-name prefix, onto stdout
    for i, la in enumerate(launchers):
        assert f"host=node{i}" in la.stdout + la.stderr_path.read_text(errors="replace"), la.tail()
        assert f"[node{i}] " in la.stdout, la.tail()
    losses, _, end = read_metrics(out)
    ref_losses, _, ref_end = single_node
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert end["world_size"] == ref_end["world_size"] == 2
    assert end["global_batch"] == ref_end["global_batch"] == 16
    worst = max(abs(losses[s] - ref_losses[s]) for s in losses)
    assert worst <= 1e-6, f"two-node losses differ from single-node by up to {worst}"
    assert end["final_loss"] == pytest.approx(ref_end["final_loss"], abs=1e-6)


JOBSET = "torchrig-train"  # the rendered JobSet's name, and so its subdomain


@pytest.fixture(scope="module")
def jobset_pods():
    """Two pods of the rendered JobSet: hostnames ``<jobset>-node-0-<i>``, each resolvable as
    ``<hostname>.<subdomain>`` (what ``network.enableDNSHostnames`` and the headless service give pods)."""
    with _two_nodes((f"{JOBSET}-node-0-0", f"{JOBSET}-node-0-1"), subdomain=JOBSET) as made:
        yield made


def rendered_jobset_pod(work: Path, out: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """`torchrig cluster k8s --kind jobset` for this job: the pod's command + args and environment."""
    import yaml

    manifest = work / "jobset.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "torchrig", "cluster", "k8s", "--kind", "jobset", "--nodes", "2",
         "--gpus-per-node", "0", "--image", "img:1", "--rdzv-port", str(port), "-o", str(manifest),
         "--", *TRAIN, "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (doc,) = yaml.safe_load_all(manifest.read_text())
    assert doc["metadata"]["name"] == doc["spec"]["network"]["subdomain"] == JOBSET
    (container,) = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    return container["command"] + container["args"], {e["name"]: e["value"] for e in container["env"]}


def test_rendered_jobset_pods_on_two_nodes_reach_the_single_node_losses(jobset_pods, single_node, tmp_path):
    """The rendered JobSet's pod command, run in each pod as Kubernetes would run it: the pod's hostname
    and DNS name, its JOB_COMPLETION_INDEX and the manifest's environment; node 0's DNS name is the
    rendezvous endpoint."""
    out = tmp_path / "run"
    command, env = rendered_jobset_pod(tmp_path, out, 29405)
    assert command[:2] == ["torchrig", "launch"] and f"{JOBSET}-node-0-0.{JOBSET}:29405" in command
    launchers = []
    for i, pod in enumerate(jobset_pods):
        # What the kubelet execs: command + args with $(NAME) filled in from the pod's variables, no shell.
        pod_env = {**env, "JOB_COMPLETION_INDEX": str(i)}
        argv = [k8s.kubelet_expand(w, pod_env) for w in command]
        argv = [sys.executable, "-m", "torchrig", *argv[1:]]  # this checkout's torchrig
        launchers.append(Launcher(pod, [], out, tmp_path, pod.hostname, argv=argv, env=pod_env))
    codes = [la.wait() for la in launchers]
    assert codes == [0, 0], "\n".join(la.tail() for la in launchers)
    for i, (pod, la) in enumerate(zip(jobset_pods, launchers, strict=True)):
        assert (
            "pre-flight process-group: ok: 2 rank(s) created a gloo process group"
            in la.stdout + la.stderr_path.read_text(errors="replace")
        ), la.tail()
        assert f"/torchrig-logs/{JOBSET}/node{i}/" in la.stdout, la.tail()
        assert f"host={pod.hostname}" in la.stderr_path.read_text(), la.tail()
    losses, _, end = read_metrics(out)
    ref_losses = single_node[0]
    assert sorted(losses) == list(range(1, STEPS + 1)) and end["world_size"] == 2
    worst = max(abs(losses[s] - ref_losses[s]) for s in losses)
    assert worst <= 1e-6, f"JobSet pods' losses differ from single-node by up to {worst}"


def test_lost_node_comes_back_and_the_job_resumes(nodes, single_node, tmp_path):
    out = tmp_path / "run"
    endpoint = f"{nodes[0].addr}:29402"
    extra = ("--max-restarts", "1", "--rdzv-timeout", "90", "--collective-timeout", "30", "--no-preflight")
    n0 = Launcher(nodes[0], node_args(0, endpoint, "comeback", *extra), out, tmp_path, "node0")
    n1 = Launcher(nodes[1], node_args(1, endpoint, "comeback", *extra), out, tmp_path, "node1")
    ckpt_step = wait_for_checkpoint(out, [n0, n1])
    assert n1.proc.poll() is None, "node 1 finished before it could be killed: raise STEPS"
    os.killpg(n1.proc.pid, signal.SIGKILL)  # node 1's launcher, its whole process group
    n1.wait(timeout=30)
    # torchrun and the ranks run in their own session; they must go with their launcher, not linger.
    deadline = time.monotonic() + 20
    while nodes[1].pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not nodes[1].pids(), (
        f"node 1's torchrun or ranks outlived their SIGKILLed launcher\n{nodes[1].describe()}\n{n1.tail()}"
    )
    n1_again = Launcher(nodes[1], node_args(1, endpoint, "comeback", *extra), out, tmp_path, "node1-again")
    assert n0.wait() == 0, n0.tail()
    assert n1_again.wait() == 0, n1_again.tail()
    assert "restarted after attempt 0" in n0.stdout, n0.tail()
    losses, events, end = read_metrics(out)
    assert sorted(losses) == list(range(1, STEPS + 1)), "lost or repeated steps"
    resumes = [e for e in events if e["event"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] >= ckpt_step and resumes[0]["step"] % CKPT_EVERY == 0
    assert resumes[0]["restart"] == 1 and resumes[0]["world_size"] == 2
    # Resuming from a checkpoint is exact: the same losses as the run that never failed.
    ref_losses, _, ref_end = single_node
    worst = max(abs(losses[s] - ref_losses[s]) for s in losses)
    assert worst <= 1e-6, f"resumed losses differ from the uninterrupted run by up to {worst}"
    assert end["final_loss"] == pytest.approx(ref_end["final_loss"], abs=1e-6)


@pytest.mark.parametrize("loss", ["launcher", "machine"])
def test_lost_node_that_never_returns_stops_node0_with_its_name(nodes, tmp_path, loss):
    """`launcher`: SIGKILL to node 1's launcher group; `machine`: to every process of node 1."""
    out = tmp_path / "run"
    endpoint = f"{nodes[0].addr}:{29403 if loss == 'launcher' else 29404}"
    extra = ("--max-restarts", "1", "--rdzv-timeout", str(RDZV_TIMEOUT_S), "--collective-timeout", "30",
             "--no-preflight")  # fmt: skip
    n0 = Launcher(nodes[0], node_args(0, endpoint, "lost", *extra), out, tmp_path, "node0")
    n1 = Launcher(nodes[1], node_args(1, endpoint, "lost", *extra), out, tmp_path, "node1")
    wait_for_checkpoint(out, [n0, n1])
    assert n1.proc.poll() is None, "node 1 finished before it could be killed: raise STEPS"
    if loss == "launcher":
        os.killpg(n1.proc.pid, signal.SIGKILL)
    else:
        nodes[1].kill_all()
    killed_at = time.monotonic()
    n1.wait(timeout=30)
    code = n0.wait(timeout=RDZV_TIMEOUT_S + 120)
    stopped_after_s = time.monotonic() - killed_at
    assert code == 1, n0.tail()
    # Bounded: the failed collective is noticed at once; the restart waits RDZV_TIMEOUT_S for node 1, then stops.
    assert stopped_after_s < RDZV_TIMEOUT_S + 90, f"node 0 took {stopped_after_s:.0f} s to stop"
    report = n0.stdout
    assert "the rendezvous timed out: not all 2 node(s) joined again" in report, n0.tail()
    assert "lost a peer" in report, n0.tail()
    # gloo names the peer in the rank's error ("Read error [ADDR]:PORT: Connection reset by peer" or
    # "Connection closed by peer [ADDR]:PORT"); the summary must carry it.
    assert nodes[1].addr in report, f"the summary does not name the lost node {nodes[1].addr}\n{n0.tail()}"
    # torchrun's own traceback is kept in the run's torchrun.log, out of the user's terminal
    logs = "".join(f.read_text(errors="replace") for f in tmp_path.rglob("torchrun.log") if "node0" in str(f))
    assert "RendezvousTimeoutError" in logs, n0.tail()
    assert "RendezvousTimeoutError" not in n0.stderr_path.read_text(), n0.tail()
