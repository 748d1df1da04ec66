"""Compare src/torchrig/data/torch.toml with what PyPI publishes for torch, torchvision and torchaudio.

For every torch release on PyPI (2.0 and later, no pre-releases) it reads the Linux x86_64 wheels: their
Python tags, the first upload date, and the wheel's METADATA (PEP 658 ``.metadata`` file, or the METADATA
member read from the wheel with HTTP range requests). The Requires-Dist pins say which CUDA build a plain
``pip install torch==X`` gets (``nvidia-cuda-runtime-cu12==12.8.90`` or ``cuda-toolkit[...]==13.0.2`` means
``cu128`` / ``cu130``) and which cuDNN and NCCL it brings. torchvision and torchaudio releases are paired with
the torch version their wheels pin (``torch==2.8.0``).

Then it reports releases missing from torch.toml, and for releases already there every difference in
``pypi_variant``, the PyPI variant's ``cuda``/``cudnn``/``nccl``, ``python``, ``released``, ``torchvision`` and
``torchaudio``; releases in the file that PyPI does not list (or has yanked) too.

usage:
  python tools/refresh_torch_data.py                 # human report
  python tools/refresh_torch_data.py --json          # the same as JSON (schema_version 1)
  python tools/refresh_torch_data.py --write         # also append skeleton rows for new releases
  python tools/refresh_torch_data.py --since 2.8     # only releases from 2.8 on
  python tools/refresh_torch_data.py --check-arch    # also compare the PyPI wheels' compiled arch lists

``--write`` appends one ``[[release]]`` per new release with its PyPI variant filled from the wheel (arch
list read from the CUDA arch-flags text in ``libtorch_python.so``, ~10 MB read by range requests), marked
``notes = "REVIEW: ..."``; the other variants (download.pytorch.org) must be added by hand with sources.

exit status: 0 the file matches PyPI, 1 differences found, 2 usage or network error.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import re
import sys
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TORCH_TOML = ROOT / "src" / "torchrig" / "data" / "torch.toml"
PYPI = "https://pypi.org"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
RELEASE_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
LINUX_X86_64 = re.compile(r"manylinux[^-]*x86_64\.whl$")
# python tag, abi tag: "cp311-cp311" counts, "cp313-cp313t" (free-threaded) and "py3-none" do not.
CPYTHON_TAG = re.compile(r"-cp(\d)(\d+)-cp\d+-")
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*\(?\s*([^;)]*)\)?")
ARCH_FLAGS = re.compile(rb"(?:sm|compute)_\d{2,3}(?: (?:sm|compute)_\d{2,3})+")


# ---------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class WheelFile:
    filename: str
    url: str
    size_bytes: int
    uploaded: str  # ISO timestamp
    yanked: bool = False


@dataclass(frozen=True)
class Pins:
    """What a wheel's Requires-Dist pins (None: not pinned)."""

    cuda_variant: str | None  # "cu128"; None for a CPU-only wheel
    cuda_runtime: str | None  # "12.8.90"
    cudnn: str | None
    nccl: str | None


@dataclass(frozen=True)
class PyPIRelease:
    version: str
    released: str  # YYYY-MM-DD of the first upload
    python: tuple[str, ...]
    wheel: WheelFile
    pins: Pins
    yanked: bool = False


@dataclass(frozen=True)
class Change:
    kind: str  # new-release | changed | not-on-pypi | yanked
    version: str
    field: str = ""
    in_file: Any = None
    on_pypi: Any = None

    def render(self) -> str:
        if self.kind == "new-release":
            return f"{self.version}: new release on PyPI ({self.on_pypi})"
        if self.kind == "not-on-pypi":
            return f"{self.version}: in torch.toml but not published on PyPI"
        if self.kind == "yanked":
            return f"{self.version}: yanked on PyPI"
        return f"{self.version}: {self.field}: torch.toml has {self.in_file!r}, PyPI says {self.on_pypi!r}"


