"""The oldest facts in the real knowledge base: the torch 1.x era, as check / resolve use them.

- CUDA 9.2, 10.0, 10.1 and 10.2 need their own toolkit's driver (396.26, 410.48, 418.39, 440.33: "CUDA Toolkit and
  Compatible Driver Versions" in each release's notes). Minor-version compatibility starts with CUDA 11, so a
  10.2 build on a 10.1 driver fails, where an 11.8 build on an 11.0-era 450.80.02 driver runs with a caveat.
- torch 1.5.0-1.13.1 with each release's builds (1.12.1: cu102, cu113, cu116; 1.13.1: cu116, cu117); PyPI served
  cu102 up to 1.12.1 and cu117 for 1.13.
- A version older than the oldest release is "older than torchrig's knowledge base", not "never published".
- Nightlies of any CUDA (cu92, cu100, older than the data, newer than the data) or CPU are judged, never refused.
"""

from __future__ import annotations

import contextlib
import datetime
import io

import pytest

from torchrig.cli import main
from torchrig.compat import Verdict, check, load_kb
from torchrig.compat.rules import DriverSupportKind, driver_cuda_support
from torchrig.errors import InputError

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.fixture(scope="module")
def kb():
    return load_kb()


# ------------------------------------------------------------------------------------------- CUDA 9.2 / 10.x


@pytest.mark.parametrize(
    ("cuda", "floor", "below"),
    [
        ("9.2", "396.26", "390.48"),
        ("10.0", "410.48", "396.82"),
        ("10.1", "418.39", "410.104"),
        ("10.2", "440.33", "418.87.01"),
    ],
)
def test_cuda_10_builds_need_their_own_floor_with_no_minor_version_compatibility(kb, cuda, floor, below):
    tk = kb.toolkit(cuda)
    assert tk.min_driver == floor and tk.min_driver_minor_compat is None
    assert driver_cuda_support(kb, floor, cuda).kind is DriverSupportKind.NATIVE
    ds = driver_cuda_support(kb, below, cuda)
    assert ds.kind is DriverSupportKind.UNSUPPORTED
    assert "no minor-version compatibility before CUDA 11" in ds.message


def test_a_10_2_build_on_a_10_1_driver_fails_while_11_x_gets_minor_compat(kb):
    v100 = [kb.find_gpu("Tesla V100-SXM2-16GB")]
    old = check(kb, v100, "418.87.01", kb.find_build("1.12.1+cu102"))
    assert old.verdict is Verdict.FAILS and "driver_too_old" in old.codes
    assert "driver_minor_compat" not in old.codes
    # the same distance inside CUDA 11 (an 11.3 build on the 11.0 driver 450.80.02) is minor-version compatible
    new = check(kb, v100, "450.80.02", kb.find_build("1.12.1+cu113"))
    assert new.verdict is Verdict.WORKS_WITH_CAVEATS and "driver_minor_compat" in new.codes


def test_cuda_10_toolkits_build_kepler_3_0_and_turing_but_not_ampere(kb):
    assert {"3.0", "3.2", "7.5"} <= set(kb.toolkit("10.2").compute_capabilities)
    assert "7.5" not in kb.toolkit("9.2").compute_capabilities
    assert "8.0" not in kb.toolkit("10.2").compute_capabilities


def test_old_branches_read_as_their_cuda(kb):
    assert kb.branch_of("440.33.01").max_cuda == "10.2"
    assert kb.branch_of("418.87.01").max_cuda == "10.1"


# ------------------------------------------------------------------------------------------- torch 1.x


@pytest.mark.parametrize(
    ("version", "variants", "pypi"),
    [
        ("1.12.1", {"cu102", "cu113", "cu116", "cpu"}, "cu102"),
        ("1.13.1", {"cu116", "cu117", "cpu"}, "cu117"),
        ("1.8.0", {"cu102", "cu111", "cpu"}, "cu102"),
        ("1.5.0", {"cu92", "cu101", "cu102", "cpu"}, "cu102"),
    ],
)
def test_torch_1_x_releases_and_their_builds(kb, version, variants, pypi):
    rel = kb.release(version)
    assert {v.name for v in rel.variants} == variants
    assert rel.pypi_variant == pypi
    assert kb.find_build(version).variant.name == pypi


