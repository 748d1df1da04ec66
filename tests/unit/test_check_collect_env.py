"""``check --collect-env``: PyTorch's collect_env report, as users paste it, read into the request the options
make, and answered exactly as those options are (tests/fixtures/collect_env/cases.toml: real reports from
public issues, each with its source). Then the formats of the script's history line by line, the wheel source
the conda/NGC lines make certain, the overrides, the one-line errors, and a fuzz of arbitrary text and bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from torchrig.cli import main
from torchrig.compat.collectenv import read_report

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "collect_env"
CASES = tomllib.loads((FIX / "cases.toml").read_text())["case"]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _explicit(case: dict) -> list[str]:
    argv = ["check"]
    for gpu in case["gpus"]:
        argv += ["--gpu", gpu]
    for key in ("torch", "driver", "platform", "index"):
        if case.get(key):
            argv += [f"--{key}", case[key]]
    return argv


def test_the_corpus_is_sourced_and_covers_the_kinds_asked_for():
    files = {p.name for p in FIX.glob("*.txt")}
    assert files == {c["file"] for c in CASES}, "every report has a case, every case a report"
    for c in CASES:
        assert c["source"].startswith("https://github.com/") and c["kind"], c["file"]
        assert ("verdict" in c) != ("error" in c), c["file"]
    kinds = " ".join(c["kind"] for c in CASES).lower()
    for word in (
        "pip",
        "wsl",
        "jetson",
        "aarch64",
        "windows",
        "different gpus",
        "cpu",
        "quoted",
        "indented",
        "conda",
    ):
        assert word in kinds, word
    assert len(CASES) >= 8


@pytest.mark.parametrize("case", CASES, ids=[c["file"].removesuffix(".txt") for c in CASES])
def test_a_real_report_is_read_and_answered_as_the_options_would_be(case, capsys):
    report = read_report((FIX / case["file"]).read_text())
    assert list(report.gpus) == case["gpus"]
    assert report.torch == case.get("torch")
    assert report.driver == case.get("driver")
    assert report.platform == case["platform"]
    assert report.index == case.get("index")
    if "inferred" in case:
        assert any(case["inferred"] in note for note in report.inferred), report.inferred
    code, out, err = _run(["check", "--collect-env", str(FIX / case["file"]), "--json"], capsys)
    if "error" in case:
        assert code == 2 and case["error"] in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
        if case["gpus"] and case.get("torch"):  # the same error as the options get
            assert _run(_explicit(case), capsys)[2] == err
        return
    got = json.loads(out)
    assert got["verdict"] == case["verdict"], got["reasons"]
    assert code == (1 if case["verdict"] == "fails" else 0)
    read = got.pop("collect_env")
    assert read["request"]["torch"] == case["torch"] and read["overridden"] == []
    e_code, e_out, _ = _run([*_explicit(case), "--json"], capsys)
    assert (e_code, json.loads(e_out)) == (code, got), "the answer is the one the options get"


def test_the_human_view_says_what_was_read_and_what_it_stands_for(capsys):
    code, out, _ = _run(["check", "--collect-env", str(FIX / "wsl2-rtx4070-laptop-2.4.0-cu121.txt")], capsys)
    assert code == 0
    assert out.startswith(
        "read from the collect_env report:\n  PyTorch version: 2.4.0+cu121  (--torch 2.4.0+cu121)"
    )
    assert (
        "Python platform: Linux-5.15.153.1-microsoft-standard-WSL2-x86_64-with-glibc2.35  (--platform wsl)"
        in out
    )
    assert "Nvidia driver version: 551.88  (--driver 551.88)" in out
    assert "torch 2.4.0+cu121 on NVIDIA GeForce RTX 4070 Laptop GPU (sm_89), driver 551.88, wsl: WORKS" in out


def test_options_given_override_the_report(capsys):
    path = str(FIX / "wsl2-rtx4070-laptop-2.4.0-cu121.txt")
    code, out, _ = _run(["check", "--collect-env", path, "--driver", "470.57.02", "--json"], capsys)
    got = json.loads(out)
    assert code == 1 and got["driver"] == "470.57.02" and got["collect_env"]["overridden"] == ["--driver"]
    e_code, e_out, _ = _run(
        [
            *("check", "--gpu", "NVIDIA GeForce RTX 4070 Laptop GPU", "--torch", "2.4.0+cu121"),
            *("--driver", "470.57.02", "--platform", "wsl", "--json"),
        ],
        capsys,
    )
    got.pop("collect_env")
    assert (e_code, json.loads(e_out)) == (code, got)
    # a field the report lacks, given as an option: the answer goes on
    nightly = str(FIX / "windows-cpu-nightly-no-cuda.txt")
    code, out, _ = _run(["check", "--collect-env", nightly, "--gpu", "RTX 3060"], capsys)
    assert code == 1 and "CPU" in out, out


def test_standard_input(tmp_path):
    text = (FIX / "pip-h100-2.9.1-cu126-driver580.txt").read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "torchrig", "check", "--collect-env", "-", "--json"],
        input=text,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "works"


def test_without_collect_env_gpu_and_torch_are_still_required(capsys):
    code, _, err = _run(["check", "--gpu", "A100"], capsys)
    assert code == 2 and "the following arguments are required: --torch" in err and err.count("\n") == 1


# The formats of the script's history, one field at a time (lines as torch/utils/collect_env.py prints them).
HEAD = "OS: Ubuntu 22.04.4 LTS (x86_64)\nGPU models and configuration: GPU 0: NVIDIA GeForce RTX 4090\n"


@pytest.mark.parametrize(
    ("text", "torch", "index", "inferred"),
    [
        # the pytorch conda channel: its build string names the CUDA, the version does not
        (
            "PyTorch version: 2.0.1\nCUDA used to build PyTorch: 11.8\n"
            "[conda] pytorch                   2.0.1           py3.10_cuda11.8_cudnn8.7.0_0    pytorch\n"
            "[conda] pytorch-cuda              11.8                 h7e8668a_5    pytorch\n",
            "2.0.1+cu118",
            None,
            "the pytorch conda channel's build py3.10_cuda11.8_cudnn8.7.0_0",
        ),
        (
            "PyTorch version: 2.1.0\nCUDA used to build PyTorch: None\n"
            "[conda] pytorch                   2.1.0               py3.11_cpu_0    pytorch\n",
            "2.1.0+cpu",
            None,
            "CPU build",
        ),
        # conda-forge: the build string names the variant; --index conda-forge
        (
            "PyTorch version: 2.5.1\nCUDA used to build PyTorch: 12.6\n"
            "[conda] pytorch                   2.5.1           cuda126_mkl_py312_h30b5a27_303    conda-forge\n",
            "2.5.1+cu126",
            "conda-forge",
            "conda-forge's build cuda126_mkl_py312_h30b5a27_303",
        ),
        (
            "PyTorch version: 1.8.0\nCUDA used to build PyTorch: 11.2\n"
            "[conda] pytorch-gpu 1.8.0 cuda112py38h0bbbad9_1 conda-forge\n",
            "1.8.0+cu112",
            "conda-forge",
            "conda-forge's build",
        ),
        # pip inside conda: the pypi channel is PyPI's wheel, as printed
        ("PyTorch version: 2.3.1+cu121\n[conda] torch 2.3.1 pypi_0 pypi\n", "2.3.1+cu121", None, None),
        # an NGC container's torch without its nvYY.MM tag: exactly one container has it
        (
            "PyTorch version: 2.3.0a0+ebedce2\nCUDA used to build PyTorch: 12.3\n",
            "2.3.0a0+ebedce2",
            "ngc",
            "NGC",
        ),
        # a pre-release hash no container carries: as printed, and said
        (
            "PyTorch version: 2.4.0a0+deadbeef0\nCUDA used to build PyTorch: 12.4\n",
            "2.4.0a0+deadbeef0",
            None,
            "no NGC container in torchrig's data carries",
        ),
        # the nvYY.MM tag is check's to place (NGC off a Jetson, NVIDIA's JetPack wheel on one)
        ("PyTorch version: 2.5.0a0+e000cf0ad9.nv24.10\n", "2.5.0a0+e000cf0ad9.nv24.10", None, None),
        # a bare version and its CUDA: the tag the CUDA line makes certain
        (
            "PyTorch version: 2.1.0\nCUDA used to build PyTorch: 12.1\n",
            "2.1.0+cu121",
            None,
            "built with CUDA 12.1",
        ),
        ("PyTorch version: 2.2.2\nCUDA used to build PyTorch: Could not collect\n", "2.2.2+cpu", None, "CPU"),
        # torch did not import: the pip line says which is installed
        (
            "PyTorch version: N/A\n[pip3] numpy==1.26.4\n[pip3] torch==2.4.1+cu124\n",
            "2.4.1+cu124",
            None,
            None,
        ),
    ],
)
def test_the_torch_lines_and_the_wheel_source(text, torch, index, inferred):
    r = read_report(HEAD + text)
    assert (r.torch, r.index) == (torch, index)
    if inferred:
        assert any(inferred in note for note in r.inferred), r.inferred
    else:
        assert not [n for n in r.inferred if "torch" in n], r.inferred


def test_the_conda_source_answers_as_its_options(capsys, tmp_path):
    report = tmp_path / "r.txt"
    report.write_text(
        HEAD
        + "Nvidia driver version: 560.35.03\nPyTorch version: 2.5.1\nCUDA used to build PyTorch: 12.6\n"
        + "[conda] pytorch 2.5.1 cuda126_mkl_py312_h30b5a27_303 conda-forge\n"
    )
    code, out, _ = _run(["check", "--collect-env", str(report), "--json"], capsys)
    got = json.loads(out)
    assert got["collect_env"]["request"]["index"] == "conda-forge"
    got.pop("collect_env")
    argv = ["check", "--gpu", "NVIDIA GeForce RTX 4090", "--torch", "2.5.1+cu126", "--driver", "560.35.03"]
    e_code, e_out, _ = _run([*argv, "--platform", "linux-x86_64", "--index", "conda-forge", "--json"], capsys)
    assert (e_code, json.loads(e_out)) == (code, got)
    assert "conda-forge" in got["reasons"][0]["message"]
    # another --torch drops the source that was inferred from the report's torch lines
    code, out, _ = _run(["check", "--collect-env", str(report), "--torch", "2.5.1+cu124", "--json"], capsys)
    assert json.loads(out)["collect_env"]["overridden"] == ["--torch"]
    assert "conda-forge" not in json.loads(out)["reasons"][0]["message"]


@pytest.mark.parametrize(
    ("text", "platform"),
    [
        ("Python platform: Linux-5.15.153.1-microsoft-standard-WSL2-x86_64-with-glibc2.35\n", "wsl"),
        ("Python platform: Linux-5.10.120-tegra-aarch64-with-glibc2.29\n", "jetson"),
        ("Python platform: Windows-10-10.0.22631-SP0\n", "windows"),
        ("Python platform: Linux-6.8.0-1027-nvidia-64k-aarch64-with-glibc2.35\n", "linux-aarch64"),
        ("OS: Microsoft Windows 10 Pro\n", "windows"),
        ("OS: Ubuntu 22.04.5 LTS (aarch64)\n", "linux-aarch64"),
        ("OS: Could not collect\nCPU:\nArchitecture:                         aarch64\n", "linux-aarch64"),
        ("OS: Ubuntu 18.04.4 LTS\n", "linux-x86_64"),  # before 1.7: the machine is not printed
        ("OS: Could not collect\n", None),
    ],
)
def test_the_platform(text, platform):
    r = read_report("PyTorch version: 2.8.0+cu128\n" + text)
    assert r.platform == platform
    if platform is None:
        assert "OS" in r.missing


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("GPU models and configuration: GPU 0: NVIDIA A100-SXM4-80GB\n", ["NVIDIA A100-SXM4-80GB"]),
        (
            "GPU models and configuration: \nGPU 0: Tesla V100-SXM2-16GB\nGPU 1: NVIDIA GeForce RTX 4090\n\n"
            "Nvidia driver version: 550.54.14\n",
            ["Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090"],
        ),
        (  # nvidia-smi -L with MIG devices and an undeleted UUID
            "GPU models and configuration:\n"
            "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
            "  MIG 3g.20gb     Device  0: (UUID: MIG-aaaa)\n"
            "Nvidia driver version: 535.104.05\n",
            ["NVIDIA A100-SXM4-40GB"],
        ),
        ("GPU models and configuration: Quadro P1000\n", ["Quadro P1000"]),
        ("GPU models and configuration: Could not collect\n", []),
        ("GPU models and configuration: No CUDA\nNvidia driver version: No CUDA\n", []),
    ],
)
def test_the_gpus(text, gpus):
    r = read_report("PyTorch version: 2.8.0+cu128\nOS: Ubuntu 22.04 (x86_64)\n" + text)
    assert list(r.gpus) == gpus


def test_crlf_and_quotes_and_indentation_read_the_same():
    plain = (FIX / "pip-h100-2.9.1-cu126-driver580.txt").read_text()
    want = read_report(plain)
    for variant in (
        plain.replace("\n", "\r\n"),
        "".join(f"> {line}\n" for line in plain.splitlines()),
        "".join(f"    {line}\n" for line in plain.splitlines()),
    ):
        got = read_report(variant)
        assert (got.gpus, got.torch, got.driver, got.platform) == (
            want.gpus,
            want.torch,
            want.driver,
            want.platform,
        )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("PyTorch version: N/A\n" + HEAD, "does not give PyTorch version (N/A); pass --torch VERSION"),
        (
            "PyTorch version: 2.8.0+cu128\nGPU models and configuration: GPU 0: A100\n",
            "OS (absent); pass --platform",
        ),
        (
            "PyTorch version: 2.4.0+rocm6.0\nROCM used to build PyTorch: 6.0.32830\n" + HEAD,
            "a ROCm build of torch",
        ),
        (
            "PyTorch version: 2.2.2\nOS: macOS 14.5 (x86_64)\nGPU models and configuration: GPU 0: RTX 4090\n",
            "from macOS",
        ),
        ("", "does not give PyTorch version (absent), GPU models and configuration (absent), OS (absent)"),
    ],
)
def test_what_the_report_lacks_is_one_line_naming_the_option(text, needle, tmp_path, capsys):
    report = tmp_path / "r.txt"
    report.write_text(text)
    code, _, err = _run(["check", "--collect-env", str(report)], capsys)
    assert code == 2 and needle in err, err
    assert err.startswith("torchrig: error: ") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"PyTorch version: 2.8.0\x00\n", "NUL bytes"),
        (b"\xff\xfe\x00binary", "not UTF-8"),
    ],
)
def test_a_binary_file_is_refused(content, needle, tmp_path, capsys):
    report = tmp_path / "r.bin"
    report.write_bytes(content)
    code, _, err = _run(["check", "--collect-env", str(report), "--json"], capsys)
    assert code == 2 and needle in err and err.count("\n") == 1


def test_a_missing_file_and_a_folder(tmp_path, capsys):
    code, _, err = _run(["check", "--collect-env", str(tmp_path / "nope.txt")], capsys)
    assert code == 2 and "does not exist" in err
    code, _, err = _run(["check", "--collect-env", str(tmp_path)], capsys)
    assert code == 2 and "is a folder" in err


def test_the_docs_example_runs_as_shown(tmp_path):
    """docs/knowledge-base.md's collect_env block, run as written on a real report (the WSL2 one)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import docblocks

    (block,) = docblocks.tested_by(
        ROOT / "docs" / "knowledge-base.md",
        "tests/unit/test_check_collect_env.py::test_the_docs_example_runs_as_shown",
    )
    (tmp_path / "report.txt").write_bytes((FIX / "wsl2-rtx4070-laptop-2.4.0-cu121.txt").read_bytes())
    steps = block.steps()
    assert len(steps) == 2
    for command, shown in steps:
        proc = docblocks.run(command, tmp_path, timeout=120)
        want = 1 if "# exit 1" in command else 0
        assert proc.returncode == want, proc.stderr
        assert not docblocks.missing(proc.stdout, shown), (command, docblocks.missing(proc.stdout, shown))


