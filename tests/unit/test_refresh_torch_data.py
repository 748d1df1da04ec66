"""tools/refresh_torch_data.py: the PyPI diff against recorded PyPI answers, and its HTTP adapter against a
local server that answers range requests the way files.pythonhosted.org does.

Fixtures in tests/fixtures/pypi/ were recorded from pypi.org on 2026-11-30: the simple-index JSON (PEP 691)
for torch 2.0.1/2.8.0/2.9.1/2.15.0 and their torchvision/torchaudio companions, trimmed to the fields the
tool reads; each release's METADATA (header and Requires-Dist lines); and the arch-flags text of the
torch 2.8.0 (cu128) wheel's libtorch_python.so.
"""

from __future__ import annotations

import copy
import http.server
import importlib.util
import io
import json
import os
import sys
import threading
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPI_FIXTURES = ROOT / "tests" / "fixtures" / "pypi"
TORCH_TOML = ROOT / "src" / "torchrig" / "data" / "torch.toml"
SIMPLE = {
    "torch": "simple-torch-2.0.1-2.8.0-2.9.1-2.15.0.json",
    "torchvision": "simple-torchvision-0.15.2-0.23.0-0.24.1-0.29.2.json",
    "torchaudio": "simple-torchaudio-2.0.2-2.8.0-2.9.1-2.11.1.json",
}