@dataclass
class Report:
    checked: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    written: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "checked": self.checked,
            "changes": [asdict(c) for c in self.changes],
            "written": self.written,
        }

    def render_text(self) -> str:
        lines = [f"checked {len(self.checked)} torch releases on PyPI against {TORCH_TOML.name}"]
        lines += [f"  {c.render()}" for c in self.changes] or ["  no differences"]
        lines += [f"appended skeleton row for {v} (marked REVIEW)" for v in self.written]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- pure logic
def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def releases_in_index(doc: Mapping[str, Any], project: str, since: str = "0") -> dict[str, list[WheelFile]]:
    """Group a PEP 691 simple-index document's wheels by final release version (>= since)."""
    grouped: dict[str, list[WheelFile]] = {}
    for entry in doc.get("files", []):
        name = entry["filename"]
        match = re.match(rf"^{re.escape(project)}-([^-]+)-", name)
        if not match or not name.endswith(".whl") or not RELEASE_VERSION.match(match.group(1)):
            continue
        version = match.group(1)
        if version_key(version) < version_key(since):
            continue
        grouped.setdefault(version, []).append(
            WheelFile(
                name,
                entry["url"],
                int(entry.get("size", 0)),
                entry.get("upload-time", ""),
                bool(entry.get("yanked")),
            )
        )
    return grouped


def python_versions(files: Iterable[WheelFile]) -> tuple[str, ...]:
    """CPython versions with a Linux x86_64 wheel (free-threaded builds not counted)."""
    found = {
        f"{m.group(1)}.{m.group(2)}"
        for f in files
        if LINUX_X86_64.search(f.filename) and (m := CPYTHON_TAG.search(f.filename))
    }
    return tuple(sorted(found, key=version_key))


def _build_tag(filename: str) -> int:
    """A wheel's optional build tag (``torch-2.10.0-3-cp311-...`` -> 3), 0 when absent."""
    parts = filename[: -len(".whl")].split("-")
    match = re.match(r"\d+", parts[2]) if len(parts) == 6 else None
    return int(match.group(0)) if match else 0


def linux_wheel(files: Sequence[WheelFile], prefer: str = "cp311") -> WheelFile | None:
    """The Linux x86_64 wheel to read METADATA from: ``prefer``'s tag if present, highest build tag first."""
    linux = sorted(
        (f for f in files if LINUX_X86_64.search(f.filename)),
        key=lambda f: (_build_tag(f.filename), f.filename),
        reverse=True,
    )
    preferred = [f for f in linux if f"-{prefer}-{prefer}-" in f.filename]
    candidates = preferred or linux
    return candidates[0] if candidates else None


