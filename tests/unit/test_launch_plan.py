"""The launch plan is a pure function: argv, environment and per-rank devices from a request and host facts."""

from __future__ import annotations

import pytest

from torchrig.errors import UsageError
from torchrig.launch.plan import HostFacts, LaunchRequest, build_plan, parse_endpoint, select_gpus

H8 = HostFacts(visible_gpus=tuple(range(8)), cpu_count=64, python="python3", env={})


def arg(plan, name):
    return next(a.split("=", 1)[1] for a in plan.argv if a.startswith(f"--{name}="))


def test_gpu_list_sets_visible_devices_and_local_devices():
    plan = build_plan(LaunchRequest(script="t.py", gpus="2,5", script_args=("--lr", "1")), H8, free_port=4321)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "2,5"
    assert [(r.local_rank, r.device, r.physical_gpu) for r in plan.ranks] == [
        (0, "cuda:0", 2),
        (1, "cuda:1", 5),
    ]
    assert plan.backend == "nccl" and plan.world_size == 2
    assert plan.argv[:3] == ("python3", "-m", "torch.distributed.run")
    assert arg(plan, "nproc-per-node") == "2" and arg(plan, "rdzv-endpoint") == "localhost:4321"
    assert plan.argv[-3:] == ("t.py", "--lr", "1")
    assert "torchrig.launch.worker" in plan.argv
    assert plan.env["OMP_NUM_THREADS"] == "32"


def chosen(spec, visible, **host):
    h = HostFacts(visible_gpus=visible, cpu_count=8, python="python3", env={}, **host)
    return tuple(u.gpu_index for u in select_gpus(LaunchRequest(script="t.py", gpus=spec), h).units)


def test_count_and_all():
    assert chosen("3", tuple(range(8))) == (0, 1, 2)
    assert chosen("all", (4, 6)) == (4, 6)
    assert chosen(None, (1,)) == (1,)
    assert chosen("device=5", tuple(range(8))) == (5,) == chosen("5,", tuple(range(8)))


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("9", "more GPUs than"),
        ("0,9", "not visible"),
        ("0,0", "twice"),
        ("two", "malformed"),
        ("0", "at least 1"),
        ("-1", "0 or more"),
        ("", "empty"),
        ("1,,2", "empty entry"),
        ("MIG-0b1c2d3e-0001-5f6a-8b9c-0d1e2f3a4b01", "one rank per whole GPU"),
    ],
)
def test_bad_gpu_specs(spec, msg):
    with pytest.raises(UsageError, match=msg):
        chosen(spec, tuple(range(8)))


def test_multi_node_is_c10d_with_node0_hosting():
    req = LaunchRequest(
        script="t.py",
        gpus="8",
        nnodes=2,
        node_rank=1,
        rdzv_endpoint="10.0.0.1:29400",
        rdzv_id="job7",
        max_restarts=3,
    )
    plan = build_plan(req, H8)
    assert arg(plan, "nnodes") == "2" and arg(plan, "node-rank") == "1"
    assert arg(plan, "rdzv-backend") == "c10d" and arg(plan, "rdzv-endpoint") == "10.0.0.1:29400"
    assert arg(plan, "rdzv-id") == "job7" and arg(plan, "max-restarts") == "3"
    assert "is_host=false" in arg(plan, "rdzv-conf")
    assert [r.global_rank for r in plan.ranks] == list(range(8, 16))
    assert plan.world_size == 16
    assert (
        "--rdzv-id=job7-preflight" in plan.preflight_argv
        and plan.preflight_argv[-1] == "torchrig.launch.pgprobe"
    )


def test_user_env_wins_and_nccl_defaults_have_reasons():
    host = HostFacts(visible_gpus=(0, 1), cpu_count=8, python="py", env={"NCCL_DEBUG": "INFO"})
    plan = build_plan(LaunchRequest(script="t.py", extra_env=(("FOO", "1"),)), host)
    assert "NCCL_DEBUG" not in plan.env  # the user's INFO is kept
    debug = next(e for e in plan.env_settings if e.name == "NCCL_DEBUG")
    assert debug.overridden_by_user
    assert plan.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and plan.env["FOO"] == "1"
    assert all(e.reason for e in plan.env_settings)
    assert plan.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_cpu_plan_has_no_nccl_settings():
    plan = build_plan(LaunchRequest(script="t.py", cpu=True, nproc_per_node=3), H8)
    assert plan.backend == "gloo" and plan.nproc_per_node == 3
    assert not any(k.startswith(("NCCL", "TORCH_NCCL", "TORCH_FR")) for k in plan.env)
    assert "CUDA_VISIBLE_DEVICES" not in plan.env
    assert plan.env["TORCHRIG_FR_REQUEST"] == f"{plan.log_dir}/.flight-record-request"


def test_missing_p2p_disables_it_with_a_reason():
    host = HostFacts(visible_gpus=(0, 1, 2, 3), cpu_count=8, python="py", env={}, no_p2p=((2, 3), (3, 2)))
    assert "NCCL_P2P_DISABLE" not in build_plan(LaunchRequest(script="t", gpus="0,1"), host).env
    plan = build_plan(LaunchRequest(script="t", gpus="1,2,3"), host)
    assert plan.env["NCCL_P2P_DISABLE"] == "1"


