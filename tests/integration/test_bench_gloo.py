"""The CPU/gloo path end to end: torchrun starts 2 (and 3) real worker processes, the collectives run on gloo,
every result is checked, and busbw follows nccl-tests' arithmetic."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCHEMA = Path(__file__).resolve().parents[2] / "src" / "torchrig" / "bench" / "schema.json"
# busbw factors worked out by hand from nccl-tests doc/PERFORMANCE.md
FACTORS = {
    2: {
        "all_reduce": 1.0,
        "all_gather": 0.5,
        "reduce_scatter": 0.5,
        "broadcast": 1.0,
        "all_to_all": 0.5,
        "sendrecv": 1.0,
    },
    3: {
        "all_reduce": 4 / 3,
        "all_gather": 2 / 3,
        "reduce_scatter": 2 / 3,
        "broadcast": 1.0,
        "all_to_all": 2 / 3,
        "sendrecv": 1.0,
    },
}


def check_collectives(rows, ranks):
    assert rows
    for c in rows:
        assert c["check_ok"], c
        assert c["ranks"] == ranks
        algbw = c["size_bytes"] / (c["time_us"] * 1e-6) / 1e9
        assert c["algbw_gbps"] == pytest.approx(algbw, rel=1e-9)
        assert c["busbw_gbps"] == pytest.approx(algbw * FACTORS[ranks][c["op"]], rel=1e-9)


def test_two_processes_quick_run(cli, tmp_path):
    r = cli(
        "bench", "--cpu", "--nproc-per-node", "2", "--quick", "--json", "--out", str(tmp_path), timeout=300
    )
    assert r.code == 0, r.err[-3000:]
    data = r.json()
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    m = data["measurements"]
    assert m["meta"]["backend"] == "gloo" and m["meta"]["world_size"] == 2 and m["meta"]["quick"] is True
    assert [g["rank"] for g in m["gpus"]] == [0, 1]
    assert {(g["rank"], g["dtype"]) for g in m["gemm"]} == {
        (0, "fp32"),
        (0, "bf16"),
        (1, "fp32"),
        (1, "bf16"),
    }
    assert all(g["check_ok"] for g in m["gemm"]) and all(x["check_ok"] for x in m["memory"])
    check_collectives(m["collectives"], 2)
    assert {c["op"] for c in m["collectives"]} == set(FACTORS[2])
    assert sorted((p["src"], p["dst"]) for p in m["p2p"]) == [(0, 1), (1, 0)]
    assert all(p["check_ok"] and p["oneway_gbps"] > 0 and p["latency_us"] > 0 for p in m["p2p"])
    assert [s["gpus"] for s in m["scaling"]] == [1, 2] and m["scaling"][0]["efficiency"] == 1.0
    assert {f["grade"] for f in data["findings"]} == {"no GPU"}
    assert {s["part"] for s in m["skipped"]} >= {"host"}
    assert "[1/" in r.err  # progress went to stderr, data to stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md", "bench.png"]


def test_three_processes_collectives_only(cli):
    r = cli(
        "bench",
        "--cpu",
        "--nproc-per-node",
        "3",
        "--only",
        "collectives",
        "--max-size",
        "64KiB",
        "--collectives",
        "all_reduce,reduce_scatter,all_to_all,sendrecv",
        "--json",
        timeout=300,
    )
    assert r.code == 0, r.err[-3000:]
    m = r.json()["measurements"]
    assert m["gemm"] == [] and m["p2p"] == [] and m["scaling"] == []
    check_collectives(m["collectives"], 3)
    # 1 KiB of fp32 over 3 ranks rounds to 85 elements each: S = 3 * 85 * 4 = 1020 bytes (nccl-tests rounds the same way)
    assert min(c["size_bytes"] for c in m["collectives"]) == 1020


@pytest.mark.parametrize("how", ["ctrl-c", "sigkill"])
def test_a_stopped_bench_leaves_no_torchrun_or_worker_behind(tmp_path, how, alive):
    """Ctrl-C (SIGINT to the bench alone, as a terminal sends it to the foreground group that torchrun's
    session is not in) or SIGKILL: torchrun and the workers go with the bench, within the guard's grace."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from torchrig.launch.guard import descendants

    proc = subprocess.Popen(
        [sys.executable, "-m", "torchrig", "bench", "--cpu", "--nproc-per-node", "2", "--only", "collectives",
         "--max-size", "64MiB", "--json", "--out", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip

    def workers(pids: list[int]) -> list[int]:
        found = []
        for pid in pids:
            try:
                if b"torchrig.bench.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                pass
        return found

    deadline = time.monotonic() + 120
    tree: list[int] = []
    while len(workers(tree)) < 2:
        assert proc.poll() is None, f"bench exited early: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
        assert time.monotonic() < deadline, f"bench never started its workers: {tree}"
        time.sleep(0.5)
        tree = descendants(proc.pid)
    time.sleep(2)  # the workers are in their collectives now
    tree = descendants(proc.pid)
    proc.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGKILL)
    code = proc.wait(timeout=60)
    assert code == (130 if how == "ctrl-c" else -signal.SIGKILL)

    gone_by = time.monotonic() + 30
    while any(alive(p) for p in tree) and time.monotonic() < gone_by:
        time.sleep(0.2)
    left = [p for p in tree if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"processes outlived the bench: {left}"


def test_a_bench_rank_that_dies_is_named_with_its_cause(tmp_path):
    """The workers start through the launch API: a rank killed mid-run is reported by launch's failure
    summary (which rank, how it ended, the likely cause), not as torchrun's bare exit status."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import rankkill

    options = ("--cpu", "--nproc-per-node", "2", "--only", "collectives", "--collectives", "all_reduce",
               "--max-size", "64MiB")  # fmt: skip
    rankkill.check_the_summary_names_it(tmp_path, *rankkill.bench_with_a_killed_rank(tmp_path, *options))
