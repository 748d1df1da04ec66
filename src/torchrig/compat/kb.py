"""The knowledge base as typed, frozen records, loaded from ``torchrig/data/*.toml`` (see docs/knowledge-base.md).

>>> kb = load_kb()
>>> kb.find_gpu("RTX 3090").compute_capability
'8.6'
>>> kb.find_build("2.8.0+cu126").label
'2.8.0+cu126'

Lookups of things that do not exist raise :class:`~torchrig.errors.InputError` naming the closest valid
choices; malformed text raises :class:`~torchrig.errors.UsageError` (``torchrig.compat.versions``).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchrig.compat import versions as V
from torchrig.errors import InputError


def closest(word: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.5) -> list[str]:
    from torchrig.fuzzy import closest as _closest  # difflib only on the error path

    return _closest(word, choices, n=n, cutoff=cutoff)


PYTORCH_INDEX = "https://download.pytorch.org/whl"
_PREFIXES = ("nvidia", "geforce", "tesla", "quadro")
# NVML names carry the board's form factor and memory ("Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3");
# when the exact spelling is not listed, these tokens are dropped and the name is looked up again.
_BOARD_TOKENS = re.compile(r"[\s_-]+(sxm\d?|pcie|\d+gb|hbm\d?e?|nvl|mig|\d+g)\b", re.IGNORECASE)


@dataclass(frozen=True)
class GpuArch:
    name: str
    compute_capabilities: tuple[str, ...]
    last_driver_branch: str | None = None
    min_driver_branch: str | None = None
    source: str = ""
    verified: str = ""


@dataclass(frozen=True)
class Peaks:
    """Datasheet peaks, dense; ``None`` where the datasheet does not state the figure."""

    fp32_tflops: float | None = None
    tf32_tflops: float | None = None
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    fp8_tflops: float | None = None
    memory_bandwidth_gbps: float | None = None
    nvlink_bandwidth_gbps: float | None = None
    pcie_gen: int | None = None
    pcie_bandwidth_gbps: float | None = None
    source: str | None = None


@dataclass(frozen=True)
class Gpu:
    id: str
    name: str
    arch: str
    compute_capability: str
    segment: str
    family: str
    memory_gb: float | None
    memory_type: str | None
    aliases: tuple[str, ...]
    peaks: Peaks
    source: str = ""
    verified: str = ""

    @property
    def cc(self) -> tuple[int, int]:
        return V.parse_cc(self.compute_capability)

    @property
    def sm(self) -> str:
        return V.sm_str(self.cc)


@dataclass(frozen=True)
class Toolkit:
    version: str
    min_driver: str | None
    min_driver_minor_compat: str | None
    compute_capabilities: tuple[str, ...]
    released: str | None = None
    source: str = ""
    verified: str = ""

    @property
    def major(self) -> int:
        return V.parse_cuda(self.version)[0]


@dataclass(frozen=True)
class Branch:
    branch: str
    max_cuda: str
    first_release: str | None = None
    released: str | None = None
    lts: bool = False
    source: str = ""
    verified: str = ""


@dataclass(frozen=True)
class Variant:
    name: str
    cuda: str | None
    index_url: str
    arch_list: tuple[str, ...]
    ptx: tuple[str, ...]
    cudnn: str | None = None
    nccl: str | None = None
    source: str = ""
    verified: str = ""

    @property
    def is_cpu(self) -> bool:
        return self.cuda is None


@dataclass(frozen=True)
class Release:
    version: str
    released: str | None
    python: tuple[str, ...]
    torchvision: str | None
    torchaudio: str | None
    pypi_variant: str
    variants: tuple[Variant, ...]
    source: str = ""
    verified: str = ""

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise InputError(
            f"torch {self.version} has no {name} build",
            hint=f"published: {', '.join(_closest_versions(name, [v.name for v in self.variants], n=8))}",
        )


@dataclass(frozen=True)
class Build:
    """One installable wheel: a release and one of its variants."""

    release: Release
    variant: Variant

    @property
    def label(self) -> str:
        return f"{self.release.version}+{self.variant.name}"

    @property
    def is_pypi_default(self) -> bool:
        return self.variant.name == self.release.pypi_variant

    @property
    def cuda(self) -> str | None:
        return self.variant.cuda

    @property
    def pip_command(self) -> str:
        """``pip install torch==X``: plain for the PyPI build, else from the variant's index."""
        return self.pip_command_for(("torch",))

    def pip_command_for(self, packages: Iterable[str]) -> str:
        pins = {
            "torch": self.release.version,
            "torchvision": self.release.torchvision,
            "torchaudio": self.release.torchaudio,
        }
        reqs = " ".join(f"{p}=={pins[p]}" for p in packages if pins.get(p))
        if self.is_pypi_default:
            return f"pip install {reqs}"
        return f"pip install {reqs} --index-url {self.variant.index_url}"

    def to_json(self) -> dict[str, Any]:
        v = self.variant
        return {
            "label": self.label,
            "release": self.release.version,
            "variant": v.name,
            "cuda": v.cuda,
            "pypi_default": self.is_pypi_default,
            "index_url": v.index_url,
            "arch_list": list(v.arch_list),
            "ptx": list(v.ptx),
            "cudnn": v.cudnn,
            "nccl": v.nccl,
            "pip_command": self.pip_command,
        }


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.lower())


