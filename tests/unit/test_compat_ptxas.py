"""Triton's bundled ptxas by version: each torch release's Triton pin (its wheels' Requires-Dist), what that Triton
bundles, and the rule that torch.compile on a GPU whose target that ptxas does not know is a caveat, for every
release, not a hand-picked range."""

from __future__ import annotations

import pytest

from torchrig.compat import load_kb
from torchrig.compat import versions as V

KB = load_kb()


def _gap(gpu: str, torch: str, prerelease: bool = False):
    return KB.ptxas_gap(KB.find_gpu(gpu), KB.release(torch), prerelease=prerelease)


def test_every_pin_and_triton_row_is_sourced_and_consistent():
    releases = {r.version for r in KB.releases}
    tritons = {t.version for t in KB.triton_ptxas}
    assert KB.triton_pins and KB.triton_ptxas
    for pin in KB.triton_pins:
        assert pin.torch in releases, pin
        assert pin.triton in tritons, (
            f"torch {pin.torch} pins Triton {pin.triton}, which has no [[triton]] row"
        )
        assert pin.source.startswith("https://") and pin.verified, pin
    for t in KB.triton_ptxas:
        assert t.source.startswith("https://") and t.verified, t
        for ptxas in (t.ptxas, t.ptxas_blackwell):
            if ptxas is not None:
                KB.toolkit(ptxas)  # a CUDA release cuda.toml knows (its compute capabilities decide)


def test_pins_read_from_the_wheels():
    pins = {p.torch: p.triton for p in KB.triton_pins}
    assert pins["2.5.1"] == "3.1.0"
    assert pins["2.9.1"] == "3.5.1"
    assert pins["2.10.0"] == pins["2.11.0"] == "3.6.0"
    assert pins["2.13.0"] == "3.7.1"


@pytest.mark.parametrize(
    "gpu, torch, ptxas",
    [
        # DGX Spark: Triton 3.5's ptxas 12.8 lacks sm_121a (triton#8539); 3.6 adds a 12.9 ptxas-blackwell
        ("NVIDIA GB10", "2.9.0", "12.8"),
        ("NVIDIA GB10", "2.9.1", "12.8"),
        ("NVIDIA GB10", "2.10.0", None),
        ("NVIDIA GB10", "2.11.0", None),
        ("NVIDIA GB10", "2.13.0", None),
        # Thor: sm_110a needs CUDA 13's ptxas: 3.5 (12.8) and 3.6 (12.9 ptxas-blackwell) lack it, 3.7 (13.1) has it
        ("NVIDIA Thor", "2.9.1", "12.8"),
        ("NVIDIA Thor", "2.10.0", "12.9"),
        ("NVIDIA Thor", "2.11.0", "12.9"),
        ("NVIDIA Thor", "2.12.0", None),
        ("NVIDIA Thor", "2.13.0", None),
        # GB300 / B300 (sm_103a): CUDA 12.9 first knows it (triton#7964 on Triton 3.4)
        ("NVIDIA GB300", "2.8.0", "12.8"),
        ("NVIDIA GB300", "2.9.1", "12.8"),
        ("NVIDIA GB300", "2.10.0", None),
        # RTX 5090 (sm_120): ptxas 12.4 of Triton 3.2 lacks it; Triton 3.3's 12.8 knows it
        ("NVIDIA GeForce RTX 5090", "2.6.0", "12.4"),
        ("NVIDIA GeForce RTX 5090", "2.7.0", None),
        ("NVIDIA B200", "2.6.0", "12.4"),
        ("NVIDIA B200", "2.7.1", None),
        # every ptxas in the data knows Hopper, Ada, Ampere, Volta
        ("NVIDIA H100 80GB HBM3", "2.4.0", None),
        ("NVIDIA H100 80GB HBM3", "2.13.0", None),
        ("NVIDIA GeForce RTX 4090", "2.1.0", None),
        ("Tesla V100-SXM2-16GB", "2.13.0", None),
        # below Triton's floor (compute capability 7.0) the ptxas is never reached
        ("Tesla P100-PCIE-16GB", "2.6.0", None),
        # torch 2.0.x's Triton 2.0.0 is not in the data: no claim
        ("NVIDIA GeForce RTX 5090", "2.0.1", None),
    ],
)
def test_the_gap_follows_the_bundled_ptxas(gpu, torch, ptxas):
    gap = _gap(gpu, torch)
    if ptxas is None:
        assert gap is None, gap
        return
    assert gap is not None and gap.certain
    assert gap.ptxas == ptxas
    cc = KB.find_gpu(gpu).compute_capability
    assert gap.target == V.sm_str(V.parse_cc(cc)) + "a"
    assert cc not in KB.toolkit(ptxas).compute_capabilities


