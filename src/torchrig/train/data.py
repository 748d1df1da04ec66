"""Datasets and a resumable distributed sampler.

Data sources (``--data``):
- ``synthetic``: uniform random tokens or noise images; for throughput, nothing to learn.
- ``generated``: a small learnable dataset made from the seed: token sequences from a fixed sparse Markov
  chain (each token has 4 possible successors), or images whose class sets the stripe orientation and
  colour. Loss falls quickly; useful for tests and demos.
- a token file: ``.bin`` (raw uint16, as nanoGPT writes it) or ``.npy`` (1-D integer array);
- an image folder: ``ROOT/<class>/*.png|jpg`` (Pillow decodes).

The sampler is ``DistributedSampler`` with a start offset: step ``s`` always consumes global samples
``[s·G, (s+1)·G)`` of the epoch's permutation (G = micro-batch × accumulation × world), rank ``r`` taking
every world-th sample. So a run resumed on a different number of GPUs with the same global batch sees
exactly the samples it would have seen.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from torchrig.errors import InputError, UsageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


class SyntheticTokens(Dataset):
    def __init__(self, length: int, seq_len: int, vocab: int, seed: int) -> None:
        self.length, self.seq_len, self.vocab, self.seed = length, seq_len, vocab, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        seq = torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g)
        return seq[:-1], seq[1:]


class GeneratedTokens(Dataset):
    """Sequences from a fixed sparse Markov chain: learnable, deterministic from the seed."""

    def __init__(self, length: int, seq_len: int, vocab: int, seed: int, branching: int = 4) -> None:
        g = torch.Generator().manual_seed(seed)
        succ = torch.randint(0, vocab, (vocab, branching), generator=g)
        seq = torch.empty(length, seq_len + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, vocab, (length,), generator=g)
        for t in range(1, seq_len + 1):
            choice = torch.randint(0, branching, (length,), generator=g)
            seq[:, t] = succ[seq[:, t - 1], choice]
        self.seq = seq

    def __len__(self) -> int:
        return self.seq.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.seq[i]
        return s[:-1], s[1:]


class TokenFile(Dataset):
    """Non-overlapping windows of ``seq_len + 1`` tokens from a ``.bin`` (uint16) or ``.npy`` file."""

    def __init__(self, path: Path, seq_len: int, vocab: int) -> None:
        import numpy as np

        if not path.is_file():
            raise InputError(f"{path}: not a token file", hint="give a .bin (uint16) or .npy file")
        try:
            if path.suffix == ".npy":
                self.tokens = np.load(path, mmap_mode="r", allow_pickle=False)
            elif path.stat().st_size % 2:
                raise InputError(
                    f"{path}: {path.stat().st_size} bytes, an odd count: not a file of uint16 tokens",
                    hint="write the tokens as uint16 (nanoGPT's .bin), or as a .npy array",
                )
            else:
                self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        except (ValueError, OSError, EOFError) as err:  # a damaged .npy header, an empty file
            raise InputError(
                f"{path}: not a readable token file ({' '.join(str(err).split())[:120]})"
            ) from None
        if getattr(self.tokens, "dtype", None) is None or self.tokens.dtype.kind not in "iu":
            raise InputError(
                f"{path}: tokens must be integers, found {getattr(self.tokens, 'dtype', type(self.tokens))}",
                hint="save the token ids as uint16 or int32",
            )
        if self.tokens.ndim != 1 or len(self.tokens) < seq_len + 1:
            raise InputError(f"{path}: need a 1-D token array of at least {seq_len + 1} tokens")
        head = self.tokens[: min(len(self.tokens), 1 << 20)]
        top, bottom = int(head.max()), int(head.min())
        if bottom < 0:
            raise InputError(f"{path}: negative token id {bottom}", hint="token ids start at 0")
        if top >= vocab:
            raise InputError(
                f"{path}: token id {top} >= the model's vocabulary {vocab}", hint="choose a larger --size"
            )
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        import numpy as np

        o = i * self.seq_len
        w = torch.from_numpy(np.asarray(self.tokens[o : o + self.seq_len + 1], dtype=np.int64))
        return w[:-1], w[1:]


def _stripes(label: int, num_classes: int, size: int, g: torch.Generator) -> torch.Tensor:
    angle = math.pi * label / num_classes
    ys, xs = torch.meshgrid(
        torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32), indexing="ij"
    )
    wave = torch.sin((xs * math.cos(angle) + ys * math.sin(angle)) * 0.8 + torch.rand((), generator=g) * 6.28)
    colour = torch.tensor([math.cos(angle), math.sin(angle), 0.5]).view(3, 1, 1)
    return wave.unsqueeze(0) * colour + 0.3 * torch.randn(3, size, size, generator=g)


class ImagesInMemory(Dataset):
    """Synthetic noise (``learnable=False``) or class-dependent stripes (``learnable=True``)."""

    def __init__(self, length: int, size: int, num_classes: int, seed: int, learnable: bool) -> None:
        self.length, self.size, self.num_classes, self.seed, self.learnable = (
            length,
            size,
            num_classes,
            seed,
            learnable,
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        label = int(torch.randint(0, self.num_classes, (), generator=g))
        img = (
            _stripes(label, self.num_classes, self.size, g)
            if self.learnable
            else torch.randn(3, self.size, self.size, generator=g)
        )
        return img, torch.tensor(label)


class ImageFolder(Dataset):
    """``ROOT/<class>/<image>``: classes sorted by name; images resized to ``size`` and normalised."""

    def __init__(self, root: Path, size: int) -> None:
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [
            (f, c)
            for c, name in enumerate(self.classes)
            for f in sorted((root / name).iterdir())
            if f.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not self.items:
            raise InputError(f"{root}: no images found", hint="expected ROOT/<class>/<image>.png|jpg")
        self.size = size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        import numpy as np
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as im:
            arr = np.asarray(im.convert("RGB").resize((self.size, self.size)), dtype=np.float32) / 255.0
        img = (torch.from_numpy(arr).permute(2, 0, 1) - 0.5) / 0.25
        return img, torch.tensor(label)


def build_dataset(
    model: str,
    data: str,
    *,
    seq_len: int,
    vocab: int,
    image_size: int,
    num_classes: int,
    seed: int,
    min_length: int,
) -> tuple[Dataset, int]:
    """The dataset, and the number of classes it has (images) or the vocabulary (tokens)."""
    if data in ("synthetic", "generated"):
        if model == "gpt":
            if data == "synthetic":
                return SyntheticTokens(max(min_length, 1024), seq_len, vocab, seed), vocab
            return GeneratedTokens(max(4096, min(min_length, 65536)), seq_len, vocab, seed), vocab
        return ImagesInMemory(
            max(min_length, 1024), image_size, num_classes, seed, data == "generated"
        ), num_classes
    path = Path(data)
    if not path.exists():
        raise UsageError(
            f"--data {data!r}: no such file or folder",
            hint="use synthetic, generated, a token file (.bin/.npy) or an image folder",
        )
    if model == "gpt":
        if path.is_dir():
            raise UsageError(f"--data {data}: the GPT model needs a token file (.bin or .npy), not a folder")
        return TokenFile(path, seq_len, vocab), vocab
    if not path.is_dir():
        raise UsageError(f"--data {data}: the ResNet model needs an image folder ROOT/<class>/<image>")
    ds = ImageFolder(path, image_size)
    return ds, len(ds.classes)


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` that can start mid-epoch at a global sample offset."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int, global_batch: int) -> None:
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        n = len(dataset)  # type: ignore[arg-type,unused-ignore]  # only with torch installed
        self.usable = (n // global_batch) * global_batch  # whole global batches per epoch
        if self.usable == 0:
            raise InputError(
                f"the dataset has {n} samples, fewer than one global batch of {global_batch}",
                hint="lower --micro-batch or --grad-accum",
            )
        self.start = 0

    def set_position(self, epoch: int, start: int) -> None:
        self.set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.dataset), generator=g)[: self.usable].tolist()  # type: ignore[arg-type,unused-ignore]  # only with torch installed
        return iter(order[self.start + self.rank :: self.num_replicas])

    def __len__(self) -> int:
        return (self.usable - self.start) // self.num_replicas


def batches(
    dataset: Dataset,
    *,
    micro_batch: int,
    world: int,
    rank: int,
    seed: int,
    global_batch: int,
    start_sample: int,
    workers: int,
    pin: bool,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Micro-batches forever, starting at global sample ``start_sample`` (epochs roll over)."""
    sampler = ResumableSampler(dataset, world, rank, seed, global_batch)
    epoch, start = divmod(start_sample, sampler.usable)
    loader = DataLoader(
        dataset,
        batch_size=micro_batch,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin,
        drop_last=True,
        persistent_workers=workers > 0,
    )
    while True:
        sampler.set_position(epoch, start)
        yield from loader
        epoch, start = epoch + 1, 0
