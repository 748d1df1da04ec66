"""GPU names as users, NVML, nvidia-smi and pci.ids spell them, matched to the knowledge base's records.

A name is compared in normalised forms (:func:`norm`: no case, spaces, dashes or underscores; and
:func:`strip_prefixes`: without "NVIDIA", "GeForce", "Tesla", "Quadro"), then without the board's form factor
and memory ("Tesla V100-SXM2-32GB" -> "V100"). Names gpus.toml does not list fall back to the PCI ID database's
NVIDIA GPUs (:func:`pci_gpus`) and to the desktop namesake of a laptop part (:func:`laptop_part`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping

from torchrig.compat.records import Gpu, Peaks

_PREFIXES = ("nvidia", "geforce", "tesla", "quadro")
# NVML names carry the board's form factor and memory ("Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3");
# when the exact spelling is not listed, these tokens are dropped and the name is looked up again.
_BOARD_TOKENS = re.compile(r"[\s_-]+(sxm\d?|pcie|\d+gb|hbm\d?e?|nvl|mig|\d+g)\b", re.IGNORECASE)
# pci.ids' "GA102 [GeForce RTX 3090]": the marketing name in brackets after the chip
_PCI_NAME = re.compile(r"\s*[A-Z]{2}\d{3}[A-Z]*\s*\[(.+)\]\s*")
_LAPTOP = re.compile(r"(.+?)\s+(?:laptop(?:\s+gpu)?|max-q)(?:\s+gpu)?", re.IGNORECASE)


def norm(name: str) -> str:
    """``"NVIDIA GeForce RTX-4090"`` -> ``"nvidiageforcertx4090"``."""
    return re.sub(r"[\s_\-]+", "", name.lower())


def strip_prefixes(name: str) -> str:
    """``"NVIDIA GeForce RTX 4090"`` -> ``"rtx4090"``."""
    words = name.lower().replace("_", " ").replace("-", " ").split()
    while words and words[0] in _PREFIXES:
        words.pop(0)
    return "".join(words)


def marketing_name(name: str) -> str:
    """pci.ids' ``"GA102 [GeForce RTX 3090]"`` -> ``"GeForce RTX 3090"``; any other name as it is."""
    pci = _PCI_NAME.fullmatch(name)
    return pci.group(1) if pci else name


def lookup_keys(name: str) -> tuple[str, str, str]:
    """The keys ``name`` is looked up under, most exact first."""
    return norm(name), strip_prefixes(name), strip_prefixes(_BOARD_TOKENS.sub("", name))


def index_gpus(gpus: Iterable[Gpu]) -> dict[str, Gpu]:
    """Every listed spelling of every GPU (name, id, aliases) in both normalised forms; the first row wins."""
    index: dict[str, Gpu] = {}
    for g in gpus:
        for spelling in (g.name, g.id, *g.aliases):
            for key in (norm(spelling), strip_prefixes(spelling)):
                index.setdefault(key, g)
    return index


@functools.lru_cache(maxsize=1)
def pci_gpus() -> dict[str, Gpu]:
    """The PCI ID database's NVIDIA GPUs of compute capability >= 3.5 (``data/pci_gpus.json``, written by
    tools/gen_pci_gpus.py), by normalised name: the fallback for names gpus.toml does not list. A name two
    entries give different capabilities is left out (it cannot say which GPU it is)."""
    from torchrig import data

    doc = data.load_json("pci_gpus")
    sources = {r["compute_capability"] + r["arch"]: r["source"] for r in doc["rules"]}
    found: dict[str, Gpu] = {}
    clash: set[str] = set()
    for row in doc["gpu"]:
        for spelling in row["names"]:
            gpu = Gpu(
                id=f"pci-{row['device_id'].replace(':', '-')}",
                name=spelling,
                arch=row["arch"],
                compute_capability=row["compute_capability"],
                segment=row["segment"],
                family=row["arch"],
                memory_gb=None,
                memory_type=None,
                aliases=(),
                peaks=Peaks(),
                source=f"{doc['source']}; compute capability: {sources[row['compute_capability'] + row['arch']]}",
                verified=doc["verified"],
            )
            for key in (norm(spelling), strip_prefixes(spelling)):
                have = found.get(key)
                if have is not None and have.compute_capability != gpu.compute_capability:
                    clash.add(key)
                found.setdefault(key, gpu)
    return {k: g for k, g in found.items() if k not in clash}


def laptop_part(name: str, index: Mapping[str, Gpu]) -> Gpu | None:
    """``NVIDIA GeForce RTX 4080 Laptop GPU`` (as nvidia-smi prints a laptop part) not listed: its desktop
    namesake's architecture and compute capability, which NVIDIA's CUDA GPU list gives laptop GeForce parts
    (https://developer.nvidia.com/cuda-gpus); memory and peaks unknown."""
    m = _LAPTOP.fullmatch(name.strip())
    if not m:
        return None
    base = index.get(norm(m.group(1))) or index.get(strip_prefixes(m.group(1)))
    if base is None or base.segment not in ("consumer", "workstation"):
        return None
    return Gpu(
        id=f"{base.id}-laptop",
        name=name.strip(),
        arch=base.arch,
        compute_capability=base.compute_capability,
        segment=base.segment,
        family=base.family,
        memory_gb=None,
        memory_type=None,
        aliases=(),
        peaks=Peaks(),
        source="https://developer.nvidia.com/cuda-gpus",
        verified=base.verified,
    )
