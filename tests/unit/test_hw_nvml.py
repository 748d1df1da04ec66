"""The one NVML adapter (torchrig.hw.nvml) and both of its users, doctor and the runtime inventory, against
NVML's answers replayed at the pynvml boundary: the real pynvml module (constants, structures, NVMLError and
its texts) with only its functions replaced by ones answering what a recorded machine answered.

The recorded doctor facts of the H200 machines (tests/fixtures/doctor/*.json) hold every NVML answer the probe
read; replayed, the probe must give back exactly those facts, and the runtime inventory exactly the snapshot
recorded on the same 1x H200 machine (tests/fixtures/runtime/recorded-1xh200-driver580.json). The cases
where the two former adapters differed are each pinned by a test below.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from torchrig.doctor.facts import ProbeStatus, facts_from_json
from torchrig.doctor.probes.nvml import probe_nvml
from torchrig.hw import nvml
from torchrig.report import jsonable
from torchrig.runtime import nvml as runtime_nvml
from torchrig.runtime.inventory import from_dict, to_dict

pynvml = pytest.importorskip("pynvml")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nvmlreplay import FIX, fail, mib, ns, recorded, replay, written_by_nvml  # noqa: E402

DOCTOR_FIXTURES = sorted(p.stem for p in (FIX / "doctor").glob("*.json"))


@pytest.mark.parametrize("case", DOCTOR_FIXTURES)
def test_doctor_probe_gives_back_the_recorded_facts(monkeypatch, case):
    facts = recorded(case)
    if facts["status"] == "missing" and "nvidia-ml-py" in (facts["error"] or ""):
        monkeypatch.setitem(sys.modules, "pynvml", None)
    else:
        monkeypatch.setitem(sys.modules, "pynvml", replay(facts))
    want = jsonable(facts_from_json(json.loads((FIX / "doctor" / f"{case}.json").read_text())).nvml)
    who = {
        p["pid"]: (p.get("user"), p.get("container")) for g in facts.get("gpus") or [] for p in g["processes"]
    }
    assert jsonable(probe_nvml(identify=lambda pids: {p: who[p] for p in pids})) == want


def test_runtime_inventory_gives_back_the_snapshot_of_the_same_machine(monkeypatch):
    # doctor's facts and the runtime snapshot were recorded on the one 1x H200 machine (the same GPU UUID)
    monkeypatch.setitem(sys.modules, "pynvml", replay(recorded("h200x1-driver580-cu130")))
    snapshot = json.loads((FIX / "runtime" / "recorded-1xh200-driver580.json").read_text())
    inv = runtime_nvml.probe(numa_of=lambda bus: None)  # that VM's GPU had no NUMA node
    assert inv.source == "nvml"
    want = from_dict(snapshot, "snapshot")
    assert (inv.driver_version, inv.cuda_driver_version) == (want.driver_version, want.cuda_driver_version)
    # the snapshot was recorded by the inventory's probe of its day: the fields it has are the same
    keys = set(snapshot["nvml"]["gpus"][0])
    assert [{k: v for k, v in jsonable(g).items() if k in keys} for g in inv.gpus] == [
        {k: v for k, v in jsonable(g).items() if k in keys} for g in want.gpus
    ]
    assert from_dict(to_dict(inv), "again") == dataclasses.replace(inv, source="again")


@pytest.mark.parametrize(
    ("code", "kind", "status"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NvmlErrorKind.LIBRARY_MISSING, ProbeStatus.MISSING),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, nvml.NvmlErrorKind.DRIVER_NOT_LOADED, ProbeStatus.FAILED),
        (pynvml.NVML_ERROR_NO_PERMISSION, nvml.NvmlErrorKind.NO_PERMISSION, ProbeStatus.DENIED),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, nvml.NvmlErrorKind.VERSION_MISMATCH, ProbeStatus.FAILED),
        (pynvml.NVML_ERROR_UNKNOWN, nvml.NvmlErrorKind.OTHER, ProbeStatus.FAILED),
    ],
)
def test_init_errors_are_mapped_once_for_both(monkeypatch, code, kind, status):
    monkeypatch.setitem(
        sys.modules, "pynvml", replay(recorded("h200x1-driver580-cu130"), nvmlInit=fail(code))
    )
    text = pynvml.NVMLError._errcode_to_string[code]
    with pytest.raises(nvml.NvmlError) as err, nvml.session():
        pass
    assert (err.value.kind, err.value.step, err.value.code, err.value.message) == (
        kind,
        "nvmlInit",
        code,
        text,
    )
    assert (probe_nvml().status, probe_nvml().error) == (status, f"nvmlInit: {text}")
    assert runtime_nvml.probe().source == f"nvml ({text})" and runtime_nvml.probe().gpus == ()


def test_bindings_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(nvml.NvmlError) as err, nvml.session():
        pass
    assert (err.value.kind, err.value.step) == (nvml.NvmlErrorKind.BINDINGS_MISSING, "import")
    assert runtime_nvml.probe().source == "nvml (nvidia-ml-py not installed)"


def h200x2(**override: Any) -> types.ModuleType:
    return replay(recorded("h200x2-driver580-cu130"), **override)


def test_a_refused_gpu_handle_is_an_empty_inventory_not_a_crash(monkeypatch):
    """Runtime let NVMLError escape (exit 3, 'internal error'); doctor made it a FAILED probe. Now both
    report it, and NVML is still shut down."""
    shut = []
    lost = fail(pynvml.NVML_ERROR_GPU_IS_LOST)
    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        h200x2(
            nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i) if i == 0 else lost(),
            nvmlShutdown=lambda: shut.append(1),
        ),
    )
    inv = runtime_nvml.probe()
    assert (inv.source, inv.gpus) == ("nvml (GPU is lost)", ())
    f = probe_nvml()
    assert (f.status, f.error, f.gpus) == (ProbeStatus.FAILED, "NVML: GPU is lost", ())
    assert shut == [1, 1]


def test_a_gpu_without_uuid_is_left_out_of_the_inventory_and_none_in_the_facts(monkeypatch):
    """Runtime crashed when NVML refused a GPU's UUID or name (or the driver version); doctor kept None."""
    refused = fail(pynvml.NVML_ERROR_UNKNOWN)
    real = h200x2()
    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        h200x2(
            nvmlDeviceGetUUID=lambda h: refused() if h == ("gpu", 1) else real.nvmlDeviceGetUUID(h),
            nvmlSystemGetDriverVersion=refused,
        ),
    )
    inv = runtime_nvml.probe(numa_of=lambda bus: None)
    assert [g.index for g in inv.gpus] == [0] and inv.driver_version is None
    assert inv.source == "nvml (GPU 1 left out: no UUID or name from NVML)"
    f = probe_nvml()
    assert f.status is ProbeStatus.OK and [g.uuid is None for g in f.gpus] == [False, True]


