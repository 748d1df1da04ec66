"""Launch options declared once (torchrig.launch.options): launch, train and cluster take every one of them
with the same bounds, the API refuses what the parsers refuse, and cluster renders each one so that the
node's ``torchrig launch`` gets the value given."""

from __future__ import annotations

import argparse

import pytest

from torchrig.argtypes import TorchrigParser
from torchrig.cli import cmd_cluster, cmd_launch, cmd_train
from torchrig.cluster import ClusterJob
from torchrig.cluster.job import launcher_argv
from torchrig.errors import UsageError
from torchrig.launch import options
from torchrig.launch.plan import LaunchRequest


def parser_of(module, *prefix: str) -> argparse.ArgumentParser:
    p = TorchrigParser(prog="torchrig")
    if module is cmd_cluster:
        sub = p.add_subparsers(dest="target")
        for name in ("slurm", "k8s"):
            module._add_common(sub.add_parser(name))
        return p
    module.configure(p)
    return p


# train runs on one node: it takes the failure options, not the rendezvous ones
CASES = [(m, o) for m in (cmd_launch, cmd_cluster) for o in options.LAUNCH_OPTIONS] + [
    (cmd_train, o) for o in options.FAILURE_OPTIONS
]


IDS = [f"{m.__name__.rsplit('_', 1)[-1]}{o.flag}" for m, o in CASES]


@pytest.mark.parametrize("module, option", CASES, ids=IDS)
def test_each_option_has_one_type_and_bounds_everywhere(module, option):
    lead = ["slurm"] if module is cmd_cluster else []
    tail = ["--", "t.py"] if module is cmd_cluster else (["t.py"] if module is cmd_launch else [])
    args = parser_of(module).parse_args([*lead, option.flag, str(option.hi), *tail])
    assert getattr(args, option.field) == option.hi
    for bad in (option.lo - 1, option.hi + 1):
        with pytest.raises(UsageError, match=f"{option.flag} must be"):
            parser_of(module).parse_args([*lead, option.flag, str(bad), *tail])
    # the API refuses the same values with the same words
    with pytest.raises(UsageError, match=f"{option.flag} must be"):
        LaunchRequest(script="t.py", **{option.field: option.lo - 1})
    with pytest.raises(UsageError, match=f"{option.flag} must be"):
        ClusterJob(script="t.py", **{option.field: option.lo - 1})


def test_cluster_passes_every_launch_option_to_the_node():
    values = {o.field: o.lo + 7 for o in options.LAUNCH_OPTIONS}
    job = ClusterJob(script="t.py", nodes=2, **values)
    argv = launcher_argv(job, nnodes="2", node_rank="1", endpoint="head:29500", rdzv_id="42", log_dir="lg")
    p = argparse.ArgumentParser()
    cmd_launch.configure(p)
    req = cmd_launch.request_from_args(p.parse_args([str(a) for a in argv[2:]]))
    assert {f: getattr(req, f) for f in values} == values


def test_left_out_is_launchs_default():
    job = ClusterJob(script="t.py")
    argv = launcher_argv(job, nnodes="1", node_rank="0", endpoint="h:1", rdzv_id="x", log_dir="lg")
    flags = {o.flag for o in options.LAUNCH_OPTIONS} & set(map(str, argv))
    assert flags == {"--max-restarts"}  # always said: the schedulers' restart policies follow it too