def test_every_release_with_a_known_triton_is_judged_not_a_range():
    # for each GPU target newer than some bundled ptxas, the releases flagged are exactly those whose Triton's
    # ptxas for that target lacks it: computed independently here from the two tables
    for gpu in ("NVIDIA GB10", "NVIDIA Thor", "NVIDIA GB300", "NVIDIA GeForce RTX 5090"):
        g = KB.find_gpu(gpu)
        for release in KB.releases:
            triton = KB.triton_of(release)
            gap = KB.ptxas_gap(g, release)
            if triton is None:
                assert gap is None
                continue
            ptxas = triton.ptxas_for(g.compute_capability)[0]
            lacks = ptxas is not None and g.compute_capability not in KB.toolkit(ptxas).compute_capabilities
            assert (gap is not None) == lacks, (gpu, release.version)


def test_workaround_names_a_ptxas_that_knows_the_target_and_the_first_fixed_release():
    thor = _gap("NVIDIA Thor", "2.10.0")
    assert thor is not None
    assert "CUDA 13.0 or newer" in thor.workaround
    assert "ptxas-blackwell" in thor.workaround  # Triton 3.6 reads no variable for it
    assert "torch 2.12.0 or newer" in thor.workaround
    spark = _gap("NVIDIA GB10", "2.9.1")
    assert spark is not None
    assert spark.workaround.startswith("TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas")
    assert "CUDA 12.9 or newer" in spark.workaround and "torch 2.10.0 or newer" in spark.workaround


def test_a_nightly_may_lack_the_blackwell_ptxas():
    # 2.10.0.dev20251024 came with pytorch-triton 3.5.0 (triton#8539), 2.11.0a0 with a ptxas too old for sm_121
    # (triton#9181): a pre-release is judged by the Triton's ptxas for every target too, and said to be uncertain
    gap = _gap("NVIDIA GB10", "2.10.0", prerelease=True)
    assert gap is not None and not gap.certain and gap.ptxas == "12.8"
    assert _gap("NVIDIA GB10", "2.10.0") is None
    # a nightly carries the previous line's Triton until its own pin lands: 2.7.0.dev20250305 came with
    # pytorch-triton 3.2.0, whose ptxas 12.4 fails on sm_120 (pytorch#148551); the 2.7.0 release's 3.3.0 does not
    rtx5090 = _gap("NVIDIA GeForce RTX 5090", "2.7.0", prerelease=True)
    assert (
        rtx5090 is not None and not rtx5090.certain and (rtx5090.triton, rtx5090.ptxas) == ("3.2.0", "12.4")
    )
    assert _gap("NVIDIA GeForce RTX 5090", "2.7.0") is None
    # a release whose every ptxas knows the target stays clean as a nightly too
    assert _gap("NVIDIA H100 80GB HBM3", "2.10.0", prerelease=True) is None
    assert _gap("NVIDIA GeForce RTX 5090", "2.12.0", prerelease=True) is None


def test_check_reports_the_caveat(capsys):
    import json

    from torchrig.cli import main

    code = main(["check", "--gpu", "NVIDIA GB300", "--torch", "2.8.0+cu128", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verdict"] == "works_with_caveats"
    text = json.dumps(out)
    assert "compile_ptxas_unsupported" in text and "sm_103a" in text and "Triton (3.4.0)" in text
