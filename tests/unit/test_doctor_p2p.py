"""P2P is judged from CUDA's answer only for a pair whose two GPUs CUDA saw, else from NVML's, else not at all.

The cases are the facts recorded on the 2x H200 VM (NVLink between the pair; NVML answers the P2P write and
NVLink queries but not the read query there; CUDA's torch.cuda.can_device_access_peer said True): healthy,
with CUDA_VISIBLE_DEVICES=7 (torch saw no GPU), and with a 64 MB /dev/shm run with --only container,gpu (no
torch probe). Variants change only what the case is about."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchrig.doctor import diagnose
from torchrig.doctor.facts import facts_from_json, load_facts
from torchrig.doctor.findings import Severity

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
BASE = "h200x2-driver580-cu130"


def raw(name: str) -> dict[str, Any]:
    return json.loads((FIX / f"{name}.json").read_text())  # type: ignore[no-any-return]


def p2p_findings(facts: Any) -> dict[str, Any]:
    return {f.id: f for f in diagnose(facts).findings if f.id.startswith("gpu.p2p")}


def with_torch(
    base: dict[str, Any], cvd: str | None, names: list[str], peers: list[tuple[int, int, bool]]
) -> Any:
    """The recorded machine as torch would see it with CUDA_VISIBLE_DEVICES=cvd."""
    f = json.loads(json.dumps(base))
    f["env"]["cuda_visible_devices"] = cvd
    t = f["torch"]
    t["device_count"] = len(names)
    t["is_available"] = bool(names)
    t["devices"] = [dict(t["devices"][0], index=i, name=n) for i, n in enumerate(names)]
    t["peer_access"] = [{"a": a, "b": b, "can_access": ok} for a, b, ok in peers]
    return facts_from_json(f)


def test_recorded_machine_facts_are_what_the_cases_assume():
    f = raw(BASE)
    assert f["source"].startswith("recorded")
    assert f["nvml"]["p2p"] == [
        {"a": 0, "b": 1, "read": None, "write": "ok", "nvlink": "ok", "topology": "hostbridge"}
    ]
    assert f["torch"]["peer_access"] == [{"a": 0, "b": 1, "can_access": True}]
    hidden = raw(f"{BASE}-cuda-visible-devices-7")
    assert (hidden["torch"]["device_count"], hidden["torch"]["peer_access"]) == (0, [])
    assert raw(f"{BASE}-shm-64m")["torch"]["status"] == "skipped"


def test_healthy_pair_is_judged_by_cuda():
    found = p2p_findings(load_facts(FIX / f"{BASE}.json"))
    assert set(found) == {"gpu.p2p"}
    assert found["gpu.p2p"].evidence == (
        "GPU 0 <-> GPU 1: NVML read no answer, write ok, via NVLink; torch.cuda.can_device_access_peer: True",
    )


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("cuda-visible-devices-7", "torch saw 0 GPU(s) with CUDA_VISIBLE_DEVICES=7"),
        ("shm-64m", "torch probe skipped"),
    ],
)
def test_gpus_hidden_from_cuda_are_judged_by_nvml_not_reported_broken(case, why):
    """The recorded faults once also said 'P2P is unavailable' though P2P works on that machine."""
    found = p2p_findings(load_facts(FIX / f"{BASE}-{case}.json"))
    assert set(found) == {"gpu.p2p"}, {k: v.summary for k, v in found.items()}
    assert found["gpu.p2p"].severity is Severity.OK
    assert found["gpu.p2p"].evidence[0].endswith(f"judged by NVML ({why})")


def test_cuda_answer_counts_only_for_pairs_it_saw_both_of():
    base = raw(BASE)
    # CUDA_VISIBLE_DEVICES=1: torch sees one GPU, no pair; NVML decides
    found = p2p_findings(with_torch(base, "1", ["NVIDIA H200"], []))
    assert set(found) == {"gpu.p2p"} and "judged by NVML (torch saw 1 GPU(s)" in found["gpu.p2p"].evidence[0]
    # CUDA_VISIBLE_DEVICES=1,0: torch's pair (0, 1) is NVML's (1, 0); its "no" wins over NVML's "ok"
    found = p2p_findings(with_torch(base, "1,0", ["NVIDIA H200"] * 2, [(0, 1, False), (1, 0, False)]))
    assert set(found) == {"gpu.p2p_unavailable"}
    assert found["gpu.p2p_unavailable"].evidence[0].endswith("torch.cuda.can_device_access_peer: False")
    # CUDA_VISIBLE_DEVICES by UUID prefix maps too
    uuids = [g["uuid"][:12] for g in base["nvml"]["gpus"]]
    found = p2p_findings(with_torch(base, ",".join(uuids), ["NVIDIA H200"] * 2, [(0, 1, False)]))
    assert set(found) == {"gpu.p2p_unavailable"}


def test_a_mapping_whose_names_disagree_with_nvml_is_not_trusted():
    found = p2p_findings(with_torch(raw(BASE), None, ["NVIDIA A100", "NVIDIA H200"], [(0, 1, False)]))
    assert set(found) == {"gpu.p2p"} and "judged by NVML" in found["gpu.p2p"].evidence[0]


def test_nvml_no_or_no_answer_without_cuda():
    f = raw(f"{BASE}-cuda-visible-devices-7")
    f["nvml"]["p2p"][0].update(write="topology_not_supported")  # NVML's own "no" still counts
    assert set(p2p_findings(facts_from_json(f))) == {"gpu.p2p_unavailable"}
    f["nvml"]["p2p"][0].update(read=None, write=None)  # neither CUDA nor NVML answered: a note, no verdict
    found = p2p_findings(facts_from_json(f))
    assert set(found) == {"gpu.p2p_unknown"}
    assert found["gpu.p2p_unknown"].severity is Severity.INFO
    assert "torch saw 0 GPU(s)" in found["gpu.p2p_unknown"].evidence[0]
