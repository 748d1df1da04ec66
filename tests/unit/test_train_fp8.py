"""``--precision fp8`` without a GPU: where it is refused (CPU, a GPU below compute capability 8.9, torchao
missing) and what torchao's conversion keeps (parameter names and values, the tied output projection, the
checkpoints a bf16 resume and export load). torchao's Float8Linear converts and runs on CPU modules (torch's
CPU ``_scaled_mm``); the tests that need torchao skip without it."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from torchrig.errors import UsageError
from torchrig.train import fp8
from torchrig.train.config import TrainConfig

FIXTURES = Path(__file__).parents[1] / "fixtures"

# ---------------------------------------------------------------- where fp8 is refused


@pytest.mark.parametrize(
    "device, capability, torchao, msg",
    [
        ("cpu", None, "0.18.0", "needs a CUDA GPU"),
        ("cuda", (8, 0), "0.18.0", "this GPU is 8.0"),  # A100: no fp8 tensor cores
        ("cuda", (8, 6), "0.18.0", "this GPU is 8.6"),
        ("cuda", (8, 9), None, "torchao is not installed"),
        ("cuda", (7, 5), None, "this GPU is 7.5"),  # the GPU is named before the missing package
    ],
)
def test_fp8_is_refused_with_what_to_do(device, capability, torchao, msg):
    err = fp8.problem(device, capability, torchao)
    assert err is not None and msg in err.one_line()
    assert err.exit_code == 2 and "\n" not in err.one_line()
    if "torchao" in msg:
        assert f"pip install torchao=={fp8.TORCHAO_VERSION}" in err.one_line()
    else:
        assert "--precision bf16" in err.one_line()


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0), (12, 0)])
def test_fp8_runs_on_ada_hopper_blackwell_with_torchao(capability):
    assert fp8.problem("cuda", capability, "0.18.0") is None


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"precision": "fp8", "device": "cpu"}, "--precision fp8 needs a CUDA GPU"),
        ({"fp8_recipe": "tensorwise"}, "--fp8-recipe tensorwise applies only with --precision fp8"),
        ({"precision": "fp8", "fp8_recipe": "delayed"}, "unknown --fp8-recipe 'delayed'"),
        ({"precision": "fp4"}, "unknown --precision 'fp4'"),
        ({"precision": "fp8", "model": "resnet"}, "--model resnet has none to convert"),
    ],
)
def test_fp8_config_errors(kw, msg):
    with pytest.raises(UsageError) as err:
        TrainConfig(**kw)
    assert msg in err.value.one_line()


def test_fp8_config_round_trips_to_the_ranks_argv():
    cfg = TrainConfig(precision="fp8", fp8_recipe="tensorwise")
    assert cfg.to_argv() == ["--precision", "fp8", "--fp8-recipe", "tensorwise"]


def test_fp8_on_the_cpu_is_one_line_exit_2(cli, tmp_path):
    r = cli("train", "--device", "cpu", "--precision", "fp8", "--out", str(tmp_path / "run"))
    assert r.code == 2 and r.err.count("\n") == 1 and "needs a CUDA GPU" in r.err, r.err
    assert "Traceback" not in r.err


def test_fp8_on_a_machine_without_gpu_is_one_line_exit_2(cli_in_process, tmp_path):
    """--device auto on a CPU-only machine: the rank refuses before training (torchao present or not). In this
    process (torch is imported here already; a new interpreter would import it again for one line)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    r = cli_in_process("train", "--precision", "fp8", "--steps", "2", "--out", str(tmp_path / "run"))
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "needs a CUDA GPU" in r.err or "torchao is not installed" in r.err


def test_fp8_without_torchao_names_the_install_command(tmp_path):
    """torchao hidden (an import of it fails, as when it is not installed): refused before any rank starts."""
    code = (
        "import sys; sys.modules['torchao'] = None\n"  # blocks 'import torchao'; find_spec returns None
        "from torchrig.cli import main\n"
        f"sys.exit(main(['train', '--precision', 'fp8', '--steps', '2', '--out', {str(tmp_path / 'run')!r}]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "torchao is not installed" in r.stderr, r.stderr
    assert f"pip install torchao=={fp8.TORCHAO_VERSION}" in r.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- what the conversion keeps


def _gpt() -> object:
    torch = pytest.importorskip("torch")
    from torchrig.train.config import sizes
    from torchrig.train.models import build_model

    torch.manual_seed(0)
    return build_model("gpt", sizes()["gpt"]["tiny"], context=64)


def test_conversion_swaps_the_block_linears_and_keeps_the_parameters():
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    model = _gpt()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {n: id(p) for n, p in model.named_parameters()}
    names = fp8.convert(model, "rowwise", compiled=False)
    assert names == [f"blocks.{i}.{n}" for i in range(2) for n in ("qkv", "proj", "fc", "out")]
    assert all(isinstance(model.get_submodule(n), Float8Linear) for n in names)
    # the tied output projection stays a plain Linear sharing the embedding's weight
    assert type(model.head).__name__ == "Linear" and model.head.weight is model.wte.weight
    after = model.state_dict()
    assert list(after) == list(before)  # same names, same order: checkpoints and the optimizer see no change
    assert all(after[k].dtype == v.dtype and after[k].equal(v) for k, v in before.items())
    assert {n: id(p) for n, p in model.named_parameters()} == params  # the same Parameter objects


def test_only_linears_with_widths_divisible_by_16_are_converted():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 10), torch.nn.Linear(24, 32))
    assert fp8.convert(m, "tensorwise", compiled=False) == ["0"]
    assert [type(x).__name__ for x in m] == ["Float8Linear", "Linear", "Linear"]


