"""Trainer pieces that need no process group: config, schedule, sampler order, metrics rewind, CLI errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from torchrig.errors import UsageError
from torchrig.train.config import TrainConfig, sizes


def test_sizes_have_sources_and_gpt2_small_is_124m_shape():
    s = sizes()
    assert s["gpt"]["small"]["layers"] == 12 and s["gpt"]["small"]["width"] == 768
    assert all(v.get("source") for model in s.values() for v in model.values())


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"size": "smal"}, "did you mean: small"),
        ({"model": "vit"}, "--model"),
        ({"micro_batch": 0}, "micro-batch"),
        ({"precision": "fp4"}, "precision"),
        ({"compile_mode": "fast"}, "choose from default, reduce-overhead"),
        (
            {"parallel": "fsdp", "compile_mode": "reduce-overhead"},
            "max-autotune-no-cudagraphs with --parallel fsdp",
        ),
        ({"seq_len": 5000}, "seq-len"),
        ({"gc_every": -1}, "--gc-every must be 0 or more"),
        ({"attention": "fa3"}, "choose from auto, cudnn, flash"),
        ({"step_graph": "yes"}, "choose from auto, on, off"),
        ({"step_graph": "on"}, "add --compile"),
        ({"step_graph": "on", "compile": True, "compile_mode": "reduce-overhead"}, "graphs do not nest"),
        ({"step_graph": "on", "compile": True, "precision": "fp16"}, "GradScaler"),
        ({"step_graph": "on", "compile": True, "on_nonfinite": "skip"}, "--on-nonfinite stop"),
        ({"step_graph": "on", "compile": True, "parallel": "ddp"}, "one process on one GPU"),
    ],
)
def test_config_errors(kw, msg):
    with pytest.raises(UsageError) as err:
        TrainConfig(**kw)
    assert msg in err.value.one_line()


def test_collector_runs_python_gc_only_at_its_steps_and_restores_it():
    import gc

    from torchrig.train.loop import Collector

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a

    def nodes():
        return sum(isinstance(o, Node) for o in gc.get_objects())

    assert gc.isenabled()
    c = Collector(3)
    try:
        assert not gc.isenabled()
        c.after_step(1, 1)  # the first step: collect, then freeze the survivors
        assert gc.get_freeze_count() > 0
        for _ in range(2000):  # far past gen 0's threshold: the automatic collector would have run
            cycle()
        c.after_step(2, 1)
        assert nodes() >= 4000  # not a collection step: the cycles are still there
        c.after_step(3, 1)
        assert nodes() == 0  # step 3 = every 3: collected
    finally:
        c.close()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    off = Collector(0)  # --gc-every 0: Python's automatic collector, untouched
    assert gc.isenabled()
    off.after_step(1, 1)
    assert gc.get_freeze_count() == 0
    off.close()
    assert gc.isenabled()


def test_to_argv_round_trips():
    cfg = TrainConfig(size="mini", compile=True, tensorboard=False, lr=1e-3, steps=7)
    assert cfg.to_argv() == [
        "--size",
        "mini",
        "--steps",
        "7",
        "--lr",
        "0.001",
        "--compile",
        "--no-tensorboard",
    ]


def test_lr_warmup_then_cosine_to_floor():
    from torchrig.train.loop import lr_at

    cfg = TrainConfig(lr=1.0, warmup_steps=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(5, cfg) == pytest.approx(0.5)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)
    assert lr_at(110, cfg) == pytest.approx(0.1)


def test_sampler_steps_see_the_same_samples_on_any_world_size():
    """Step s consumes global samples [s*G, (s+1)*G) of the epoch's permutation, whatever the rank count."""
    import torch

    from torchrig.train.data import ResumableSampler

    ds = list(range(100))
    G = 8

    def step_sets(world, start_step):
        per_rank = []
        for r in range(world):
            s = ResumableSampler(ds, world, r, seed=3, global_batch=G)
            s.set_position(0, start_step * G)
            per_rank.append(list(s))
        per_step = G // world
        steps = len(per_rank[0]) // per_step
        return [
            sorted(i for lst in per_rank for i in lst[k * per_step : (k + 1) * per_step])
            for k in range(steps)
        ]

    one, two, four = step_sets(1, 0), step_sets(2, 0), step_sets(4, 0)
    assert one == two == four and len(one) == 12  # 96 usable samples of 100
    assert step_sets(2, 5) == one[5:]  # resuming mid-epoch continues exactly
    assert sorted(i for st in one for i in st) == sorted(
        torch.randperm(100, generator=torch.Generator().manual_seed(3))[:96].tolist()
    )


