"""The fuzz harness forks a child per call: torch in that child must work after the parent used its thread
pool (an earlier test in the same session), or every real run in a fuzz case hangs until its time bound."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit  # noqa: E402


def _layer_norms() -> int:
    x = torch.randn(64, 8192)
    for _ in range(5):
        torch.nn.functional.layer_norm(x, (8192,))
    return 0


def test_a_forked_call_runs_torch_after_the_parent_used_its_thread_pool(tmp_path):
    if torch.get_num_threads() < 2:
        pytest.skip("one CPU thread: no thread pool to inherit")
    _layer_norms()  # the parent's OpenMP pool now exists
    out = fuzzkit.run_bounded(_layer_norms, ["layer_norm"], cwd=tmp_path, time_limit_s=20)
    assert out.code == 0 and out.elapsed_s < 15, out.describe()