def _strip_prefixes(name: str) -> str:
    words = name.lower().replace("_", " ").replace("-", " ").split()
    while words and words[0] in _PREFIXES:
        words.pop(0)
    return "".join(words)


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def _closest_versions(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Closest versions by number (2.9.5 -> 2.9.1, 2.9.0), falling back to spelling for non-numeric words."""
    pool = list(dict.fromkeys(choices))
    target = _numbers(word)
    if not target:
        return closest(word, pool, n=n) or pool[:n]

    def distance(choice: str) -> tuple[int, ...]:
        got = _numbers(choice) or (10**6,)
        width = max(len(got), len(target))
        a, b = target + (0,) * (width - len(target)), got + (0,) * (width - len(got))
        return tuple(abs(x - y) for x, y in zip(a, b, strict=True))

    return sorted(pool, key=distance)[:n]


@dataclass(frozen=True)
class KnowledgeBase:
    gpus: tuple[Gpu, ...]
    archs: tuple[GpuArch, ...]
    toolkits: tuple[Toolkit, ...]
    branches: tuple[Branch, ...]
    releases: tuple[Release, ...]  # newest first
    _gpu_index: Mapping[str, Gpu] = field(default_factory=dict, repr=False, compare=False)

    # ---- GPUs
    def find_gpu(self, name: str) -> Gpu:
        """The GPU called ``name`` (any listed spelling, case/space/prefix-insensitive), else InputError."""
        if not name or not name.strip():
            raise InputError("empty GPU name", hint="e.g. --gpu 'RTX 4090' or --gpu 'NVIDIA H100 80GB HBM3'")
        for key in (_norm(name), _strip_prefixes(name), _strip_prefixes(_BOARD_TOKENS.sub("", name))):
            if key in self._gpu_index:
                return self._gpu_index[key]
        short = _strip_prefixes(name)
        family = list(
            dict.fromkeys(g for k, g in self._gpu_index.items() if len(short) >= 3 and k.startswith(short))
        )
        if family and len({(g.arch, g.compute_capability) for g in family}) == 1:
            # "V100" or "H100": every board it can mean has the same architecture and compute capability,
            # which is all check/resolve use; the first listed board stands for them.
            return family[0]
        if family:
            raise InputError(
                f"GPU {name.strip()!r} is ambiguous",
                hint=f"it matches {', '.join(g.name for g in family[:4])}; pass the full name",
            )
        keys = closest(_strip_prefixes(name), list(self._gpu_index), n=6, cutoff=0.6)
        names = list(dict.fromkeys(self._gpu_index[k].name for k in keys))[:3]
        hint = (
            f"did you mean: {', '.join(names)}?"
            if names
            else "see 'torchrig matrix' for the GPUs torchrig knows"
        )
        raise InputError(f"unknown GPU {name.strip()!r}", hint=hint)

    def arch(self, name: str) -> GpuArch:
        for a in self.archs:
            if a.name == name:
                return a
        raise InputError(
            f"unknown GPU architecture {name!r}",
            hint=f"did you mean: {', '.join(closest(name, [a.name for a in self.archs]))}?",
        )

    # ---- CUDA and drivers
    def toolkit(self, version: str) -> Toolkit:
        mm = V.cuda_major_minor(version)
        for t in self.toolkits:
            if t.version == mm:
                return t
        choices = _closest_versions(mm, [t.version for t in self.toolkits])
        raise InputError(f"unknown CUDA toolkit {version!r}", hint=f"known: {', '.join(choices)}")

    def branch_of(self, driver: str) -> Branch | None:
        """The driver branch that ``driver`` (``"570.86.10"``) belongs to, or None if the KB does not list it."""
        major = V.driver_branch(driver)
        for b in self.branches:
            if b.branch == major:
                return b
        return None

    # ---- torch
    def release(self, version: str) -> Release:
        norm = V.normalise_release(version)
        for r in self.releases:
            if r.version == norm:
                return r
        choices = _closest_versions(norm, [r.version for r in self.releases])
        raise InputError(
            f"torch {norm} was never published (or is newer than torchrig's knowledge base)",
            hint=f"closest releases: {', '.join(choices)}",
        )

    def find_build(self, text: str) -> Build:
        """``"2.8.0+cu126"`` -> that build; ``"2.8.0"`` -> the build PyPI serves; ``"2.8.0+cpu"`` -> CPU-only."""
        version, variant = V.parse_torch_build(text)
        rel = self.release(version)
        return Build(rel, rel.variant(variant or rel.pypi_variant))

    def builds_for_release(self, version: str) -> list[Build]:
        rel = self.release(version)
        return [Build(rel, v) for v in rel.variants]

    def all_builds(self) -> list[Build]:
        return [Build(r, v) for r in self.releases for v in r.variants]

    def other_builds_with_native_cubin(self, build: Build, gpu: Gpu) -> list[Build]:
        """Variants of ``build``'s release that carry an exact cubin for ``gpu`` (used to flag forward runs)."""
        want = gpu.sm
        return [
            b
            for b in self.builds_for_release(build.release.version)
            if b.variant.name != build.variant.name and want in b.variant.arch_list
        ]


# ---------------------------------------------------------------- loading


def _tuple(row: Mapping[str, Any], key: str) -> tuple[str, ...]:
    return tuple(str(x) for x in row.get(key, ()))


def _opt(row: Mapping[str, Any], key: str) -> Any:
    value = row.get(key)
    return None if value in (None, "") else value


def _row(kind: str, row: Mapping[str, Any], build: Any) -> Any:
    try:
        return build(row)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"knowledge base: bad {kind} row {dict(row).get('name') or dict(row)!r}: {err!r}"
        ) from err


