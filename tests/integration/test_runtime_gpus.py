"""GPU leases on the real engine with a recorded 8x H200 inventory (this host has no GPU).

The containers are created with their GPU device requests (``up --create-only``): this engine has no NVIDIA
runtime to start them with, so the requests are checked through the engine's own container inspection.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures/runtime"
BASE = "torchrig-test/debian:bookworm"


@pytest.fixture
def ledger_env(tmp_path):
    return {
        "TORCHRIG_STATE_DIR": str(tmp_path / "state"),
        "HOME": str(tmp_path),
        "TORCHRIG_GPU_INVENTORY": str(FIX / "inventory-8xh200.json"),
    }


@pytest.fixture
def cleanup(engine):
    names: list[str] = []
    yield names
    for n in names:
        with contextlib.suppress(Exception):
            engine.containers.get(n).remove(force=True)
        for v in engine.volumes.list(filters={"label": f"torchrig.workspace={n}"}):  # its kept /workspace
            with contextlib.suppress(Exception):
                v.remove(force=True)


def _popen(args, env):
    import os

    return subprocess.Popen(
        [sys.executable, "-m", "torchrig", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_nine_concurrent_ups_on_eight_gpus(cli, engine, ledger_env, cleanup):
    names = [f"trt-gpu-{i}" for i in range(9)]
    cleanup.extend(names)
    procs = [
        _popen(
            ["up", "--image", BASE, "--gpus", "1", "--name", n, "--create-only", "--no-jupyter", "--no-ssh"],
            ledger_env,
        )
        for n in names
    ]
    results = [
        (n, p.wait(timeout=180), p.stdout.read(), p.stderr.read()) for n, p in zip(names, procs, strict=True)
    ]
    ok = [r for r in results if r[1] == 0]
    failed = [r for r in results if r[1] != 0]
    assert len(ok) == 8 and len(failed) == 1, [(n, code, err) for n, code, _, err in failed]
    _, code, _, err = failed[0]
    assert code == 1 and err.startswith("torchrig: error: no free GPU") and err.count("\n") == 1, err
    assert all(n in err for n, *_ in ok)  # the holders are listed

    # the engine's inspection: each container requests exactly one GPU, all different
    seen = []
    for n, *_ in ok:
        reqs = engine.api.inspect_container(n)["HostConfig"]["DeviceRequests"]
        assert len(reqs) == 1 and reqs[0]["Driver"] == "nvidia" and len(reqs[0]["DeviceIDs"]) == 1
        assert ["gpu", "compute", "utility"] in reqs[0]["Capabilities"]
        seen.append(reqs[0]["DeviceIDs"][0])
    assert len(set(seen)) == 8

    board = cli("gpus", "--json", env=ledger_env).json()
    assert sorted(h["container"] for g in board["gpus"] for h in g["holders"]) == sorted(n for n, *_ in ok)

    # removing a container behind torchrig's back frees its lease at the next command
    gone = ok[3][0]
    gone_uuid = engine.api.inspect_container(gone)["HostConfig"]["DeviceRequests"][0]["DeviceIDs"][0]
    engine.containers.get(gone).remove(force=True)
    r = cli(
        "up",
        "--image",
        BASE,
        "--gpus",
        "1",
        "--name",
        "trt-gpu-again",
        "--create-only",
        "--no-jupyter",
        "--no-ssh",
        "--json",
        env=ledger_env,
    )
    cleanup.append("trt-gpu-again")
    assert r.code == 0, r.err
    assert [u["uuid"] for u in r.json()["plan"]["gpus"]] == [gone_uuid]


def test_killed_container_frees_its_lease(cli, engine, ledger_env, cleanup):
    """A running environment's lease, freed when the container is killed."""
    from torchrig.runtime.inventory import load_snapshot
    from torchrig.runtime.lease import acquire
    from torchrig.runtime.ledger import Ledger
    from torchrig.runtime.placement import parse_gpus

    cleanup.append("trt-kill")
    r = cli(
        "up",
        "--image",
        BASE,
        "--name",
        "trt-kill",
        "--no-jupyter",
        "--no-ssh",
        env=ledger_env,
    )
    assert r.code == 0, r.err
    assert engine.containers.get("trt-kill").status == "running"
    # the lease such an environment holds on a GPU host (this engine cannot start GPU containers)
    led = Ledger.open(Path(ledger_env["TORCHRIG_STATE_DIR"]))
    acquire(
        led,
        load_snapshot(ledger_env["TORCHRIG_GPU_INVENTORY"]),
        parse_gpus("device=5"),
        user="u",
        container="trt-kill",
        share=False,
        live=None,
        listed_at_s=time.time(),
    )
    led.bind("trt-kill", engine.containers.get("trt-kill").id)
    held = cli("gpus", "--json", env=ledger_env).json()["gpus"][5]["holders"]
    assert [h["container"] for h in held] == ["trt-kill"]
    engine.containers.get("trt-kill").kill()
    board = cli("gpus", "--json", env=ledger_env).json()
    assert board["gpus"][5]["holders"] == [] and "trt-kill" in board["notes"][0]