def test_rewind_jsonl_drops_steps_after_the_checkpoint(tmp_path):
    from torchrig.train.metrics import rewind_jsonl

    p = tmp_path / "metrics.jsonl"
    recs = [{"event": "start", "step": 0}] + [{"step": i, "loss": 1.0} for i in range(1, 8)]
    p.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"step": 8, "lo')  # a line cut by a crash
    rewind_jsonl(p, 4)
    kept = [json.loads(x) for x in p.read_text().splitlines()]
    assert [r["step"] for r in kept] == [0, 1, 2, 3, 4]


def test_gpt_flops_formula_matches_the_baseline_count():
    from torchrig.train.models import build_model

    m = build_model("gpt", sizes()["gpt"]["small"], context=1024)
    n = sum(p.numel() for p in m.parameters()) - m.wpe.weight.numel()
    assert (
        round(n / 1e6, 1) == 123.7
    )  # what the baseline prints as params_M; tied embeddings counted once, positions excluded
    assert m.flops_per_token(1024) == 6 * n + 12 * 12 * 12 * 64 * 1024


@pytest.mark.parametrize(
    "args, msg",
    [
        (["train", "--size", "huge"], "unknown --size 'huge'"),
        (["train", "--data", "/nonexistent/tokens.bin"], "no such file"),
        (["train", "--micro-batch", "0"], "--micro-batch must be at least 1"),
        (["train", "--ddp-compile", "outside"], "unknown --ddp-compile 'outside'"),
        (["train", "--ddp-bucket-mb", "0"], "--ddp-bucket-mb must be positive"),
        (["train", "--ddp-comm-hook", "fp8"], "unknown --ddp-comm-hook 'fp8'"),
        (["train", "--device", "cpu", "--ddp-comm-hook", "bf16"], "bf16 needs GPUs"),
        (["train", "--compile-mode", "fast"], "unknown --compile-mode 'fast'"),
        (["train", "--loss", "fast"], "unknown --loss 'fast'"),
        (["train", "--loss", "$(id)\n'"], "unknown --loss"),
        (["train", "--steps", "5", "--profile-steps", "5"], "--profile-steps 5 leaves no unprofiled step"),
        (["train", "--profile-steps", "-1"], "--profile-steps must be 0 or more"),
        (["train", "--gc-every", "-1"], "--gc-every must be 0 or more"),
        (["train", "--gc-every", "often"], "--gc-every"),
        (["train", "--parallel", "fsdp", "--compile-mode", "reduce-overhead"], "need fixed addresses"),
        (["train", "--stopped-grace", "-1"], "--stopped-grace must be 0 or more"),
        (["launch", "--cpu", "--stopped-grace", "1e20", "t.py"], "--stopped-grace"),
        (["launch", "--gpus", "x", "--cpu", "t.py"], "exclude"),
        (["launch", "--nnodes", "2", "t.py"], "--rdzv-endpoint"),
        (["launch", "--cpu", "--env", "NOEQUALS", "t.py"], "malformed --env"),
        (["export", "/nonexistent/run"], "no checkpoint at"),
        (["export", "/nonexistent/run", "--tolerance", "0"], "--tolerance must be positive"),
    ],
)
def test_bad_input_is_one_line_exit_2(cli, args, msg):
    r = cli(*args)
    assert r.code == 2, r.err
    assert r.err.count("\n") == 1 and r.err.startswith("torchrig: error:") and msg in r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize(
    "args, msg",
    [
        (["train", "--gpus", "1", "--size", "tiny"], "no GPU is visible"),  # placed like launch
        (["train", "--gpus", "2", "--size", "tiny"], "no GPU is visible"),
        (["launch", "--gpus", "2", "t.py"], "no GPU is visible"),
    ],
)
def test_asking_for_gpus_without_any_is_one_line_exit_2(cli, args, msg):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    r = cli(*args)
    assert r.code == 2 and r.err.count("\n") == 1 and msg in r.err, r.err


