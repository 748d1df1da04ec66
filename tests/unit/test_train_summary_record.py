"""The run's summary is one typed record (train/record.py) built in one place (summary.finish): its JSON keeps
the keys and values ``summary.json``, the ``end`` event and ``train --json`` carried as a plain dict."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pytest

from torchrig.errors import InputError
from torchrig.jsonrecords import RecordError
from torchrig.train.config import TrainConfig
from torchrig.train.record import (
    DdpSummary,
    Fp8Summary,
    GpuClocks,
    KernelTimes,
    ProfileSummary,
    TrainSummary,
    read_summary,
)

# the keys, in order, of summary.json (GPT: tokens_per_s)
KEYS = [
    "steps", "resumed_from", "final_loss", "world_size", "precision", "parallel", "compile", "compile_mode",
    "step_graph", "attention", "loss", "fp8", "ddp", "bf16_weight_copies", "fused_mlp_blocks", "tuned_gemm_shapes", "gc_every", "on_nonfinite",
    "skipped_steps",
    "micro_batch", "grad_accum", "global_batch", "params", "device", "tokens_per_s", "mfu", "peak_tflops",
    "peak_source", "elapsed_s", "profile", "gpus",
]  # fmt: skip

# a 2-rank DDP fp8 GPT run's summary.json, as the dict wrote it (rank 1's GPU unknown); its profile is the
# breakdown of the recorded 2x H200 trace (h200x2-outer-profile-kernels, its top 3 kernels), rank 0's GPU
# clocks are GpuWatch.result's keys with the recorded H200's values
SUMMARY = json.loads(
    (Path(__file__).parents[1] / "fixtures/train/summary-gpt-ddp-fp8-2gpus.json").read_text()
)
GPU = SUMMARY["gpus"][0]


def test_the_json_round_trips_with_the_same_keys_in_the_same_order():
    s = TrainSummary.from_json(SUMMARY)
    assert s.fp8 == Fp8Summary("rowwise", 48, "0.14.1") and s.ddp == DdpSummary(
        "outer", 100.0, False, "none", ("wte.weight",)
    )
    assert (s.unit, s.rate_per_s, s.skipped_steps) == ("tokens", 400_000.5, (31,))
    assert s.gpus == (GpuClocks((1665, 1800, 1965), 1980, (600.0, 690.0, 700.0), 700.0, (52, 61, 63), 6, 0.9, 0.0), None)  # fmt: skip
    assert s.profile is not None and isinstance(s.profile.kernels, KernelTimes)
    assert (s.profile.comm_exposed_ms, s.profile.kernels.top_kernels_ms[0]) == (
        1.51,
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 5.381),
    )
    assert list(s.to_json()) == KEYS and s.to_json() == SUMMARY
    # the same text: key order inside the parts, and a clock in whole MHz still an integer
    assert json.dumps(s.to_json(), indent=2) == json.dumps(SUMMARY, indent=2)
    images = {k if k != "tokens_per_s" else "images_per_s": v for k, v in SUMMARY.items()}
    assert (
        TrainSummary.from_json(images).to_json() == images and TrainSummary.from_json(images).unit == "images"
    )


@pytest.mark.parametrize(
    "change, where",
    [
        ({"steps": "60"}, "summary.steps: expected an integer, got a string"),
        ({"fp8": {"recipe": "rowwise"}}, "summary.fp8.layers: missing"),
        ({"skipped_steps": "31"}, "summary.skipped_steps: expected a list, got a string"),
        ({"gpus": [GPU, 3]}, "summary.gpus[1]"),
        ({"gpus": [GPU | {"samples": "6"}]}, "summary.gpus[0].samples: expected an integer, got a string"),
        (
            {"gpus": [GPU | {"sm_clock_mhz": [1665, 1800]}]},
            "summary.gpus[0].sm_clock_mhz: expected a list of 3",
        ),
        (
            {"gpus": [GPU | {"power_w": [600.0, True, 700.0]}]},
            "summary.gpus[0].power_w[1]: expected a number",
        ),
        ({"profile": {"steps": 3}}, "summary.profile.step_ms: missing"),
        ({"profile": SUMMARY["profile"] | {"kernels": []}}, "summary.profile.kernels: expected an object"),
        ({"tokens_per_s": None, "final_loss": True}, "summary.final_loss: expected a number, got a boolean"),
    ],
)
def test_a_summary_that_does_not_fit_is_refused_by_the_key(change, where):
    with pytest.raises(RecordError, match="^" + where.replace("[", r"\[").replace("]", r"\]")):
        TrainSummary.from_json(SUMMARY | change)
    with pytest.raises(RecordError, match="no tokens_per_s or images_per_s"):
        TrainSummary.from_json({k: v for k, v in SUMMARY.items() if k != "tokens_per_s"})


def test_a_damaged_summary_file_is_one_line_input_error(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(SUMMARY | {"world_size": [2]}))
    with pytest.raises(InputError, match=r"summary.json.world_size: expected an integer, got a list") as e:
        read_summary(path)
    assert "\n" not in e.value.one_line() and e.value.exit_code == 2


def test_finish_builds_the_record_and_writes_what_it_returns(tmp_path):
    """summary.finish, the one place the summary is built: its record, summary.json and the end event agree
    and carry the keys the dict carried."""
    torch = pytest.importorskip("torch")
    from torchrig.train import summary
    from torchrig.train.job import Run
    from torchrig.train.setup import Runtime

    events: list[dict] = []
    metrics = types.SimpleNamespace(
        steady=lambda after, before_step=None: 1000.0,
        event=lambda **rec: events.append(rec),
        close=lambda: None,
    )
    cfg = dataclasses.replace(TrainConfig(steps=30), out=str(tmp_path))
    job = types.SimpleNamespace(
        cfg=cfg, rt=Runtime(0, 0, 1, torch.device("cpu"), "fp32", "none", 0), global_batch=8, params=1000,
        unit="tokens", flops_per_unit=6000.0, fp8_layers=[], weight_copies=0, fused_mlp_blocks=0, tuned_gemm_shapes=None, skipped=[], out=tmp_path,
        late=None, step_graph=None,
    )  # fmt: skip
    clocks = TrainSummary.from_json(SUMMARY).gpus[0]  # type: ignore[index]
    profile = ProfileSummary(steps=3, step_ms=10.0, device_events=0, trace="t.json.gz")
    run = Run(0, None, None, "no GPU", None, final_loss=4.5, elapsed_s=1.234, profile=profile, gpu=clocks)
    got = summary.finish(job, metrics, run)  # type: ignore[arg-type]
    written = json.loads((tmp_path / "summary.json").read_text())
    assert isinstance(got, TrainSummary) and got.to_json() == written
    assert events == [{"event": "end", **written}]
    assert list(written) == KEYS and (written["tokens_per_s"], written["elapsed_s"]) == (1000.0, 1.23)
    assert written["profile"] == {"steps": 3, "step_ms": 10.0, "device_events": 0, "trace": "t.json.gz"}
    assert written["gpus"] == [GPU] and (got.profile, got.gpus) == (profile, (clocks,))
    assert read_summary(tmp_path / "summary.json") == got


def test_a_profile_window_for_an_outside_profiler_reads_back_and_is_said():
    """``--profiler cuda``: the summary keeps what marked the window, and its line says where the kernels are."""
    data = json.loads(json.dumps(SUMMARY))
    data["profile"] = {"steps": 2, "step_ms": 31.2, "device_events": 0, "window": "cudaProfilerStart/Stop"}
    got = TrainSummary.from_json(data)
    assert got.profile is not None and got.profile.window == "cudaProfilerStart/Stop"
    assert got.to_json()["profile"] == data["profile"]
    assert any("marked by cudaProfilerStart/Stop for the outside profiler" in ln for ln in got.lines())
