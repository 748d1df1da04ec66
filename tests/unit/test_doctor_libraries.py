"""Issue 21: the driver libraries the loader picks (probed on real files), who is on a GPU, PCIe, Xid, the
header's words for unknowns, and ``--python`` taken as given."""

from __future__ import annotations

import dataclasses
import getpass
import os
import sys
from pathlib import Path

import pytest

from torchrig.doctor import diagnose
from torchrig.doctor.facts import GpuProcess, load_facts
from torchrig.doctor.findings import Severity
from torchrig.doctor.probes import kernel, processes

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"

# ``ldconfig -p`` as glibc prints it (this form, from the recorded H200 VM's libraries)
LDCONFIG = """3 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ml.so.1
\tlibcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1
\tlibcuda.so (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so
"""


def _lib(directory: Path, real: str, size: int, soname: str = "libcuda.so.1") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / real).write_bytes(b"\0" * size)
    (directory / soname).symlink_to(real)
    return directory / soname


def test_ld_cache_reads_ldconfig_p():
    cache = kernel.ld_cache(LDCONFIG)
    assert cache["libcuda.so.1"] == ["/usr/local/nvidia/lib64/libcuda.so.1"]
    assert cache["libnvidia-ml.so.1"] == ["/usr/local/nvidia/lib64/libnvidia-ml.so.1"]


def test_driver_libraries_in_the_loaders_order(tmp_path):
    """LD_LIBRARY_PATH first, then the cache; versions from the real files' names; a small file is a stub."""
    old = _lib(tmp_path / "old", "libcuda.so.570.133.20", kernel.STUB_MAX_BYTES + 1)
    stub = _lib(tmp_path / "cuda" / "lib64" / "stubs", "libcuda.so", 4096)
    system = _lib(tmp_path / "sys", "libcuda.so.580.159.04", kernel.STUB_MAX_BYTES + 1)
    libs = kernel.driver_libraries(
        f"{old.parent}:{stub.parent}", {"libcuda.so.1": [str(system)], "libnvidia-ml.so.1": []}
    )
    mine = [lib for lib in libs if str(tmp_path) in lib.path]
    assert [(lib.origin, lib.version, lib.stub) for lib in mine] == [
        ("ld_library_path", "570.133.20", False),
        ("ld_library_path", None, True),
        ("ld_cache", "580.159.04", False),
    ]
    assert mine[0].real_path == str(old.parent / "libcuda.so.570.133.20")


def test_xid_lines_are_kept_from_the_kernel_log():
    log = (
        "[ 12.3] nvidia 0000:00:06.0: enabling device\n"
        "[ 99.1] NVRM: Xid (PCI:0000:00:06): 79, pid=2381, name=python3, GPU has fallen off the bus.\n"
        "[ 99.2] NVRM: GPU 0000:00:06.0: GPU has fallen off the bus.\n"
    )
    assert kernel.xid_events(log) == (
        "NVRM: Xid (PCI:0000:00:06): 79, pid=2381, name=python3, GPU has fallen off the bus.",
    )


def test_a_process_is_named_by_its_user():
    who = processes.identify([os.getpid()], None)
    assert who == {os.getpid(): (getpass.getuser(), None)}


def test_a_docker_process_gets_its_container_id_without_an_engine():
    cid = "ab" * 32
    who = processes.identify([7], None, user=lambda _p: "alice", container=lambda _p: cid)
    assert who == {7: ("alice", cid[:12])}


def _with_gpu(name: str, **changes):
    facts = load_facts(FIX / f"{name}.json")
    g = dataclasses.replace(facts.nvml.gpus[0], **changes)
    return dataclasses.replace(facts, nvml=dataclasses.replace(facts.nvml, gpus=(g,)))


def test_doctors_own_probe_is_not_someone_else():
    facts = load_facts(FIX / "h200x1-driver580-cu130.json")
    me = GpuProcess(pid=4242, used_memory_mib=700, name="python3", user="root")
    facts = dataclasses.replace(facts, torch=dataclasses.replace(facts.torch, pid=4242))
    g = dataclasses.replace(facts.nvml.gpus[0], processes=(me,), memory_used_mib=1315)
    facts = dataclasses.replace(facts, nvml=dataclasses.replace(facts.nvml, gpus=(g,)))
    assert not [f for f in diagnose(facts).findings if f.id == "gpu.busy"]


def test_a_small_process_is_a_note_and_unlisted_memory_is_said():
    small = GpuProcess(pid=9, used_memory_mib=2048, name="jupyter", user="bob")
    r = diagnose(_with_gpu("h200x1-driver580-cu130", processes=(small,), memory_used_mib=2663))
    busy = next(f for f in r.findings if f.id == "gpu.busy")
    assert busy.severity is Severity.INFO and "user bob" in busy.evidence[0]
    # memory in use that no listed process holds: another container or VM
    r = diagnose(_with_gpu("h200x1-driver580-cu130", memory_used_mib=100_000))
    busy = next(f for f in r.findings if f.id == "gpu.busy")
    assert busy.severity is Severity.WARNING
    assert any("NVML does not list here" in e for e in busy.evidence)


def test_pcie_generation_drops_at_idle_without_a_finding():
    idle = _with_gpu("h200x1-driver580-cu130", pcie_gen_current=1, pcie_gen_max=5, pcie_width_current=16)
    idle = dataclasses.replace(idle)  # gpu_idle is among the recorded reasons
    assert not [f for f in diagnose(idle).findings if f.id == "gpu.pcie_link_degraded"]
    busy = _with_gpu(
        "h200x1-driver580-cu130",
        pcie_gen_current=3,
        pcie_gen_max=5,
        pcie_width_current=16,
        pcie_width_max=16,
        utilization_pct=90,
        throttle_reasons=(),
    )
    found = [f for f in diagnose(busy).findings if f.id == "gpu.pcie_link_degraded"]
    assert found and "Gen3 of Gen5 under load" in found[0].summary


