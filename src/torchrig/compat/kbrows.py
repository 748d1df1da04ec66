"""The knowledge base's data files (parsed TOML: ``data/gpus.toml``, ``cuda.toml``, ``drivers.toml``,
``torch.toml``, ``platforms.toml``) turned into the typed records of ``torchrig.compat.records`` and
``torchrig.compat.platforms``: one function per kind of row, each naming the row it could not read.

Pure: it reads no file (``torchrig.compat.kb.load_kb`` reads them through ``torchrig.data``), so tests build a
knowledge base from small in-memory documents.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from torchrig.compat import versions as V
from torchrig.compat.gpunames import index_gpus
from torchrig.compat.platforms import ArchOverride, JetPack, PlatformInfo, PypiDefault, TritonPin, TritonPtxas
from torchrig.compat.records import (
    PYTORCH_INDEX,
    Branch,
    Gpu,
    GpuArch,
    LibraryFloor,
    Peaks,
    Release,
    Toolkit,
    Variant,
)
from torchrig.errors import InputError

T = TypeVar("T")
SCHEMA_VERSION = 1
FILES = ("gpus", "cuda", "drivers", "torch", "platforms")
DAMAGED = "the data files of this installation are damaged or from another version: reinstall torchrig"


def _tuple(row: Mapping[str, Any], key: str) -> tuple[str, ...]:
    return tuple(str(x) for x in row.get(key, ()))


def _opt(row: Mapping[str, Any], key: str) -> Any:
    value = row.get(key)
    return None if value in (None, "") else value


def _row(kind: str, row: Mapping[str, Any], build: Callable[[Mapping[str, Any]], T]) -> T:
    try:
        return build(row)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        label = row.get("name") or row.get("id") or row.get("version") if isinstance(row, Mapping) else None
        raise InputError(
            f"knowledge base: bad {kind} row {label or row!r:.80}: {err!r}", hint=DAMAGED
        ) from err


def _rows(doc: Mapping[str, Any], key: str, build: Callable[[Mapping[str, Any]], T]) -> tuple[T, ...]:
    return tuple(_row(key, r, build) for r in doc.get(key, ()))


def _sourced(r: Mapping[str, Any]) -> dict[str, str]:
    return {"source": r.get("source", ""), "verified": str(r.get("verified", ""))}


def _date(r: Mapping[str, Any]) -> str | None:
    return str(r["released"]) if r.get("released") else None


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
        host_platform=row.get("host_platform"),
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
        confirmed=bool(row.get("confirmed", True)),
        find_links=_opt(row, "find_links"),
    )


def _release(row: Mapping[str, Any]) -> Release:
    return Release(
        version=row["version"],
        released=_date(row),
        python=_tuple(row, "python"),
        torchvision=_opt(row, "torchvision"),
        torchaudio=_opt(row, "torchaudio"),
        pypi_variant=row["pypi_variant"],
        variants=_rows(row, "variant", _variant),
        source=row.get("source", ""),
        verified=str(row.get("verified", "")),
    )


def _arch(r: Mapping[str, Any]) -> GpuArch:
    return GpuArch(
        name=r["name"],
        compute_capabilities=_tuple(r, "compute_capabilities"),
        last_driver_branch=_opt(r, "last_driver_branch"),
        min_driver_branch=_opt(r, "min_driver_branch"),
        **_sourced(r),
    )


def _toolkit(r: Mapping[str, Any]) -> Toolkit:
    return Toolkit(
        version=r["version"],
        min_driver=_opt(r, "min_driver"),
        min_driver_minor_compat=_opt(r, "min_driver_minor_compat"),
        compute_capabilities=_tuple(r, "compute_capabilities"),
        released=_date(r),
        **_sourced(r),
    )


def _library_floor(r: Mapping[str, Any]) -> LibraryFloor:
    return LibraryFloor(
        r["library"], r["versions"], r["min_compute_capability"], r.get("workaround", ""), **_sourced(r)
    )


def _branch(r: Mapping[str, Any]) -> Branch:
    return Branch(
        branch=str(r["branch"]),
        max_cuda=r["max_cuda"],
        first_release=_opt(r, "first_release"),
        released=_date(r),
        lts=bool(r.get("lts", False)),
        **_sourced(r),
    )


def _platform(r: Mapping[str, Any]) -> PlatformInfo:
    return PlatformInfo(r["id"], r["name"], r["wheel_tag"], r["driver_numbering"], **_sourced(r))


def _pypi_default(r: Mapping[str, Any]) -> PypiDefault:
    return PypiDefault(
        r["platform"], r["releases"], r["variant"], bool(r.get("confirmed", True)), **_sourced(r)
    )


def _arch_override(r: Mapping[str, Any]) -> ArchOverride:
    return ArchOverride(
        r["platform"],
        r["releases"],
        r["variant"],
        _tuple(r, "arch_list"),
        _tuple(r, "ptx"),
        r.get("evidence", ""),
        **_sourced(r),
    )


def _jetpack(r: Mapping[str, Any]) -> JetPack:
    return JetPack(
        str(r["version"]), str(r["l4t"]), r["max_cuda"], r["torch"], _opt(r, "driver"), **_sourced(r)
    )


def _triton_pin(r: Mapping[str, Any]) -> TritonPin:
    return TritonPin(str(r["torch"]), str(r["triton"]), **_sourced(r))


def _triton(r: Mapping[str, Any]) -> TritonPtxas:
    return TritonPtxas(
        str(r["version"]),
        _opt(r, "ptxas"),
        _opt(r, "ptxas_blackwell"),
        _opt(r, "blackwell_override"),
        **_sourced(r),
    )


def kb_fields(docs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The KnowledgeBase's fields from the parsed files (``docs["gpus"]`` …; ``platforms`` may be absent).
    A file of another schema version or a row missing a key or of the wrong type is an InputError naming it."""
    docs = {"platforms": {"schema_version": SCHEMA_VERSION}, **docs}
    for name in FILES:
        version = docs[name].get("schema_version")
        if version != SCHEMA_VERSION:
            raise InputError(
                f"knowledge base: {name}.toml has schema_version {version!r}, expected {SCHEMA_VERSION}",
                hint=DAMAGED,
            )
    gpus, cuda, plats = docs["gpus"], docs["cuda"], docs["platforms"]
    gpu_rows = _rows(gpus, "gpu", _gpu)
    releases = sorted(
        _rows(docs["torch"], "release", _release), key=lambda r: V.parse_release(r.version), reverse=True
    )
    return {
        "gpus": gpu_rows,
        "archs": _rows(gpus, "arch", _arch),
        "toolkits": _rows(cuda, "toolkit", _toolkit),
        "branches": _rows(docs["drivers"], "branch", _branch),
        "releases": tuple(releases),
        "_gpu_index": index_gpus(gpu_rows),
        "library_floors": _rows(cuda, "library_floor", _library_floor),
        "platforms": _rows(plats, "platform", _platform),
        "pypi_defaults": _rows(plats, "pypi_default", _pypi_default),
        "arch_overrides": _rows(plats, "arch_list", _arch_override),
        "jetpacks": _rows(plats, "jetpack", _jetpack),
        "triton_pins": _rows(plats, "triton_pin", _triton_pin),
        "triton_ptxas": _rows(plats, "triton", _triton),
    }
