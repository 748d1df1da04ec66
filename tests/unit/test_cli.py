"""The CLI frame: help, version, errors as one line with exit 2, and a light start-up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchrig.cli import COMMANDS

# cattrs (and attrs under it): 35 ms, imported by the first record read from a file (torchrig/jsonrecords.py)
HEAVY = ("torch", "docker", "pynvml", "numpy", "rich", "matplotlib", "cattrs", "attrs")


def test_help_lists_every_command(cli):
    r = cli("--help")
    assert r.code == 0
    for name in COMMANDS:
        assert f"  {name} " in r.out


def test_version(cli):
    r = cli("--version")
    assert r.code == 0 and r.out.startswith("torchrig ")


def test_unknown_command_is_one_line_exit_2(cli):
    r = cli("doctr")
    assert r.code == 2
    assert r.err.strip().count("\n") == 0
    assert "did you mean: doctor" in r.err
    assert "Traceback" not in r.err


def test_unknown_global_option(cli):
    r = cli("--frobnicate")
    assert r.code == 2 and "unknown option" in r.err and r.err.count("\n") == 1


def imported_modules(args: list[str]) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "torchrig", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    mods = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            mods.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return mods


@pytest.mark.parametrize("args", [["--help"], ["check", "--help"]])
def test_light_commands_import_nothing_heavy(args):
    mods = imported_modules(args)
    assert "torchrig" in mods  # the probe works
    assert not (mods & set(HEAVY)), mods & set(HEAVY)