@pytest.mark.parametrize(
    ("text", "argv", "said"),
    [
        (  # several different GPUs: each judged, as --gpu repeated
            "PyTorch version: 2.8.0+cu126\nPython platform: Linux-6.8.0-60-generic-x86_64-with-glibc2.39\n"
            "GPU models and configuration: \nGPU 0: Tesla V100-SXM2-32GB\nGPU 1: NVIDIA GeForce RTX 4090\n"
            "GPU 2: NVIDIA GeForce RTX 4090\n\nNvidia driver version: 550.54.14\n",
            [
                *(
                    "--gpu",
                    "Tesla V100-SXM2-32GB",
                    "--gpu",
                    "NVIDIA GeForce RTX 4090",
                    "--torch",
                    "2.8.0+cu126",
                ),
                *("--driver", "550.54.14", "--platform", "linux-x86_64"),
            ],
            "Tesla V100-SXM2-32GB",
        ),
        (  # an NGC container's build off a Jetson: check places the nvYY.MM tag and says so
            "PyTorch version: 2.5.0a0+e000cf0ad9.nv24.10\nCUDA used to build PyTorch: 12.6\n"
            "OS: Ubuntu 22.04.4 LTS (x86_64)\nGPU models and configuration: GPU 0: NVIDIA H100 80GB HBM3\n"
            "Nvidia driver version: 560.35.03\n",
            [
                *("--gpu", "NVIDIA H100 80GB HBM3", "--torch", "2.5.0a0+e000cf0ad9.nv24.10"),
                *("--driver", "560.35.03", "--platform", "linux-x86_64"),
            ],
            "nv24.10",
        ),
        (  # the same tag on a Jetson (a -tegra kernel): NVIDIA's JetPack wheel
            "PyTorch version: 2.0.0a0+ec3941ad.nv23.02\nCUDA used to build PyTorch: 11.4\n"
            "Python platform: Linux-5.10.120-tegra-aarch64-with-glibc2.29\n"
            "GPU models and configuration: GPU 0: Orin (nvgpu)\nNvidia driver version: Could not collect\n",
            ["--gpu", "Orin (nvgpu)", "--torch", "2.0.0a0+ec3941ad.nv23.02", "--platform", "jetson"],
            "JetPack",
        ),
    ],
)
def test_a_report_answers_as_its_options(text, argv, said, tmp_path, capsys):
    report = tmp_path / "r.txt"
    report.write_text(text)
    code, out, _ = _run(["check", "--collect-env", str(report), "--json"], capsys)
    got = json.loads(out)
    got.pop("collect_env")
    e_code, e_out, _ = _run(["check", *argv, "--json"], capsys)
    assert (e_code, json.loads(e_out)) == (code, got)
    assert said in json.dumps(got)