def test_train_and_launch_take_the_same_failure_options():
    """train starts its ranks through launch: every option that decides restarts and hang verdicts is there
    too, with launch's default, bounds and wording (train once lacked --stopped-grace its docs listed)."""
    from torchrig.cli import build_parser

    def failures(name: str) -> dict[str, tuple]:
        parser, _ = build_parser(name)
        keep = (
            "max_restarts",
            "collective_timeout_s",
            "hang_timeout_s",
            "nccl_timeout_grace_s",
            "stopped_grace_s",
        )
        return {a.dest: (a.option_strings, a.default, a.help) for a in parser._actions if a.dest in keep}

    assert failures("train") == failures("launch") and len(failures("train")) == 5


def test_launch_dry_run_json_is_light_and_complete(cli):
    r = cli(
        "launch",
        "--cpu",
        "--nproc-per-node",
        "2",
        "--dry-run",
        "--json",
        "-m",
        "torchrig.train",
        "--steps",
        "3",
    )
    assert r.code == 0, r.err
    plan = r.json()["plan"]
    assert plan["world_size"] == 2 and plan["backend"] == "gloo"
    assert plan["argv"][-4:] == ["--module", "torchrig.train", "--steps", "3"]
    assert {e["name"] for e in plan["env_settings"]} >= {"PYTHONUNBUFFERED", "TORCHRIG_COLLECTIVE_TIMEOUT_S"}
    assert [r["device"] for r in plan["ranks"]] == ["cpu", "cpu"]


def test_ddp_knobs_reach_ddp_and_outer_compiles_the_ddp_module(tmp_path):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torchrig.train.config import TrainConfig
    from torchrig.train.setup import Runtime, wrap

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        rt = Runtime(0, 0, 1, torch.device("cpu"), "fp32", "ddp", 0)
        knobs = dict(device="cpu", ddp_bucket_mb=2.0, ddp_static_graph=True)
        inner = wrap(nn.Linear(4, 4), rt, TrainConfig(**knobs))
        assert isinstance(inner, DDP) and inner.bucket_bytes_cap == 2 * 1024 * 1024 and inner.static_graph
        outer = wrap(nn.Linear(4, 4), rt, TrainConfig(compile=True, ddp_compile="outer", **knobs))
        assert isinstance(outer._orig_mod, DDP)  # compile(DDP(model)): dynamo sees DDP's buckets
        assert outer.no_sync is not None  # gradient accumulation still reaches DDP's no_sync
        default = wrap(nn.Linear(4, 4), rt, TrainConfig(device="cpu"))
        assert default.bucket_bytes_cap == 100 * 1024 * 1024  # torchrig's default, not PyTorch's 25 MB
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "device, parallel, mode, resolved, graphs",
    [
        ("cuda", "none", "auto", "reduce-overhead", True),
        ("cuda", "ddp", "auto", "reduce-overhead", True),
        ("cuda", "fsdp", "auto", "default", False),  # FSDP2 regathers parameters: no fixed addresses
        ("cpu", "none", "auto", "default", False),  # no CUDA graphs on the CPU
        ("cuda", "none", "default", "default", False),
        ("cuda", "none", "max-autotune", "max-autotune", True),
        ("cpu", "none", "reduce-overhead", "reduce-overhead", False),
    ],
)
def test_compile_mode_auto_uses_cuda_graphs_only_where_shapes_are_static(
    device, parallel, mode, resolved, graphs
):
    import torch

    from torchrig.train.setup import Runtime, compile_mode, uses_cudagraphs

    rt = Runtime(0, 0, 1, torch.device(device), "bf16", parallel, 0)
    cfg = TrainConfig(compile=True, compile_mode=mode)
    assert compile_mode(cfg, rt) == resolved
    assert uses_cudagraphs(cfg, rt) is graphs
    assert uses_cudagraphs(TrainConfig(compile=False, compile_mode=mode), rt) is False


def test_compile_mode_defaults_to_auto_and_attention_to_pytorchs_choice():
    cfg = TrainConfig()
    assert (cfg.compile_mode, cfg.attention, cfg.compile_tuning) == ("auto", "auto", False)


SUMMARY = Path(__file__).parents[1] / "fixtures/train/summary-gpt-ddp-fp8-2gpus.json"