def test_an_fp8_checkpoint_resumes_in_bf16_and_exports(tmp_path):
    """An fp8 run's checkpoint (real fp8 steps on CPU) loads into the plain model and optimizer, as a
    --precision bf16 resume does, and into a plain model alone, as export does."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from torchrig.train import checkpoint as ckpt

    model = _gpt()
    fp8.convert(model, "tensorwise", compiled=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 512, (2, 64))
    for _ in range(2):
        model(x, x).backward()  # fp32 on CPU: Float8Linear still casts to e4m3 and runs _scaled_mm
        opt.step()
        opt.zero_grad()
    final = ckpt.save(tmp_path / "checkpoints", 2, model, opt, {"global_batch": 2}, keep=2, run_id="run-a")

    plain = _gpt()
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    ckpt.load(final, plain, plain_opt)
    for (n, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert p.equal(q), n
    assert plain_opt.state_dict()["state"][0]["step"].item() == 2

    exported = _gpt()
    ckpt.load_model_only(final, exported)
    assert all(p.equal(q) for p, q in zip(model.parameters(), exported.parameters(), strict=True))


def test_the_summary_line_names_the_recipe_and_the_converted_layers():
    from torchrig.train.record import TrainSummary
    from torchrig.train.run import TrainResult

    s = json.loads((FIXTURES / "train/summary-gpt-ddp-fp8-2gpus.json").read_text())
    s |= {
        "world_size": 1,
        "parallel": "none",
        "ddp": None,
        "skipped_steps": [],
        "profile": None,
        "gpus": None,
    }
    line = TrainResult(TrainSummary.from_json(s), None).render_text()
    assert "(none, fp8 rowwise: 48 Linear layers, compiled): final loss 5.2500" in line


def test_the_trainer_builds_fp8_layers_under_bf16_autocast_and_steps(tmp_path):
    """The loop's own pieces with an fp8 runtime (init refuses the CPU; the rest runs on it): _build converts
    before wrapping and autocasts to bf16, a step trains, the optimizer holds the same fp32 parameters."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from torchrig.train import loop
    from torchrig.train.metrics import Metrics
    from torchrig.train.setup import Runtime

    cfg = TrainConfig(precision="fp8", fp8_recipe="tensorwise", steps=3, micro_batch=2, workers=0)
    cfg = dataclasses.replace(cfg, out=str(tmp_path / "run"), lr=1e-2, warmup_steps=0)
    rt = Runtime(0, 0, 1, torch.device("cpu"), "fp8", "none", 0)
    job = loop._build(cfg, rt)
    assert job.fp8_layers == [f"blocks.{i}.{n}" for i in range(2) for n in ("qkv", "proj", "fc", "out")]
    assert type(job.run_model.blocks[0].fc).__name__ == "Float8Linear" and job.run_model is job.model
    with job.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    opt_params = [p for g in job.opt.param_groups for p in g["params"]]
    assert {id(p) for p in opt_params} == {id(p) for p in job.model.parameters()}
    assert all(p.dtype == torch.float32 for p in opt_params)
    it = iter([(x, x.roll(1, dims=1)) for x in [torch.randint(0, 512, (2, 64))] * 3])  # one batch, memorised
    loss_sum = torch.zeros(())
    losses = []
    metrics = Metrics(tmp_path / "run", 3, enabled=False, tensorboard=False)
    for step in (1, 2, 3):
        loop._step(job, metrics, step, it, loss_sum)
        losses.append(float(loss_sum))
        loss_sum.zero_()
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses


def test_other_precisions_convert_nothing():
    torch = pytest.importorskip("torch")
    from torchrig.train.setup import Runtime, low_precision

    model = _gpt()
    rt = Runtime(0, 0, 1, torch.device("cpu"), "bf16", "none", 0)
    assert low_precision(model, rt, TrainConfig()) == []
    assert type(model.blocks[0].qkv).__name__ == "Linear"
