"""(GPU, driver, build) -> verdict against the real knowledge base, one case per real user report or maintainer
statement (tests/fixtures/compat/reported_cases.toml: each case carries its thread URL, which is part of the
test id, and a quote)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from torchrig.compat import check, load_kb

CASES_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "compat" / "reported_cases.toml"
CASES = tomllib.loads(CASES_FILE.read_text(encoding="utf-8"))["case"]


def test_the_table_is_big_and_sourced():
    assert len(CASES) >= 40
    assert len({c["id"] for c in CASES}) == len(CASES)
    for c in CASES:
        assert c["source"].startswith("https://"), c["id"]
        assert c["quote"].strip(), c["id"]
        assert c["verdict"] in ("works", "works_with_caveats", "fails"), c["id"]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['id']} <{c['source']}>" for c in CASES])
def test_reported_case(case):
    kb = load_kb()
    result = check(
        kb, gpus=[kb.find_gpu(case["gpu"])], driver=case.get("driver"), build=kb.find_build(case["torch"])
    )
    detail = [f"{r.code}: {r.message}" for r in result.reasons]
    assert result.verdict.value == case["verdict"], detail
    if case.get("data_disagrees"):
        assert case["reason"] not in result.codes, "the data was fixed: drop this case's data_disagrees"
        pytest.xfail(f"known data error: {case['data_disagrees']}")
    assert case["reason"] in result.codes, detail
    if result.verdict.value == "fails":
        assert result.fixes, "a failing verdict names the nearest fix"