def requirements(metadata: str) -> dict[str, str]:
    """Requires-Dist lines as {name: version specifier}, extras-only requirements skipped."""
    reqs: dict[str, str] = {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        text = line.split(":", 1)[1]
        if "extra ==" in text.split(";", 1)[-1] and ";" in text:
            continue
        match = REQUIREMENT.match(text)
        if match:
            reqs[match.group(1).lower()] = match.group(3).replace(" ", "")
    return reqs


def _pinned(spec: str | None) -> str | None:
    match = re.match(r"^(?:==|~=)([\d.]+)(?:\+[\w.]+)?$", spec or "")
    return match.group(1) if match else None


def pins(metadata: str) -> Pins:
    """CUDA build, cuDNN and NCCL from a torch wheel's METADATA."""
    reqs = requirements(metadata)

    def first(prefix: str) -> str | None:
        for name, spec in reqs.items():
            if name.startswith(prefix) and _pinned(spec):
                return _pinned(spec)
        return None

    runtime = first("nvidia-cuda-runtime-cu") or first("cuda-toolkit")
    variant = None
    if runtime:
        major, minor = runtime.split(".")[:2]
        variant = f"cu{major}{minor}"
    return Pins(variant, runtime, first("nvidia-cudnn-cu"), first("nvidia-nccl-cu"))


def torch_pin(metadata: str) -> str | None:
    """The exact torch version a torchvision/torchaudio wheel requires (``torch==2.8.0``), else None."""
    spec = requirements(metadata).get("torch")
    pinned = _pinned(spec)
    return pinned.split("+")[0] if pinned else None


def arch_flags(library: bytes) -> tuple[list[str], list[str]]:
    """``sm_XX`` cubin targets and ``compute_XX`` PTX targets from the arch-flags text in libtorch_python.so
    (what ``torch._C._cuda_getArchFlags()`` returns); empty lists when the text is absent."""
    match = ARCH_FLAGS.search(library)
    if not match:
        return [], []
    flags = match.group(0).decode().split()
    by_cc = lambda f: int(f.split("_")[1])  # noqa: E731
    return (sorted({f for f in flags if f.startswith("sm_")}, key=by_cc),
            sorted({f for f in flags if f.startswith("compute_")}, key=by_cc))  # fmt: skip


def diff(
    kb: Mapping[str, Any],
    pypi: Sequence[PyPIRelease],
    companions: Mapping[str, Mapping[str, str]],
    since: str = "0",
) -> list[Change]:
    """Differences between torch.toml (``kb``) and PyPI. ``companions``: {"torchvision": {torch: version}}."""
    rows = {r["version"]: r for r in kb.get("release", [])}
    on_pypi = {r.version: r for r in pypi}
    changes: list[Change] = []
    for rel in sorted(pypi, key=lambda r: version_key(r.version)):
        row = rows.get(rel.version)
        if rel.yanked:
            changes.append(Change("yanked", rel.version))
        if row is None:
            if not rel.yanked:
                changes.append(Change("new-release", rel.version, on_pypi=rel.pins.cuda_variant or "cpu"))
            continue
        changes += _compare(row, rel, companions)
    for version in sorted(rows, key=version_key):
        if version not in on_pypi and version_key(version) >= version_key(since):
            changes.append(Change("not-on-pypi", version))
    return changes


def _compare(
    row: Mapping[str, Any], rel: PyPIRelease, companions: Mapping[str, Mapping[str, str]]
) -> list[Change]:
    out: list[Change] = []

    def check(field_name: str, in_file: Any, on_pypi: Any) -> None:
        if on_pypi is not None and in_file != on_pypi:
            out.append(Change("changed", rel.version, field_name, in_file, on_pypi))

    pypi_name = rel.pins.cuda_variant or "cpu"
    check("pypi_variant", row.get("pypi_variant"), pypi_name)
    check("released", row.get("released"), rel.released)
    check("python", list(row.get("python", [])), list(rel.python) or None)
    variant = next((v for v in row.get("variant", []) if v.get("name") == pypi_name), None)
    if variant is None:
        out.append(Change("changed", rel.version, f"variant {pypi_name}", None, "published on PyPI"))
    else:
        check(
            f"{pypi_name}.cuda",
            variant.get("cuda"),
            ".".join(rel.pins.cuda_runtime.split(".")[:2]) if rel.pins.cuda_runtime else None,
        )
        check(f"{pypi_name}.cudnn", variant.get("cudnn"), rel.pins.cudnn)
        check(f"{pypi_name}.nccl", variant.get("nccl"), rel.pins.nccl)
    for project, paired in companions.items():
        check(project, row.get(project), paired.get(rel.version))
    return out


def compare_arch(
    row: Mapping[str, Any], rel: PyPIRelease, flags: tuple[list[str], list[str]]
) -> list[Change]:
    """The PyPI variant's ``arch_list``/``ptx`` in torch.toml against the arch flags read from its wheel."""
    name = rel.pins.cuda_variant or "cpu"
    variant = next((v for v in row.get("variant", []) if v.get("name") == name), None)
    if variant is None or not flags[0]:
        return []
    out = []
    for key, read in (("arch_list", flags[0]), ("ptx", flags[1])):
        if list(variant.get(key, [])) != read:
            out.append(Change("changed", rel.version, f"{name}.{key}", list(variant.get(key, [])), read))
    return out


def skeleton(rel: PyPIRelease, arch: tuple[list[str], list[str]] | None, verified: str) -> str:
    """A ``[[release]]`` row for a new release, with its PyPI variant, marked for review."""
    q = json.dumps
    name = rel.pins.cuda_variant or "cpu"
    lines = [
        "",
        "[[release]]",
        f"version = {q(rel.version)}",
        f"released = {q(rel.released)}",
        f"python = {q(list(rel.python))}",
        f"pypi_variant = {q(name)}",
        'notes = "REVIEW: skeleton written by tools/refresh_torch_data.py from PyPI; add torchvision/torchaudio '
        'and the download.pytorch.org variants with their sources"',
        f"source = {q(f'https://pypi.org/project/torch/{rel.version}/')}",
        f"verified = {q(verified)}",
        "",
        "[[release.variant]]",
        f"name = {q(name)}",
    ]
    if rel.pins.cuda_runtime:
        lines.append(f"cuda = {q('.'.join(rel.pins.cuda_runtime.split('.')[:2]))}")
    lines.append(f"index_url = {q('https://download.pytorch.org/whl/' + name)}")
    if rel.pins.cuda_variant and arch and arch[0]:
        lines += [f"arch_list = {q(arch[0])}", f"ptx = {q(arch[1])}"]
    for key in ("cudnn", "nccl"):
        if getattr(rel.pins, key):
            lines.append(f"{key} = {q(getattr(rel.pins, key))}")
    lines += ['evidence = "wheel"', f"source = {q(rel.wheel.url)}", f"verified = {q(verified)}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- PyPI adapter
class Index(Protocol):
    def simple(self, project: str) -> Mapping[str, Any]: ...
    def metadata(self, wheel: WheelFile) -> str: ...
    def member(self, wheel: WheelFile, suffix: str) -> bytes: ...


class _RangeReader(io.RawIOBase):
    """A seekable file over HTTP range requests, so zipfile reads one member without the whole wheel."""

    def __init__(self, session: Any, url: str, size: int, timeout_s: float) -> None:
        self._session, self._url, self._size, self._timeout_s, self._pos = session, url, size, timeout_s, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: offset, 1: self._pos + offset, 2: self._size + offset}[whence]
        return self._pos

    def readinto(self, buffer: Any) -> int:
        end = min(self._pos + len(buffer), self._size)
        if end <= self._pos:
            return 0
        response = self._session.get(
            self._url, headers={"Range": f"bytes={self._pos}-{end - 1}"}, timeout=self._timeout_s
        )
        response.raise_for_status()
        data = response.content if response.status_code == 206 else response.content[self._pos : end]
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


class PyPIIndex:
    """PyPI's simple JSON API (PEP 691), PEP 658 metadata files, and range reads of wheels."""

    def __init__(self, base: str = PYPI, timeout_s: float = 60.0) -> None:
        import requests  # imported here: only the network path needs it

        self._session = requests.Session()
        self._base, self._timeout_s = base.rstrip("/"), timeout_s

    def simple(self, project: str) -> Mapping[str, Any]:
        response = self._session.get(
            f"{self._base}/simple/{project}/", headers={"Accept": SIMPLE_JSON}, timeout=self._timeout_s
        )
        response.raise_for_status()
        return response.json()

    def metadata(self, wheel: WheelFile) -> str:
        response = self._session.get(wheel.url + ".metadata", timeout=self._timeout_s)
        if response.status_code == 200 and response.content:
            return response.text
        return self.member(wheel, ".dist-info/METADATA").decode("utf-8")

    def member(self, wheel: WheelFile, suffix: str) -> bytes:
        reader = io.BufferedReader(
            _RangeReader(self._session, wheel.url, wheel.size_bytes, self._timeout_s), 1 << 20
        )
        with zipfile.ZipFile(reader) as archive:
            name = next((n for n in archive.namelist() if n.endswith(suffix)), None)
            if name is None:
                raise FileNotFoundError(f"{wheel.filename} has no member ending in {suffix}")
            return archive.read(name)


def fetch_releases(index: Index, since: str) -> list[PyPIRelease]:
    out = []
    for version, files in sorted(releases_in_index(index.simple("torch"), "torch", since).items()):
        wheel = linux_wheel(files)
        if wheel is None:
            continue
        out.append(
            PyPIRelease(
                version=version,
                released=min(f.uploaded for f in files)[:10],
                python=python_versions(files),
                wheel=wheel,
                pins=pins(index.metadata(wheel)),
                yanked=all(f.yanked for f in files),
            )
        )
    return out


def fetch_companions(index: Index, releases: Sequence[PyPIRelease]) -> dict[str, dict[str, str]]:
    """{"torchvision": {torch version: companion version}} from the companions' exact torch pins; companion
    releases uploaded before the oldest checked torch release are not read."""
    wanted = {r.version for r in releases}
    not_before = min((r.released for r in releases), default="")
    paired: dict[str, dict[str, str]] = {}
    for project in ("torchvision", "torchaudio"):
        paired[project] = {}
        grouped = releases_in_index(index.simple(project), project)
        for version, files in sorted(grouped.items(), key=lambda kv: version_key(kv[0])):
            if max(f.uploaded for f in files)[:10] < not_before:
                continue
            wheel = linux_wheel(files)
            pin = torch_pin(index.metadata(wheel)) if wheel else None
            if pin in wanted:
                paired[project][pin] = version  # later companion releases for the same torch win
    return paired


# ---------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="refresh_torch_data.py",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="exit status: 0 the file matches PyPI, 1 differences found, 2 usage or network error.",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--write", action="store_true", help="append skeleton rows for new releases (marked REVIEW)"
    )
    parser.add_argument("--since", default="2.0", help="oldest torch release to check (default 2.0)")
    parser.add_argument(
        "--check-arch",
        action="store_true",
        help="also read each PyPI CUDA wheel's arch flags (~10 MB of libtorch_python.so per release) and compare",
    )
    args = parser.parse_args(argv)
    if not re.match(r"^\d+(\.\d+){0,2}$", args.since):
        parser.error(f"--since takes a version like 2.8, not {args.since!r}")
    return args


