"""Planning from NVML before CUDA is touched, and torch's check of that plan beside the job.

NVML's answers are replayed at the pynvml boundary from the facts doctor recorded on real machines
(tests/fixtures/doctor/*.json), and torch's answers are what torch said on the same machine (the same
files' ``torch`` record): NVML's plan must match what torch saw wherever torch could use the GPUs, and the
check must stop the job wherever it could not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from torchrig.findings import Finding, Severity
from torchrig.launch import gpuplan, probe, run
from torchrig.launch import preflight as pf
from torchrig.launch.plan import LaunchRequest

pytest.importorskip("pynvml")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nvmlreplay import FIX, recorded, replay

REAL_PROBE_GPUS = probe.probe_gpus  # torch on this host, in a subprocess


def facts(case: str) -> dict[str, Any]:
    return json.loads((FIX / "doctor" / f"{case}.json").read_text())  # type: ignore[no-any-return]


def torch_said(case: str) -> probe.GpuProbe:
    """What torch answered on the recorded machine, as the launcher's torch probe reports it."""
    t = facts(case)["torch"]
    blocked = [(p["a"], p["b"]) for p in t.get("peer_access") or [] if not p["can_access"]]
    return probe.GpuProbe(
        int(t["device_count"]),
        tuple(d["name"] for d in t.get("devices") or []),
        tuple(sorted({*blocked, *((b, a) for a, b in blocked)})),
        torch_version=t["version"],
    )


@pytest.fixture
def host(monkeypatch, tmp_path):
    """This process on the recorded machine ``case``: NVML replayed, its CUDA_VISIBLE_DEVICES, an empty
    cache; torch's probe must not run before the job (it answers beside it)."""

    def on(case: str) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", replay(recorded(case)))
        cvd = facts(case)["env"].get("cuda_visible_devices")
        if cvd is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
        monkeypatch.setenv("TORCHRIG_CACHE_DIR", str(tmp_path))
        monkeypatch.setattr(probe, "torch_version", lambda: facts(case)["torch"]["version"])
        monkeypatch.setattr(probe, "probe_gpus", lambda *a, **k: pytest.fail("torch probed before the job"))

    return on