def test_a_mig_instance_without_uuid_is_left_out(monkeypatch):
    facts = recorded("h200x1-driver580-cu130")
    facts["gpus"][0] |= {"mig_mode": True, "mig_pending": True}
    facts["gpus"][0]["mig_instances"] = [
        {
            "uuid": "MIG-5b1f0c2e-aaaa-5bbb-8ccc-0123456789ab",
            "name": "NVIDIA H200 MIG 1g.18gb",
            "memory_total_mib": 16384,
        },
        {"uuid": None, "name": None, "memory_total_mib": None},
    ]
    monkeypatch.setitem(sys.modules, "pynvml", replay(facts, nvmlDeviceGetGpuInstanceId=lambda h: 7 + h[2]))
    inv = runtime_nvml.probe(numa_of=lambda bus: None)
    (gpu,) = inv.gpus
    assert gpu.mig_mode and [(m.name, m.gpu_instance_id) for m in gpu.mig_instances] == [
        ("NVIDIA H200 MIG 1g.18gb", 7),
        (None, 8),  # the one record keeps what NVML said; the inventory's units leave it out
    ]
    assert [u.label for u in inv.units()] == ["0/1g.18gb#7"]
    assert [m.uuid for m in probe_nvml().gpus[0].mig_instances] == [
        facts["gpus"][0]["mig_instances"][0]["uuid"],
        None,
    ]


