"""``--profile-steps``: the GPU-time breakdown computed from Chrome-trace kernel events."""

from __future__ import annotations

import gzip
import json

import pytest

from torchrig.errors import UsageError
from torchrig.hw.record import to_json
from torchrig.train.config import TrainConfig
from torchrig.train.profile import breakdown, is_comm_kernel, kernel_groups, read_trace
from torchrig.train.record import ProfileSummary


def k(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_comm_kernels_are_nccls():
    assert is_comm_kernel(NCCL) and is_comm_kernel("ncclKernel_AllGather_RING_LL_Sum_int8_t")
    assert not is_comm_kernel("sm90_xmma_gemm_bf16bf16_bf16f32") and not is_comm_kernel("triton_red_fused_0")


def test_breakdown_splits_compute_hidden_and_exposed_comm_and_idle():
    # Two steps over 2 ms of wall time (times in microseconds). Compute: 0-600 and 500-900 (overlapping
    # kernels on two streams: 900 us of union), a memcpy 1000-1100, and 1200-1800. NCCL: 700-1000 (200 us
    # under compute, 100 us alone) and 1850-1950 (alone). CPU events and zero-length kernels do not count.
    events = [
        k("sm90_gemm", 0, 600),
        k("triton_poi_fused_1", 500, 400),
        k("Memcpy HtoD (Pinned -> Device)", 1000, 100, cat="gpu_memcpy"),
        k("sm90_gemm", 1200, 600),
        k(NCCL, 700, 300),
        k(NCCL, 1850, 100),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},
        k("triton_empty", 1990, 0),
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 10},
    ]
    b = breakdown(events, steps=2, wall_s=0.002)
    assert b.step_ms == 1.0
    assert b.compute_ms == pytest.approx(1.6 / 2)  # (900 + 100 + 600) us over 2 steps
    assert b.comm_ms == pytest.approx(0.4 / 2)
    assert b.comm_overlapped_ms == pytest.approx(0.2 / 2)
    assert b.comm_exposed_ms == pytest.approx(0.2 / 2)
    busy = 1.6 + 0.2  # compute union + exposed comm, in ms, over the 2 steps
    assert b.idle_ms == pytest.approx((2.0 - busy) / 2)
    assert b.device_events == 6 and b.comm_kernels == 2


def test_no_device_events_gives_the_step_time_alone():
    b = breakdown([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9}], steps=3, wall_s=0.03)
    assert b == ProfileSummary(steps=3, step_ms=10.0, device_events=0)
    assert to_json(b) == {"steps": 3, "step_ms": 10.0, "device_events": 0}  # what a CPU run wrote


def test_read_trace_takes_plain_and_gzipped_chrome_traces(tmp_path):
    doc = {"traceEvents": [k(NCCL, 0, 10)], "deviceProperties": []}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    with gzip.open(tmp_path / "b.json.gz", "wt") as f:
        json.dump(doc, f)
    assert read_trace(tmp_path / "a.json") == read_trace(tmp_path / "b.json.gz") == doc["traceEvents"]


def test_profile_steps_must_leave_timed_steps():
    with pytest.raises(UsageError) as err:
        TrainConfig(steps=5, profile_steps=5)
    assert "--profile-steps 5" in err.value.one_line()
    with pytest.raises(UsageError):
        TrainConfig(profile_steps=-1)
    assert TrainConfig(steps=6, profile_steps=5).profile_steps == 5


@pytest.mark.parametrize(
    "fixture, expected",
    [
        # What torchrig train --profile-steps 5 reported on the GPU machine for these traces (run 7, call A).
        (
            "h200x2-outer-profile-kernels",
            {
                "compute_ms": 32.338,
                "comm_ms": 2.636,
                "comm_exposed_ms": 1.51,
                "idle_ms": 22.553,
                "comm_kernels": 25,
            },
        ),
        (
            "h200x1-profile-kernels",
            {"compute_ms": 32.419, "comm_ms": 0.0, "idle_ms": 2.165, "comm_kernels": 0},
        ),
    ],
)
def test_breakdown_of_recorded_h200_traces(fixture, expected):
    """Device events kept from real traces (tools/gpu/trace_kernels.py): GPT-2 small, bf16, compiled, DDP on
    2x H200 and one H200; the breakdown here gives what the run printed there."""
    from pathlib import Path

    path = Path(__file__).parents[1] / "fixtures" / "train" / f"{fixture}.json.gz"
    with gzip.open(path, "rt") as f:
        meta = json.load(f)["torchrig"]
    b = breakdown(read_trace(path), meta["steps"], meta["wall_s"])
    assert {k: getattr(b, k) for k in expected} == expected


