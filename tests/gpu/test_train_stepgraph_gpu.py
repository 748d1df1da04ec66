"""The whole step as one CUDA graph (--step-graph on, train/stepgraph.py) on a real GPU: the same losses as
the ordinary compiled step while the learning rate changes every step (a rate frozen into the graph at
capture would show), with gradient accumulation and clipping, and across a resume. Skipped without CUDA."""

from __future__ import annotations

import json

import pytest
from tests.gpu.test_train_gpu import TINY, summary, torchrig

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# the learning rate warms up over all 30 steps: every replay runs at a different rate
BASE = [
    *TINY,
    "--precision",
    "bf16",
    "--compile",
    "--grad-accum",
    "2",
    "--warmup-steps",
    "30",
    "--log-every",
    "5",
]


def _losses(out) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and r.get("step")}


def test_the_step_graph_trains_like_the_ordinary_compiled_step(tmp_path):
    got = {}
    for graph in ("off", "on"):
        out = tmp_path / graph
        s = summary(torchrig(*BASE, "--step-graph", graph, "--compile-mode", "default", "--out", str(out)))
        assert s["step_graph"] is (graph == "on") and s["compile_mode"] == "default"
        got[graph] = _losses(out)
    assert sorted(got["on"]) == [5, 10, 15, 20, 25, 30]
    for step, loss in got["off"].items():
        assert abs(loss - got["on"][step]) < 2e-3 * abs(loss), got


def test_a_step_graph_run_resumes_where_it_stopped(tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    summary(torchrig(*BASE, "--step-graph", "on", "--out", str(whole)))
    summary(torchrig(*BASE, "--step-graph", "on", "--steps", "15", "--ckpt-every", "15", "--out", str(cut)))
    s = summary(torchrig(*BASE, "--step-graph", "on", "--resume", "--out", str(cut)))
    assert s["resumed_from"] == 15 and s["step_graph"] is True
    a, b = _losses(whole), _losses(cut)
    for step in (20, 25, 30):
        assert abs(a[step] - b[step]) < 2e-3 * abs(a[step]), (a, b)
