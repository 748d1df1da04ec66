"""Two `torchrig launch` nodes on one host (c10d rendezvous on node 0): the job runs across both; when node
1's launcher is SIGKILLed mid-run, its ranks go with it and node 0 stops with an error naming the lost
peer, within the rendezvous timeout instead of hanging."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

LOOP = """
import datetime, time, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
x = torch.ones(1)
for i in range(int(__import__("sys").argv[1])):
    dist.all_reduce(x)
    assert x.item() == dist.get_world_size(), x
    x.fill_(1)
    print("iter", i, flush=True)
    time.sleep(0.2)
"""


def start(node: int, port: int, tmp: Path, iters: int, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchrig",
            "--json",
            "launch",
            "--cpu",
            "--nproc-per-node",
            "1",
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--rdzv-endpoint",
            f"localhost:{port}",
            "--rdzv-id",
            f"nodes{port}",
            "--log-dir",
            str(tmp / f"node{node}"),
            *extra,
            str(tmp / "loop.py"),
            str(iters),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def running_with(word: str) -> list[int]:
    """Pids whose command line mentions ``word`` (read from /proc, no procps needed)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if word in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_two_nodes_run_one_job(tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    port = free_port()
    nodes = [start(n, port, tmp_path, 5) for n in (0, 1)]
    outs = [p.communicate(timeout=240) for p in nodes]
    for p, (out, err) in zip(nodes, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        rep = json.loads(out)
        assert rep["plan"]["world_size"] == 2
        assert next(f for f in rep["preflight"] if f["id"] == "process-group")["severity"] == "ok"
    assert "iter 4" in outs[0][1] and "iter 4" in outs[1][1]


def test_lost_node_stops_node0_with_the_lost_peer_named(tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    port = free_port()
    extra = ("--no-preflight", "--max-restarts", "1", "--rdzv-timeout", "15")
    node0, node1 = (start(n, port, tmp_path, 1000, *extra) for n in (0, 1))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until both ranks are training
        logs = list((tmp_path / "node1").rglob("stdout.log"))
        if logs and "iter 5" in logs[0].read_text():
            break
        time.sleep(0.5)
    node1.send_signal(signal.SIGKILL)  # the launcher only: its torchrun and rank must not outlive it
    node1.wait()
    t0 = time.monotonic()
    out, _ = node0.communicate(timeout=180)
    assert node0.returncode == 1
    assert time.monotonic() - t0 < 15 + 60
    s = json.loads(out)["result"]["summary"]
    assert s["headline"].startswith("the rendezvous timed out: not all 2 node(s) joined again")
    assert "lost a peer at 127.0.0.1" in s["headline"]
    # Ranks get SIGTERM when their torchrun goes; on a loaded 2-core machine exiting can take a few seconds.
    gone_by = time.monotonic() + 20
    while running_with(str(tmp_path / "loop.py")) and time.monotonic() < gone_by:
        time.sleep(0.5)
    assert not running_with(str(tmp_path / "loop.py")), "ranks outlived their launcher"