def test_cuda_driver_version_zero_is_unknown_for_both(monkeypatch):
    """Doctor turned 0 into "0.0", runtime into None: 0 is no version, so both say unknown."""
    monkeypatch.setitem(sys.modules, "pynvml", h200x2(nvmlSystemGetCudaDriverVersion_v2=lambda: 0))
    assert probe_nvml().cuda_driver_version is None
    assert runtime_nvml.probe(numa_of=lambda bus: None).cuda_driver_version is None


def nvswitch(cliques: list[int]) -> dict[str, Any]:
    """The 2x H200 pair as on an NVSwitch system: every link to a switch, fabric registered (constructed)."""
    return {
        "nvmlDeviceGetNvLinkRemoteDeviceType": lambda h, link: pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
        "nvmlDeviceGetGpuFabricInfo": lambda h, ref: fabric_completed(ref, cliques[h[1]]),
    }


def fabric_completed(ref: Any, clique: int) -> int:
    info = written_by_nvml(ref)
    info.state, info.status = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0
    setattr(info, "cliqueId" if hasattr(type(info), "cliqueId") else "partitionId", clique)  # 12.535's name
    # The field's type follows the binding (c_uint8 * 16 in nvidia-ml-py 13.615, c_uint8 * 80 in 13.580, c_char * 80
    # in 12.570): write its memory, as NVML does.
    field = type(info).clusterUuid
    ctypes.memmove(
        ctypes.addressof(info) + field.offset, bytes(i % 255 + 1 for i in range(field.size)), field.size
    )
    return 0


def test_nvswitch_fabric_cliques_split_domains(monkeypatch):
    """The runtime adapter passed the fabric structure by value, so NVML never filled it: every switched GPU
    landed in one domain whatever its clique. By reference, two cliques are two domains."""
    monkeypatch.setitem(sys.modules, "pynvml", h200x2(**nvswitch([1, 2])))
    a, b = runtime_nvml.probe(numa_of=lambda bus: None).gpus
    assert a.nvlink_domain and b.nvlink_domain and a.nvlink_domain != b.nvlink_domain
    assert [g.fabric_state for g in probe_nvml().gpus] == ["completed", "completed"]
    monkeypatch.setitem(sys.modules, "pynvml", h200x2(**nvswitch([1, 1])))
    a, b = runtime_nvml.probe(numa_of=lambda bus: None).gpus
    assert a.nvlink_domain is not None and a.nvlink_domain == b.nvlink_domain


def test_direct_nvlink_peers_share_a_domain(monkeypatch):
    buses = [g["pci_bus_id"] for g in recorded("h200x2-driver580-cu130")["gpus"]]
    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        h200x2(
            nvmlDeviceGetNvLinkRemoteDeviceType=lambda h, link: pynvml.NVML_NVLINK_DEVICE_TYPE_GPU,
            nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: types.SimpleNamespace(
                busId=buses[1 - h[1]].encode()
            ),
        ),
    )
    a, b = runtime_nvml.probe(numa_of=lambda bus: None).gpus
    assert a.nvlink_domain is not None and a.nvlink_domain == b.nvlink_domain
    assert [(g.nvlink_active, g.nvlink_inactive) for g in probe_nvml().gpus] == [(18, 0), (18, 0)]


def test_a_binding_without_a_function_costs_one_field(monkeypatch):
    """An old binding lacks newer functions and constants: doctor crashed on a missing throttle-reason
    function or P2P constant (the whole NVML probe FAILED); now each is one unknown field."""
    nv = h200x2()
    del nv.nvmlDeviceGetCurrentClocksEventReasons, nv.NVML_P2P_CAPS_INDEX_NVLINK, nv.c_nvmlGpuFabricInfo_t
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    f = probe_nvml()
    assert f.status is ProbeStatus.OK and f.gpus[0].throttle_reasons == () and f.gpus[0].fabric_state is None
    assert (f.p2p[0].write, f.p2p[0].nvlink) == ("ok", None)
    assert len(runtime_nvml.probe(numa_of=lambda bus: None).gpus) == 2


