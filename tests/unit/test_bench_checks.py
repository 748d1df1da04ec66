"""The correctness checks can fail: a collective that does not move the data is caught.

(The real gloo run in tests/integration/test_bench_gloo.py shows the same checks pass on real collectives.)
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torchrig.bench.busbw import Collective  # noqa: E402
from torchrig.bench.comm import CollectiveCase  # noqa: E402


class DeadDist:
    """A process group whose collectives return without touching the data (a broken transport)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self, group=None) -> int:
        return self.world

    def __getattr__(self, name):
        return lambda *a, **k: []


@pytest.mark.parametrize("op", [c.value for c in Collective if c is not Collective.BROADCAST])
def test_check_catches_untouched_output(op):
    case = CollectiveCase(torch, DeadDist(rank=1, world=2), torch.device("cpu"), op, 4096, "bf16")
    assert case.check() is False


def test_broadcast_on_a_non_root_rank_is_caught():
    case = CollectiveCase(torch, DeadDist(rank=1, world=2), torch.device("cpu"), "broadcast", 4096, "bf16")
    assert case.check() is False


def test_expected_values_are_exact_in_bf16():
    case = CollectiveCase(
        torch, DeadDist(rank=0, world=8), torch.device("cpu"), "all_reduce", 1 << 16, "bf16"
    )
    want = case.expected().float()
    assert float(want.max()) == 8 * 9 / 2 + 8 * 6 and float(want.min()) == 36
