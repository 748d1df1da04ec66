"""The embeddings' gradient all-reduced outside DDP: DDP leaves them out, and the optimizer step in two parts
(the other parameters while the all-reduce runs, then the embeddings) is the same update as one step."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torchrig.train.config import TrainConfig, sizes
from torchrig.train.lategrads import LateGrads, late_params
from torchrig.train.models import build_model
from torchrig.train.setup import Runtime, optimizer, outside_ddp, wrap

CPU = Runtime(0, 0, 1, torch.device("cpu"), "fp32", "ddp", 0)


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("gpt", sizes()["gpt"]["tiny"], context=32, vocab=None, num_classes=0)


def backward(model: torch.nn.Module) -> None:
    torch.manual_seed(1)
    idx = torch.randint(0, 512, (2, 32))
    model(idx, idx.roll(1, dims=1)).backward()


def test_gpt_names_its_embeddings_and_resnet_has_none():
    m = gpt()
    assert [id(p) for p in late_params(m)] == [id(m.wte.weight), id(m.wpe.weight)]
    assert m.head.weight is m.wte.weight  # tied: the output projection's gradient lands in wte too
    resnet = build_model("resnet", sizes()["resnet"]["resnet18"], context=0, vocab=None, num_classes=10)
    assert late_params(resnet) == []


@pytest.mark.parametrize("others_zeroed_in_place", [False, True])
def test_the_two_part_step_is_one_optimizer_step(group, others_zeroed_in_place):
    """Bit for bit: the parameters, AdamW's state (step counts included) and the gradients left behind.
    ``others_zeroed_in_place``: CUDA graphs with accumulation keep every .grad allocated (zeroed, never
    None); the second part must still not step the other parameters again."""
    cfg = TrainConfig(device="cpu", weight_decay=0.1)
    a = gpt()
    b = copy.deepcopy(a)
    opt_a, opt_b = optimizer(a, cfg, CPU), optimizer(b, cfg, CPU)
    for _ in range(3):
        backward(a)
        backward(b)
        opt_a.step()
        late = LateGrads.for_backend(late_params(b))
        grads = [p.grad for p in b.parameters()]
        late.start()
        assert late.pending  # the all-reduces are in flight
        late.step(opt_b)
        assert not late.pending
        assert [p.grad for p in b.parameters()] == grads  # every .grad is back where it was
        if others_zeroed_in_place:
            opt_a.zero_grad(set_to_none=False)
            opt_b.zero_grad(set_to_none=False)
        else:
            opt_a.zero_grad()
            opt_b.zero_grad()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        sa, sb = opt_a.state[pa], opt_b.state[pb]
        assert float(sa["step"]) == float(sb["step"]) == 3, name
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])


def test_ddp_leaves_the_embeddings_out_and_the_option_turns_it_off(group):
    m = gpt()
    two = Runtime(0, 0, 2, torch.device("cpu"), "fp32", "ddp", 0)  # only the world size matters here
    late = outside_ddp(m, two, TrainConfig(device="cpu"))
    assert [id(p) for p in late] == [id(m.wte.weight), id(m.wpe.weight)]
    ddp = wrap(m, CPU, TrainConfig(device="cpu"), late)
    assert isinstance(ddp, DDP)
    assert ddp.parameters_to_ignore == {"wte.weight", "wpe.weight"}
    assert all(getattr(p, "_ddp_ignored", False) for p in late)  # dynamo's DDP optimizer reads this mark
    assert outside_ddp(gpt(), two, TrainConfig(device="cpu", ddp_overlap_embeddings=False)) == []
    assert outside_ddp(gpt(), CPU, TrainConfig(device="cpu")) == []  # one rank: no DDP work to move
    fsdp = Runtime(0, 0, 2, torch.device("cpu"), "fp32", "fsdp", 0)
    assert outside_ddp(gpt(), fsdp, TrainConfig(device="cpu")) == []
