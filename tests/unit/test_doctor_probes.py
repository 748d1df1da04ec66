"""The probe frame and the pieces of probes that do not need a GPU: a hung or crashing probe becomes a record
(never a hang or a traceback), the torch probe's child script, /etc/os-release, and distribution fixes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from torchrig.doctor import fixes
from torchrig.doctor.facts import ProbeStatus
from torchrig.doctor.probes import _assemble, _run_all
from torchrig.doctor.probes.kernel import os_release
from torchrig.doctor.probes.pytorch import SCRIPT, _from_child, probe_torch


def test_hung_and_crashing_probes_become_records():
    def hang():
        time.sleep(30)

    def crash():
        raise RuntimeError("boom")

    t0 = time.perf_counter()
    results, _ms = _run_all({"nvml": (hang, 0.3), "kernel": (crash, 5), "env": (lambda: None, 5)})
    assert time.perf_counter() - t0 < 5
    parts = _assemble(
        results, {"nvml": 0.3, "kernel": 5, "env": 5, "container": 5, "docker": 5, "torch": 5}, torch=False
    )
    assert parts["nvml"].status is ProbeStatus.TIMEOUT and "0.3 s" in parts["nvml"].error
    assert parts["kernel"].status is ProbeStatus.FAILED
    assert parts["torch"].status is ProbeStatus.SKIPPED


def test_torch_script_runs_without_torchrig_and_prints_json():
    proc = subprocess.run(
        [sys.executable, "-I", "-c", SCRIPT.read_text()], capture_output=True, text=True, timeout=120
    )
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["status"] in ("ok", "missing") and data["python_executable"] == sys.executable
    if data["status"] == "ok":  # where the child's time went, step by step
        steps = data["steps_ms"]
        assert steps["import"] == data["import_ms"] and {"versions", "cuda_init", "maps"} <= set(steps)
        assert ("devices" in steps) == bool(data["is_available"])
        assert _from_child(data).steps_ms == steps


def test_the_knowledge_base_loads_meanwhile_only_where_a_driver_shows(monkeypatch, tmp_path):
    from torchrig.cli import cmd_doctor
    from torchrig.doctor import kb

    monkeypatch.setattr(cmd_doctor, "_NVIDIA_SIGNS", (str(tmp_path / "absent"),))
    assert cmd_doctor._load_kb_meanwhile() is None
    (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX Open Kernel Module  580.159.04\n")
    monkeypatch.setattr(cmd_doctor, "_NVIDIA_SIGNS", (str(tmp_path / "version"),))
    thread = cmd_doctor._load_kb_meanwhile()
    assert thread is not None
    thread.join(30)
    assert not thread.is_alive() and kb.load() is not None


def test_torch_probe_of_a_missing_interpreter(tmp_path):
    facts = probe_torch(str(tmp_path / "nope"), timeout_s=5)
    assert facts.status is ProbeStatus.MISSING and "cannot run" in (facts.error or "")


def test_torch_probe_of_a_crashing_interpreter(tmp_path):
    exe = tmp_path / "python"
    exe.write_text("#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n")
    exe.chmod(0o755)
    facts = probe_torch(str(exe), timeout_s=5)
    assert facts.status is ProbeStatus.FAILED and "status 139: Segmentation fault" in (facts.error or "")


def test_os_release(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "os-release").write_text(
        'PRETTY_NAME="Ubuntu 24.04.2 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n'
    )
    rel = os_release(str(tmp_path))
    assert (rel["ID"], rel["VERSION_ID"], rel["ID_LIKE"]) == ("ubuntu", "24.04", "debian")


def test_driver_install_steps_per_distribution():
    debian, src = fixes.steps("driver_install", "debian", (), "12")
    assert any("nvidia-driver firmware-misc-nonfree" in s for s in debian) and "wiki.debian.org" in src
    assert any("repos/debian12/" in s for s in debian)
    ubuntu, _ = fixes.steps("driver_install", "ubuntu", ("debian",), "24.04", branch="580")
    assert "sudo ubuntu-drivers install --gpgpu" in ubuntu
    assert any("nvidia-driver-580-server-open" in s for s in ubuntu)
    rocky, _ = fixes.steps("driver_install", "rocky", ("rhel", "centos", "fedora"), "9.4")
    assert any("repos/rhel9/" in s for s in rocky)
    other, src = fixes.steps("driver_install", "gentoo", (), None)
    assert "driver-installation-guide" in src and other
    # a derivative falls back to its parent (ID_LIKE)
    mint, _ = fixes.steps("driver_install", "linuxmint", ("ubuntu", "debian"), "22")
    assert "sudo ubuntu-drivers install --gpgpu" in mint


def test_device_nodes_listed_and_opened_through_the_bounded_readers(tmp_path):
    import os

    from torchrig import inputfiles

    (tmp_path / "nvidia0").write_text("")
    (tmp_path / "nvidia-caps").mkdir()  # a folder is left out
    os.mkfifo(tmp_path / "nvidia-uvm")
    listed = inputfiles.device_nodes((str(tmp_path / "nvidia*"),))
    assert [os.path.basename(p) for p, _ok in listed] == ["nvidia-uvm", "nvidia0"]
    assert len(inputfiles.device_nodes((str(tmp_path / "nvidia*"),), max_entries=1)) == 1
    # a FIFO or a file is refused unopened (an open of a FIFO would block); a character device opens
    assert inputfiles.device_open_error(tmp_path / "nvidia-uvm") == "not a character device"
    assert inputfiles.device_open_error(tmp_path / "nvidia0") == "not a character device"
    assert "No such file" in (inputfiles.device_open_error(tmp_path / "absent") or "")
    assert inputfiles.device_open_error("/dev/null") is None


def test_device_nodes_are_listed_before_the_torch_probe_starts(monkeypatch):
    """CUDA's first use (the torch probe) recreates a missing /dev/nvidia-uvm: the listing comes first and is
    the one the kernel facts carry."""
    from torchrig.doctor import probes
    from torchrig.doctor.facts import DeviceNode, TorchFacts
    from torchrig.doctor.probes import kernel, pytorch

    order: list[str] = []
    before = (DeviceNode("/dev/nvidiactl", True), DeviceNode("/dev/nvidia0", True))

    def listing():
        order.append("nodes")
        return before

    def torch_probe(python, timeout_s):
        order.append("torch")
        return TorchFacts(ProbeStatus.MISSING)

    monkeypatch.setattr(kernel, "device_nodes", listing)
    monkeypatch.setattr(pytorch, "probe_torch", torch_probe)
    facts = probes.collect(probes.ProbeOptions(probe_timeout_s=10))
    assert order == ["nodes", "torch"]
    assert facts.kernel.device_nodes == before and facts.kernel.uvm_node_error is None


def test_a_uvm_node_of_another_device_or_refused_is_said(monkeypatch, tmp_path):
    """/dev/nvidia-uvm judged by its device number against /proc/devices' nvidia-uvm, then by a real open."""
    from torchrig.doctor.facts import DeviceNode
    from torchrig.doctor.probes import kernel

    null = (DeviceNode("/dev/null", True),)
    monkeypatch.setattr(kernel, "UVM_NODE", "/dev/null")  # a real character device: 1:3, opens read-write
    monkeypatch.setattr(kernel, "uvm_major", lambda: 509)
    assert kernel.uvm_node_error(null) == "another device (1:3), not nvidia-uvm (major 509 in /proc/devices)"
    monkeypatch.setattr(kernel, "uvm_major", lambda: 1)
    assert kernel.uvm_node_error(null) is None
    monkeypatch.setattr(kernel, "UVM_NODE", str(tmp_path / "nvidia-uvm"))
    (tmp_path / "nvidia-uvm").write_text("")
    assert (
        kernel.uvm_node_error((DeviceNode(str(tmp_path / "nvidia-uvm"), True),)) == "not a character device"
    )
    assert kernel.uvm_node_error(()) is None  # not listed: nothing to judge (the check says it is missing)


