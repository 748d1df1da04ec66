"""tools/gpu/bench_docs.py: a GPU run's results folder becomes the docs section, in one command.

The fixture is the real first 1x H200 run (tools/gpu/bench.sh output and all.sh's machine.txt).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gpu" / "bench_docs.py"
RUN1 = ROOT / "tests" / "fixtures" / "bench" / "h200x1-run1"
spec = importlib.util.spec_from_file_location("bench_docs", TOOL)
assert spec and spec.loader
docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs)

PAGE = """# Benchmarks

intro

<!-- bench-results:h200x1:begin -->
old figures
<!-- bench-results:h200x1:end -->

<!-- bench-results:h200x2:begin -->
<!-- bench-results:h200x2:end -->
tail
"""


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run1"
    shutil.copytree(RUN1, folder)
    (folder / "bench" / "bench-1gpu.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return folder / "bench"


def test_section_replaces_only_its_markers_and_copies_the_plot(run: Path, tmp_path: Path):
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    page.write_text(PAGE)
    assert docs.main([str(run), "--label", "run 1", "--docs", str(page)]) == 0
    text = page.read_text()
    assert (
        "old figures" not in text and text.startswith("# Benchmarks\n\nintro\n") and text.endswith("tail\n")
    )
    one = text.split("<!-- bench-results:h200x1:begin -->")[1].split("<!-- bench-results:h200x1:end -->")[0]
    assert "#### 1× NVIDIA H200: run 1" in one
    assert "driver 580.159.04 (CUDA 13.0)" in one and "torch 2.11.0+cu130" in one and "Python 3.12.3" in one
    assert "2026-11-30T11:11:37Z" in one
    assert "python3 .baselines/anchor_probe.py    # rc=0 8.8s" in one  # the commands as they ran
    assert "| GEMM tf32 8192³ (GPU 0) | 350.8 TFLOP/s | 397.6 TFLOP/s | 0.882 | LOW (info) |" in one
    assert "tf32 409.4 (1.030 of the anchor)" in one  # the quick run's second sample
    assert "| GPU 0 h2d pageable | 8.5 GB/s | 55 | 15% | info |" in one  # re-graded by this version
    assert "![torchrig bench plots, 1× NVIDIA H200](img/bench-h200x1.png)" in one
    assert (page.parent / "img" / "bench-h200x1.png").read_bytes().startswith(b"\x89PNG")
    assert "<!-- bench-results:h200x2:begin -->\n<!-- bench-results:h200x2:end -->" in text
    # idempotent: a second run gives the same page
    docs.main([str(run), "--label", "run 1", "--docs", str(page)])
    assert page.read_text() == text


def test_parent_folder_with_a_bench_subfolder_is_found(run: Path):
    assert [n for n, _ in docs.find_runs(run.parent)] == [1]
    assert docs.machine_facts(run)["driver"] == "580.159.04"


def test_missing_markers_and_missing_runs_say_what_to_do(run: Path, tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="no '<!-- bench-results:h200x1:begin -->'"):
        docs.main([str(run), "--docs", str(page)])
    with pytest.raises(SystemExit, match=r"no bench-<N>gpu\.json"):
        docs.main([str(tmp_path / "empty"), "--docs", str(page)])
