"""TORCHRIG_TUNED_GEMMS (train/ltgemm.py) on a real GPU: cuBLASLt's plain and bias GEMM by every algorithm of
its heuristic against PyTorch's result, in each layout a training step uses; the timing at start choosing
only algorithms that agree; and a compiled training run with the lever against one without. Skipped without
CUDA."""

from __future__ import annotations

import pytest
from tests.gpu.test_train_fusedmlp_gpu import train_run

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("layout", ["fwd", "dgrad", "wgrad"])
def test_every_algorithm_computes_pytorchs_gemm(layout):
    from torchrig.train import cublaslt

    g = torch.Generator(device="cuda").manual_seed(0)
    t, i, o = 2048, 768, 2304
    x = torch.randn(t, i, device="cuda", generator=g).bfloat16()
    w = (0.02 * torch.randn(o, i, device="cuda", generator=g)).bfloat16()
    dy = (0.01 * torch.randn(t, o, device="cuda", generator=g)).bfloat16()
    b = (0.1 * torch.randn(o, device="cuda", generator=g)).bfloat16()
    a, c, bias = {"fwd": (x, w.t(), b), "dgrad": (dy, w, None), "wgrad": (dy.t(), x, None)}[layout]
    ref = torch.addmm(bias, a, c) if bias is not None else a @ c
    n = cublaslt.algorithm_count(a, c, bias is not None)
    assert n >= 1
    for algo in range(n):
        assert _rel(cublaslt.matmul(a, c, bias, algo=algo), ref) < 0.02, algo


def test_the_timing_at_start_keeps_only_faster_algorithms_that_agree():
    from torchrig.train import ltgemm

    ltgemm.enable()
    try:
        layer = torch.nn.Linear(768, 3072, device="cuda")
        x = torch.randn(16, 1024, 768, device="cuda", requires_grad=True)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = ltgemm.linear(x, layer)
            y.float().square().mean().backward()

        tuned = ltgemm.tune_model(step)
        assert len(tuned.shapes) == 3  # the forward, the input and the weight gradient
        for s in tuned.shapes:
            assert s["torch_ms"] > 0
            if s["algo"] is not None:
                assert s["ms"] <= s["torch_ms"] * (1 - ltgemm.MIN_GAIN)
        assert tuned.saving_ms() >= 0
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = ltgemm.linear(x, layer)
            ref = layer(x)
        assert _rel(got, ref) < 0.02
    finally:
        ltgemm.disable()


def test_a_run_with_tuned_gemms_trains_as_one_without(tmp_path):
    s_plain, plain, _ = train_run(tmp_path, "plain", {"TORCHRIG_TUNED_GEMMS": "0"})
    s_tuned, tuned, err = train_run(tmp_path, "tuned", {"TORCHRIG_TUNED_GEMMS": "1"})
    assert s_plain["tuned_gemm_shapes"] is None and isinstance(s_tuned["tuned_gemm_shapes"], int)
    assert "TORCHRIG_TUNED_GEMMS=1:" in err and "GEMM shapes run a faster cuBLASLt algorithm" in err, err[
        -2000:
    ]
    assert sorted(tuned) == sorted(plain) and len(plain) >= 5
    for step, loss in plain.items():
        assert abs(loss - tuned[step]) < 0.02 * abs(loss), (plain, tuned)