@pytest.mark.parametrize(
    "content", [None, b"", b"{", b"\xff\xfe", b"[1, 2]", b'"text"', b'{"steps": 3}', b"ok"]
)
def test_a_missing_or_damaged_summary_json_is_no_summary_not_a_crash(tmp_path, content):
    from torchrig.train.record import TrainSummary
    from torchrig.train.run import read_summary

    path = tmp_path / "summary.json"
    if content is not None:
        path.write_bytes(SUMMARY.read_bytes() if content == b"ok" else content)
    want = TrainSummary.from_json(json.loads(SUMMARY.read_text())) if content == b"ok" else None
    assert read_summary(path) == want
    assert read_summary(tmp_path) is None  # a folder where the file should be


def test_other_model_names_what_differs_in_the_weights_shapes_only():
    from torchrig.train.resume import other_model

    saved = {
        "model": "gpt",
        "size_info": {"layers": 2, "heads": 2, "width": 64, "vocab": 512, "source": "a", "verified": None},
        "context": 64,
        "vocab": 512,
        "num_classes": 10,
        "image_size": 32,
    }
    meta = {"model_spec": saved, "config": {"size": "tiny"}}
    same = {**saved, "size_info": {**saved["size_info"], "source": "b", "verified": "2026-11-30"}}
    assert other_model(meta, {**same, "num_classes": 3, "image_size": 64}) is None  # not a GPT's shapes
    assert other_model(meta, {**same, "context": 32}) == (
        "context 64 (saved) vs 32; it was saved with --size tiny"
    )
    wider = {**same, "size_info": {**same["size_info"], "width": 128}}
    assert other_model(meta, wider) == "width 64 (saved) vs 128; it was saved with --size tiny"
    assert other_model({}, same) is None and other_model({"model_spec": "x"}, same) is None
    resnet = {"model": "resnet", "size_info": {"blocks": [2, 2], "width": 64}, "context": 0, "vocab": None}
    assert (
        other_model({"model_spec": resnet}, {**resnet, "num_classes": 10}) == "num_classes None (saved) vs 10"
    )
    hostile = {**saved, "model": "gpt\n$(id)\x1b[2J", "size_info": {"width": ["\n"] * 1000}}
    said = other_model({"model_spec": hostile, "config": {"size": "a\nb"}}, same)
    assert said and "\n" not in said and "\x1b" not in said and len(said) < 400


@pytest.mark.parametrize(
    "device, world, parallel, precision, kw, why",
    [
        ("cuda", 1, "none", "bf16", {}, None),
        ("cuda", 1, "none", "fp8", {}, None),
        ("cuda", 1, "none", "bf16", {"compile_mode": "max-autotune-no-cudagraphs"}, None),
        ("cpu", 1, "none", "fp32", {}, "CUDA graphs need a GPU"),
        ("cuda", 2, "ddp", "bf16", {}, "2 processes (ddp)"),
        ("cuda", 1, "none", "fp16", {"precision": "fp16"}, "GradScaler"),
        ("cuda", 1, "none", "bf16", {"on_nonfinite": "skip"}, "--on-nonfinite skip"),
        ("cuda", 1, "none", "bf16", {"compile_mode": "reduce-overhead"}, "captures the model's own graphs"),
        ("cuda", 1, "none", "bf16", {"compile": False}, "not compiled"),
    ],
)
def test_the_step_graph_is_refused_where_the_step_decides_on_the_host(
    device, world, parallel, precision, kw, why
):
    import torch

    from torchrig.train.setup import Runtime, compile_mode, step_graph, step_graph_refusal

    rt = Runtime(0, 0, world, torch.device(device), precision, parallel, 0)
    cfg = TrainConfig(**{"compile": True, **kw})
    got = step_graph_refusal(cfg, rt)
    assert got is None if why is None else why in got
    if why is None:
        asked = dataclasses.replace(cfg, step_graph="on")
        assert step_graph(asked, rt) is True
        assert compile_mode(asked, rt) == {"auto": "default"}.get(
            cfg.compile_mode, cfg.compile_mode
        )  # no Inductor graphs
    else:  # asked for where it cannot run: the config's rules or the runtime's refusal, a usage error
        with pytest.raises(UsageError, match="--step-graph on") as err:
            step_graph(dataclasses.replace(cfg, step_graph="on"), rt)
        assert err.value.exit_code == 2
    assert step_graph(dataclasses.replace(cfg, step_graph="off"), rt) is False
