"""bf16 weight copies kept by the optimizer step (TORCHRIG_BF16_WEIGHTS=1) train the same model to the same
losses and parameters as autocast's per-use casts; the copies follow every step and every load; the tied head
keeps its own cast. And TORCHRIG_INDUCTOR_CONFIG sets Inductor entries or refuses unknown ones."""

from __future__ import annotations

import copy

import pytest
import torch

from torchrig.errors import UsageError
from torchrig.train.config import TrainConfig, sizes
from torchrig.train.models import build_model
from torchrig.train.optim import CopiedLinear, keep_bf16_copies
from torchrig.train.setup import Runtime, bf16_weight_copies, inductor_settings, optimizer


def gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("gpt", sizes()["gpt"]["tiny"], context=32, vocab=None, num_classes=0)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 4) -> list[float]:
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 512, (2, 32), generator=g)
        y = torch.randint(0, 512, (2, 32), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), foreach=True)


def test_copies_train_like_autocast_casts() -> None:
    plain, copied = gpt(), gpt()
    opt_plain, opt_copied = adamw(plain), adamw(copied)
    holder = keep_bf16_copies(copied, opt_copied)
    assert holder.layers == 2 * 4  # tiny: 2 blocks x (qkv, proj, fc, out); not the tied head
    assert type(copied.head) is torch.nn.Linear
    assert train(plain, opt_plain) == train(copied, opt_copied)
    for p, q in zip(plain.parameters(), copied.parameters(), strict=True):
        assert torch.equal(p, q) and q.dtype == torch.float32
    for c, m in zip(holder.copies, holder.masters, strict=True):
        assert c.dtype == torch.bfloat16 and torch.equal(c, m.detach().to(torch.bfloat16))
    assert list(plain.state_dict()) == list(copied.state_dict())  # the buffers are not saved


def test_copies_follow_a_loaded_state_dict() -> None:
    model = gpt()
    holder = keep_bf16_copies(model, adamw(model))
    other = gpt()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    model.load_state_dict(copy.deepcopy(other.state_dict()))
    for c, m in zip(holder.copies, holder.masters, strict=True):
        assert torch.equal(c, m.detach().to(torch.bfloat16))


def test_without_autocast_the_layer_is_a_plain_linear() -> None:
    model = gpt()
    keep_bf16_copies(model, adamw(model))
    layer = model.blocks[0].fc
    assert isinstance(layer, CopiedLinear)
    x = torch.randn(3, layer.in_features)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize(
    ("env", "precision", "parallel", "layers"),
    [("1", "bf16", "none", 8), ("0", "bf16", "none", 0), ("1", "fp32", "none", 0), ("1", "bf16", "ddp", 0)],
)
def test_switch(monkeypatch, env, precision, parallel, layers) -> None:
    monkeypatch.setenv("TORCHRIG_BF16_WEIGHTS", env)
    rt = Runtime(0, 0, 1, torch.device("cpu"), precision, parallel, 0)
    cfg = TrainConfig()
    model = gpt()
    assert bf16_weight_copies(model, optimizer(model, cfg, rt), rt, cfg) == layers


def test_inductor_settings(monkeypatch) -> None:
    import torch._inductor.config as c

    monkeypatch.setattr(c, "combo_kernels", False)
    monkeypatch.setattr(c, "max_autotune_gemm_backends", "ATEN,TRITON")
    got = inductor_settings("combo_kernels=1, max_autotune_gemm_backends=TRITON")
    assert got == {"combo_kernels": True, "max_autotune_gemm_backends": "TRITON"}
    assert c.combo_kernels is True and c.max_autotune_gemm_backends == "TRITON"
    for bad in ("no_such_entry=1", "combo_kernels", "triton.no_such=1"):
        with pytest.raises(UsageError, match="TORCHRIG_INDUCTOR_CONFIG"):
            inductor_settings(bad)


def test_mix_order_reduction_is_turned_off_on_hopper_only_unless_the_user_chose(monkeypatch) -> None:
    import torch._inductor.config as c

    from torchrig.train import setup

    monkeypatch.delenv("TORCHINDUCTOR_MIX_ORDER_REDUCTION", raising=False)
    monkeypatch.setattr(c.triton, "mix_order_reduction", True)
    cuda = torch.device("cuda", 0)
    capability = {"cc": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability["cc"])
    assert setup.mix_order_reduction_off(cuda)
    assert not setup.mix_order_reduction_off(torch.device("cpu"))
    capability["cc"] = (8, 0)  # A100: not measured, Inductor's default stays
    assert not setup.mix_order_reduction_off(cuda)
    capability["cc"] = (9, 0)
    monkeypatch.setenv("TORCHINDUCTOR_MIX_ORDER_REDUCTION", "1")  # the user's word wins
    assert not setup.mix_order_reduction_off(cuda)
    monkeypatch.delenv("TORCHINDUCTOR_MIX_ORDER_REDUCTION")

    setup._compile_settings(TrainConfig(compile=False), cuda)  # no compile: nothing is touched
    assert c.triton.mix_order_reduction is True
    setup._compile_settings(TrainConfig(compile=True), cuda)
    assert c.triton.mix_order_reduction is False
    c.triton.mix_order_reduction = True
    monkeypatch.setenv("TORCHRIG_INDUCTOR_CONFIG", "triton.mix_order_reduction=1")  # applied last
    setup._compile_settings(TrainConfig(compile=True), cuda)
    assert c.triton.mix_order_reduction is True
