"""The environment a user carries, on recorded facts: NCCL/gloo interfaces and IB HCAs against the host,
PyTorch's allocator grammar, CUDA_DEVICE_ORDER on mixed GPUs, transports switched off, debugging settings
left on, LD_PRELOAD; where each was set; the NCCL bootstrap check; and the bisection of a failed probe."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchrig.doctor import diagnose, envrules
from torchrig.doctor.facts import (
    CrashTrace,
    EnvVar,
    IbDevice,
    NcclDeviceCheck,
    NcclFacts,
    ProbeStatus,
    facts_from_json,
    facts_to_json,
    load_facts,
)
from torchrig.doctor.probes.env import probe_env, where_set
from torchrig.doctor.probes.trace import culprits, describe, trace

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
H200 = load_facts(FIX / "h200x1-recorded-healthy.json")
H200X2 = load_facts(FIX / "h200x2-driver580-cu130.json")


def with_env(facts, vars_, ifaces=("lo", "eth0", "docker0"), ib=()):
    env = dataclasses.replace(
        facts.env,
        variables=tuple(EnvVar(k, v, s) for k, v, s in vars_),
        net_interfaces=ifaces,
        ib_devices=ib,
    )
    return dataclasses.replace(facts, env=env)


def ids(facts, severity=None):
    return [
        f.id
        for f in diagnose(facts, use_kb=False).findings
        if severity is None or f.severity.value == severity
    ]


def find(facts, fid):
    return next(f for f in diagnose(facts, use_kb=False).findings if f.id == fid)


# ---------------------------------------------------------------- the rules are data, each with its source
def test_every_rule_names_its_documentation_and_a_known_check():
    data = envrules.load()
    assert data["vars"] and data["alloc_keys"]
    for r in data["vars"].values():
        assert r.source.startswith("https://") and r.verified and r.breaks
        assert r.rule in envrules.RULES, r.name
        if r.needs:
            assert r.needs in data["vars"]
    for k in data["alloc_keys"].values():
        assert k.source.startswith("https://") and k.type in {
            "bool",
            "choice",
            "fraction",
            "size_mb",
            "size",
            "pow2",
            "pow2_list",
        }


# ---------------------------------------------------------------- NCCL's and gloo's interfaces
@pytest.mark.parametrize(
    "spec, selected",
    [
        ("eth", ["eth0"]),
        ("=eth0", ["eth0"]),
        ("=eth", []),
        ("^docker,lo", ["eth0"]),
        ("^=docker0", ["lo", "eth0"]),
        ("eth9", []),
        ("^e,d,l", []),
        ("ib,eth", ["eth0"]),
    ],
)
def test_nccl_interface_selection(spec, selected):
    assert envrules.select_interfaces(spec, ["lo", "eth0", "docker0"]) == selected


def test_a_socket_ifname_naming_no_interface_is_an_error_with_where_and_fix():
    facts = with_env(H200, [("NCCL_SOCKET_IFNAME", "ens9f0", ("/etc/profile.d/nccl.sh:3",))])
    f = find(facts, "env.nccl_socket_ifname")
    assert f.severity.value == "error" and "ens9f0" in f.summary
    assert "NCCL_SOCKET_IFNAME='ens9f0'" in f.evidence
    assert any("/etc/profile.d/nccl.sh:3" in e for e in f.evidence)
    assert any("docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html" in e for e in f.evidence)
    assert f.fix[0].startswith("edit /etc/profile.d/nccl.sh line 3")
    assert "export NCCL_SOCKET_IFNAME==eth0" in f.fix[-1]
    assert "env.nccl_socket_ifname" not in ids(with_env(H200, [("NCCL_SOCKET_IFNAME", "=eth0", ())]))
    assert "env.nccl_socket_ifname" not in ids(with_env(H200, [("NCCL_SOCKET_IFNAME", "^docker,lo", ())]))


def test_gloo_takes_exact_names():
    facts = with_env(H200, [("GLOO_SOCKET_IFNAME", "eth", ("container",))])
    f = find(facts, "env.gloo_socket_ifname")
    assert f.severity.value == "error"
    assert any("container's start environment" in e for e in f.evidence)
    assert "env.gloo_socket_ifname" not in ids(with_env(H200, [("GLOO_SOCKET_IFNAME", "eth0", ())]))


@pytest.mark.parametrize(
    "spec, hit",
    [
        ("mlx5", True),
        ("mlx5_0:1", True),
        ("=mlx5_0:1,mlx5_1:1", True),
        ("=mlx5", False),
        ("mlx5_0:2", False),
        ("^mlx5", False),
        ("^=mlx5_1", True),
        ("mlx4", False),
    ],
)
def test_ib_hca_selection(spec, hit):
    facts = with_env(H200, [("NCCL_IB_HCA", spec, ())], ib=(IbDevice("mlx5_0", (1,)),))
    assert ("env.nccl_ib_hca" not in ids(facts)) == hit


def test_ib_hca_without_ib_devices_is_a_note():
    facts = with_env(H200, [("NCCL_IB_HCA", "mlx5", ())], ib=())
    assert find(facts, "env.nccl_ib_hca").severity.value == "info"


def test_transports_switched_off_where_the_host_has_them():
    two = with_env(
        H200X2, [("NCCL_P2P_DISABLE", "1", ()), ("NCCL_SHM_DISABLE", "1", ()), ("NCCL_IB_DISABLE", "1", ())]
    )
    found = [f for f in diagnose(two, use_kb=False).findings if f.id == "env.nccl_transport_disabled"]
    assert {f.evidence[0].split("=")[0] for f in found} == {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"}
    one = with_env(H200, [("NCCL_P2P_DISABLE", "1", ())])
    assert "env.nccl_transport_disabled" not in ids(one)
    ib = with_env(H200, [("NCCL_IB_DISABLE", "1", ())], ib=(IbDevice("mlx5_0", (1,)),))
    assert "env.nccl_transport_disabled" in ids(ib)


# ---------------------------------------------------------------- the allocator's grammar
@pytest.mark.parametrize(
    "value, ok",
    [
        ("expandable_segments:True", True),
        ("max_split_size_mb:512,garbage_collection_threshold:0.6", True),
        ("backend:cudaMallocAsync", True),
        ("roundup_power2_divisions:[256:1,512:2,>:4]", True),
        ("roundup_power2_divisions:4", True),
        ("pinned_use_cuda_host_register:True,pinned_num_register_threads:8", True),
        (" expandable_segments : True ", True),
        ("expandable_segments:true", False),
        ("max_split_size_mb:abc", False),
        ("max_split_size_mb:10", False),
        ("max_split_size_mb=512", False),
        ("garbage_collection_threshold:1.5", False),
        ("garbage_collection_threshold:0", False),
        ("roundup_power2_divisions:3", False),
        ("backend:cudaMalloc", False),
        ("pinned_num_register_threads:3", False),
        ("pinned_num_register_threads:256", False),
        ("expandable_segment:True", False),
        ("max_split_size_mb", False),
    ],
)
def test_alloc_conf_grammar(value, ok):
    assert (envrules.parse_alloc_conf(value) == []) == ok, envrules.parse_alloc_conf(value)


# Keys torch's CPU build parses itself (the CUDA allocator's own keys are parsed only where CUDA is).
ACCELERATOR_CASES = [
    "expandable_segments:True",
    "expandable_segments:true",
    "max_split_size_mb:abc",
    "max_split_size_mb:10",
    "max_split_size_mb:512",
    "max_split_size_mb=512",
    "garbage_collection_threshold:1.5",
    "garbage_collection_threshold:0.5",
    "roundup_power2_divisions:3",
    "roundup_power2_divisions:[256:1,>:4]",
]


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="needs torch",
)
def test_alloc_conf_grammar_agrees_with_torchs_own_parser():
    code = (
        "import json, sys, torch\n"
        "out = {}\n"
        "for v in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        torch._C._accelerator_setAllocatorSettings(v); out[v] = True\n"
        "    except Exception:\n"
        "        out[v] = False\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(ACCELERATOR_CASES)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.skip(f"this torch has no _accelerator_setAllocatorSettings: {proc.stderr[-200:]}")
    torch_says = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = {v: envrules.parse_alloc_conf(v) == [] for v in ACCELERATOR_CASES}
    assert ours == torch_says


def test_a_malformed_alloc_conf_is_named_with_torchs_words():
    facts = with_env(H200, [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:true", ("/root/.bashrc:12",))])
    facts = dataclasses.replace(
        facts,
        torch=dataclasses.replace(facts.torch, alloc_conf_error="ValueError: Expected 'True' or 'False'"),
    )
    f = find(facts, "env.alloc_conf")
    assert f.severity.value == "error" and "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true" in f.summary
    assert any("torch's parser" in e for e in f.evidence)
    assert f.fix[0] == "edit /root/.bashrc line 12: remove the PYTORCH_CUDA_ALLOC_CONF line"


def test_two_allocator_variables_that_disagree():
    facts = with_env(
        H200,
        [
            ("PYTORCH_ALLOC_CONF", "expandable_segments:True", ()),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512", ()),
        ],
    )
    assert any(
        "both set" in f.summary for f in diagnose(facts, use_kb=False).findings if f.id == "env.alloc_conf"
    )


# ---------------------------------------------------------------- GPU order, debug settings, LD_PRELOAD
def test_device_order_on_mixed_gpus():
    gpus = list(H200X2.nvml.gpus)
    gpus[1] = dataclasses.replace(gpus[1], name="NVIDIA L40S")
    mixed = dataclasses.replace(H200X2, nvml=dataclasses.replace(H200X2.nvml, gpus=tuple(gpus)))
    assert "env.cuda_device_order" in ids(with_env(mixed, []))
    assert "env.cuda_device_order" not in ids(with_env(mixed, [("CUDA_DEVICE_ORDER", "PCI_BUS_ID", ())]))
    assert "env.cuda_device_order" not in ids(with_env(H200X2, []))  # the same GPUs: one order
    assert "env.cuda_device_order" in ids(with_env(H200, [("CUDA_DEVICE_ORDER", "PCI", ())]))


def test_debug_settings_left_on():
    facts = with_env(
        H200,
        [
            ("CUDA_LAUNCH_BLOCKING", "1", ("/etc/environment:2",)),
            ("NCCL_DEBUG", "TRACE", ()),
            ("TORCH_NCCL_BLOCKING_WAIT", "1", ()),
            ("NCCL_DEBUG_SUBSYS", "ALL", ()),
        ],
    )
    found = [f for f in diagnose(facts, use_kb=False).findings if f.id == "env.debug_setting"]
    named = {f.evidence[0].split("=")[0] for f in found}
    assert named == {"CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG", "TORCH_NCCL_BLOCKING_WAIT", "NCCL_DEBUG_SUBSYS"}
    assert all(f.severity.value == "warning" for f in found)
    quiet = with_env(
        H200,
        [("NCCL_DEBUG", "WARN", ()), ("NCCL_DEBUG_SUBSYS", "ALL", ()), ("CUDA_LAUNCH_BLOCKING", "0", ())],
    )
    assert "env.debug_setting" not in ids(quiet)


def test_ld_preload_of_a_cuda_library_is_a_warning():
    facts = with_env(H200, [("LD_PRELOAD", "/opt/old/libcudart.so.11.0", ())])
    assert find(facts, "env.ld_preload").severity.value == "warning"
    assert (
        find(with_env(H200, [("LD_PRELOAD", "libjemalloc.so.2", ())]), "env.ld_preload").severity.value
        == "info"
    )


def test_older_facts_without_the_variables_stay_quiet():
    assert H200.env.variables is None
    assert not [
        i for i in ids(H200) if i.startswith(("env.nccl", "env.alloc", "env.debug", "env.cuda_device"))
    ]


# ---------------------------------------------------------------- where a variable was set
def test_where_set_reads_profiles_and_nccl_conf(tmp_path):
    (tmp_path / ".bashrc").write_text("# mine\nexport NCCL_SOCKET_IFNAME=ens9\nCUDA_LAUNCH_BLOCKING=1\n")
    (tmp_path / ".nccl.conf").write_text("NCCL_DEBUG=INFO\n")
    found = where_set(["NCCL_SOCKET_IFNAME", "CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG", "UNSET"], str(tmp_path))
    assert found["NCCL_SOCKET_IFNAME"] == [f"{tmp_path}/.bashrc:2"]
    assert found["CUDA_LAUNCH_BLOCKING"] == [f"{tmp_path}/.bashrc:3"]
    assert found["NCCL_DEBUG"] == [f"{tmp_path}/.nccl.conf:1"]
    assert found["UNSET"] == []
    assert where_set(["X"], None, container_env={"X": "1"})["X"] == ["container"]


def test_the_env_probe_records_the_variables_and_the_host(tmp_path):
    (tmp_path / ".profile").write_text("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true\n")
    env = {
        "HOME": str(tmp_path),
        "PATH": "/usr/bin",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true",
        "SECRET": "x",
    }
    facts = probe_env(env)
    assert [v.name for v in facts.variables] == ["PYTORCH_CUDA_ALLOC_CONF"]  # only what CUDA/NCCL/torch read
    assert facts.variables[0].set_in == (f"{tmp_path}/.profile:1",)
    assert facts.net_interfaces and "lo" in facts.net_interfaces
    assert facts.ib_devices is not None


def test_new_facts_round_trip_and_old_ones_load():
    facts = with_env(H200, [("NCCL_DEBUG", "INFO", ("/etc/nccl.conf:1",))], ib=(IbDevice("mlx5_0", (1, 2)),))
    torch = dataclasses.replace(
        facts.torch,
        nccl=NcclFacts(
            "failed", None, (NcclDeviceCheck(0, False, "DistBackendError: x", 12.5),), ("NCCL_DEBUG=INFO",)
        ),
        trace=CrashTrace("killed by SIGSEGV", True, None, ("A=1",), ("PATH",), 5, 1000.0, None),
    )
    facts = dataclasses.replace(facts, torch=torch)
    again = facts_from_json(json.loads(json.dumps(facts_to_json(facts))))
    assert (
        again.env == facts.env
        and again.torch.nccl == facts.torch.nccl
        and again.torch.trace == facts.torch.trace
    )
    assert not again.absent
    assert "variables" not in facts_to_json(H200)["env"]  # unknown stays unwritten


# ---------------------------------------------------------------- the NCCL bootstrap check
def with_nccl(facts, nccl):
    return dataclasses.replace(facts, torch=dataclasses.replace(facts.torch, nccl=nccl))


def test_nccl_bootstrap_ok_and_failed():
    ok = with_nccl(H200, NcclFacts("ok", None, (NcclDeviceCheck(0, True, None, 310.0),)))
    assert find(ok, "nccl.ok").severity.value == "ok"
    bad = with_env(H200, [("NCCL_SOCKET_IFNAME", "ens9", ())])
    err = "DistBackendError: NCCL error: invalid usage, Bootstrap : no socket interface found"
    bad = with_nccl(
        bad, NcclFacts("failed", None, (NcclDeviceCheck(0, False, err, 40.0),), ("NCCL_SOCKET_IFNAME=ens9",))
    )
    f = find(bad, "nccl.bootstrap_failed")
    assert f.severity.value == "error" and "no socket interface" in f.summary
    assert "NCCL_SOCKET_IFNAME=ens9 selects no network interface" in f.cause
    assert any(s.startswith("export NCCL_SOCKET_IFNAME") for s in f.fix)
    hung = with_nccl(H200, NcclFacts("timeout", "the NCCL communicator did not come up in 20 s"))
    assert find(hung, "nccl.bootstrap_failed").summary.startswith("the NCCL check timeout")


# ---------------------------------------------------------------- a failed probe, traced
def test_bisection_finds_one_variable_and_a_pair():
    env = {f"V{i}": str(i) for i in range(40)}
    runs = []

    def one(e):
        runs.append(1)
        return "V17" in e

    assert culprits(sorted(env), {}, env, one) == ["V17"]
    assert len(runs) <= 2 * 6 + 1
    pair = culprits(sorted(env), {}, env, lambda e: "V3" in e and "V30" in e)
    assert sorted(pair) == ["V3", "V30"]


def test_trace_clean_ok_names_the_variable_and_respects_its_budget():
    env = {"PATH": "/usr/bin", "HOME": "/root", "TORCH_LOGS": "bogus", "EDITOR": "vi", "X": "1"}
    t = trace(lambda e: "ValueError" if "TORCH_LOGS" in e else None, env, "ValueError: Invalid log settings")
    assert t.clean_ok is True and t.culprits == ("TORCH_LOGS=bogus",) and t.essentials == ("PATH", "HOME")
    broken = trace(lambda e: "killed by SIGSEGV", env, "killed by SIGSEGV")
    assert (
        broken.clean_ok is False and broken.culprits == () and broken.runs == 2
    )  # clean and suspects, side by side
    slow = trace(lambda e: "x" if "X" in e and "EDITOR" in e else None, env, "x", max_runs=2)
    assert slow.note and "stopped after 2 runs" in slow.note and slow.clean_ok is True
    needs_path = trace(
        lambda e: None if "LD_LIBRARY_PATH" in e and "BAD" not in e else "x",
        {**env, "LD_LIBRARY_PATH": "/opt/cuda/lib", "BAD": "1"},
        "x",
    )
    assert "LD_LIBRARY_PATH" in needs_path.essentials and needs_path.culprits == ("BAD=1",)


def test_describe_names_the_signal():
    assert describe(-11, "x") == "killed by SIGSEGV: x"
    assert describe(1, "boom") == "exited with status 1: boom"


def failed_torch(facts, trace_):
    t = dataclasses.replace(
        facts.torch, status=ProbeStatus.FAILED, error="killed by SIGSEGV", trace=trace_, origin=None
    )
    return dataclasses.replace(facts, torch=t)


def test_a_traced_crash_names_the_variable_not_reinstall():
    tr = CrashTrace(
        "killed by SIGSEGV", True, None, ("PYTORCH_CUDA_ALLOC_CONF=foo",), ("PATH", "HOME"), 5, 9000.0
    )
    f = find(failed_torch(H200, tr), "env.breaks_torch")
    assert f.severity.value == "error" and "PYTORCH_CUDA_ALLOC_CONF" in f.summary
    assert not any("reinstall" in s for s in f.fix)
    assert "torch.import_failed" not in ids(failed_torch(H200, tr))


def test_reinstall_only_when_a_clean_environment_fails_too():
    tr = CrashTrace("killed by SIGSEGV", False, "killed by SIGSEGV", (), ("PATH", "HOME"), 1, 4000.0)
    f = find(failed_torch(H200, tr), "torch.import_failed")
    assert any("--force-reinstall" in s for s in f.fix)


def test_deep_pairs_that_fail_are_named():
    from torchrig.doctor.facts import NcclPairCheck

    ok = (NcclDeviceCheck(0, True, None, 300.0), NcclDeviceCheck(1, True, None, 280.0))
    pairs = (NcclPairCheck(0, 1, False, "DistBackendError: NCCL error: unhandled system error", 40.0),)
    facts = with_nccl(H200X2, NcclFacts("ok", None, ok, (), pairs))
    f = find(facts, "nccl.pair_failed")
    assert f.severity.value == "error" and "GPU 0 and 1" in f.summary
    good = with_nccl(H200X2, NcclFacts("ok", None, ok, (), (NcclPairCheck(0, 1, True, None, 12.0),)))
    assert "1 GPU pair(s)" in find(good, "nccl.ok").summary and "nccl.pair_failed" not in ids(good)
