"""Why a rank ended: one small rule per kind of ending, the first that applies gives the cause."""

from __future__ import annotations

import inspect

from torchrig.launch import causes
from torchrig.launch.ranklog import RankLog


def _log(**kw) -> RankLog:
    return RankLog(
        **({"global_rank": 1, "local_rank": 1, "host": "vm", "pid": 7, "attempt": 0, "text": ""} | kw)
    )


def test_every_rule_is_one_small_function():
    for rule in causes.RULES:
        lines = len(inspect.getsource(rule).splitlines())
        assert lines <= 25, f"{rule.__name__}: {lines} lines; a kind of ending is one small rule"


def test_the_first_rule_that_applies_gives_the_cause():
    oom_then_killed = _log(exit_code=-9, text="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert causes.own_cause(oom_then_killed)[0] == "the GPU ran out of memory"  # the message beats the signal
    assert causes.own_cause(_log(exit_code=-9))[0].startswith("the process was killed with SIGKILL")
    assert causes.own_cause(_log(exit_code=1)) == causes.NO_MESSAGE
    ending = causes.Ending.of(_log(exit_code=1, text="ValueError: bad shape"))
    applies = [r.__name__ for r in causes.RULES if r(ending) is not None]
    assert applies == ["_uncaught_exception"]
    assert causes.own_cause(ending.log)[0] == "an uncaught exception in the script: ValueError: bad shape"


def test_a_victim_is_told_by_its_cause():
    timed_out = _log(exit_code=1, text="Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)")
    assert causes.is_victim(causes.own_cause(timed_out)[0])
    assert not causes.is_victim(causes.own_cause(_log(exit_code=-9))[0])