def test_the_issue_example_works_on_a_v100_with_driver_450(cli):
    r = cli("check", "--gpu", "Tesla V100", "--torch", "1.12.1+cu102", "--driver", "450.80", "--json")
    assert r.code == 0, r.err
    data = r.json()
    assert data["verdict"] == "works" and data["build"]["label"] == "1.12.1+cu102"


def test_an_ampere_gpu_on_the_pypi_cu102_build_fails_and_names_the_cu11x_build(kb):
    # the PyPI 1.10.1 wheel carries sm_37 sm_50 sm_60 sm_70 only (read from the wheel)
    r = check(kb, [kb.find_gpu("A100-SXM4-80GB")], "470.57.02", kb.find_build("1.10.1"))
    assert r.verdict is Verdict.FAILS and "arch_not_covered" in r.codes
    assert r.fixes and r.fixes[0].summary.startswith("torch 1.10.1+cu111 works")


def test_builds_before_1_11_install_from_the_find_links_page(kb):
    # pytorch.org's previous-versions page: "pip install torch==1.8.1+cu101 torchvision==0.9.1+cu101
    # torchaudio==0.8.1 -f https://download.pytorch.org/whl/torch_stable.html"
    build = kb.find_build("1.8.1+cu101")
    assert build.pip_command_for(("torch", "torchvision", "torchaudio")) == (
        "pip install torch==1.8.1+cu101 torchvision==0.9.1+cu101 torchaudio==0.8.1 "
        "-f https://download.pytorch.org/whl/torch_stable.html"
    )
    assert kb.find_build("1.8.1").pip_command == "pip install torch==1.8.1"  # PyPI's cu102
    assert kb.find_build("1.12.1+cu113").pip_command.endswith(
        "--index-url https://download.pytorch.org/whl/cu113"
    )


def test_1_8_0_cu111_kernels_are_not_confirmed(kb):
    build = kb.find_build("1.8.0+cu111")
    assert not build.variant.confirmed
    r = check(kb, [kb.find_gpu("RTX 3090")], "460.32.03", build)
    assert r.verdict is Verdict.WORKS_WITH_CAVEATS and "build_not_confirmed" in r.codes


def test_a_version_older_than_the_data_says_so(kb):
    oldest = kb.releases[-1].version
    with pytest.raises(InputError) as err:
        kb.release("1.3.0")
    assert f"older than torchrig's knowledge base, which starts at torch {oldest}" in str(err.value)
    assert "never published" not in str(err.value)
    with pytest.raises(InputError, match="never published"):
        kb.release("1.14.0")  # inside the covered range: a version that does not exist


def test_older_version_is_one_line_exit_2(cli):
    r = cli("check", "--gpu", "Tesla V100", "--torch", "1.4.0", "--driver", "450.80")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "older than torchrig's knowledge base" in r.err


# ------------------------------------------------------------------------------------------- nightlies


@pytest.mark.parametrize("variant", ["cu92", "cu100", "cu101", "cu102"])
def test_cuda_10_nightlies_are_judged(cli, variant):
    r = cli(
        "check",
        "--gpu",
        "Tesla V100",
        "--torch",
        f"1.6.0.dev20200415+{variant}",
        "--driver",
        "450.80",
        "--json",
    )
    assert r.code == 0, r.err
    data = r.json()
    assert data["verdict"] == "works_with_caveats"
    assert "prerelease_build" in [x["code"] for x in data["reasons"]]