def test_importing_the_adapter_and_its_users_does_not_import_pynvml():
    code = (
        "import sys, torchrig.hw.nvml, torchrig.runtime.nvml, torchrig.doctor.probes.nvml\n"
        "assert 'pynvml' not in sys.modules, 'pynvml imported'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_sensors_and_index_of_on_the_recorded_pair(monkeypatch):
    """What bench samples after each timed GEMM: the GPU found by the UUID torch reports (without ``GPU-``),
    and its clock, temperature and power as recorded."""
    facts = recorded("h200x2-driver580-cu130")
    monkeypatch.setitem(sys.modules, "pynvml", replay(facts))
    with nvml.session() as gpus:
        for g in facts["gpus"]:
            assert gpus.index_of(g["uuid"]) == g["index"]
            assert gpus.index_of(g["uuid"].removeprefix("GPU-")) == g["index"]
            assert gpus.sensors(g["index"]) == nvml.NvmlSensors(
                sm_clock_mhz=g["sm_clock_mhz"],
                temperature_c=g["temperature_c"],
                power_draw_w=g["power_draw_w"],
            )
        assert gpus.index_of("GPU-00000000-0000-0000-0000-000000000000") is None


class _Props:
    def __init__(self, uuid: str) -> None:
        self.uuid = uuid


def _torch_with(uuid: str) -> Any:
    return types.SimpleNamespace(cuda=types.SimpleNamespace(get_device_properties=lambda _d: _Props(uuid)))


CUDA0 = types.SimpleNamespace(type="cuda", index=0)


def test_bench_reads_its_gpu_through_the_adapter(monkeypatch):
    from torchrig.bench import device as bench_device

    facts = recorded("h200x2-driver580-cu130")
    shutdowns: list[int] = []
    monkeypatch.setitem(sys.modules, "pynvml", replay(facts, nvmlShutdown=lambda: shutdowns.append(1)))
    g = facts["gpus"][1]  # CUDA_VISIBLE_DEVICES=1: CUDA's device 0 is NVML's GPU 1
    read = bench_device.gpu_state_reader(_torch_with(g["uuid"].removeprefix("GPU-")), CUDA0)
    assert read is not None
    assert read() == (g["sm_clock_mhz"], g["temperature_c"], round(g["power_draw_w"], 1))
    assert shutdowns == []  # the session stays open for the worker's life
    # a GPU NVML does not list, the CPU, a clock NVML refuses
    assert bench_device.gpu_state_reader(_torch_with("00000000-0000-0000-0000-000000000000"), CUDA0) is None
    assert shutdowns == [1]
    assert bench_device.gpu_state_reader(_torch_with(g["uuid"]), types.SimpleNamespace(type="cpu")) is None
    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        replay(facts, nvmlDeviceGetClockInfo=fail(pynvml.NVML_ERROR_NOT_SUPPORTED)),
    )
    read = bench_device.gpu_state_reader(_torch_with(g["uuid"]), CUDA0)
    assert read is not None and read() == (None, g["temperature_c"], round(g["power_draw_w"], 1))


def test_bench_without_nvml_has_no_reader(monkeypatch):
    from torchrig.bench import device as bench_device

    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert bench_device.gpu_state_reader(_torch_with("ab2a08d6-ef8c-084b-4c48-9ab327f58ba1"), CUDA0) is None
    facts = recorded("h200x2-driver580-cu130")
    monkeypatch.setitem(
        sys.modules, "pynvml", replay(facts, nvmlInit=fail(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    )
    assert bench_device.gpu_state_reader(_torch_with("ab2a08d6-ef8c-084b-4c48-9ab327f58ba1"), CUDA0) is None


class _FabricInfo12535(ctypes.Structure):  # nvidia-ml-py 12.535.161's c_nvmlGpuFabricInfo_t
    _fields_ = [
        ("clusterUuid", ctypes.c_char * 80),
        ("status", ctypes.c_uint),
        ("partitionId", ctypes.c_uint32),
        ("state", ctypes.c_uint8),
    ]


class _FabricInfo13580(ctypes.Structure):  # nvidia-ml-py 13.580.82's
    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * 80),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint8),
    ]


