"""Public reports -> the outcome each shows, answered by ``torchrig check`` as a user would type it
(tests/fixtures/compat/public_reports.toml). Works-vs-fails must agree on every case; the exact verdict on 95 %."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from torchrig.cli import main
from torchrig.compat.platforms import Platform

CASES = tomllib.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "compat" / "public_reports.toml").read_text()
)["case"]


def _answer(case, capsys) -> dict:
    argv = ["check", "--gpu", case["gpu"], "--torch", case["torch"], "--json"]
    for key in ("driver", "platform", "index"):
        if key in case:
            argv += [f"--{key}", case[key]]
    code = main(argv)
    out = json.loads(capsys.readouterr().out)
    assert code in (0, 1), out
    return out


@pytest.fixture(autouse=True)
def _x86_host(monkeypatch):
    # a case without --platform is a Linux x86_64 report, whatever machine runs the test
    monkeypatch.setattr("torchrig.compat.host.host_platform", lambda: Platform("linux-x86_64"))


def test_the_corpus_is_sourced_and_unique():
    assert len({c["id"] for c in CASES}) == len(CASES)
    for c in CASES:
        assert c["source"].startswith("https://") and c["quote"].strip(), c["id"]
        assert c["outcome"] in ("works", "fails") and c["verdict"] in ("works", "works_with_caveats", "fails")
        assert (c["outcome"] == "fails") == (c["verdict"] == "fails"), c["id"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_works_vs_fails(case, capsys):
    got = _answer(case, capsys)["verdict"]
    assert (got == "fails") == (case["outcome"] == "fails"), f"{case['source']}: {got}"


def test_exact_verdicts(capsys):
    exact = [c["id"] for c in CASES if _answer(c, capsys)["verdict"] == c["verdict"]]
    missed = sorted({c["id"] for c in CASES} - set(exact))
    assert len(exact) >= 0.95 * len(CASES), missed