def test_kernel_groups_sort_kernels_into_parts_of_the_model():
    ev = [
        k("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 0, 400),
        k("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", 400, 200),
        k("triton_red_fused__log_softmax__to_copy__unsafe_view_prepare_softmax_online_view_18", 600, 100),
        k("triton_poi_fused_gelu_view_9", 700, 50),
        k(
            "void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata, FusedAdamMathFunctor>",
            750,
            30,
        ),
        k(NCCL, 780, 20),
        k("Memcpy HtoD (Pinned -> Device)", 800, 10, cat="gpu_memcpy"),
        k("some_cpu_op", 0, 999, cat="cpu_op"),
    ]
    g = kernel_groups(ev, steps=2, top=2)
    assert g.groups_ms == {
        "matmul": 0.2,
        "attention": 0.1,
        "loss (softmax, NLL)": 0.05,
        "norm, GELU, adds (Triton)": 0.025,
        "optimizer": 0.015,
        "nccl": 0.01,
        "copy, fill": 0.005,
    }
    assert [n for n, _ in g.top_kernels_ms] == [ev[0]["name"], ev[1]["name"]]


def test_kernel_groups_of_the_recorded_h200_trace():
    """GPT-2 small, bf16, compiled, micro-batch 16 on one H200 (tools/gpu/trace_kernels.py): the matmuls take
    about half of the GPU time; cuDNN's attention, Inductor's kernels and the loss the rest."""
    from pathlib import Path

    path = Path(__file__).parents[1] / "fixtures" / "train" / "h200x1-profile-kernels.json.gz"
    g = kernel_groups(read_trace(path), 5).groups_ms
    assert (g["matmul"], g["attention"], g["loss (softmax, NLL)"], g["optimizer"]) == (
        17.202,
        3.952,
        2.337,
        1.022,
    )


def test_profiler_cuda_needs_a_window_and_a_gpu():
    with pytest.raises(UsageError) as err:
        TrainConfig(steps=5, profiler="cuda")
    assert (
        "--profile-steps" in err.value.one_line() and "ncu --profile-from-start off" in err.value.one_line()
    )
    with pytest.raises(UsageError) as err:
        TrainConfig(steps=5, profile_steps=1, profiler="cuda", device="cpu")
    assert "needs a CUDA GPU" in err.value.one_line()
    with pytest.raises(UsageError) as err:
        TrainConfig(steps=5, profile_steps=1, profiler="nsys")
    assert "choose from torch, cuda" in err.value.one_line()
    assert TrainConfig(steps=5, profile_steps=1, profiler="cuda").profiler == "cuda"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--profile-steps", "1", "--profiler", "cuda"], "--profiler cuda needs a CUDA GPU"),
        (["--precision", "fp8"], "--precision fp8 needs a CUDA GPU"),
        (["--device", "cuda"], "--device cuda but torch sees no GPU"),
    ],
)
def test_what_this_machine_cannot_do_is_refused_before_the_run_folder_exists(cli, tmp_path, args, says):
    """Found at start-up in one line (not at the profiled steps at the run's end), and before torchrig train
    takes its --out: a refused run leaves no folder and no lock file."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = cli(
        "train", "--size", "tiny", "--steps", "3", *args, "--out", str(tmp_path / "run"), "--no-tensorboard"
    )
    assert r.code == 2, r.err
    assert r.err.count("\n") == 1 and says in r.err and "Traceback" not in r.err
    assert not (tmp_path / "run").exists()


def test_cuda_window_brackets_the_steps_between_profiler_start_and_stop(monkeypatch):
    """The calls an outside profiler keys on, in order (the CUDA runtime calls are the hardware boundary,
    recorded here instead of made): start after a sync, one NVTX range per step, stop after a sync."""
    import torch

    from torchrig.train.profile import CudaWindow
    from torchrig.train.record import render_profile

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("cudaProfilerStart"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("cudaProfilerStop"))

    class Range:
        def __init__(self, msg):
            self.msg = msg

        def __enter__(self):
            calls.append(f"push {self.msg}")

        def __exit__(self, *exc):
            calls.append("pop")

    monkeypatch.setattr(torch.cuda.nvtx, "range", Range)
    w = CudaWindow(torch.device("cuda", 0))
    w.start()
    for step in (9, 10):
        with w.step(step):
            calls.append(f"step {step}")
    summary = w.stop(2)
    assert calls == [
        "sync", "cudaProfilerStart",
        "push torchrig step 9", "step 9", "pop", "push torchrig step 10", "step 10", "pop",
        "sync", "cudaProfilerStop",
    ]  # fmt: skip
    assert summary.steps == 2 and summary.step_ms >= 0 and summary.window == "cudaProfilerStart/Stop"
    assert to_json(summary)["window"] == "cudaProfilerStart/Stop"
    line = render_profile(summary)
    assert "marked by cudaProfilerStart/Stop" in line and "no GPU kernels" not in line