def run(
    args: argparse.Namespace, index: Index, kb_path: Path = TORCH_TOML, today: str | None = None
) -> Report:
    """Check torch.toml at ``kb_path`` against ``index``; with ``--write`` append skeletons for new releases."""
    kb = tomllib.loads(kb_path.read_text(encoding="utf-8"))
    releases = fetch_releases(index, args.since)
    companions = fetch_companions(index, releases)
    report = Report(checked=[r.version for r in releases], changes=diff(kb, releases, companions, args.since))
    rows = {r["version"]: r for r in kb.get("release", [])}
    if args.check_arch:
        for rel in releases:
            if rel.pins.cuda_variant and rel.version in rows:
                flags = arch_flags(index.member(rel.wheel, "lib/libtorch_python.so"))
                report.changes += compare_arch(rows[rel.version], rel, flags)
    if args.write:
        new = {c.version for c in report.changes if c.kind == "new-release"}
        verified = today or datetime.date.today().isoformat()
        with kb_path.open("a", encoding="utf-8") as out:
            for rel in (r for r in releases if r.version in new):
                arch = (
                    arch_flags(index.member(rel.wheel, "lib/libtorch_python.so"))
                    if rel.pins.cuda_variant
                    else None
                )
                out.write(skeleton(rel, arch, verified))
                report.written.append(rel.version)
    return report


def main(argv: Sequence[str] | None = None, index: Index | None = None, kb_path: Path = TORCH_TOML) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        report = run(args, index or PyPIIndex(), kb_path)
    except OSError as exc:  # requests' errors are OSErrors
        print(
            f"refresh_torch_data: error: PyPI could not be read ({exc}); check the network or proxy",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render_text())
    return 1 if report.changes else 0


if __name__ == "__main__":
    sys.exit(main())