@pytest.mark.parametrize(
    "layout", [_FabricInfo12535, _FabricInfo13580, None], ids=["12.535", "13.580", "installed"]
)
def test_fabric_info_of_every_binding_layout_is_read(monkeypatch, layout):
    """The GPU machine's binding (13.580) declares the cluster UUID as 80 bytes, 12.570 as c_char (read back
    cut at the first zero byte), 12.535 names the clique partitionId: each is read, cliques and all."""
    nv = h200x2(**nvswitch([1, 2]))
    if layout is not None:
        nv.c_nvmlGpuFabricInfo_t = layout
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    a, b = runtime_nvml.probe(numa_of=lambda bus: None).gpus
    assert a.nvlink_domain and b.nvlink_domain and a.nvlink_domain != b.nvlink_domain
    facts = probe_nvml().gpus
    assert [g.fabric_state for g in facts] == ["completed", "completed"]


def test_processes_carry_sm_use_and_a_graphics_one_is_listed_once(monkeypatch):
    """nvidia-smi's process table: compute and graphics processes (a pid on both once, as compute), each with
    the SM use of its latest nvmlDeviceGetProcessUtilization sample; the PCIe link of nvidia-smi -q."""
    nv_facts = recorded("h200x1-driver580-cu130")
    nv_facts["gpus"][0]["processes"] = [{"pid": 11, "used_memory_mib": 1024, "name": "python3"}]
    samples = [
        ns(pid=11, smUtil=40, timeStamp=1),
        ns(pid=11, smUtil=55, timeStamp=2),
        ns(pid=12, smUtil=9, timeStamp=2),
    ]
    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        replay(
            nv_facts,
            nvmlDeviceGetProcessUtilization=lambda _h, _since: samples,
            nvmlDeviceGetGraphicsRunningProcesses=lambda _h: [
                ns(pid=11, usedGpuMemory=mib(1024)),
                ns(pid=12, usedGpuMemory=None),
            ],
            nvmlSystemGetProcessName=lambda pid: {11: b"python3", 12: b"Xorg"}[pid],
            nvmlDeviceGetCurrPcieLinkGeneration=lambda _h: 1,
            nvmlDeviceGetMaxPcieLinkGeneration=lambda _h: 5,
            nvmlDeviceGetCurrPcieLinkWidth=lambda _h: 16,
            nvmlDeviceGetMaxPcieLinkWidth=lambda _h: 16,
        ),
    )
    g = probe_nvml(identify=None).gpus[0]
    assert [(p.pid, p.kind, p.sm_util_pct, p.used_memory_mib) for p in g.processes] == [
        (11, "compute", 55, 1024),
        (12, "graphics", 9, None),
    ]
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (1, 5, 16, 16)


@pytest.mark.parametrize(
    "case", ["h200x2-driver580-cu130", "mig-enabled-no-instances-h200", "mixed-architectures-h200-a100"]
)
def test_identities_are_the_cheap_part_of_the_devices(monkeypatch, case):
    """What ``torchrig launch`` plans with before CUDA is touched: the same index, UUID, name and MIG mode as
    the full device records, from four queries a GPU."""
    monkeypatch.setitem(sys.modules, "pynvml", replay(recorded(case)))
    with nvml.session() as gpus:
        ids, devices = gpus.identities(), gpus.devices()
    assert [(i.index, i.uuid, i.name, i.mig_mode) for i in ids] == [
        (d.index, d.uuid, d.name, d.mig_mode) for d in devices
    ]
    assert [i.name for i in ids] == [g["name"] for g in recorded(case)["gpus"]]