def test_request_puts_the_options_given_over_the_report():
    from torchrig.compat.collectenv import CheckRequest, request

    report = read_report(
        HEAD + "Nvidia driver version: 560.35.03\nPyTorch version: 2.5.1\nCUDA used to build PyTorch: 12.6\n"
        "[conda] pytorch 2.5.1 cuda126_mkl_py312_h30b5a27_303 conda-forge\n"
    )
    asked, overridden = request(report, CheckRequest())
    assert asked == CheckRequest(
        ("NVIDIA GeForce RTX 4090",), "2.5.1+cu126", "560.35.03", "linux-x86_64", "conda-forge"
    )
    assert overridden == ()
    asked, overridden = request(report, CheckRequest(driver="550.54.14", platform="wsl"))
    assert (asked.driver, asked.platform, asked.index) == ("550.54.14", "wsl", "conda-forge")
    assert overridden == ("--driver", "--platform")
    asked, overridden = request(report, CheckRequest(torch="2.5.1+cu124"))
    assert (asked.torch, asked.index, overridden) == ("2.5.1+cu124", None, ("--torch",))


def test_cuda_not_available_with_a_build_that_fits_points_at_the_machine(tmp_path, capsys):
    report = tmp_path / "r.txt"
    text = (FIX / "pip-h100-2.9.1-cu126-driver580.txt").read_text()
    report.write_text(text.replace("Is CUDA available: True", "Is CUDA available: False"))
    code, out, _ = _run(["check", "--collect-env", str(report)], capsys)
    assert code == 0 and "note: the report says Is CUDA available: False" in out and "torchrig doctor" in out
    code, out, _ = _run(["check", "--collect-env", str(report), "--json"], capsys)
    assert "Is CUDA available: False" in json.loads(out)["collect_env"]["note"]
    # a CPU build explains it: no note
    code, out, _ = _run(
        ["check", "--collect-env", str(FIX / "cpu-build-a100-mig-2.4.0-cpu.txt"), "--json"], capsys
    )
    assert code == 1 and json.loads(out)["collect_env"]["note"] is None


def test_check_collect_env_imports_nothing_heavy():
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "torchrig",
            "check",
            "--collect-env",
            str(FIX / "conda-pytorch-channel-rtx4080-2.1.0-cu121.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    mods = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "torchrig" in mods
    assert not (mods & {"torch", "docker", "pynvml", "rich", "numpy", "matplotlib"})