# case -> (GPUs the ranks see per NVML, the check's verdict on a launch on every one of them)
CASES = {
    "h200x1-recorded-healthy": (1, Severity.OK),
    "h200x2-driver580-cu130": (2, Severity.OK),
    "h200x1-recorded-cuda-visible-devices-0-7": (1, Severity.OK),  # CUDA stops at 7: one GPU
    "p2p-blocked-by-acs-h200x2": (2, Severity.OK),  # NVML's "no P2P" is torch's too
    "torch-cpu-build-h200": (1, Severity.ERROR),
    "driver-535-h200-cu130": (1, Severity.ERROR),
    "driver-uvm-not-loaded-h200": (1, Severity.ERROR),
    "libcuda-stub-on-ld-library-path-h200": (1, Severity.ERROR),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_nvml_plans_what_torch_sees_and_the_check_stops_what_torch_cannot_use(case, host):
    host(case)
    answer = probe.gpu_answer()
    count, verdict = CASES[case]
    assert answer.unconfirmed and answer.gpus.count == count
    plan, names, pending = run._plan(LaunchRequest(script="train.py"), nvml_first=True)
    assert pending == answer and plan.backend == "nccl" and len(plan.ranks) == count
    assert names == tuple(g["name"] for g in facts(case)["nvml"]["gpus"])[:count]
    found = gpuplan.judge(answer.gpus, torch_said(case), plan, {})
    assert found.severity is verdict, found
    if verdict is Severity.OK:  # where torch can use the GPUs, NVML's answer is torch's
        assert answer.gpus == torch_said(case)


@pytest.mark.parametrize(
    "case",
    [
        "h200x1-recorded-cuda-visible-devices-7",
        "h200x1-recorded-cuda-visible-devices-bad-uuid",
        "h200x1-recorded-cuda-visible-devices-empty",
        "h200x1-recorded-cuda-visible-devices-minus1",
        "cuda-visible-devices-7-h200x2",
    ],
)
def test_a_cuda_visible_devices_that_hides_every_gpu_plans_cpu_ranks_as_torch_did(case, host):
    host(case)
    assert probe.gpu_answer().gpus.count == torch_said(case).count == 0
    plan, _names, pending = run._plan(LaunchRequest(script="train.py"), nvml_first=True)
    assert plan.backend == "gloo" and pending is None  # nothing on a GPU for torch to check
    with pytest.raises(Exception, match="--gpus given but no GPU is visible"):
        run._plan(LaunchRequest(script="train.py", gpus="1"), nvml_first=True)


def test_p2p_nvml_says_is_blocked_is_disabled_before_the_job(host):
    host("p2p-blocked-by-acs-h200x2")
    plan, _names, _pending = run._plan(LaunchRequest(script="train.py"), nvml_first=True)
    assert plan.env["NCCL_P2P_DISABLE"] == "1"
    assert [f.severity for f in [pf.check_p2p(plan)]] == [Severity.WARNING]


def test_mig_is_asked_of_torch_before_the_job(host, monkeypatch):
    """A GPU in MIG mode: CUDA enumerates its instances, not the GPU, so NVML's list of GPUs cannot stand in."""
    host("mig-enabled-no-instances-h200")
    asked = []
    monkeypatch.setattr(
        probe, "probe_gpus", lambda *a, **k: asked.append(1) or torch_said("mig-enabled-no-instances-h200")
    )
    answer = probe.gpu_answer()
    assert asked == [1] and not answer.unconfirmed and answer.gpus.count == 0


def test_gpus_of_two_kinds_are_asked_of_torch_unless_cuda_orders_them_as_nvml(host, monkeypatch):
    """CUDA's default order puts the fastest GPU first; only CUDA_DEVICE_ORDER=PCI_BUS_ID is NVML's order."""
    case = "mixed-architectures-h200-a100"
    host(case)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setattr(probe, "probe_gpus", lambda *a, **k: torch_said(case))
    assert not probe.gpu_answer().unconfirmed
    monkeypatch.setenv(
        "CUDA_DEVICE_ORDER", "PCI_BUS_ID"
    )  # another order: torch's kept answer is not this one
    answer = probe.gpu_answer()
    assert answer.unconfirmed and answer.gpus == torch_said(case)


def test_without_nvml_torch_is_asked_before_the_job_as_before(host, monkeypatch):
    host("h200x2-driver580-cu130")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    monkeypatch.setattr(probe, "probe_gpus", lambda *a, **k: torch_said("h200x2-driver580-cu130"))
    answer = probe.gpu_answer()
    assert not answer.unconfirmed and answer.gpus.count == 2
    assert probe.cached(probe.probe_key()) == answer.gpus  # kept: the next launch asks nobody


def test_a_cached_torch_answer_wins_and_nvml_is_not_read(host, monkeypatch):
    host("h200x2-driver580-cu130")
    probe.remember(probe.probe_key(), probe.GpuProbe(1, ("NVIDIA H200",), (), torch_version="2.11.0+cu130"))
    monkeypatch.setattr(probe, "read_nvml", lambda: pytest.fail("NVML read with a cached answer"))
    answer = probe.gpu_answer()
    assert not answer.unconfirmed and answer.gpus.count == 1


def test_several_nodes_and_no_preflight_ask_torch_before_the_job(host, monkeypatch):
    """Without the pre-flight beside the job there is nothing to run torch's check: torch plans, as before."""
    host("h200x2-driver580-cu130")
    monkeypatch.setattr(probe, "probe_gpus", lambda *a, **k: torch_said("h200x2-driver580-cu130"))
    _plan, _names, pending = run._plan(LaunchRequest(script="t.py", gpus="2"), nvml_first=False)
    assert pending is None


def _h200x2_plan(host: Any) -> tuple[Any, probe.GpuAnswer]:
    host("h200x2-driver580-cu130")
    plan, _names, pending = run._plan(LaunchRequest(script="train.py"), nvml_first=True)
    assert pending is not None
    return plan, pending


def test_judge_torch_that_fails_is_an_error(host):
    plan, answer = _h200x2_plan(host)
    broken = probe.GpuProbe(0, (), (), error="the CUDA probe did not answer within 60 s")
    f = gpuplan.judge(answer.gpus, broken, plan, {})
    assert f.severity is Severity.ERROR and f.summary.endswith("the CUDA probe did not answer within 60 s")
    assert f.id == "cuda" and any("torchrig doctor" in x for x in f.fix)


def test_judge_a_cpu_build_says_so(host):
    host("torch-cpu-build-h200")
    plan, _names, answer = run._plan(LaunchRequest(script="train.py", gpus="1"), nvml_first=True)
    assert answer is not None
    f = gpuplan.judge(answer.gpus, torch_said("torch-cpu-build-h200"), plan, {})
    assert f.summary == "torch 2.11.0+cpu sees no CUDA device (a CPU build); the job was given GPU(s) 0"


def test_judge_p2p_torch_denies_is_a_warning_and_kept_for_the_next_launch(host):
    plan, answer = _h200x2_plan(host)
    denied = probe.GpuProbe(2, ("NVIDIA H200",) * 2, ((0, 1), (1, 0)), torch_version="2.11.0+cu130")
    f = gpuplan.judge(answer.gpus, denied, plan, {})
    assert f.severity is Severity.WARNING and "NCCL_P2P_DISABLE" in f.summary
    assert gpuplan.judge(answer.gpus, denied, plan, {"NCCL_P2P_DISABLE": "1"}).severity is Severity.OK


def test_judge_more_gpus_in_torch_is_a_warning(host):
    plan, answer = _h200x2_plan(host)
    more = probe.GpuProbe(3, ("NVIDIA H200",) * 3, (), torch_version="2.11.0+cu130")
    assert gpuplan.judge(answer.gpus, more, plan, {}).severity is Severity.WARNING


def test_the_check_keeps_an_agreeing_answer_only(host, monkeypatch):
    plan, answer = _h200x2_plan(host)
    monkeypatch.setattr(
        probe, "probe_gpus", lambda *a, **k: probe.GpuProbe(0, (), (), torch_version="2.13.0+cpu")
    )
    assert pf.check_cuda(plan, answer, {}, 5).severity is Severity.ERROR
    assert probe.cached(answer.key) is None  # the next launch checks again
    monkeypatch.setattr(probe, "probe_gpus", lambda *a, **k: torch_said("h200x2-driver580-cu130"))
    assert pf.check_cuda(plan, answer, {}, 5).severity is Severity.OK
    assert probe.cached(answer.key) == torch_said("h200x2-driver580-cu130")


def test_a_failed_check_beside_the_job_stops_it_and_skips_the_rest():
    ran = []
    checks = [
        run.Check("cuda", lambda: Finding("cuda", Severity.ERROR, "torch sees no CUDA device")),
        run.Check("process-group", lambda: ran.append(1) or Finding("process-group", Severity.OK, "ok")),
    ]
    side = run._Beside(checks, lambda _line: None)
    found = side.wait()
    assert side.failure() == "the pre-flight cuda check failed beside the job: torch sees no CUDA device"
    assert ran == [] and [(f.id, f.severity) for f in found] == [
        ("cuda", Severity.ERROR),
        ("process-group", Severity.WARNING),
    ]
    assert found[1].summary == "skipped: an earlier pre-flight check failed"


def test_a_check_not_started_when_the_job_ends_is_not_started():
    import threading

    release, ran = threading.Event(), []

    def slow() -> Finding:
        release.wait(10)
        return Finding("cuda", Severity.OK, "torch can use the GPUs")

    checks = [
        run.Check("cuda", slow),
        run.Check("process-group", lambda: ran.append(1) or pytest.fail("ran")),
    ]
    side = run._Beside(checks, lambda _line: None)
    side.job_ended()
    release.set()
    found = side.wait()
    assert ran == [] and [(f.id, f.severity) for f in found] == [
        ("cuda", Severity.OK),  # the check under way finishes: its answer is kept for the next launch
        ("process-group", Severity.INFO),
    ]


def test_a_check_that_raises_is_a_warning_not_a_stop():
    def boom() -> Finding:
        raise OSError("no such file")

    side = run._Beside([run.Check("cuda", boom)], lambda _line: None)
    (f,) = side.wait()
    assert f.severity is Severity.WARNING and side.failure() is None


def test_the_real_torch_probe_on_this_cpu_host_stops_a_plan_on_gpus(host, monkeypatch):
    """torch on this machine, asked for real, against a plan from the recorded 1x H200's NVML."""
    host("h200x1-driver580-cu130")
    monkeypatch.setattr(probe, "probe_gpus", REAL_PROBE_GPUS)
    plan, _names, answer = run._plan(LaunchRequest(script="train.py", gpus="1"), nvml_first=True)
    assert answer is not None
    f = pf.check_cuda(plan, answer, {}, 120)
    if f.severity is Severity.OK:
        pytest.skip("this host's torch can use a GPU")
    assert f.severity is Severity.ERROR and "sees no CUDA device" in f.summary
    assert probe.cached(answer.key) is None


def test_the_checks_beside_the_job_start_once_every_rank_is_about_to_run_the_script():
    """The shims' header lines, as torchrun tees them, say when; until then the checks wait (they would
    compete with the job's start-up for the CPU)."""
    import threading

    from torchrig.launch.supervise import _Started

    began = threading.Event()
    side = run._Beside(
        [run.Check("cuda", lambda: began.set() or Finding("cuda", Severity.OK, "ok"))], lambda _l: None, 30.0
    )
    started = _Started(2, side.ranks_started)
    started.saw("[default1]:torchrig-worker: rank=1 local_rank=1 world_size=2 restart=0 pid=7 host=h\n")
    started.saw("[default1]:torchrig-worker: rank=1 local_rank=1 world_size=2 restart=0 pid=7 host=h\n")
    started.saw("[default0]:first-line 1764000000.0\n")
    assert not began.wait(0.5)  # rank 0's shim has not said so yet
    started.saw("[default0]:torchrig-worker: rank=0 local_rank=0 world_size=2 restart=0 pid=6 host=h\n")
    assert began.wait(5)
    assert [f.severity for f in side.wait()] == [Severity.OK]


@pytest.mark.parametrize(
    "read, write, verdict",
    [
        ("ok", "ok", True),
        ("ok", "not_supported", False),
        (None, "disabled_by_regkey", False),
        (None, None, None),
    ],
)
def test_doctor_and_the_placement_judge_a_pair_by_one_rule(read, write, verdict):
    from torchrig.doctor.checks.gpu import nvml_says
    from torchrig.hw.nvml_records import NvmlPair
    from torchrig.hw.record import P2PPair
    from torchrig.launch.gpuplan import no_p2p

    assert nvml_says(P2PPair(0, 1, read, write, None, None)) is verdict
    assert no_p2p(NvmlPair(0, 1, read, write, None, None)) is (verdict is False)
