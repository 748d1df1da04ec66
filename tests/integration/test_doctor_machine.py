"""``torchrig doctor`` on this machine, for real: no NVIDIA GPU (so the CPU build is the fix), a CPU-only torch, CUDA_VISIBLE_DEVICES
empty and -1, a shadowing LD_LIBRARY_PATH (real CUDA runtime libraries from PyPI), an interpreter without
torch, a torch probe that hangs, and --record/--facts on the probed facts."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import docblocks  # tests/docblocks.py

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    Path("/proc/driver/nvidia/version").exists(),
    reason="this machine has an NVIDIA driver: the no-GPU cases do not apply",
)


def ids(data: dict, severity: str | None = None) -> list[str]:
    return [f["id"] for f in data["findings"] if severity is None or f["severity"] == severity]


@pytest.fixture(scope="module")
def machine(cli):
    r = cli("doctor", "--json")
    assert r.code in (0, 1), r.err  # 1 only for a warning this machine's setup may add (none here)
    return r.json()


@pytest.fixture(scope="module")
def cli():  # module-scoped twin of the conftest fixture (pytest's `cli` is function-scoped)
    import json as _json
    from types import SimpleNamespace

    def run(*args: str, env: dict | None = None, timeout: float = 120):
        full = dict(os.environ)
        full.pop("TORCHRIG_DEBUG", None)
        full.update(env or {})
        p = subprocess.run(
            [sys.executable, "-m", "torchrig", *args],
            capture_output=True,
            text=True,
            env=full,
            timeout=timeout,
        )
        return SimpleNamespace(
            code=p.returncode, out=p.stdout, err=p.stderr, json=lambda: _json.loads(p.stdout)
        )

    return run


def test_the_doctor_page_shows_what_doctor_says_on_this_machine(tmp_path):
    """docs/doctor.md's "Real output" of this machine: the command as the page writes it, every line it
    shows (the interpreter's path, /dev/shm's size and the run's time differ between machines)."""
    node = "tests/integration/test_doctor_machine.py::test_the_doctor_page_shows_what_doctor_says_on_this_machine"
    (block,) = docblocks.tested_by(ROOT / "docs" / "doctor.md", node)
    ((cmd, shown),) = block.steps()
    r = docblocks.run(cmd, tmp_path)
    assert r.returncode == 0, r.stderr
    vary = {r"in /\S+/python3(?:\.\d+)?\b": "in PYTHON", r"/dev/shm is [\d.]+ GiB": "/dev/shm is N GiB",
            r"\([\d.]+ s, exit": "(T s, exit"}  # fmt: skip
    assert not docblocks.missing(r.stdout, shown, vary), r.stdout


def test_no_gpu_leads_to_the_cpu_build(machine):
    """No NVIDIA GPU here: no driver to install; the fix is the CPU build (issue 17.8)."""
    import json

    import jsonschema

    schema = json.loads((ROOT / "src" / "torchrig" / "doctor" / "schema" / "report.schema.json").read_text())
    jsonschema.validate(machine, schema)
    if machine["facts"]["kernel"]["pci_gpus"]:
        pytest.skip("an NVIDIA GPU is on this machine's PCI bus")
    no_gpu = next(f for f in machine["findings"] if f["id"] == "driver.no_gpu")
    assert no_gpu["severity"] == "info" and no_gpu["fix"][0].split("#")[0].strip() == "torchrig resolve"
    assert "driver.missing" not in ids(machine) and not ids(machine, "error")
    assert machine["facts"]["nvml"]["status"] in ("missing", "failed")


def test_cpu_only_torch_is_named(machine):
    torch_facts = machine["facts"]["torch"]
    if torch_facts["status"] != "ok" or torch_facts["cuda_version"]:
        pytest.skip("needs the CPU build of torch installed")
    assert "torch.cpu_build" in ids(machine, "info")  # the right build for a machine without a GPU
    assert torch_facts["init_error"] == "AssertionError: Torch not compiled with CUDA enabled"


def test_docker_engine_is_probed_through_its_api(machine):
    d = machine["facts"]["docker"]
    if d["status"] == "missing":
        pytest.skip("no Docker engine here")
    assert d["status"] == "ok" and d["server_version"] and "runc" in d["runtimes"]


@pytest.mark.parametrize("value", ["", "-1"])
def test_cuda_visible_devices_hides_everything(cli, value):
    r = cli("doctor", "--only", "env", "--json", env={"CUDA_VISIBLE_DEVICES": value})
    assert r.code == 1
    finding = next(f for f in r.json()["findings"] if f["id"] == "env.cuda_visible_devices")
    assert finding["severity"] == "error"
    assert "unset CUDA_VISIBLE_DEVICES   # all GPUs" in finding["fix"]


def test_a_valid_looking_cuda_visible_devices_is_not_flagged_without_gpus(cli):
    r = cli("doctor", "--only", "env", "--json", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert "env.cuda_visible_devices" not in ids(r.json())


def _extract(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest)


@pytest.fixture(scope="module")
def venv_with_cuda_runtime(tmp_path_factory):
    """A venv (seeing the system torch) with NVIDIA's CUDA runtime wheel, as a CUDA torch install has it; and a
    'system' copy of another libcudart.so.13 release, as a CUDA toolkit puts in /usr/local/cuda/lib64."""
    tmp = tmp_path_factory.mktemp("shadow")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "nvidia-cuda-runtime==13.0.96"], check=True, timeout=300)
    subprocess.run(
        [*pip, "download", "--no-deps", "-d", str(tmp / "dl"), "nvidia-cuda-runtime==13.5.37"],
        check=True,
        timeout=300,
    )
    _extract(next((tmp / "dl").glob("*.whl")), tmp / "system")
    system_lib = tmp / "system" / "nvidia" / "cu13" / "lib"
    assert (system_lib / "libcudart.so.13").exists()
    return py, system_lib


