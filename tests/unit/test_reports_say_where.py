"""Small promises of the reports: bench refuses an absurd message size, export names the file that holds
the ONNX weights, train says where it wrote the run."""

from __future__ import annotations

import pytest

from torchrig.cli.cmd_export import ExportReport
from torchrig.export.core import Artifact, ExportResult
from torchrig.train.run import TrainResult


@pytest.mark.parametrize("size", ["1000000TiB", "257GiB", "0"])
def test_bench_max_size_is_bounded(cli, size):
    r = cli("bench", "--only", "collectives", "--max-size", size, "--dry-run")
    assert r.code == 2 and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err


def test_bench_max_size_in_range_is_taken(cli_in_process):
    # in process: a dry run on the GPUs torch sees imports torch, which a new interpreter pays seconds for
    r = cli_in_process("bench", "--only", "collectives", "--max-size", "4GiB", "--dry-run")
    assert r.code == 0, r.err


def test_export_names_the_onnx_weights_file():
    onnx = Artifact(
        "onnx", "/r/export/model.onnx", 10, 0.0, "onnxruntime", True, 1.0, ("/r/export/model.onnx.data",)
    )
    pt2 = Artifact("pt2", "/r/export/model.pt2", 10, 0.0, "torch.export", True, 1.0)
    text = ExportReport(
        ExportResult("/r/checkpoints/step-2", 2, "gpt", (1, 8), 1e-3, (pt2, onnx))
    ).render_text()
    assert "/r/export/model.onnx keeps its weights in /r/export/model.onnx.data" in text
    assert text.count("keeps its weights") == 1


def test_train_says_where_the_run_is():
    text = TrainResult(None, None, "/runs/a").render_text()
    assert text == "the run is in /runs/a (metrics.jsonl, checkpoints/, summary.json)"
    assert TrainResult(None, None, "/runs/a").to_json()["out"] == "/runs/a"
