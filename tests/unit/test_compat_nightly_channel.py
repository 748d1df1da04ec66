"""The nightly channel's CUDA variants by date (wheel_sources.toml [[nightly]], from the history of test-infra's
binary build matrix): a nightly is told whether its variant was in the channel that day, and never refused."""

from __future__ import annotations

import json
import re

import pytest

from torchrig.cli import main
from torchrig.compat import load_kb
from torchrig.compat.nightly import channel_remark, load_nightly, nightly_date


def test_every_nightly_row_is_sourced_and_dates_are_ordered():
    rows = load_nightly()
    assert {r.variant for r in rows} >= {"cu118", "cu121", "cu124", "cu126", "cu128", "cu129", "cu130"}
    for r in rows:
        assert r.source.startswith("https://github.com/pytorch/test-infra/blob/"), r
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r.listed_from) and re.fullmatch(
            r"\d{4}-\d{2}-\d{2}", r.verified
        )
        if r.dropped:
            assert r.listed_from < r.dropped and r.dropped_source and r.dropped_source.startswith("https://")
    assert len({r.variant for r in rows}) == len(rows)


@pytest.mark.parametrize(
    ("prerelease", "variant", "code"),
    [
        ("2.9.0.dev20250720", "cu129", "nightly_channel"),  # cu129: 2025-06-16 to 2025-09-01
        ("2.9.0.dev20251020", "cu129", "nightly_channel_not_listed"),  # dropped before that day
        ("2.7.0.dev20250101", "cu128", "nightly_channel_not_listed"),  # not yet: from 2025-02-03
        ("2.6.0.dev20241201", "cu126", "nightly_channel"),
        ("2.6.0.dev20241201", "cu121", "nightly_channel_not_listed"),  # dropped 2024-11-12
    ],
)
def test_channel_remark_by_date(prerelease, variant, code):
    remark = channel_remark(prerelease, variant)
    assert remark is not None and remark[0] == code, remark


def test_no_remark_without_a_date_a_row_or_before_the_first_readable_date():
    assert nightly_date("2.11.0rc1") is None and channel_remark("2.11.0rc1", "cu128") is None
    assert channel_remark("2.9.0.dev20250720", "cu999") is None
    assert channel_remark("2.0.0.dev20221201", "cu118") is None  # earlier_unknown: not "not listed"


def _check(capsys, *argv):
    code = main(["check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_nightly_of_a_cuda_newer_than_the_data_is_judged_not_refused(capsys):
    newest = max(load_kb().toolkits, key=lambda t: tuple(int(p) for p in t.version.split("."))).version
    major, minor = newest.split(".")
    ahead = f"cu{major}{int(minor) + 1}"
    code, out = _check(
        capsys, "--gpu", "H100", "--driver", "580.65.06", "--torch", f"2.99.0.dev20990101+{ahead}"
    )
    assert code in (0, 1) and "cuda_not_in_data" in [r["code"] for r in out["reasons"]], out
    assert out["build"]["cuda"] == newest  # a lower bound, said so
    # the recorded case: cu134 on the channel from 2026-08-10
    code, out = _check(
        capsys, "--gpu", "H100", "--driver", "580.65.06", "--torch", "2.14.0.dev20260815+cu134"
    )
    codes = [r["code"] for r in out["reasons"]]
    assert code == 0 and "nightly_channel" in codes


def test_a_dropped_variant_is_a_caveat_in_check(capsys):
    code, out = _check(capsys, "--gpu", "H100", "--driver", "580.65.06", "--torch", "2.9.0.dev20251020+cu129")
    assert code == 0 and out["verdict"] == "works_with_caveats"
    assert "nightly_channel_not_listed" in [r["code"] for r in out["reasons"]]
