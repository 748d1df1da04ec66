"""Training scaling: a reference model's throughput on 1, 2, 4 ... N GPUs and the scaling efficiency.

The reference model is self-contained (a GPT-style decoder: pre-norm blocks, causal SDPA attention, GELU MLP,
tied embeddings) so that the figure does not depend on anything else in the package. On a GPU it is the
GPT-2-small shape (12 layers, 768 wide, 12 heads, sequence 1024, 124M parameters) in bf16 autocast with
fused AdamW and DDP; on the CPU path a tiny one. Each group size ``k`` trains on ranks ``0..k-1`` of the
workers through its own process group while the other ranks wait, so one torchrun launch covers every ``k``.
Efficiency is ``tokens/s at k / (k x tokens/s at 1)``. ``torch`` and ``dist`` are passed in.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from torchrig.bench.records import ScalingResult


@dataclasses.dataclass(frozen=True)
class ModelShape:
    layers: int
    width: int
    heads: int
    seq_len: int
    vocab: int
    micro_batch: int

    def describe(self) -> str:
        return (
            f"GPT-style decoder, {self.layers} layers x {self.width} wide, {self.heads} heads, "
            f"seq {self.seq_len}, vocab {self.vocab}, micro-batch {self.micro_batch} per GPU"
        )


GPU_SHAPE = ModelShape(layers=12, width=768, heads=12, seq_len=1024, vocab=50304, micro_batch=16)
CPU_SHAPE = ModelShape(layers=2, width=64, heads=4, seq_len=64, vocab=256, micro_batch=4)


def group_sizes(world: int) -> list[int]:
    """1, 2, 4, ... up to ``world``, always ending with ``world``."""
    sizes, k = [], 1
    while k < world:
        sizes.append(k)
        k *= 2
    sizes.append(world)
    return sizes


def build_model(torch: Any, shape: ModelShape) -> Any:
    nn, F = torch.nn, torch.nn.functional
    Module: Any = nn.Module

    class Block(Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(shape.width), nn.LayerNorm(shape.width)
            self.qkv = nn.Linear(shape.width, 3 * shape.width)
            self.proj = nn.Linear(shape.width, shape.width)
            self.fc, self.out = (
                nn.Linear(shape.width, 4 * shape.width),
                nn.Linear(4 * shape.width, shape.width),
            )

        def forward(self, x: Any) -> Any:
            b, s, w = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, shape.heads, w // shape.heads).unbind(2)
            a = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, w))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class Decoder(Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(shape.vocab, shape.width)
            self.pos = nn.Embedding(shape.seq_len, shape.width)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.ln = nn.LayerNorm(shape.width)

        def forward(self, idx: Any) -> Any:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.ln(x) @ self.tok.weight.t()

    return Decoder()


def _throughput(
    torch: Any, dist: Any, device: Any, shape: ModelShape, group: Any, k: int, steps: int, warmup: int
) -> tuple[float, float]:
    """(tokens/s over the group, ms per step) for DDP on ``k`` ranks (plain training when k == 1)."""
    torch.manual_seed(0)
    model = build_model(torch, shape).to(device)
    cuda = device.type == "cuda"
    if k > 1:
        ids = [device.index] if cuda else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if cuda else {}))
    gen = torch.Generator(device=device).manual_seed(dist.get_rank())
    data = torch.randint(0, shape.vocab, (shape.micro_batch, shape.seq_len + 1), device=device, generator=gen)
    x, y = data[:, :-1], data[:, 1:]

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, shape.vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    return k * shape.micro_batch * shape.seq_len * steps / elapsed, elapsed / steps * 1e3


def measure_scaling(
    torch: Any, dist: Any, device: Any, steps: int, warmup: int, progress: Callable[[str], None]
) -> tuple[list[ScalingResult], str]:
    """Throughput for each group size; rows on rank 0 (every rank returns them)."""
    shape = GPU_SHAPE if device.type == "cuda" else CPU_SHAPE
    rank, world = dist.get_rank(), dist.get_world_size()
    rows: list[ScalingResult] = []
    base: float | None = None
    for k in group_sizes(world):
        group = dist.new_group(list(range(k))) if k > 1 else None
        progress(f"scaling on {k} GPU{'s' if k > 1 else ''}")
        result = _throughput(torch, dist, device, shape, group, k, steps, warmup) if rank < k else None
        got: list[Any] = [None] * world
        dist.all_gather_object(got, result)
        tokens_per_s, step_ms = got[0]
        base = tokens_per_s if k == 1 else base
        eff = tokens_per_s / (k * base) if base else None
        rows.append(ScalingResult(gpus=k, tokens_per_s=tokens_per_s, step_ms=step_ms, efficiency=eff))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, shape.describe()