def test_start_without_gpu_runtime_fails_cleanly(cli, engine, ledger_env):
    """On an engine without the NVIDIA runtime: exit 2 naming the fix; no container, no lease left."""
    r = cli(
        "up", "--image", BASE, "--gpus", "2", "--name", "trt-nort", "--no-jupyter", "--no-ssh", env=ledger_env
    )
    assert r.code == 2 and "cannot give containers GPUs" in r.err and "nvidia-ctk" in r.err
    assert r.err.count("\n") == 1
    assert not engine.containers.list(all=True, filters={"name": "^trt-nort$"}, ignore_removed=True)
    board = cli("gpus", "--json", env=ledger_env).json()
    assert all(g["holders"] == [] for g in board["gpus"])


@pytest.fixture(scope="module")
def cu130_image(engine, test_labels):
    """A small image labelled as a torch 2.9.1+cu130 build (labels as torchrig image build writes them),
    under a tag of its own and with the session's labels (the leak check finds it if it stays)."""
    dockerfile = (
        f"FROM {BASE}\nLABEL org.torchrig.torch=2.9.1+cu130 org.torchrig.cuda=13.0 "
        "org.torchrig.arch-list='sm_75 sm_80 sm_86 sm_90 sm_100 sm_120' org.torchrig.ptx=compute_120 "
        "org.torchrig.min-driver=580.65.06 org.torchrig.user=root:0:0\n"
    )
    from docker.errors import ImageNotFound

    tag = f"torchrig-test/labelled-cu130:{uuid.uuid4().hex[:10]}"
    try:
        engine.images.build(
            fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True, labels=test_labels
        )
        yield tag
    finally:
        with contextlib.suppress(ImageNotFound):
            engine.images.remove(tag, force=True)


def test_preflight_refuses_cuda_newer_than_driver(cli, engine, cu130_image, tmp_path):
    env = {
        "TORCHRIG_STATE_DIR": str(tmp_path / "s"),
        "HOME": str(tmp_path),
        "TORCHRIG_GPU_INVENTORY": str(FIX / "driver-535-2xa100-pcie.json"),
    }
    r = cli(
        "up", "--image", cu130_image, "--gpus", "1", "--name", "trt-pre", "--no-jupyter", "--no-ssh", env=env
    )
    assert r.code == 1, r.err
    assert "pre-flight refused" in r.err and "535.104.05" in r.err and r.err.count("\n") == 1
    assert "upgrade the host driver to ≥ 580.65.06" in r.err and "CUDA ≤ 12.2" in r.err
    assert not engine.containers.list(all=True, filters={"name": "^trt-pre$"}, ignore_removed=True)
    assert all(g["holders"] == [] for g in cli("gpus", "--json", env=env).json()["gpus"])
    # the same image passes pre-flight on the H200 host (driver 580)
    ok = cli(
        "up",
        "--image",
        cu130_image,
        "--gpus",
        "1",
        "--dry-run",
        "--no-jupyter",
        "--no-ssh",
        "--json",
        env={**env, "TORCHRIG_GPU_INVENTORY": str(FIX / "inventory-8xh200.json")},
    )
    assert ok.code == 0 and {f["code"] for f in ok.json()["preflight"]} >= {"driver_native"}


def test_mig_instance_and_deliberate_sharing(cli, engine, tmp_path, cleanup):
    env = {
        "TORCHRIG_STATE_DIR": str(tmp_path / "s"),
        "HOME": str(tmp_path),
        "TORCHRIG_GPU_INVENTORY": str(FIX / "mig-1xh100-3-instances.json"),
    }
    common = ["--image", BASE, "--create-only", "--no-jupyter", "--no-ssh"]
    mig = "MIG-0b1c2d3e-0001-5f6a-8b9c-0d1e2f3a4b01"
    cleanup.extend(["trt-mig", "trt-sh1", "trt-sh2", "trt-excl"])
    assert cli("up", *common, "--gpus", mig, "--name", "trt-mig", env=env).code == 0
    reqs = engine.api.inspect_container("trt-mig")["HostConfig"]["DeviceRequests"]
    assert reqs[0]["DeviceIDs"] == [mig]
    r = cli("up", *common, "--gpus", "device=0", "--name", "trt-x", env=env)
    assert r.code == 2 and "MIG mode" in r.err
    # GPU 1 shared by two --share environments; an exclusive request then finds no free GPU
    assert cli("up", *common, "--gpus", "1", "--share", "--name", "trt-sh1", env=env).code == 0
    assert cli("up", *common, "--gpus", "1", "--share", "--name", "trt-sh2", env=env).code == 0
    r = cli("up", *common, "--gpus", "1", "--name", "trt-excl", env=env)
    assert r.code == 1 and "trt-sh1 (shared)" in r.err and "trt-sh2 (shared)" in r.err
    board = {g["gpu"]: g for g in cli("gpus", "--json", env=env).json()["gpus"]}
    assert sorted(h["container"] for h in board["1"]["holders"]) == ["trt-sh1", "trt-sh2"]