def _gpu(row: Mapping[str, Any]) -> Gpu:
    peaks = row.get("peaks") or {}
    return Gpu(
        id=row["id"],
        name=row["name"],
        arch=row["arch"],
        compute_capability=row["compute_capability"],
        segment=row.get("segment", ""),
        family=row.get("family", row["arch"]),
        memory_gb=_opt(row, "memory_gb"),
        memory_type=_opt(row, "memory_type"),
        aliases=_tuple(row, "aliases"),
        peaks=Peaks(**{k: v for k, v in peaks.items() if k in Peaks.__dataclass_fields__}),
        source=row.get("source", ""),
        verified=str(row.get("verified", "")),
    )


def _variant(row: Mapping[str, Any]) -> Variant:
    name = row["name"]
    return Variant(
        name=name,
        cuda=_opt(row, "cuda"),
        index_url=row.get("index_url", f"{PYTORCH_INDEX}/{name}"),
        arch_list=_tuple(row, "arch_list"),
        ptx=_tuple(row, "ptx"),
        cudnn=_opt(row, "cudnn"),
        nccl=_opt(row, "nccl"),
        source=row.get("source", ""),
        verified=str(row.get("verified", "")),
    )


def _release(row: Mapping[str, Any]) -> Release:
    return Release(
        version=row["version"],
        released=str(row["released"]) if row.get("released") else None,
        python=_tuple(row, "python"),
        torchvision=_opt(row, "torchvision"),
        torchaudio=_opt(row, "torchaudio"),
        pypi_variant=row["pypi_variant"],
        variants=tuple(_row("variant", v, _variant) for v in row.get("variant", ())),
        source=row.get("source", ""),
        verified=str(row.get("verified", "")),
    )


def _index_gpus(gpus: Iterable[Gpu]) -> dict[str, Gpu]:
    index: dict[str, Gpu] = {}
    for g in gpus:
        for spelling in (g.name, g.id, *g.aliases):
            for key in (_norm(spelling), _strip_prefixes(spelling)):
                index.setdefault(key, g)
    return index