def test_a_torch_probe_answer_of_the_wrong_kind_is_a_failed_probe_naming_the_key(tmp_path):
    """The child's facts line is read as every record is (torchrig.jsonrecords): a value of the wrong kind (an
    interpreter whose start-up prints its own JSON, a damaged script) is a failed probe that names the key,
    not a traceback and not a fact taken as given."""
    with pytest.raises(ValueError, match=r"^torch probe\.devices\[0\]\.index: expected an integer"):
        _from_child({"status": "ok", "devices": [{"index": "0"}]})
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho \'{"status": "ok", "is_available": "yes"}\'\n')
    fake.chmod(0o755)
    facts = probe_torch(str(fake), timeout_s=30, trace_failures=False)
    assert facts.status is ProbeStatus.FAILED and facts.error == (
        "unreadable torch probe output: torch probe.is_available: expected true or false, got a string"
    )


def test_the_nccl_check_answer_is_read_as_a_record():
    from torchrig.doctor.facts import NcclDeviceCheck
    from torchrig.doctor.probes.pytorch import _nccl

    line = {"status": "ok", "devices": [{"index": 0, "ok": True, "error": None, "elapsed_ms": 12.5}]}
    got = _nccl(line | {"env_used": ["NCCL_DEBUG=INFO"]}, 0, "")
    assert (got.status, got.devices, got.env_used) == (
        "ok",
        (NcclDeviceCheck(0, True, None, 12.5),),
        ("NCCL_DEBUG=INFO",),
    )
    bad = _nccl({"devices": [{"index": "0", "ok": True}]}, 0, "")
    assert (bad.status, bad.error) == (
        "failed",
        "unreadable NCCL check output: NCCL check.devices[0].index: expected an integer, got a string",
    )