def _load_tool():
    spec = importlib.util.spec_from_file_location(
        "refresh_torch_data", ROOT / "tools" / "refresh_torch_data.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


R = _load_tool()

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class RecordedIndex:
    """The PyPI boundary answered from recorded files (tests/fixtures/pypi)."""

    def __init__(self) -> None:
        self.members_read: list[str] = []

    def simple(self, project: str) -> Mapping[str, Any]:
        return json.loads((PYPI_FIXTURES / SIMPLE[project]).read_text())

    def metadata(self, wheel: Any) -> str:
        project, version = wheel.filename.split("-")[:2]
        return (PYPI_FIXTURES / f"{project}-{version}.METADATA").read_text()

    def member(self, wheel: Any, suffix: str) -> bytes:
        self.members_read.append(wheel.filename)
        assert suffix == "lib/libtorch_python.so"
        version = wheel.filename.split("-")[1]
        (recorded,) = PYPI_FIXTURES.glob(f"libtorch_python-{version}-*-archflags.bin")
        return recorded.read_bytes()


def _kb(*versions: str) -> dict[str, Any]:
    """The real torch.toml, cut down to ``versions``."""
    kb = tomllib.loads(TORCH_TOML.read_text())
    kb["release"] = [r for r in kb["release"] if r["version"] in versions]
    assert {r["version"] for r in kb["release"]} == set(versions)
    return kb


def _write_kb(path: Path, kb: Mapping[str, Any]) -> Path:
    """Write a cut-down torch.toml (JSON-quoted strings are valid TOML basic strings)."""
    q = json.dumps
    lines = ["schema_version = 1", ""]
    for release in kb["release"]:
        lines.append("[[release]]")
        lines += [f"{k} = {q(v)}" for k, v in release.items() if k != "variant"]
        for variant in release["variant"]:
            lines += ["", "[[release.variant]]", *(f"{k} = {q(v)}" for k, v in variant.items())]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def _fetch(since: str = "2.0"):
    index = RecordedIndex()
    releases = R.fetch_releases(index, since)
    return releases, R.fetch_companions(index, releases)


# ---------------------------------------------------------------------------------------------- parsing
def test_pins_read_the_old_parenthesised_requires_dist_format():
    pins = R.pins((PYPI_FIXTURES / "torch-2.0.1.METADATA").read_text())
    assert pins == R.Pins("cu117", "11.7.99", "8.5.0.96", "2.14.3")


def test_pins_read_the_cuda_12_wheel_format():
    pins = R.pins((PYPI_FIXTURES / "torch-2.8.0.METADATA").read_text())
    assert pins == R.Pins("cu128", "12.8.90", "9.10.2.21", "2.27.3")


def test_pins_read_the_cuda_toolkit_meta_package_of_cuda_13_wheels():
    pins = R.pins((PYPI_FIXTURES / "torch-2.15.0.METADATA").read_text())
    assert pins == R.Pins("cu132", "13.2.2", "9.26.0.51", "2.30.7")


def test_pins_of_a_cpu_wheel_are_empty():
    metadata = "Name: torch\nVersion: 2.8.0\nRequires-Dist: filelock\nRequires-Dist: sympy>=1.13.3\n"
    assert R.pins(metadata) == R.Pins(None, None, None, None)


def test_extras_only_requirements_are_ignored():
    metadata = 'Requires-Dist: nvidia-nccl-cu12==2.99.1; extra == "nccl"\nRequires-Dist: jinja2\n'
    assert R.requirements(metadata) == {"jinja2": ""}


@pytest.mark.parametrize(
    ("fixture", "pin"),
    [
        ("torchvision-0.15.2.METADATA", "2.0.1"),  # "torch (==2.0.1)"
        ("torchvision-0.23.0.METADATA", "2.8.0"),
        ("torchaudio-2.9.1.METADATA", "2.9.1"),  # "torch==2.9.1"
        ("torchvision-0.29.2.METADATA", None),  # "torch (>=2.14.0)": not a pairing
        ("torchaudio-2.11.1.METADATA", None),  # "torch>=2.11"
    ],
)
def test_companion_torch_pin(fixture: str, pin: str | None):
    assert R.torch_pin((PYPI_FIXTURES / fixture).read_text()) == pin


def test_torch_pin_drops_a_local_version():
    assert R.torch_pin("Requires-Dist: torch (==2.0.0+cu117)\n") == "2.0.0"


def test_arch_flags_read_from_the_recorded_libtorch_python_text():
    data = (PYPI_FIXTURES / "libtorch_python-2.8.0-cu128-archflags.bin").read_bytes()
    assert R.arch_flags(data) == (["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], [])


def test_arch_flags_split_cubins_from_ptx_and_tolerate_absence():
    assert R.arch_flags(b"\x00sm_90 sm_100 sm_120 compute_120\x00") == (
        ["sm_90", "sm_100", "sm_120"],
        ["compute_120"],
    )
    assert R.arch_flags(b"no cuda here sm_90") == ([], [])


def test_index_grouping_keeps_final_releases_and_linux_python_tags():
    doc = json.loads((PYPI_FIXTURES / SIMPLE["torch"]).read_text())
    grouped = R.releases_in_index(doc, "torch", since="2.8")
    assert sorted(grouped, key=R.version_key) == ["2.8.0", "2.9.1", "2.15.0"]
    assert R.python_versions(grouped["2.9.1"]) == ("3.10", "3.11", "3.12", "3.13", "3.14")
    assert R.python_versions(grouped["2.15.0"]) == ("3.11", "3.12", "3.13", "3.14", "3.15")
    wheel = R.linux_wheel(grouped["2.8.0"])
    assert wheel is not None and wheel.filename == "torch-2.8.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    rebuilt = [
        R.WheelFile(f"torch-2.10.0-{tag}cp311-cp311-manylinux_2_28_x86_64.whl", "u", 1, "")
        for tag in ("", "3-")
    ]
    assert R.linux_wheel(rebuilt) == rebuilt[1]  # the re-uploaded build (build tag 3) wins
    pre = {"files": [{"filename": "torch-2.16.0rc1-cp311-cp311-manylinux_2_28_x86_64.whl", "url": "u"}]}
    assert R.releases_in_index(pre, "torch") == {}


def test_fetch_pairs_companions_by_their_exact_torch_pin():
    releases, companions = _fetch()
    assert [r.version for r in releases] == ["2.0.1", "2.15.0", "2.8.0", "2.9.1"]
    assert companions["torchvision"] == {"2.0.1": "0.15.2", "2.8.0": "0.23.0", "2.9.1": "0.24.1"}
    assert companions["torchaudio"] == {"2.0.1": "2.0.2", "2.8.0": "2.8.0", "2.9.1": "2.9.1"}
    by_version = {r.version: r for r in releases}
    assert by_version["2.8.0"].released == "2025-08-06"
    assert by_version["2.8.0"].pins.cuda_variant == "cu128"


# ---------------------------------------------------------------------------------------------- diff
def test_the_shipped_torch_toml_matches_the_recorded_pypi_answers():
    releases, companions = _fetch()
    kb = _kb("2.0.1", "2.8.0", "2.9.1", "2.15.0")
    assert R.diff(kb, releases, companions) == []


def test_a_release_missing_from_the_file_is_reported_new():
    releases, companions = _fetch()
    changes = R.diff(_kb("2.0.1", "2.8.0", "2.9.1"), releases, companions)
    assert changes == [R.Change("new-release", "2.15.0", on_pypi="cu132")]
    assert changes[0].render() == "2.15.0: new release on PyPI (cu132)"


def test_changed_pins_python_tags_and_companions_are_reported():
    releases, companions = _fetch()
    kb = copy.deepcopy(_kb("2.0.1", "2.8.0", "2.9.1", "2.15.0"))
    rows = {r["version"]: r for r in kb["release"]}
    cu128 = next(v for v in rows["2.8.0"]["variant"] if v["name"] == "cu128")
    cu128["cudnn"] = "9.8.0.87"
    rows["2.9.1"]["python"] = ["3.10", "3.11", "3.12", "3.13"]
    rows["2.9.1"]["torchvision"] = "0.24.0"
    rows["2.0.1"]["pypi_variant"] = "cu118"
    changes = {(c.version, c.field): c for c in R.diff(kb, releases, companions)}
    assert changes[("2.8.0", "cu128.cudnn")].on_pypi == "9.10.2.21"
    assert changes[("2.9.1", "python")].on_pypi == ["3.10", "3.11", "3.12", "3.13", "3.14"]
    assert changes[("2.9.1", "torchvision")].on_pypi == "0.24.1"
    assert (
        changes[("2.0.1", "pypi_variant")].render()
        == "2.0.1: pypi_variant: torch.toml has 'cu118', PyPI says 'cu117'"
    )
    assert len(changes) == 4


def test_a_release_the_file_lists_but_pypi_does_not_is_reported():
    releases, companions = _fetch(since="2.8")
    kb = _kb("2.8.0", "2.9.1", "2.15.0", "2.7.1")
    changes = R.diff(kb, releases, companions, since="2.7")
    assert R.Change("not-on-pypi", "2.7.1") in changes


def test_arch_lists_are_compared_with_the_wheel():
    releases, _ = _fetch()
    rel = next(r for r in releases if r.version == "2.8.0")
    flags = R.arch_flags((PYPI_FIXTURES / "libtorch_python-2.8.0-cu128-archflags.bin").read_bytes())
    row = copy.deepcopy(_kb("2.8.0")["release"][0])
    assert R.compare_arch(row, rel, flags) == []
    next(v for v in row["variant"] if v["name"] == "cu128")["arch_list"].remove("sm_70")
    (change,) = R.compare_arch(row, rel, flags)
    assert change.field == "cu128.arch_list" and "sm_70" in change.on_pypi


# ---------------------------------------------------------------------------------------------- CLI
def test_main_reports_json_and_exits_1_on_differences(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    kb_path = _write_kb(tmp_path / "torch.toml", _kb("2.0.1", "2.8.0", "2.9.1"))
    code = R.main(["--json"], index=RecordedIndex(), kb_path=kb_path)
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["schema_version"] == 1
    assert report["checked"] == ["2.0.1", "2.15.0", "2.8.0", "2.9.1"]
    assert report["changes"] == [
        {"kind": "new-release", "version": "2.15.0", "field": "", "in_file": None, "on_pypi": "cu132"}
    ]


def test_main_exits_0_when_the_file_matches(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    kb_path = _write_kb(tmp_path / "torch.toml", _kb("2.0.1", "2.8.0", "2.9.1", "2.15.0"))
    assert R.main(["--check-arch"], index=RecordedIndex(), kb_path=kb_path) == 0
    assert "no differences" in capsys.readouterr().out


def test_write_appends_a_review_skeleton_with_the_wheels_facts(tmp_path: Path):
    kb_path = _write_kb(tmp_path / "torch.toml", _kb("2.0.1", "2.9.1", "2.15.0"))
    index = RecordedIndex()
    report = R.run(R.parse_args(["--write"]), index, kb_path, today="2026-11-30")
    assert report.written == ["2.8.0"] and index.members_read == [
        "torch-2.8.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    ]
    written = next(r for r in tomllib.loads(kb_path.read_text())["release"] if r["version"] == "2.8.0")
    assert written["notes"].startswith("REVIEW:")
    assert (written["pypi_variant"], written["released"], written["verified"]) == (
        "cu128",
        "2025-08-06",
        "2026-11-30",
    )
    (variant,) = written["variant"]
    expected = {
        "name": "cu128",
        "cuda": "12.8",
        "index_url": "https://download.pytorch.org/whl/cu128",
        "arch_list": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
        "ptx": [],
        "cudnn": "9.10.2.21",
        "nccl": "2.27.3",
        "evidence": "wheel",
    }
    assert {k: variant[k] for k in expected} == expected
    assert variant["source"].endswith("/torch-2.8.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    # Running again finds the release in the file: nothing new to write.
    again = R.run(R.parse_args(["--write"]), RecordedIndex(), kb_path, today="2026-11-30")
    assert again.written == [] and not [c for c in again.changes if c.kind == "new-release"]


def test_bad_since_is_a_usage_error(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exc:
        R.parse_args(["--since", "latest"])
    assert exc.value.code == 2
    assert "--since takes a version like 2.8" in capsys.readouterr().err


class _Unreachable(RecordedIndex):
    def simple(self, project: str) -> Mapping[str, Any]:
        raise ConnectionError("Name or service not known")


def test_network_failure_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]):
    assert R.main([], index=_Unreachable()) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("refresh_torch_data: error: PyPI could not be read") and "\n" not in err


# ---------------------------------------------------------------------------------------------- HTTP adapter
class _WheelHost(http.server.BaseHTTPRequestHandler):
    """Serves /simple/torch/ and wheels with Range support; .metadata files only when present."""

    files: ClassVar[dict[str, bytes]] = {}
    ranges: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        body = self.files.get(self.path)
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status, chunk = 200, body
        header = self.headers.get("Range")
        if header:
            self.ranges.append(header)
            start, end = (int(x) for x in header.removeprefix("bytes=").split("-"))
            status, chunk = 206, body[start : end + 1]
        self.send_response(status)
        self.send_header("Content-Length", str(len(chunk)))
        self.end_headers()
        self.wfile.write(chunk)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def wheel_host() -> Iterator[str]:
    metadata = (PYPI_FIXTURES / "torch-2.8.0.METADATA").read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr("torch/__init__.py", "")
        # 4 MB that does not compress, ahead of the members read: only ranges of the wheel may be fetched.
        wheel.writestr("torch/lib/libtorch_cpu.so", os.urandom(4 << 20), compress_type=zipfile.ZIP_STORED)
        wheel.writestr(
            "torch/lib/libtorch_python.so",
            (PYPI_FIXTURES / "libtorch_python-2.8.0-cu128-archflags.bin").read_bytes() * 50,
        )
        wheel.writestr("torch-2.8.0.dist-info/METADATA", metadata)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WheelHost)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    name = "torch-2.8.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    _WheelHost.files = {
        "/simple/torch/": json.dumps(
            {
                "files": [
                    {
                        "filename": name,
                        "url": f"{base}/files/{name}",
                        "size": len(buffer.getvalue()),
                        "upload-time": "2025-08-06T14:55:05Z",
                    }
                ]
            }
        ).encode(),
        f"/files/{name}": buffer.getvalue(),
    }
    _WheelHost.ranges = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield base
    finally:
        server.shutdown()
        server.server_close()


def test_adapter_reads_metadata_and_members_with_range_requests(wheel_host: str):
    index = R.PyPIIndex(base=wheel_host, timeout_s=10)
    (release,) = R.fetch_releases(index, "2.0")  # no .metadata file: METADATA comes out of the zip
    assert release.pins == R.Pins("cu128", "12.8.90", "9.10.2.21", "2.27.3")
    assert R.arch_flags(index.member(release.wheel, "lib/libtorch_python.so"))[0][-1] == "sm_120"
    assert _WheelHost.ranges, "the wheel must be read by range requests"
    served = sum(int(r.split("-")[1]) - int(r.split("=")[1].split("-")[0]) + 1 for r in _WheelHost.ranges)
    assert served < len(_WheelHost.files[release.wheel.url.removeprefix(wheel_host)]) / 2


def test_adapter_prefers_the_pep_658_metadata_file(wheel_host: str):
    index = R.PyPIIndex(base=wheel_host, timeout_s=10)
    doc = index.simple("torch")
    wheel = R.linux_wheel(R.releases_in_index(doc, "torch")["2.8.0"])
    assert wheel is not None
    _WheelHost.files[wheel.url.removeprefix(wheel_host) + ".metadata"] = (
        b"Requires-Dist: nvidia-nccl-cu12==2.27.3\n"
    )
    assert index.metadata(wheel) == "Requires-Dist: nvidia-nccl-cu12==2.27.3\n"
    assert _WheelHost.ranges == []


def test_adapter_turns_http_errors_into_the_network_error_path(wheel_host: str, tmp_path: Path, capsys):
    index = R.PyPIIndex(base=wheel_host + "/nowhere", timeout_s=10)
    assert R.main([], index=index, kb_path=_write_kb(tmp_path / "torch.toml", _kb("2.8.0"))) == 2
    assert "404" in capsys.readouterr().err
