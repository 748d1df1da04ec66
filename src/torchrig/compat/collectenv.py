"""Reading the text of PyTorch's ``python -m torch.utils.collect_env`` into the question ``check`` answers.

Users paste that report into issues. :func:`read_report` picks out of it what ``check --gpu --torch --driver
--platform --index`` would be given, and says which lines it read and what it inferred from them; the command
then answers exactly as it would with those options (``check --collect-env FILE``; options given on the command
line override the fields read).

Every format of the script's history is read (torch/utils/collect_env.py, v1.4 to v2.x, and the copy vLLM
ships): ``Key: value`` lines, with any padding before the colon (``PyTorch version              : 2.6.0``),
indented or quoted (``> ``) as pasted in an issue, CRLF line ends, a GPU list on the lines after
``GPU models and configuration:`` (``GPU 0: ...`` / ``GPU 1: ...``, ``nvidia-smi -L``'s), ``Could not collect``
/ ``No CUDA`` / ``N/A`` for what the script could not find. Which lines it uses:

- ``PyTorch version`` (else the ``[pip3] torch==X`` line), ``CUDA used to build PyTorch`` (a version without a
  ``+cuXYZ``/``+cpu`` tag gets the one this line makes certain), ``ROCM used to build PyTorch`` (a ROCm build is
  not judged);
- ``[conda] pytorch VERSION BUILD CHANNEL``: the channel ``pytorch`` (its build ``py3.10_cuda11.8_cudnn8.7.0_0``
  gives the CUDA: the same release and CUDA as download.pytorch.org's wheel) or ``conda-forge`` (its build
  ``cuda126_...`` gives the variant: ``--index conda-forge``);
- a version ``2.x.0a0+<hash>`` that is exactly one NGC container's torch (``data/wheel_sources.toml``): that
  container (``--index ngc``); an ``nvYY.MM`` tag is left to check, which knows NGC from Jetson by the platform;
- ``GPU models and configuration`` (each different GPU once), ``Nvidia driver version``;
- the platform from ``Python platform`` (``-microsoft-standard-WSL2`` is WSL, ``-tegra`` a Jetson,
  ``Windows-...`` Windows, ``-aarch64``), else ``OS`` (``Microsoft Windows ...``, ``... (aarch64)``), else the
  ``CPU:`` section's ``Architecture:``.

:func:`request` then puts the options given over what the report says (a field neither gives is a one-line
error naming the option to pass). Pure functions of the text (and torchrig's packaged data): nothing here
touches the host.

>>> r = read_report("PyTorch version: 2.7.0+cu128\\nOS: Ubuntu 22.04 LTS (x86_64)\\n"
...                 "GPU models and configuration: GPU 0: NVIDIA GeForce RTX 5090\\nNvidia driver version: 570.86.10\\n")
>>> (r.gpus, r.torch, r.driver, r.platform)
(('NVIDIA GeForce RTX 5090',), '2.7.0+cu128', '570.86.10', 'linux-x86_64')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torchrig.errors import InputError

# What the script prints where it found nothing (collect_env.py's replace_nones / 'No CUDA' / 'N/A').
_NOTHING = {"", "could not collect", "no cuda", "n/a", "none", "no relevant packages"}
# Labels, lower case, as the script prints them; vLLM's copy pads them before the colon.
_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9 _/()-]{0,60}?)\s*:\s?(.*)$")
_GPU_LINE = re.compile(r"^GPU\s+\d+\s*:\s*(.+?)\s*$")
_UUID = re.compile(r"\s*\((?:UUID|S/N)\s*:[^)]*\)")
_PIP_TORCH = re.compile(r"^\[(?:pip3?|conda)\]\s+torch\s*==\s*(\S+)\s*$")
_CONDA = re.compile(r"^\[conda\]\s+(\S+)\s+(\S+)\s+(\S+)(?:\s+(\S+))?\s*$")
_CONDA_PYTORCH_CUDA = re.compile(r"(?:^|_)cuda(\d+)\.(\d+)(?:\.\d+)*(?:_|$)")  # py3.10_cuda11.8_cudnn8.7.0_0
_CONDA_FORGE_CUDA = re.compile(r"^cuda(\d+?)(\d)(?:_|py|$)")  # cuda126_mkl_py312_..., cuda112py38h...
_CUDA_VERSION = re.compile(r"^(\d{1,2})\.(\d{1,2})")
_NGC_HASH = re.compile(r"^\d+\.\d+\.\d+a0\+[0-9a-f]{7,40}$")
_QUOTE = re.compile(r"^\s*(?:>\s?)+")
# The longest line worth reading: a report's lines are short; a longer one is not the script's.
MAX_LINE = 4096
TORCH_PACKAGES = ("pytorch", "torch", "libtorch", "pytorch-gpu")
# The order the fields read are listed in: the build first, as check's answer names it.
READ_ORDER = (
    "PyTorch version",
    "[pip] torch",
    "CUDA used to build PyTorch",
    "[conda]",
    "GPU models and configuration",
    "Nvidia driver version",
    "Python platform",
    "OS",
    "Architecture",
    "Is CUDA available",
)


@dataclass(frozen=True)
class Field:
    """One line of the report that was read: its label, its value as printed, and the option it stands for."""

    label: str
    value: str
    option: str | None = None  # "--torch", ... ; None: read, but only as evidence

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "value": self.value, "option": self.option}


@dataclass(frozen=True)
class Report:
    """What the report says ``check`` should be asked; None where it does not say."""

    gpus: tuple[str, ...] = ()
    torch: str | None = None
    driver: str | None = None
    platform: str | None = None
    index: str | None = None
    read: tuple[Field, ...] = ()
    inferred: tuple[str, ...] = ()
    missing: dict[str, str] = field(default_factory=dict)  # label -> why (as printed)

    def to_json(self) -> dict[str, Any]:
        return {
            "read": [f.to_json() for f in self.read],
            "inferred": list(self.inferred),
            "request": {
                "gpu": list(self.gpus),
                "torch": self.torch,
                "driver": self.driver,
                "platform": self.platform,
                "index": self.index,
            },
        }


def _lines(text: str) -> list[str]:
    """The report's lines: quote marks and indentation gone, CR ends gone, overlong lines dropped."""
    out = []
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if len(raw) > MAX_LINE:
            out.append("")
            continue
        out.append(_QUOTE.sub("", raw).strip())
    return out