def test_module_script():
    plan = build_plan(LaunchRequest(script="torchrig.train", module=True, cpu=True), H8)
    assert plan.argv[-2:] == ("--module", "torchrig.train")


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"nnodes": 2}, "needs --rdzv-endpoint"),
        ({"node_rank": 1}, "--node-rank"),
        ({"max_restarts": -1}, "max-restarts"),
        ({"rdzv_endpoint": "a:b:c"}, "malformed"),
        ({"cpu": True, "gpus": "1"}, "exclude"),
        ({"rdzv_id": "a b"}, "rdzv-id"),
        ({"nccl_timeout_grace_s": -1}, "--nccl-timeout-grace must be 0"),
    ],
)
def test_bad_requests(kw, msg):
    with pytest.raises(UsageError, match=msg):
        LaunchRequest(script="t.py", **kw)


def test_endpoint():
    assert parse_endpoint("node0:29500") == ("node0", 29500)
    assert parse_endpoint("[fe80::1]:1") == ("[fe80::1]", 1)
    with pytest.raises(UsageError):
        parse_endpoint("h:70000")


def test_no_gpu_visible():
    host = HostFacts(visible_gpus=(), cpu_count=2, python="py")
    with pytest.raises(UsageError, match="no GPU is visible"):
        build_plan(LaunchRequest(script="t", gpus="1"), host)


@pytest.mark.parametrize("command", ["launch", "train"])
def test_negative_nccl_timeout_grace_is_one_line_exit_2(cli, command, tmp_path):
    args = ["--cpu", "x.py"] if command == "launch" else ["--device", "cpu", "--out", str(tmp_path / "o")]
    r = cli(command, "--nccl-timeout-grace", "-1", *args)
    assert r.code == 2 and r.err.count("\n") == 1 and "--nccl-timeout-grace must be 0" in r.err
    assert not (tmp_path / "o").exists()  # nothing trained


def test_missing_script_or_module_is_one_line_exit_2_before_any_preflight(cli, tmp_path):
    r = cli("launch", "--cpu", str(tmp_path / "nosuch.py"))
    assert r.code == 2 and r.err.count("\n") == 1 and "no script at" in r.err and "pre-flight" not in r.err
    r = cli("launch", "--cpu", "-m", "torchrig_no_such_module.train")
    assert r.code == 2 and r.err.count("\n") == 1 and "no module named torchrig_no_such_module.train" in r.err


def test_flight_record_dump_goes_next_to_the_rank_logs():
    host = HostFacts(visible_gpus=(0, 1), cpu_count=8, python="py", env={})
    plan = build_plan(LaunchRequest(script="t.py", log_dir="/runs/logs"), host)
    assert plan.env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/runs/logs/nccl_trace_rank_"
    mine = HostFacts(
        visible_gpus=(0, 1), cpu_count=8, python="py", env={"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/"}
    )
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in build_plan(LaunchRequest(script="t.py"), mine).env
    gloo = build_plan(LaunchRequest(script="t.py", cpu=True, log_dir="/runs/logs"), host)
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in gloo.env
    newer = HostFacts(visible_gpus=(0, 1), cpu_count=8, python="py", env={"TORCH_FR_DUMP_TEMP_FILE": "/y/"})
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in build_plan(LaunchRequest(script="t.py"), newer).env
    # torch 2.11 logs the old name as deprecated: from 2.11 on the dump path goes under the new one
    h211 = HostFacts(visible_gpus=(0, 1), cpu_count=8, python="py", env={}, torch_version="2.11.0+cu130")
    env = build_plan(LaunchRequest(script="t.py", log_dir="/runs/logs"), h211).env
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/runs/logs/nccl_trace_rank_"
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env


@pytest.mark.parametrize(
    "torch_version, name",
    [
        (None, "TORCH_NCCL_TRACE_BUFFER_SIZE"),  # no GPU probe: the name every release reads
        ("2.8.0+cu128", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
        ("2.11.0+cu130", "TORCH_FR_BUFFER_SIZE"),  # the release that warned the old name is deprecated
        ("2.13.0a0+git1234", "TORCH_FR_BUFFER_SIZE"),
        ("10.0.0", "TORCH_FR_BUFFER_SIZE"),
    ],
)
def test_flight_recorder_size_under_the_name_the_ranks_torch_reads(torch_version, name):
    host = HostFacts(visible_gpus=(0, 1), cpu_count=8, python="py", env={}, torch_version=torch_version)
    plan = build_plan(LaunchRequest(script="t.py"), host)
    other = {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"} - {name}
    assert plan.env[name] == "2000" and not other & set(plan.env)


@pytest.mark.parametrize("exported", ["TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"])
def test_flight_recorder_size_exported_under_either_name_is_the_users(exported):
    for version in ("2.8.0", "2.11.0"):
        host = HostFacts(
            visible_gpus=(0,), cpu_count=8, python="py", env={exported: "0"}, torch_version=version
        )
        plan = build_plan(LaunchRequest(script="t.py"), host)
        assert not {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"} & set(plan.env)
        fr = [e for e in plan.env_settings if "BUFFER_SIZE" in e.name]
        assert len(fr) == 1 and fr[0].overridden_by_user


def test_the_rendezvous_port_check_binds_it_as_the_store_will():
    """pre-flight's port check asks the same bind as up's port choice (runtime.ports.can_bind): a port a
    listener holds is an error naming it, the same port free again is ok."""
    import socket

    from torchrig.findings import Severity
    from torchrig.launch.preflight import check_port

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        plan = build_plan(LaunchRequest(script="t.py", cpu=True, rdzv_endpoint=f"localhost:{port}"), H8)
        busy = check_port(plan)
        assert busy.severity is Severity.ERROR and f"rendezvous port {port} is already in use" in busy.summary
    assert check_port(plan).severity is Severity.OK
