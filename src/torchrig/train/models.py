"""The trainer's models: a GPT-2-style language model and a ResNet image classifier.

GPT: pre-norm blocks, one fused qkv projection, causal ``scaled_dot_product_attention`` (flash/cuDNN
kernels on GPUs), tanh-GELU MLP, tied input/output embeddings, GPT-2 initialisation. ``forward(idx)``
returns logits; ``forward(idx, targets)`` the mean cross-entropy (computed in fp32). With ``fused_loss`` set
the output projection and the cross-entropy run as one step that never keeps the logits (train/fusedloss.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    layers: int
    heads: int
    width: int
    block_size: int
    vocab: int

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not a multiple of heads {self.heads}")


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads, self.width = c.heads, c.width
        self.ln1, self.ln2 = nn.LayerNorm(c.width), nn.LayerNorm(c.width)
        self.qkv, self.proj = nn.Linear(c.width, 3 * c.width), nn.Linear(c.width, c.width)
        self.fc, self.out = nn.Linear(c.width, 4 * c.width), nn.Linear(4 * c.width, c.width)
        # the trainer sets it: the GELU in cuBLASLt's GEMM epilogues, with this backward (train/fusedmlp.py's
        # BACKWARDS); "" for the plain MLP
        self.fused_mlp = ""
        # the trainer sets it with TORCHRIG_TUNED_GEMMS=1: the Linear layers through train/ltgemm.py's timed GEMMs
        self.tuned_gemms = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self._linear(self.qkv, self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self._linear(self.proj, y)
        if self.fused_mlp:
            from torchrig.train.fusedmlp import mlp

            return x + mlp(self.ln2(x), self.fc, self.out, self.fused_mlp)
        return x + self._linear(self.out, F.gelu(self._linear(self.fc, self.ln2(x)), approximate="tanh"))

    def _linear(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if (
            self.fused_mlp == "wbgrad" and layer.bias is not None
        ):  # the bias gradient in the weight gradient's GEMM
            from torchrig.train.fusedmlp import linear

            return linear(x, layer)
        if self.tuned_gemms:
            from torchrig.train.ltgemm import linear

            return linear(x, layer)
        return layer(x)


class GPT(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.config = c
        self.fused_loss = False  # the trainer sets it (--loss): train/fusedloss.py, same numerics
        self.wte, self.wpe = nn.Embedding(c.vocab, c.width), nn.Embedding(c.block_size, c.width)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln = nn.LayerNorm(c.width)
        self.head = nn.Linear(c.width, c.vocab, bias=False)
        self.head.weight = self.wte.weight  # tied embeddings
        for m in self.modules():  # GPT-2 initialisation: N(0, 0.02) weights, zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head_loss(x, targets)

    def head_loss(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """After the blocks: final norm, the tied output projection, and with targets the mean cross-entropy
        in fp32 (compiled on its own under FSDP2, where the blocks are compiled one by one)."""
        h = self.ln(x)
        if targets is not None and self.fused_loss:
            from torchrig.train.fusedloss import linear_cross_entropy

            return linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.head.weight, targets.reshape(-1))
        logits = self.head(h)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    def late_grad_params(self) -> list[torch.Tensor]:
        """The parameters whose gradient is complete only when the backward ends: the embeddings (the tied
        ``wte`` gets the output projection's gradient first, the lookup's last); see train/lategrads.py."""
        return [self.wte.weight, self.wpe.weight]

    def flops_per_token(self, seq_len: int) -> float:
        """PaLM's count (Chowdhery et al. 2022, appendix B): 6N + 12·L·H·Q·T, N without position embeddings."""
        c = self.config
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * n + 12 * c.layers * c.heads * (c.width // c.heads) * seq_len


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.short(x))


class ResNet(nn.Module):
    """ResNet with basic blocks and a 3x3 stem (the CIFAR-sized variant of He et al. 2015)."""

    def __init__(self, blocks: list[int], width: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, cin = [], width
        for i, n in enumerate(blocks):
            cout = width * 2**i
            for j in range(n):
                layers.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.blocks = nn.ModuleList(layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.stem(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head_loss(x, targets)

    def head_loss(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """After the blocks: pooling, the classifier and, with targets, the cross-entropy in fp32."""
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float(), targets)


def build_model(
    model: str, size_info: dict, *, context: int, vocab: int | None = None, num_classes: int = 10
) -> nn.Module:
    """The model for a config's ``model`` and size (``config.sizes()``)."""
    if model == "gpt":
        return GPT(
            GPTConfig(
                layers=int(size_info["layers"]),
                heads=int(size_info["heads"]),
                width=int(size_info["width"]),
                block_size=context,
                vocab=int(vocab or size_info["vocab"]),
            )
        )
    return ResNet(list(size_info["blocks"]), int(size_info["width"]), num_classes)


def model_spec(
    cfg_model: str, size_info: dict, *, context: int, vocab: int | None, num_classes: int, image_size: int
) -> dict:
    """What export needs to rebuild the model and an example input (stored with every checkpoint)."""
    return {
        "model": cfg_model,
        "size_info": dict(size_info),
        "context": context,
        "vocab": vocab,
        "num_classes": num_classes,
        "image_size": image_size,
    }


def model_from_spec(spec: dict) -> nn.Module:
    return build_model(
        spec["model"],
        spec["size_info"],
        context=spec["context"],
        vocab=spec["vocab"],
        num_classes=spec["num_classes"],
    )