def test_power_cap_at_idle_is_throttling():
    capped = _with_gpu("h200x1-driver580-cu130", throttle_reasons=("gpu_idle", "sw_power_cap"))
    assert any(f.id == "gpu.throttling" for f in diagnose(capped).findings)


def test_no_xid_in_a_readable_log_passes_and_an_unreadable_one_says_nothing():
    facts = load_facts(FIX / "h200x1-driver580-cu130.json")
    readable = dataclasses.replace(facts, kernel=dataclasses.replace(facts.kernel, xid_events=()))
    assert ("gpu.xid", Severity.OK) in {(f.id, f.severity) for f in diagnose(readable).findings}
    assert not [f for f in diagnose(facts).findings if f.id == "gpu.xid"]


def test_the_header_never_prints_none():
    """Issue 21: with libcuda shadowed NVML cannot say the CUDA version; unknowns stay words."""
    facts = load_facts(FIX / "libcuda-570-on-ld-library-path-h200.json")
    nv = dataclasses.replace(
        facts.nvml,
        driver_version=None,
        gpus=(dataclasses.replace(facts.nvml.gpus[0], name=None, memory_total_mib=None),),
    )
    torch = dataclasses.replace(facts.torch, version=None)
    r = diagnose(dataclasses.replace(facts, nvml=nv, torch=torch))
    text = r.render_text()
    assert "None" not in text.splitlines()[0] and "?" not in text.splitlines()[0]
    assert "CUDA version unknown" in r.machine_line() and "driver of unknown version" in r.machine_line()


def test_shadowed_libcuda_names_the_file_and_the_clean_path():
    r = diagnose(load_facts(FIX / "libcuda-570-on-ld-library-path-h200.json"))
    f = r.findings[0]
    assert f.id == "driver.library_mismatch" and "570.133.20" in f.summary and "580.159.04" in f.summary
    assert f.fix[0] == "unset LD_LIBRARY_PATH"
    assert any("/opt/nvidia-570/lib/libcuda.so.1" in e for e in f.evidence)
    assert "torch.cuda_unavailable" not in {x.id for x in r.findings}


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("cuda-compat-on-newer-driver-h200", "not needed"),
        ("libcuda-stub-on-ld-library-path-h200", "error 34"),
    ],
)
def test_compat_and_stub_say_why(name, words):
    f = diagnose(load_facts(FIX / f"{name}.json")).findings[0]
    assert words in f.cause


def test_python_is_taken_as_given_relative_too(cli, tmp_path):
    """Issue 21.2: --python ./python (or plain 'python') is the file here, not the python on PATH. Here: a
    venv's bin/, whose python reports itself as the interpreter the probe ran (the one on PATH would report
    its own path); the venv has no torch, so the probe does not pay for importing it."""
    import subprocess

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    here = tmp_path / "v" / "bin"
    r = cli("doctor", "--python", "python", "--only", "torch", "--json", cwd=str(here))
    data = r.json()
    assert data["facts"]["torch"]["python_requested"] == str(here / "python")
    assert data["facts"]["torch"]["python_executable"] == str(here / "python")
    assert f"in {here / 'python'}" in data["machine"]


def test_a_mismatched_libcuda_that_still_runs_is_a_warning():
    """CUDA ran kernels through the other version's libcuda: say so, but as a warning (the next update breaks)."""
    facts = load_facts(FIX / "libcuda-570-on-ld-library-path-h200.json")
    healthy = load_facts(FIX / "h200x1-driver580-cu130.json").torch
    torch = dataclasses.replace(
        facts.torch, is_available=True, init_error=None, device_count=1, devices=healthy.devices
    )
    f = diagnose(dataclasses.replace(facts, torch=torch)).findings[0]
    assert (f.id, f.severity) == ("driver.library_mismatch", Severity.WARNING)


def test_what_a_probed_library_prints_stays_off_stdout():
    """The CUDA toolkit's NVML stub prints to file descriptor 1 from inside nvmlInit, which broke --json on the
    H200 (the libnvidia-ml-stub fault): while the probes run, fd 1 goes to stderr."""
    import subprocess

    code = (
        "import os\n"
        "from torchrig.doctor.probes import _stdout_to_stderr\n"
        "with _stdout_to_stderr():\n"
        "    os.write(1, b'WARNING: stub library\\n')\n"
        "print('{}')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "{}\n" and "WARNING: stub library" in proc.stderr


def test_recorded_faults_carry_their_evidence():
    """The H200 campaign's recordings: who holds the GPU, the relative --python, the compat file."""
    hog = diagnose(load_facts(FIX / "h200x1-recorded-gpu-memory-hog.json"))
    busy = next(f for f in hog.findings if f.id == "gpu.busy")
    assert busy.evidence[0].startswith("GPU 0: pid ") and "user root" in busy.evidence[0]
    py = diagnose(load_facts(FIX / "h200x1-recorded-python-without-torch.json"))
    assert py.facts.torch.python_requested == "/tmp/doctor-faults/venv-bin/python"
    assert "in /tmp/doctor-faults/venv-bin/python" in py.machine_line()
    compat = diagnose(load_facts(FIX / "h200x1-recorded-cuda-compat.json")).findings[0]
    assert "580.95.05" in compat.summary and "580.159.04" in compat.summary and "not needed" in compat.cause
    denied = diagnose(load_facts(FIX / "h200x1-recorded-device-nodes-denied.json"))
    assert [f.id for f in denied.findings if f.severity is Severity.ERROR] == ["driver.device_nodes_denied"]
