"""tools/gpu/train_levers.py's pure parts: run items become the right commands and environments, the GPU-memory
units keep the compiles within the card, and the table compares each run with its own micro-batch's baseline and
default."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "train_levers", Path(__file__).parents[2] / "tools" / "gpu" / "train_levers.py"
)
assert spec and spec.loader
levers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(levers)


def test_items_become_commands(tmp_path) -> None:
    argv, env = levers.command("w16+pdl+tune+combo@64", 50, tmp_path, "b.py", [])
    assert argv[argv.index("--micro-batch") + 1] == "64" and "--compile-tuning" in argv
    assert env["TORCHRIG_BF16_WEIGHTS"] == "1" and env["TORCHINDUCTOR_ENABLE_PDL"] == "1"
    argv, env = levers.command("base", 12, tmp_path, "b.py", [])
    assert argv[-1] == "b.py" and env["MICRO_BATCH"] == "16" and env["STEPS"] == "12"
    with pytest.raises(SystemExit, match="unknown tag 'nope'"):
        levers.command("cg+nope", 3, tmp_path, "b.py", [])


def test_inductor_settings_of_two_tags_add_up(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(levers.LEVERS, "x", ({"TORCHRIG_INDUCTOR_CONFIG": "a=1"}, []))
    _, env = levers.command("combo+x", 3, tmp_path, "b.py", [])
    assert env["TORCHRIG_INDUCTOR_CONFIG"] == "combo_kernels=1,benchmark_combo_kernel=1,a=1"


def test_every_tags_inductor_settings_are_real_entries() -> None:
    """A misspelt entry would cost a GPU call: the trainer's own parser (which refuses unknown entries)
    takes every tag's TORCHRIG_INDUCTOR_CONFIG here."""
    from torchrig.train.setup import inductor_settings

    specs = {
        t: e["TORCHRIG_INDUCTOR_CONFIG"]
        for t, (e, _) in levers.LEVERS.items()
        if "TORCHRIG_INDUCTOR_CONFIG" in e
    }
    assert {"combo", "aggr", "bfus", "tma"} <= set(specs)
    import torch._inductor.config as inductor_config

    def owner_of(key):
        *path, name = key.split(".")
        owner = inductor_config
        for part in path:
            owner = getattr(owner, part)
        return owner, name

    for tag, spec in specs.items():
        keys = [item.partition("=")[0] for item in spec.split(",")]
        before = {k: getattr(*owner_of(k)) for k in keys}
        try:
            assert set(inductor_settings(spec)) == set(keys), tag
        finally:  # this worker's later compiles keep Inductor's defaults
            for k, v in before.items():
                setattr(*owner_of(k), v)


def test_default_runs_fit_the_card() -> None:
    items = set(levers.DEFAULT_RUNS.split())
    assert all(levers.parse(i)[1] in (16, 64) for i in items)
    assert max(levers.weight(i) for i in items) <= 8  # every item can compile within WARM_UNITS
    assert levers.weight("base@64") == 3 and levers.weight("cg@64") == 2 and levers.weight("cg") == 1


def test_compiles_at_once_fit_the_cards_memory() -> None:
    assert levers.warm_units(143771) == 8  # H200 (nvidia-smi's memory.total, MiB)
    assert levers.warm_units(81559) == 4  # H100 80GB HBM3, where 8 units ran out of memory
    assert levers.warm_units(24576) == 1 and levers.warm_units(None) == 8


def test_table_compares_within_a_micro_batch(tmp_path) -> None:
    def run(name, item, tok, curve=None):
        return {
            "name": name,
            "item": item,
            "rc": 0,
            "wall_s": 30,
            "profiled": False,
            "tokens_per_s": tok,
            "mfu": 0.4,
            "final_loss": 10.5,
            "curve": curve or {},
        }

    results = [
        run("base.1", "base", 100.0),
        run("cg.1", "cg", 110.0, {5: 10.0, 10: 9.0}),
        run("w16.1", "w16", 121.0, {5: 10.001, 10: 9.003}),
        run("base-mb64.1", "base@64", 200.0),
        run("cg-mb64.1", "cg@64", 210.0, {5: 11.0}),
    ]
    levers.write(tmp_path, results, 480)
    rows = {line.split()[0]: line for line in (tmp_path / "summary.txt").read_text().splitlines() if line}
    assert "1.210" in rows["w16.1"] and "0.0030 (2)" in rows["w16.1"]
    assert "1.050" in rows["cg-mb64.1"] and "0.0000 (1)" in rows["cg-mb64.1"]
    assert len(json.loads((tmp_path / "results.json").read_text())) == 5


def test_a_run_logged_every_step_has_the_same_five_step_curve() -> None:
    """`log1` logs every step; its curve is compared with the default's (logged every 5th) as 5-step means."""
    losses = {s: 10.0 - s / 7 for s in range(1, 13)}
    every_step = levers.five_step_means(losses)
    every_fifth = levers.five_step_means(
        {5: sum(losses[s] for s in range(1, 6)) / 5, 10: sum(losses[s] for s in range(6, 11)) / 5, 12: 1.0}
    )
    assert every_step.keys() == every_fifth.keys() == {5, 10}  # steps 11-12 are not a whole bin
    assert all(every_step[k] == pytest.approx(every_fifth[k]) for k in (5, 10))
    assert levers.five_step_means({25: 9.0, 50: 8.0}) == {}  # one record over five bins: nothing to compare
    assert levers.five_step_means({5: 9.0, 10: None, 15: 8.0}) == {5: 9.0, 15: 8.0}  # a skipped interval
    argv, _ = levers.command("log1", 50, Path("/tmp/x"), "b.py", [])
    assert argv[len(argv) - 1 - argv[::-1].index("--log-every") + 1] == "1"  # the last one wins in argparse
