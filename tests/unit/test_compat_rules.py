"""The compatibility rules on a small hand-written knowledge base (tests/fixtures/compat/small_kb.toml)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from torchrig.compat import Verdict, build_kb, check, resolve
from torchrig.compat.resolve import NoBuildFound
from torchrig.compat.rules import CoverageKind, DriverSupportKind, arch_coverage, driver_cuda_support
from torchrig.errors import InputError, UsageError

SMALL = Path(__file__).resolve().parents[1] / "fixtures" / "compat" / "small_kb.toml"


@pytest.fixture(scope="module")
def kb():
    doc = tomllib.loads(SMALL.read_text())
    return build_kb(doc["gpus"], doc["cuda"], doc["drivers"], doc["torch"])


# ---- arch coverage: CUDA C++ Programming Guide, "Binary Compatibility"


@pytest.mark.parametrize(
    ("cc", "archs", "ptx", "kind", "via"),
    [
        ("8.6", ["sm_80", "sm_86"], [], CoverageKind.CUBIN_EXACT, "sm_86"),
        ("8.9", ["sm_80", "sm_86"], [], CoverageKind.CUBIN_FORWARD, "sm_86"),  # sm_86 runs on 8.9
        ("8.6", ["sm_80"], [], CoverageKind.CUBIN_FORWARD, "sm_80"),  # sm_80 runs on 8.6
        ("8.0", ["sm_86"], [], CoverageKind.NOT_COVERED, None),  # never a lower minor
        ("10.0", ["sm_90"], [], CoverageKind.NOT_COVERED, None),  # never across majors
        ("12.0", ["sm_100"], [], CoverageKind.NOT_COVERED, None),
        ("12.0", ["sm_90"], ["compute_90"], CoverageKind.PTX_JIT, "compute_90"),  # PTX JITs forward
        ("9.0", ["sm_80", "compute_80"], [], CoverageKind.PTX_JIT, "compute_80"),  # get_arch_list() style
        ("8.0", ["sm_90"], ["compute_90"], CoverageKind.NOT_COVERED, None),  # PTX never backwards
        ("9.0", ["sm_90a"], [], CoverageKind.CUBIN_EXACT, "sm_90a"),
        ("10.0", ["sm_90a"], ["compute_90a"], CoverageKind.NOT_COVERED, None),  # arch-specific: that GPU only
        ("10.3", ["sm_100f"], [], CoverageKind.CUBIN_FORWARD, "sm_100f"),
        ("3.7", ["sm_50", "sm_60"], [], CoverageKind.NOT_COVERED, None),
    ],
)
def test_arch_coverage(cc, archs, ptx, kind, via):
    cov = arch_coverage(cc, arch_list=archs, ptx=ptx)
    assert cov.kind is kind and cov.via == via
    assert cov.why


def test_not_covered_explains_major_rule():
    assert "across majors" in arch_coverage("10.0", ["sm_80", "sm_90"]).why
    assert "older than the oldest" in arch_coverage("3.7", ["sm_50"]).why


# ---- driver vs CUDA: CUDA compatibility guide, minor-version compatibility


@pytest.mark.parametrize(
    ("driver", "cuda", "kind"),
    [
        ("570.86.10", "12.8", DriverSupportKind.NATIVE),
        ("570.26", "12.8", DriverSupportKind.NATIVE),
        ("535.104.05", "12.8", DriverSupportKind.MINOR_COMPAT),
        ("525.60.13", "12.4", DriverSupportKind.MINOR_COMPAT),
        ("525.60.12", "12.4", DriverSupportKind.UNSUPPORTED),
        ("470.82.01", "12.4", DriverSupportKind.UNSUPPORTED),
        ("570.86.10", "13.0", DriverSupportKind.UNSUPPORTED),  # CUDA 13 needs >= 580 even with minor compat
        ("580.65.06", "13.0", DriverSupportKind.NATIVE),
        ("470.82.01", "11.8", DriverSupportKind.MINOR_COMPAT),
    ],
)
def test_driver_cuda_support(kb, driver, cuda, kind):
    ds = driver_cuda_support(kb, driver=driver, cuda=cuda)
    assert ds.kind is kind
    if kind is DriverSupportKind.MINOR_COMPAT:
        assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in (ds.caveat or "")
    if kind is DriverSupportKind.UNSUPPORTED:
        assert ds.message.startswith("driver too old")


def one_line(excinfo) -> str:
    return excinfo.value.one_line()


def test_driver_cuda_support_unknown_toolkit(kb):
    with pytest.raises(InputError) as e:
        driver_cuda_support(kb, driver="570.86", cuda="12.9")
    assert "known: 12.8" in one_line(e)


# ---- check


def _check(kb, gpu, driver, torch):
    return check(
        kb,
        gpus=[kb.find_gpu(g) for g in ([gpu] if isinstance(gpu, str) else gpu)],
        driver=driver,
        build=kb.find_build(torch),
    )


def test_new_gpu_on_old_build_fails_with_release_fix(kb):
    r = _check(kb, "RTX 5090", "570.86.10", "2.6.0+cu124")
    assert r.verdict is Verdict.FAILS
    assert "arch_not_covered" in r.codes and "sm_120 is not compatible" in r.reasons[-1].message
    assert r.fixes[0].kind == "release" and r.fixes[0].pip_command.endswith("whl/cu128")
    assert "torch==2.7.0" in r.fixes[0].pip_command


def test_old_gpu_fix_is_variant_of_same_release(kb):
    r = _check(kb, "1080 Ti", "570.86.10", "2.7.0+cu128")
    assert r.verdict is Verdict.FAILS
    assert (
        r.fixes[0].kind == "variant" and r.fixes[0].pip_command == "pip install torch==2.7.0"
    )  # cu126 = PyPI


def test_exact_cubin_native_driver_works(kb):
    r = _check(kb, "RTX 5090", "570.86.10", "2.7.0+cu128")
    assert r.verdict is Verdict.WORKS and r.fixes == []


def test_minor_compat_is_a_caveat(kb):
    r = _check(kb, "A100", "535.104.05", "2.7.0+cu128")
    assert r.verdict is Verdict.WORKS_WITH_CAVEATS
    assert "driver_minor_compat" in r.codes


def test_driver_below_minor_compat_floor_fails_with_driver_and_variant_fix(kb):
    r = _check(kb, "A100", "470.82.01", "2.7.0+cu128")
    assert r.verdict is Verdict.FAILS and "driver_too_old" in r.codes
    assert "CUDA 12.8 needs ≥ 570.26" in r.reasons[0].message and "you have 470.82.01" in r.reasons[0].message
    assert r.fixes[0].kind == "driver" and "570.26" in r.fixes[0].summary and "R570" in r.fixes[0].summary
    assert any(f.kind == "release" and "cu118" in (f.pip_command or "") for f in r.fixes)


def test_cuda13_on_570_fails(kb):
    r = _check(kb, "H100", "570.86.10", "2.9.0+cu130")
    assert r.verdict is Verdict.FAILS and "driver_too_old" in r.codes
    assert r.fixes[0].kind == "driver" and "580" in r.fixes[0].summary
    assert (
        r.fixes[1].kind == "variant" and r.fixes[1].pip_command == "pip install torch==2.9.0"
    )  # cu128 = PyPI


def test_forward_cubin_is_caveat_only_when_another_variant_is_native(kb):
    assert (
        _check(kb, "RTX 4090", "580.65.06", "2.9.0+cu128").verdict is Verdict.WORKS_WITH_CAVEATS
    )  # cu130 has sm_89
    assert _check(kb, "RTX 4090", "580.65.06", "2.7.0+cu128").verdict is Verdict.WORKS
    assert _check(kb, "RTX 4090", "580.65.06", "2.9.0+cu130").verdict is Verdict.WORKS


def _with_ptx_variants():
    """The small KB plus 1.13.1 variants that carry compute_86 PTX (H100 then needs JIT)."""
    doc = tomllib.loads(SMALL.read_text())
    for tk in doc["cuda"]["toolkit"]:
        if tk["version"] == "11.7":
            tk["compute_capabilities"] = ["3.7", "5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "8.7"]
        if tk["version"] == "11.8":
            tk["compute_capabilities"] = [
                "3.7",
                "5.0",
                "6.0",
                "7.0",
                "7.5",
                "8.0",
                "8.6",
                "8.7",
                "8.9",
                "9.0",
            ]
    rel = next(r for r in doc["torch"]["release"] if r["version"] == "1.13.1")
    rel["variant"][0]["ptx"] = ["compute_86"]
    rel["variant"].append(
        {"name": "cu118", "cuda": "11.8", "arch_list": ["sm_80", "sm_86"], "ptx": ["compute_86"]}
    )
    return build_kb(doc["gpus"], doc["cuda"], doc["drivers"], doc["torch"])


def test_ptx_jit_caveat_native_driver_fail_under_minor_compat_or_old_toolkit():
    kb2 = _with_ptx_variants()
    jit = _check(kb2, "H100", "580.65.06", "1.13.1+cu118")
    assert jit.verdict is Verdict.WORKS_WITH_CAVEATS and "arch_ptx_jit" in jit.codes
    assert "slow first start" in next(r.message for r in jit.reasons if r.code == "arch_ptx_jit")
    old_driver = _check(kb2, "H100", "470.82.01", "1.13.1+cu118")  # 11.8 under minor compat: newer PTX fails
    assert old_driver.verdict is Verdict.FAILS and "arch_ptx_jit_driver_too_old" in old_driver.codes
    assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in old_driver.reasons[-1].message
    assert any(f.kind == "driver" and "520.61.05" in f.summary for f in old_driver.fixes)
    predates = _check(kb2, "H100", "580.65.06", "1.13.1+cu117")  # CUDA 11.7 does not know 9.0
    assert predates.verdict is Verdict.FAILS and "toolkit_predates_gpu" in predates.codes


def test_kepler_on_new_driver_fails_with_branch_reason(kb):
    r = _check(kb, "K80", "535.104.05", "1.13.1")
    assert r.verdict is Verdict.FAILS
    assert "driver_branch_drops_arch" in r.codes
    assert "R470" in next(x.message for x in r.reasons if x.code == "driver_branch_drops_arch")


def test_blackwell_on_pre_570_driver_fails(kb):
    r = _check(kb, "RTX 5090", "560.35.03", "2.7.0+cu128")
    assert r.verdict is Verdict.FAILS and "driver_branch_predates_arch" in r.codes
    assert any(f.kind == "driver" and "R570" in f.summary for f in r.fixes)


def test_cpu_build_fails_and_names_cuda_variant(kb):
    r = _check(kb, "A100", "570.86.10", "2.6.0+cpu")
    assert r.verdict is Verdict.FAILS and "cpu_only_build" in r.codes
    assert "runs on the CPU only" in r.reasons[-1].message
    assert r.fixes[0].kind == "variant" and "cu124" in r.fixes[0].summary


def test_no_driver_checks_arch_only(kb):
    r = _check(kb, "RTX 5090", None, "2.7.0+cu128")
    assert r.verdict is Verdict.WORKS and "driver_not_checked" in r.codes and r.notes


def test_all_gpus_must_work(kb):
    r = _check(kb, ["RTX 5090", "1080 Ti"], "570.86.10", "2.7.0+cu128")
    assert r.verdict is Verdict.FAILS
    assert [x.gpu for x in r.reasons if x.code == "arch_not_covered"] == ["NVIDIA GeForce GTX 1080 Ti"]


# ---- lookups


def test_find_gpu_spellings(kb):
    for name in ("NVIDIA GeForce RTX 3090", "rtx 3090", "RTX-3090", "GeForce RTX 3090", "geforce-rtx-3090"):
        assert kb.find_gpu(name).compute_capability == "8.6"
    assert kb.find_gpu("NVIDIA A100-SXM4-80GB").memory_gb == 80
    assert kb.find_gpu("A100").peaks.bf16_tflops == 312
    assert kb.find_gpu("A100").peaks.fp8_tflops is None


def test_unknown_gpu_names_closest(kb):
    with pytest.raises(InputError) as e:
        kb.find_gpu("RTX 3909")
    assert "did you mean: NVIDIA GeForce RTX 3090" in one_line(e)


def test_unknown_release_and_variant(kb):
    with pytest.raises(InputError) as e:
        kb.find_build("2.7.5")
    assert "closest releases: 2.7.0" in one_line(e)
    with pytest.raises(InputError) as e:
        kb.find_build("2.7.0+cu121")
    assert "known builds: cu126, cu128" in one_line(e) and "not confirmed" in one_line(e)
    with pytest.raises(UsageError):
        kb.find_build("2.7.0+cuda")


def test_find_build_pypi_default(kb):
    b = kb.find_build("2.7.0")
    assert b.label == "2.7.0+cu126" and b.is_pypi_default and b.pip_command == "pip install torch==2.7.0"
    assert kb.find_build("2.7.0+cu128").pip_command == (
        "pip install torch==2.7.0 --index-url https://download.pytorch.org/whl/cu128"
    )


def test_branch_of(kb):
    assert kb.branch_of("570.86.10").max_cuda == "12.8"
    assert kb.branch_of("565.57.01") is None


# ---- resolve


def test_resolve_prefers_newest_native_cuda(kb):
    res = resolve(kb, gpus=[kb.find_gpu("RTX 4090")], driver="580.65.06")
    assert res.build.label == "2.9.0+cu130"
    assert res.pip_command == "pip install torch==2.9.0 --index-url https://download.pytorch.org/whl/cu130"
    assert res.min_driver == "580.65.06" and res.torchvision == "0.24.0"


def test_resolve_prefers_native_over_newer_minor_compat(kb):
    res = resolve(kb, gpus=[kb.find_gpu("A100")], driver="560.35.03")
    assert res.build.label == "2.9.0+cu126"  # cu128 would need minor compat on R560; cu130 fails


def test_resolve_native_release_before_a_newer_minor_compat_one(kb):
    # R535 runs CUDA 12.2 natively: the newest native build ranks first, the newer cu128 is offered beside it
    res = resolve(kb, gpus=[kb.find_gpu("A100")], driver="535.104.05")
    assert res.build.label == "2.6.0+cu118" and res.verdict is Verdict.WORKS
    assert res.newer_alternative is not None and res.newer_alternative.label == "2.9.0+cu128"
    assert res.newer_caveat and "minor-version compatibility" in res.newer_caveat


def test_resolve_minor_compat_when_nothing_native(kb):
    res = resolve(kb, gpus=[kb.find_gpu("A100")], driver="535.104.05", torch_spec=">=2.7")
    assert res.build.label == "2.9.0+cu128" and res.pip_command == "pip install torch==2.9.0"  # PyPI default
    assert res.verdict is Verdict.WORKS_WITH_CAVEATS and res.newer_alternative is None


def test_resolve_all_gpus_and_spec(kb):
    res = resolve(
        kb, gpus=[kb.find_gpu("RTX 5090"), kb.find_gpu("A100")], driver="570.86.10", torch_spec="<2.9"
    )
    assert res.build.label == "2.7.0+cu128"


def test_resolve_python_filter(kb):
    res = resolve(kb, gpus=[kb.find_gpu("A100")], driver="570.86.10", python="3.9")
    assert res.build.release.version == "2.7.0"
    with pytest.raises(InputError) as e:
        resolve(kb, gpus=[kb.find_gpu("A100")], driver="570.86.10", python="3.7")
    assert "supported: 3.8, 3.9" in one_line(e)


def test_resolve_nothing_says_why_and_what_would_help(kb):
    with pytest.raises(NoBuildFound) as e:
        resolve(kb, gpus=[kb.find_gpu("RTX 5090")], driver="535.104.05")
    assert e.value.exit_code == 1
    assert any(b.code == "driver_branch_predates_arch" for b in e.value.blockers)
    assert e.value.suggestions and "570" in e.value.suggestions[0].summary