def _fields(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """``label -> value`` (the first of each) and the GPU lines (those after the GPU label, up to a blank)."""
    found: dict[str, str] = {}
    gpu_lines: list[str] = []
    in_gpus = False
    for line in lines:
        if in_gpus:
            if _GPU_LINE.match(line) or line.startswith("MIG "):
                gpu_lines.append(line)
                continue
            if not line:
                in_gpus = not gpu_lines  # the blank the script prints before a list of several GPUs
                continue
            in_gpus = False
        m = _KEY.match(line)
        if not m:
            continue
        label, value = " ".join(m.group(1).lower().split()), m.group(2).strip()
        if label == "gpu models and configuration":
            in_gpus = True
            if value:
                gpu_lines.append(value)
                in_gpus = _GPU_LINE.match(value) is not None  # a GPU on the same line: more may follow
            continue
        found.setdefault(label, value)
    return found, gpu_lines


def _nothing(value: str | None) -> bool:
    return value is None or value.strip().lower() in _NOTHING


def _gpus(gpu_lines: list[str]) -> list[str]:
    names: list[str] = []
    for line in gpu_lines:
        if line.startswith("MIG ") or _nothing(line):
            continue
        m = _GPU_LINE.match(line)
        name = _UUID.sub("", m.group(1) if m else line).strip()
        if name and not _nothing(name) and name not in names:
            names.append(name)
    return names


def _platform(found: dict[str, str]) -> tuple[str | None, Field | None, str | None]:
    """(platform id, the field it came from, a note when it is not certain) or Nones."""
    py = found.get("python platform", "")
    low = py.lower()
    if py and not _nothing(py):
        if low.startswith("windows"):
            return "windows", Field("Python platform", py, "--platform"), None
        if low.startswith(("macos", "darwin")):
            return "macos", Field("Python platform", py, "--platform"), None
        if "microsoft" in low or "wsl" in low:
            return "wsl", Field("Python platform", py, "--platform"), None
        if "tegra" in low:
            return "jetson", Field("Python platform", py, "--platform"), None
        if "aarch64" in low or "arm64" in low:
            return "linux-aarch64", Field("Python platform", py, "--platform"), None
        if "x86_64" in low or "amd64" in low:
            return "linux-x86_64", Field("Python platform", py, "--platform"), None
    os_line = found.get("os", "")
    low = os_line.lower()
    if os_line and not _nothing(os_line):
        if "windows" in low:
            return "windows", Field("OS", os_line, "--platform"), None
        if "mac" in low or "darwin" in low:
            return "macos", Field("OS", os_line, "--platform"), None
        if "aarch64" in low or "arm64" in low:
            return "linux-aarch64", Field("OS", os_line, "--platform"), None
        if "x86_64" in low:
            return "linux-x86_64", Field("OS", os_line, "--platform"), None
    arch = found.get("architecture", "")
    if arch in ("aarch64", "x86_64"):
        return f"linux-{arch}", Field("Architecture", arch, "--platform"), None
    if os_line and not _nothing(os_line):
        # collect_env before 1.7 printed a Linux distribution without the machine
        return (
            "linux-x86_64",
            Field("OS", os_line, "--platform"),
            f"the report names {os_line!r} without the machine (collect_env before 1.7 did not print it): "
            "judged as linux-x86_64",
        )
    return None, None, None


def _conda_torch(lines: list[str], release: str | None) -> tuple[str, str, str, str] | None:
    """(package, version, build, channel) of the ``[conda]`` line of torch (of ``release`` when known)."""
    for line in lines:
        m = _CONDA.match(line)
        if not m or m.group(1).lower() not in TORCH_PACKAGES:
            continue
        package, version, build, channel = m.group(1), m.group(2), m.group(3), (m.group(4) or "")
        if release is not None and _release(version) != release:
            continue
        return package, version, build, channel
    return None


def _release(text: str) -> str | None:
    """The release line ``X.Y.Z`` of a version as torch prints it; None: not a version."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(text.strip())
    except InvalidVersion:
        return None
    return ".".join(str(p) for p in (*v.release, 0, 0)[:3])


def _cuda_tag(cuda: str) -> str | None:
    m = _CUDA_VERSION.match(cuda.strip())
    return f"cu{int(m.group(1))}{int(m.group(2))}" if m else None


@dataclass
class _Reading:
    read: list[Field] = field(default_factory=list)
    inferred: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)


def read_report(text: str) -> Report:
    """What the collect_env report ``text`` says: the GPUs, torch build, driver, platform and wheel source,
    each with the line it came from; what it does not say is in ``missing`` (label -> the value printed)."""
    lines = _lines(text)
    found, gpu_lines = _fields(lines)
    r = _Reading()
    platform, pfield, pnote = _platform(found)
    if pfield:
        r.read.append(pfield)
        if pnote:
            r.inferred.append(pnote)
    else:
        r.missing["OS"] = found.get("os", "absent") or "absent"
    gpus = _gpus(gpu_lines)
    if gpus:
        r.read.append(Field("GPU models and configuration", "; ".join(gpus), "--gpu"))
    else:
        said = " ".join(gpu_lines) or found.get("gpu models and configuration", "")
        r.missing["GPU models and configuration"] = said or "absent"
    driver = found.get("nvidia driver version")
    if _nothing(driver):
        driver = None
    else:
        r.read.append(Field("Nvidia driver version", driver or "", "--driver"))
    available = found.get("is cuda available")
    if available and not _nothing(available):
        r.read.append(Field("Is CUDA available", available))
    torch, index = _torch(found, lines, platform, r)
    read = sorted(
        r.read, key=lambda f: READ_ORDER.index(f.label) if f.label in READ_ORDER else len(READ_ORDER)
    )
    return Report(
        tuple(gpus), torch, driver, platform, index, tuple(read), tuple(r.inferred), dict(r.missing)
    )


def _torch(
    found: dict[str, str], lines: list[str], platform: str | None, r: _Reading
) -> tuple[str | None, str | None]:
    """The ``--torch`` and ``--index`` the report makes certain."""
    version = found.get("pytorch version")
    label = "PyTorch version"
    if _nothing(version):
        pip = next((m.group(1) for m in map(_PIP_TORCH.match, lines) if m), None)
        if pip is None:
            r.missing["PyTorch version"] = version or "absent"
            return None, None
        version, label = pip, "[pip] torch"
    assert version is not None
    rocm = found.get("rocm used to build pytorch")
    if not _nothing(rocm) or "+rocm" in version.lower():
        raise InputError(
            f"the report is of a ROCm build of torch ({version}, ROCM used to build PyTorch: {rocm})",
            hint="torchrig judges NVIDIA CUDA builds; pass --torch to ask about one",
        )
    r.read.append(Field(label, version, "--torch"))
    cuda = found.get("cuda used to build pytorch")
    if cuda is not None and cuda.strip().lower() != "n/a":
        r.read.append(Field("CUDA used to build PyTorch", cuda))
    release = _release(version)
    if release is None:
        return version, None  # check says what is wrong with it
    conda = _conda_torch(lines, release)
    if conda is not None:
        sourced = _from_conda(version, release, conda, r)
        if sourced is not None:
            return sourced
    if _NGC_HASH.match(version) and platform != "jetson":
        ngc = _ngc_container(version)
        if ngc is not None:
            r.inferred.append(
                f"torch {version} is the torch of NGC container {ngc} (nvcr.io/nvidia/pytorch:{ngc}-py3): --index ngc"
            )
            return version, "ngc"
        r.inferred.append(
            f"torch {version} is a pre-release build (a0+<hash>) whose hash no NGC container in torchrig's data "
            "carries: check judges it as its release line; pass --index if you know where it came from"
        )
    if "+" in version or platform == "jetson":
        return version, None  # tagged (+cu128, +cpu, nvYY.MM, a0+hash) or a Jetson's bare version: as printed
    if _nothing(cuda):
        if cuda is None:
            return version, None
        r.inferred.append(f"CUDA used to build PyTorch: {cuda}: a CPU build, --torch {version}+cpu")
        return f"{version}+cpu", None
    tag = _cuda_tag(cuda or "")
    if tag is None:
        return version, None
    r.inferred.append(f"torch {version} built with CUDA {cuda}: --torch {version}+{tag}")
    return f"{version}+{tag}", None


def _from_conda(
    version: str, release: str, conda: tuple[str, str, str, str], r: _Reading
) -> tuple[str, str | None] | None:
    """The torch and index a ``[conda]`` line of the pytorch channel or conda-forge makes certain."""
    package, cversion, build, channel = conda
    r.read.append(Field("[conda]", f"{package} {cversion} {build} {channel}".strip()))
    chan = channel.lower()
    base = version.split("+", 1)[0]
    if chan in ("pytorch", "pytorch-nightly", "pytorch-test"):
        m = _CONDA_PYTORCH_CUDA.search(build)
        if m:
            tag = f"cu{int(m.group(1))}{int(m.group(2))}"
            r.inferred.append(
                f"the pytorch conda channel's build {build}: torch {release} for CUDA {m.group(1)}.{m.group(2)}, "
                f"the release and CUDA of download.pytorch.org's {base}+{tag} (--torch {base}+{tag})"
            )
            return f"{base}+{tag}", None
        if "cpu" in build.lower():
            r.inferred.append(f"the pytorch conda channel's CPU build {build}: --torch {base}+cpu")
            return f"{base}+cpu", None
        return None
    if chan == "conda-forge":
        m = _CONDA_FORGE_CUDA.match(build.lower())
        if m:
            tag = f"cu{int(m.group(1))}{m.group(2)}"
            r.inferred.append(
                f"conda-forge's build {build} (CUDA {int(m.group(1))}.{m.group(2)}): --torch {base}+{tag} "
                "--index conda-forge"
            )
            return f"{base}+{tag}", "conda-forge"
        if build.lower().startswith("cpu"):
            r.inferred.append(f"conda-forge's CPU build {build}: --torch {base}+cpu")
            return f"{base}+cpu", None
    return None


def _ngc_container(version: str) -> str | None:
    """The NGC container whose torch is exactly ``version``, when exactly one is (the data's rows)."""
    from torchrig.compat.channels import load_containers

    hits = [c.release for c in load_containers() if c.torch == version]
    return hits[0] if len(hits) == 1 else None


@dataclass(frozen=True)
class CheckRequest:
    """The question ``check`` answers, as its options give it (None / empty: not given)."""

    gpus: tuple[str, ...] = ()
    torch: str | None = None
    driver: str | None = None
    platform: str | None = None
    index: str | None = None


OPTION_OF = {
    "PyTorch version": "--torch",
    "GPU models and configuration": "--gpu",
    "OS": "--platform",
}


def request(report: Report, given: CheckRequest) -> tuple[CheckRequest, tuple[str, ...]]:
    """The request ``check`` answers: each option ``given`` as it is, the rest from the report; and the options
    given over a field the report has. The wheel source inferred from the report's torch lines goes with them:
    not with another ``--torch``. A field neither gives is an InputError naming the option to pass."""
    said = {f.option for f in report.read if f.option} | ({"--index"} if report.index else set())
    gave = {
        "--gpu": bool(given.gpus),
        "--torch": given.torch is not None,
        "--driver": given.driver is not None,
        "--platform": given.platform is not None,
        "--index": given.index is not None,
    }
    overridden = tuple(opt for opt, g in gave.items() if g and opt in said)
    asked = CheckRequest(
        gpus=given.gpus or report.gpus,
        torch=given.torch if given.torch is not None else report.torch,
        driver=given.driver if given.driver is not None else report.driver,
        platform=given.platform if given.platform is not None else report.platform,
        index=given.index if given.index is not None or given.torch is not None else report.index,
    )
    needed = [
        label
        for label, have in (
            ("PyTorch version", asked.torch),
            ("GPU models and configuration", asked.gpus),
            ("OS", asked.platform),
        )
        if not have
    ]
    if needed:
        raise missing_error(report, needed)
    if asked.platform == "macos":
        where = next((f.value for f in report.read if f.option == "--platform"), "")
        raise InputError(
            f"the collect_env report is from macOS ({where}): NVIDIA's CUDA builds of torch are not made for it",
            hint="pass --platform to ask about another platform",
        )
    return asked, overridden


def missing_error(report: Report, needed: list[str]) -> InputError:
    """The one-line error for the fields the request still lacks (``needed``: labels of :data:`OPTION_OF`)."""
    parts = [f"{label} ({report.missing.get(label, 'absent')})" for label in needed]
    options = " and ".join(
        f"{OPTION_OF[label]} {'NAME' if label != 'PyTorch version' else 'VERSION'}" for label in needed
    )
    options = options.replace("--platform NAME", "--platform PLATFORM")
    return InputError(
        f"the collect_env report does not give {', '.join(parts)}", hint=f"pass {options} to ask check"
    )