def test_ld_library_path_shadowing_the_wheel(cli, venv_with_cuda_runtime):
    py, system_lib = venv_with_cuda_runtime
    r = cli(
        "doctor",
        "--only",
        "env",
        "--python",
        str(py),
        "--json",
        env={"LD_LIBRARY_PATH": f"{system_lib}:/usr/lib"},
    )
    data = r.json()
    f = next(f for f in data["findings"] if f["id"] == "env.shadowed_libraries")
    assert (
        f["severity"] == "warning"
    )  # a CPU torch does not load libcudart itself; a CUDA build would (error)
    assert f"{system_lib}/libcudart.so.13 shadows" in f["evidence"][0]
    assert "nvidia/cu13/lib/libcudart.so.13" in f["evidence"][0]
    assert f["fix"][0] == "export LD_LIBRARY_PATH=/usr/lib"
    # and without the shadowing entry, no finding
    r2 = cli("doctor", "--only", "env", "--python", str(py), "--json", env={"LD_LIBRARY_PATH": "/usr/lib"})
    assert "env.shadowed_libraries" not in ids(r2.json())


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python"


def test_interpreter_without_torch(cli, bare_python):
    r = cli("doctor", "--python", str(bare_python), "--json")
    data = r.json()
    f = next(f for f in data["findings"] if f["id"] == "torch.not_installed")
    assert f["severity"] == "warning" and str(bare_python) in f["summary"]
    assert data["facts"]["torch"]["status"] == "missing"


def test_a_hanging_torch_probe_times_out(cli, tmp_path):
    """A wedged driver makes `import torch; torch.cuda.init()` never return; doctor must not hang with it."""
    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    r = cli("doctor", "--only", "torch", "--python", str(slow), "--timeout", "1", "--json", timeout=20)
    data = r.json()
    assert data["findings"][0]["id"] == "torch.hangs"
    assert data["elapsed_ms"] < 10_000


def test_record_then_replay_gives_the_same_findings(cli, tmp_path, machine):
    out = tmp_path / "facts.json"
    r = cli("doctor", "--record", str(out), "--json")
    assert r.code == machine["verdict"]["exit_code"] and out.exists()
    replay = cli("doctor", "--facts", str(out), "--json").json()
    assert ids(replay) == ids(r.json())
    assert replay["facts"]["source"].startswith("recorded by torchrig doctor --record")


def test_doctor_run_by_an_interpreter_without_torch(bare_python):
    """torchrig in a venv without torch: the torch facts come without a child interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHRIG_DEBUG"}
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run(
        [str(bare_python), "-m", "torchrig", "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    import json

    data = json.loads(proc.stdout)
    assert proc.returncode == 1 and data["findings"][0]["id"] == "torch.not_installed"
    assert "driver.no_gpu" in ids(data) or "driver.missing" in ids(data)
    assert data["facts"]["torch"]["status"] == "missing"
    assert data["facts"]["torch"]["python_executable"] == str(bare_python)
    assert "torch.not_installed" in ids(data)
    assert data["facts"]["nvml"]["error"] == "nvidia-ml-py (module pynvml) is not installed"