def build_kb(
    gpus: Mapping[str, Any], cuda: Mapping[str, Any], drivers: Mapping[str, Any], torch: Mapping[str, Any]
) -> KnowledgeBase:
    """Build a KnowledgeBase from the four parsed data files (tests pass small in-memory ones)."""
    for name, doc in (("gpus", gpus), ("cuda", cuda), ("drivers", drivers), ("torch", torch)):
        if doc.get("schema_version") != 1:
            raise ValueError(
                f"knowledge base: {name}.toml has schema_version {doc.get('schema_version')!r}, expected 1"
            )
    gpu_rows = tuple(_row("gpu", r, _gpu) for r in gpus.get("gpu", ()))
    archs = tuple(
        _row(
            "arch",
            r,
            lambda r: GpuArch(
                name=r["name"],
                compute_capabilities=_tuple(r, "compute_capabilities"),
                last_driver_branch=_opt(r, "last_driver_branch"),
                min_driver_branch=_opt(r, "min_driver_branch"),
                source=r.get("source", ""),
                verified=str(r.get("verified", "")),
            ),
        )
        for r in gpus.get("arch", ())
    )
    toolkits = tuple(
        _row(
            "toolkit",
            r,
            lambda r: Toolkit(
                version=r["version"],
                min_driver=_opt(r, "min_driver"),
                min_driver_minor_compat=_opt(r, "min_driver_minor_compat"),
                compute_capabilities=_tuple(r, "compute_capabilities"),
                released=str(r["released"]) if r.get("released") else None,
                source=r.get("source", ""),
                verified=str(r.get("verified", "")),
            ),
        )
        for r in cuda.get("toolkit", ())
    )
    branches = tuple(
        _row(
            "branch",
            r,
            lambda r: Branch(
                branch=str(r["branch"]),
                max_cuda=r["max_cuda"],
                first_release=_opt(r, "first_release"),
                released=str(r["released"]) if r.get("released") else None,
                lts=bool(r.get("lts", False)),
                source=r.get("source", ""),
                verified=str(r.get("verified", "")),
            ),
        )
        for r in drivers.get("branch", ())
    )
    releases = sorted(
        (_row("release", r, _release) for r in torch.get("release", ())),
        key=lambda r: V.parse_release(r.version),
        reverse=True,
    )
    return KnowledgeBase(
        gpus=gpu_rows,
        archs=archs,
        toolkits=toolkits,
        branches=branches,
        releases=tuple(releases),
        _gpu_index=_index_gpus(gpu_rows),
    )


_KB_FILES = ("gpus", "cuda", "drivers", "torch")


def _cache_dir() -> str:
    return os.environ.get("TORCHRIG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "torchrig"
    )


def _sources() -> tuple[list[bytes], str]:
    """The four data files' bytes, and a cache key: their checksums, this module's and the Python version."""
    here = os.path.abspath(__file__)
    data_dir = os.path.join(os.path.dirname(os.path.dirname(here)), "data")
    raws = []
    for name in _KB_FILES:
        with open(os.path.join(data_dir, f"{name}.toml"), "rb") as fh:
            raws.append(fh.read())
    with open(here, "rb") as fh:
        code = fh.read()
    key = "-".join(f"{zlib.crc32(r):08x}" for r in (*raws, code))
    return raws, f"kb-py{sys.version_info[0]}{sys.version_info[1]}-{key}.pickle"


def _load_docs() -> dict[str, Any]:
    """The four data files, parsed (tomllib)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    raws, _ = _sources()
    return {name: tomllib.loads(raw.decode("utf-8")) for name, raw in zip(_KB_FILES, raws, strict=True)}


@functools.lru_cache(maxsize=1)
def load_kb() -> KnowledgeBase:
    """The knowledge base from the package's data files (loaded once per process).

    Parsing the TOML (tomllib is pure Python) and building the records takes ~70 ms, a third of `torchrig check`'s
    budget, so the built knowledge base is cached with pickle under ~/.cache/torchrig (or $TORCHRIG_CACHE_DIR),
    keyed by the data files' and this module's checksums: any change to either rebuilds it.
    """
    import pickle

    _raws, name = _sources()
    cache = os.path.join(_cache_dir(), name)
    try:
        with open(cache, "rb") as fh:
            cached = pickle.load(fh)
        if isinstance(cached, KnowledgeBase):
            return cached
    except Exception:  # a missing, partial or stale cache only costs the parse
        pass
    docs = _load_docs()
    kb = build_kb(docs["gpus"], docs["cuda"], docs["drivers"], docs["torch"])
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        tmp = f"{cache}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(kb, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, cache)
    except OSError:
        pass
    return kb
