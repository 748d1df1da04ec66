"""(GPU, driver, build, platform) -> verdict against the real knowledge base: aarch64 (Grace, DGX Spark), Jetson,
Windows/WSL, regional and laptop GPU names, nightlies, Triton's ptxas. One case per public report or maintainer
statement (tests/fixtures/compat/platform_cases.toml: its thread URL is part of the test id, with a quote)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from torchrig.compat import check, load_kb
from torchrig.compat.platforms import parse_platform

CASES_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "compat" / "platform_cases.toml"
CASES = tomllib.loads(CASES_FILE.read_text(encoding="utf-8"))["case"]
REPORTED = Path(__file__).resolve().parents[1] / "fixtures" / "compat" / "reported_cases.toml"


def test_the_table_is_big_sourced_and_new():
    assert len(CASES) >= 40
    assert len({c["id"] for c in CASES}) == len(CASES)
    older = {c["id"] for c in tomllib.loads(REPORTED.read_text(encoding="utf-8"))["case"]}
    assert not older & {c["id"] for c in CASES}
    for c in CASES:
        assert c["source"].startswith("https://"), c["id"]
        assert c["quote"].strip(), c["id"]
        assert c["verdict"] in ("works", "works_with_caveats", "fails"), c["id"]
    platforms = {parse_platform(c.get("platform", "linux-x86_64")).id for c in CASES}
    assert platforms == {"linux-x86_64", "linux-aarch64", "jetson", "windows", "wsl"}


@pytest.mark.parametrize("case", CASES, ids=[f"{c['id']} <{c['source']}>" for c in CASES])
def test_platform_case(case):
    kb = load_kb()
    plat = parse_platform(case.get("platform", "linux-x86_64"))
    result = check(
        kb,
        gpus=[kb.find_gpu(case["gpu"])],
        driver=case.get("driver"),
        build=kb.find_build(case["torch"], plat),
        platform=plat,
    )
    detail = [f"{r.code}: {r.message}" for r in result.reasons]
    assert result.verdict.value == case["verdict"], detail
    assert case["reason"] in result.codes, detail
    if result.verdict.value == "fails":
        assert result.fixes, "a failing verdict names the nearest fix"