def test_a_cuda_10_nightly_needs_its_own_floor(kb):
    build = kb.find_build("1.6.0.dev20200415+cu100")
    assert build.cuda == "10.0"
    r = check(kb, [kb.find_gpu("Tesla V100")], "396.82", build)
    assert r.verdict is Verdict.FAILS and "driver_too_old" in r.codes


def test_a_nightly_older_than_every_cuda_is_judged_with_the_oldest_as_an_upper_bound(kb):
    build = kb.find_build("1.0.0.dev20181101+cu90")
    assert build.cuda == "9.2" and "cuda_older_than_data" in dict(build.remarks)
    # below 9.2's floor is not a sure failure for a 9.0 build: a caveat
    r = check(kb, [kb.find_gpu("Tesla V100")], "390.116", build)
    assert r.verdict is Verdict.WORKS_WITH_CAVEATS and "driver_floor_unknown" in r.codes
    # a GPU newer than 9.2 can build for fails: 9.0 builds for none newer
    r = check(kb, [kb.find_gpu("RTX 2080 Ti")], "450.80.02", build)
    assert r.verdict is Verdict.FAILS and "arch_not_covered" in r.codes


@pytest.mark.parametrize("text", ["0.9.0.dev20200101+cpu", "9.1.0.dev20990101+cpu", "1.6.0.dev20200415+cpu"])
def test_a_cpu_nightly_of_any_line_is_a_cpu_build(kb, text):
    build = kb.find_build(text)
    assert build.variant.is_cpu
    if not any(
        r.version == text.split(".dev")[0] for r in kb.releases
    ):  # else judged as its release's CPU build
        assert not build.is_pypi_default and "/nightly/cpu" in build.pip_command  # nightlies are not on PyPI
    r = check(kb, [kb.find_gpu("RTX 4090")], "580.65.06", build)
    assert r.verdict is Verdict.FAILS and "cpu_only_build" in r.codes


def _nightly_strings():
    day = st.dates(min_value=datetime.date(2017, 1, 1), max_value=datetime.date(2030, 12, 31))
    local = st.one_of(st.just("cpu"), st.from_regex(r"cu[0-9]{2,3}", fullmatch=True))
    return st.builds(
        lambda x, y, z, d, v: f"{x}.{y}.{z}.dev{d:%Y%m%d}+{v}",
        st.integers(0, 3),
        st.integers(0, 20),
        st.integers(0, 3),
        day,
        local,
    )


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    torch=_nightly_strings(),
    gpu=st.sampled_from(["Tesla V100", "RTX 4090", "GTX 1080 Ti", "H100", "Tesla K80"]),
    driver=st.sampled_from([None, "396.26", "440.33", "450.80.02", "535.104.05", "580.65.06"]),
)
def test_a_well_formed_nightly_is_never_refused(torch, gpu, driver):
    argv = ["check", "--gpu", gpu, "--torch", torch, "--platform", "linux-x86_64"]
    argv += ["--driver", driver] if driver else []
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code in (0, 1), (argv, err.getvalue())
    assert torch.split("+")[0].rsplit(".dev", 1)[0] in out.getvalue()


def test_resolve_on_a_cuda_10_1_driver_picks_the_newest_cu101_build(cli):
    # R418 runs CUDA 10.1 natively and nothing newer: 1.8.1+cu101 is the newest build for it
    r = cli("resolve", "--gpu", "Tesla K80", "--driver", "418.87.01")
    assert r.code == 0, r.err
    assert r.out.splitlines()[0].split() == ["torch", "1.8.1+cu101"]
    assert "418.39 (native; CUDA 10.1 has no minor-version compatibility)" in r.out
    assert "pip install torch==1.8.1+cu101 torchvision==0.9.1+cu101 torchaudio==0.8.1 -f " in r.out


def test_a_cuda_nightly_of_a_line_the_data_lacks_is_not_pypis_build(kb):
    build = kb.find_build("2.99.0.dev20300101+cu130")
    assert not build.is_pypi_default
    assert build.pip_command.endswith("--index-url https://download.pytorch.org/whl/nightly/cu130")
