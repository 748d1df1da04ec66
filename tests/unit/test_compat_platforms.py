"""The platform axis: detection from recorded facts, --platform on check/resolve/matrix, driver numbering,
the CPU build without a GPU, and doctor naming the platform of a recorded aarch64 machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrig.compat import load_kb, resolve
from torchrig.compat.platforms import HostFacts, Platform, detect_platform, parse_platform
from torchrig.errors import InputError, UsageError

DOCTOR = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
COMPAT = Path(__file__).resolve().parents[1] / "fixtures" / "compat"


@pytest.mark.parametrize(
    "facts, expected",
    [
        (
            HostFacts(system="Linux", machine="x86_64", proc_version="Linux version 6.8.0-45-generic"),
            "linux-x86_64",
        ),
        # vllm#18390: Linux-6.8.0-1027-nvidia-64k-aarch64 (GH200)
        (
            HostFacts(system="Linux", machine="aarch64", proc_version="Linux version 6.8.0-1027-nvidia-64k"),
            "linux-aarch64",
        ),
        # jetson_stats#711: /etc/nv_tegra_release on a Jetson AGX Thor, kernel 6.8.12-tegra
        (
            HostFacts(
                system="Linux",
                machine="aarch64",
                proc_version="Linux version 6.8.12-tegra",
                tegra_release="# R38 (release), REVISION: 2.0, GCID: 41844464, BOARD: generic, EABI: aarch64",
            ),
            "jetson (JetPack 7)",
        ),
        (
            HostFacts(system="Linux", machine="aarch64", tegra_release="# R36 (release), REVISION: 4.4"),
            "jetson (JetPack 6)",
        ),
        # vllm#9293: Linux-5.15.153.1-microsoft-standard-WSL2-x86_64
        (
            HostFacts(
                system="Linux",
                machine="x86_64",
                proc_version="Linux version 5.15.153.1-microsoft-standard-WSL2",
            ),
            "wsl",
        ),
        (HostFacts(system="Windows", machine="AMD64"), "windows"),
        (HostFacts(), "linux-x86_64"),
    ],
)
def test_detect_platform_is_a_function_of_recorded_facts(facts, expected):
    assert detect_platform(facts).label == expected


def test_parse_platform_spellings_and_bad_input():
    assert parse_platform("jetson7") == Platform("jetson", "7")
    assert parse_platform("Linux-AArch64") == Platform("linux-aarch64")
    assert parse_platform("wsl2") == Platform("wsl")
    with pytest.raises(UsageError) as e:
        parse_platform("macos")
    assert "linux-x86_64, linux-aarch64, jetson" in str(e.value.hint)
    with pytest.raises(UsageError):
        parse_platform("jetson9")


def test_driver_numbering_windows_and_jetson():
    kb = load_kb()
    assert kb.windows_branch("566.36").branch == "565"  # the Windows R565 driver, not a branch 566
    assert kb.windows_branch("572.83").branch == "570"
    assert kb.jetpack_for_driver("540.4.0").version == "6"
    assert kb.jetpack_for_driver("580.00").version == "7"


def test_pypi_default_per_platform():
    kb = load_kb()
    assert kb.find_build("2.8.0", Platform("linux-aarch64")).label == "2.8.0+cpu"
    assert kb.find_build("2.8.0", Platform("windows")).label == "2.8.0+cpu"
    assert kb.find_build("2.8.0", Platform("wsl")).label == "2.8.0+cu128"
    b = kb.find_build("2.11.0", Platform("linux-aarch64"))
    assert b.label == "2.11.0+cu130" and not b.pypi_confirmed


def test_resolve_without_gpu_gives_the_cpu_build_for_the_platform():
    kb = load_kb()
    res = resolve(kb, gpus=[], platform=Platform("linux-x86_64"))
    assert res.build.variant.is_cpu and res.pip_command.endswith(
        "--index-url https://download.pytorch.org/whl/cpu"
    )
    win = resolve(kb, gpus=[], platform=Platform("windows"), torch_spec="==2.14.*")
    assert (
        win.build.label == "2.14.1+cpu" and win.pip_command == "pip install torch==2.14.1"
    )  # PyPI's default there


def test_resolve_on_aarch64_never_picks_the_pypi_cpu_wheel_for_a_gpu():
    kb = load_kb()
    res = resolve(
        kb,
        gpus=[kb.find_gpu("GH200")],
        driver="580.95.05",
        torch_spec="==2.10.*",
        platform=Platform("linux-aarch64"),
    )
    assert not res.build.variant.is_cpu and "--index-url" in res.pip_command


def test_cli_platform_flag_and_bad_value(cli):
    r = cli("check", "--gpu", "GB200", "--torch", "2.8.0", "--platform", "linux-aarch64", "--json")
    assert r.code == 1 and r.json()["platform"] == "linux-aarch64"
    bad = cli("check", "--gpu", "GB200", "--torch", "2.8.0", "--platform", "solaris")
    assert bad.code == 2 and "unknown platform 'solaris'" in bad.err and "Traceback" not in bad.err


def test_cli_resolve_without_gpu(cli):
    r = cli("resolve", "--platform", "linux-x86_64", "--json")
    assert r.code == 0 and r.json()["build"]["variant"] == "cpu" and r.json()["why"]


def test_matrix_shows_the_platform(cli):
    r = cli("matrix", "--platform", "linux-aarch64", "--torch", "2.10.0", "--json")
    data = r.json()
    assert data["platform"] == "linux-aarch64"
    t4 = next(row for row in data["rows"] if row["compute_capability"] == "7.5")
    cu130 = next(c for c in t4["cells"] if c["build"] == "2.10.0+cu130")
    assert cu130["verdict"] == "fails"  # aarch64 CUDA wheels start at sm_80
    text = cli("matrix", "--platform", "jetson7", "--torch", "2.10.0+cu130").out
    assert "on jetson (JetPack 7)" in text and "Jetson" in text


def test_doctor_names_the_platform_of_a_recorded_aarch64_machine(cli):
    r = cli(
        "doctor",
        "--facts",
        str(COMPAT / "doctor-facts-gh200-aarch64-driver560-torch2.6-cu126.json"),
        "--json",
    )
    assert "platform linux-aarch64" in r.json()["machine"]
    x86 = cli("doctor", "--facts", str(DOCTOR / "h200x1-driver580-cu130.json"), "--json")
    assert "platform" not in x86.json()["machine"]  # recorded before the machine was: unknown, not guessed


def test_init_target_is_given_detected_or_the_cpu_build():
    from torchrig.compat.host import LocalGpus
    from torchrig.compat.target import choose_target

    given = choose_target(["RTX 4090"], "550.54.15", "auto", None)
    assert given.gpus == ("RTX 4090",) and given.driver == "550.54.15" and "--gpu RTX 4090" in given.why
    found = choose_target([], None, "auto", LocalGpus(("NVIDIA H100 80GB HBM3",) * 8, "550.54.15"))
    assert found.gpus == ("NVIDIA H100 80GB HBM3",) and found.driver == "550.54.15"
    assert "detected here with NVML: 8x NVIDIA H100 80GB HBM3, driver 550.54.15" in found.why
    none = choose_target([], None, "auto", LocalGpus(error="NVML Shared Library Not Found"))
    assert none.variant == "cpu" and not none.gpus and "NVML Shared Library Not Found" in none.why
    assert choose_target([], None, "cpu", None).variant == "cpu"


def test_init_on_a_machine_without_gpu_writes_the_cpu_build_and_says_why(cli, tmp_path):
    path = tmp_path / "torchrig.toml"
    r = cli("init", str(path), "--platform", "linux-x86_64", "--json")
    assert r.code == 0, r.err
    chosen = r.json()["chosen"]
    if chosen["gpus"]:  # a machine with a GPU and a driver: detected, never a silent H100
        assert chosen["driver"] and "detected here with NVML" in chosen["why"]
    else:
        assert chosen["variant"] == "cpu" and "none found here" in chosen["why"]
        assert 'variant = "cpu"' in path.read_text() and "H100" not in path.read_text()
    assert "# Chosen by torchrig init:" in path.read_text()


def test_windows_driver_fix_speaks_windows_numbers():
    from torchrig.compat import check

    kb = load_kb()
    plat = Platform("windows")
    r = check(kb, [kb.find_gpu("RTX 4090")], "516.94", kb.find_build("2.4.0+cu121", plat), plat)
    driver_fix = next(f for f in r.fixes if f.kind == "driver")
    assert driver_fix.summary.startswith("install a Windows driver numbered 530 or higher (branch R530)")


def test_nightlies_and_source_builds_read_as_their_release_line():
    from torchrig.compat.versions import parse_torch_build_text

    n = parse_torch_build_text("2.10.0.dev20250915+cu128")
    assert (n.release, n.variant, n.prerelease) == ("2.10.0", "cu128", "2.10.0.dev20250915")
    src = parse_torch_build_text("2.11.0a0+gite33eb77")
    assert (src.release, src.variant, src.prerelease) == ("2.11.0", None, "2.11.0a0")
    assert parse_torch_build_text("torch==2.8.0+cu126").prerelease is None
    with pytest.raises(UsageError):
        parse_torch_build_text("2.8.0+gpu")
    b = load_kb().find_build("2.15.0.dev20260901+cu130")
    assert b.label == "2.15.0+cu130" and any(code == "prerelease_build" for code, _ in b.remarks)


def test_unlisted_build_is_not_confirmed_never_unpublished(cli):
    r = cli("check", "--gpu", "RTX 5090", "--torch", "2.14.1+cu129")
    assert r.code == 2 and "not confirmed either way" in r.err and "published" not in r.err


def test_unlisted_laptop_parts_take_their_desktop_namesakes_compute_capability():
    kb = load_kb()
    g = kb.find_gpu("NVIDIA GeForce RTX 4080 Laptop GPU")
    assert (g.name, g.compute_capability, g.memory_gb) == ("NVIDIA GeForce RTX 4080 Laptop GPU", "8.9", None)
    assert (
        kb.find_gpu("NVIDIA GeForce RTX 3060 Laptop GPU").id == "geforce-rtx-3060-laptop"
    )  # listed: its own row
    with pytest.raises(InputError):
        kb.find_gpu("NVIDIA H100 Laptop GPU")  # no laptop H100: not a consumer part


def test_an_unconfirmed_pypi_default_names_its_index():
    kb = load_kb()
    b = kb.find_build("2.14.1", Platform("linux-aarch64"))
    assert not b.pypi_confirmed and "--index-url https://download.pytorch.org/whl/cu130" in b.pip_command


def test_a_stand_in_arch_list_does_not_fail_a_gpu_the_cuda_can_build_for():
    from torchrig.compat import check

    kb = load_kb()
    jp7 = Platform("jetson", "7")
    thor = [kb.find_gpu("NVIDIA Thor")]
    later = check(kb, thor, "580.00", kb.find_build("2.14.1+cu130", jp7), jp7)  # no aarch64 list for 2.14 yet
    assert later.verdict.value == "works_with_caveats" and "arch_not_confirmed" in later.codes
    cu128 = check(kb, thor, "580.00", kb.find_build("2.8.0+cu128", jp7), jp7)  # CUDA 12.8 cannot build sm_110
    assert cu128.verdict.value == "fails" and "arch_not_covered" in cu128.codes
