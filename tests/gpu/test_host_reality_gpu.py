"""The host daemon's reality check on a real GPU: NVML's process list sees a CUDA process that no lease
accounts for, and the GPU it runs on is not handed out (the unit tests use recorded records for the same
decision). Skipped without CUDA or NVML.

Run: python3 -m pytest -q tests/gpu/test_host_reality_gpu.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

HOLD = (
    "import torch, time; x = torch.ones(1 << 20, device='cuda:0'); print('ready', flush=True); time.sleep(60)"
)


@pytest.fixture
def gpu_process():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
    p = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield p.pid
    finally:
        p.kill()
        p.wait(timeout=30)


def test_an_unleased_cuda_process_holds_its_gpu(gpu_process):
    from torchrig.hostd.reality import gpu_processes, unaccounted
    from torchrig.runtime.lease import NoFreeGpu, choose
    from torchrig.runtime.nvml import current
    from torchrig.runtime.placement import parse_gpus

    deadline = time.monotonic() + 20
    while True:
        procs = gpu_processes()
        if procs is None:
            pytest.skip("NVML is not available here")
        where = [uuid for uuid, ps in procs.items() if any(p.pid == gpu_process for p in ps)]
        if where or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if not where:
        pytest.skip("NVML lists no process pids here (a container without the host's pid namespace)")
    extra, found = unaccounted([], [], procs, time.time())
    assert where[0] in {x.unit_uuid for x in extra}
    assert any(f"pid {gpu_process}" in d.summary for d in found)
    inv = current(None)
    index = next(u.label for u in inv.units() if u.uuid == where[0])
    with pytest.raises(NoFreeGpu, match=f"pid {gpu_process}"):
        choose(inv, parse_gpus(f"device={index}"), extra, share=False)
