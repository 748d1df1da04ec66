"""A small strict parser for the versions torchrig compares: drivers, CUDA, torch builds, compute capabilities.

Malformed text is a :class:`~torchrig.errors.UsageError` (exit 2) whose one line says what the form should be.
Whether a well-formed version names something that exists (a torch release, a variant) is the knowledge
base's job (``torchrig.compat.kb``), which raises :class:`~torchrig.errors.InputError` with the closest
valid choices.

>>> parse_driver("535.104.05")
(535, 104, 5)
>>> parse_torch_build("2.8.0+cu126")
('2.8.0', 'cu126')
>>> parse_arch("sm_90a")
Arch(kind='sm', major=9, minor=0, suffix='a')
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchrig.errors import UsageError

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

_NUM = r"(?:0|[1-9]\d*)"
# the grammars of a driver version, a release and a Python version; the image spec checks its keys with them too
DRIVER_RE = re.compile(r"\d{2,4}(?:\.\d{1,3}){0,2}")
_CUDA_RE = re.compile(rf"{_NUM}\.{_NUM}(?:\.{_NUM})?")
RELEASE_RE = re.compile(rf"{_NUM}\.{_NUM}(?:\.{_NUM})?")
_VARIANT_RE = re.compile(r"cpu|cu\d{2,4}|rocm\d+(?:\.\d+){0,2}|xpu")
_CC_RE = re.compile(r"(\d{1,2})\.(\d)")
_ARCH_RE = re.compile(r"(sm|compute)_(\d{1,2})(\d)([af]?)")
PYTHON_RE = re.compile(r"3\.\d{1,2}")
_SPEC_RE = re.compile(r"(~=|==|!=|<=|>=|<|>)?\s*(\d+(?:\.\d+){0,2})(\.\*)?")


def _strict(text: object, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"empty {what}")
    return text.strip()


def parse_driver(text: str) -> tuple[int, ...]:
    """An NVIDIA driver version ``BRANCH[.MINOR[.PATCH]]`` as a tuple of ints (``"535.104.05"`` -> ``(535, 104, 5)``)."""
    t = _strict(text, "driver version")
    if not DRIVER_RE.fullmatch(t):
        raise UsageError(
            f"malformed driver version {t!r}", hint="expected e.g. 535.104.05 or 570.86 (nvidia-smi shows it)"
        )
    return tuple(int(p) for p in t.split("."))


def driver_branch(text: str) -> str:
    """The driver branch of a version: ``"570.86.10"`` -> ``"570"``."""
    return str(parse_driver(text)[0])


def parse_cuda(text: str) -> tuple[int, ...]:
    """A CUDA version ``MAJOR.MINOR[.PATCH]`` (``"12.8"`` -> ``(12, 8)``)."""
    t = _strict(text, "CUDA version")
    if not _CUDA_RE.fullmatch(t):
        raise UsageError(f"malformed CUDA version {t!r}", hint="expected MAJOR.MINOR, e.g. 12.8")
    return tuple(int(p) for p in t.split("."))


def cuda_major_minor(text: str) -> str:
    """``"12.8.1"`` -> ``"12.8"``."""
    parts = parse_cuda(text)
    return f"{parts[0]}.{parts[1]}"


def parse_release(text: str) -> tuple[int, ...]:
    """A torch release ``MAJOR.MINOR[.PATCH]`` as a tuple of ints; a missing patch counts as 0."""
    t = _strict(text, "torch version")
    if not RELEASE_RE.fullmatch(t):
        raise UsageError(
            f"malformed torch version {t!r}", hint="expected e.g. 2.8.0, 2.8.0+cu126 or 2.8.0+cpu"
        )
    parts = tuple(int(p) for p in t.split("."))
    return parts + (0,) * (3 - len(parts))


def normalise_release(text: str) -> str:
    """``"2.8"`` -> ``"2.8.0"`` (torch publishes every release with three parts)."""
    return ".".join(str(p) for p in parse_release(text))


def parse_torch_build(text: str) -> tuple[str, str | None]:
    """``"2.8.0+cu126"`` -> ``("2.8.0", "cu126")``; ``"2.8.0"`` -> ``("2.8.0", None)`` (the PyPI build).

    A leading ``torch==`` is accepted. The local part must look like a PyTorch variant (``cpu``, ``cuXYZ``,
    ``rocmX.Y``, ``xpu``); whether that variant was published is checked against the knowledge base.
    """
    t = _strict(text, "torch version")
    t = t.removeprefix("torch==").removeprefix("torch ")
    release, plus, local = t.partition("+")
    if plus and not _VARIANT_RE.fullmatch(local.lower()):
        raise UsageError(
            f"malformed torch build {t!r}: {local!r} is not a variant",
            hint="expected VERSION, VERSION+cuXYZ or VERSION+cpu, e.g. 2.8.0+cu126",
        )
    return normalise_release(release), (local.lower() if plus else None)


_PLAIN_BUILD_RE = re.compile(r"[0-9.]+(\+[A-Za-z0-9.]+)?")


@dataclass(frozen=True)
class TorchBuildText:
    """A torch version as users paste it: the release line, the variant, and the pre-release it named."""

    release: str  # "2.10.0"
    variant: str | None  # "cu128"; None: the PyPI build
    prerelease: str | None = None  # "2.10.0.dev20250915" for a nightly, "2.11.0rc1", "2.11.0a0"


def pep440_torch(t: str, examples: str, plain: str) -> Any:
    """``t`` read by ``packaging.version`` as a torch version: no epoch, at most MAJOR.MINOR.PATCH before its
    pre-release, dev or local parts. Malformed: a one-line :class:`UsageError` naming ``examples`` (any other
    spelling) or ``plain`` (a release with too many parts)."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(t)
    except InvalidVersion:
        raise UsageError(f"malformed torch version {t!r}", hint=f"expected e.g. {examples}") from None
    if v.epoch or len(v.release) > 3:
        raise UsageError(f"malformed torch version {t!r}", hint=f"expected MAJOR.MINOR.PATCH, e.g. {plain}")
    return v


def parse_torch_build_text(text: str) -> TorchBuildText:
    """Like :func:`parse_torch_build`, and nightly or pre-release versions (``2.10.0.dev20250915+cu128``,
    ``2.11.0a0+gite33eb77``, ``2.11.0rc1``) are read with ``packaging.version`` as their release line.

    A local part that is not a variant (``+gite33eb77``, a source build) leaves the variant unknown (None).
    """
    t = _strict(text, "torch version").removeprefix("torch==").removeprefix("torch ").strip()
    if _PLAIN_BUILD_RE.fullmatch(t):  # the common case, without importing packaging (~20 ms)
        release, variant = parse_torch_build(t)
        return TorchBuildText(release, variant)
    v = pep440_torch(
        t, "2.8.0, 2.8.0+cu126, 2.8.0+cpu or a nightly such as 2.10.0.dev20250915+cu128", "2.8.0"
    )
    release = normalise_release(v.base_version)
    local = (v.local or "").lower() or None
    variant = local if local and _VARIANT_RE.fullmatch(local) else None
    if local and variant is None and not v.is_prerelease:
        raise UsageError(
            f"malformed torch build {t!r}: {local!r} is not a variant",
            hint="expected VERSION, VERSION+cuXYZ or VERSION+cpu, e.g. 2.8.0+cu126",
        )
    pre = v.public if (v.is_prerelease or v.is_devrelease) else None
    return TorchBuildText(release, variant, pre)


def parse_cc(text: str) -> tuple[int, int]:
    """A compute capability ``"8.6"`` -> ``(8, 6)``; also accepts ``sm_86``/``sm86``."""
    t = _strict(text, "compute capability")
    m = _CC_RE.fullmatch(t)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.fullmatch(r"sm_?(\d{1,2})(\d)", t.lower())
    if m:
        return int(m.group(1)), int(m.group(2))
    raise UsageError(f"malformed compute capability {t!r}", hint="expected MAJOR.MINOR, e.g. 8.6")


@dataclass(frozen=True, order=True)
class Arch:
    """One entry of a build's arch list: a cubin (``sm_86``) or embedded PTX (``compute_90``).

    ``suffix`` is ``"a"`` for arch-specific code (``sm_90a``: that exact GPU only) or ``"f"`` for
    family-specific code (``sm_100f``: the same major, CUDA 12.9+), else ``""``.
    """

    kind: str  # "sm" (cubin) | "compute" (PTX)
    major: int
    minor: int
    suffix: str = ""

    @property
    def cc(self) -> tuple[int, int]:
        return self.major, self.minor

    def __str__(self) -> str:
        return f"{self.kind}_{self.major}{self.minor}{self.suffix}"


def parse_arch(text: str) -> Arch:
    """``"sm_86"`` -> ``Arch("sm", 8, 6)``; ``"compute_120"`` -> ``Arch("compute", 12, 0)``."""
    t = _strict(text, "arch")
    m = _ARCH_RE.fullmatch(t.lower())
    if not m:
        raise UsageError(
            f"malformed arch {t!r}", hint="expected sm_XY (cubin) or compute_XY (PTX), e.g. sm_86"
        )
    return Arch(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4))


def sm_str(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def parse_python(text: str) -> str:
    """A CPython version ``3.X`` (``"3.12.4"`` is accepted and reduced to ``"3.12"``)."""
    t = _strict(text, "Python version")
    short = ".".join(t.split(".")[:2])
    if not PYTHON_RE.fullmatch(short) or not re.fullmatch(r"3\.\d{1,2}(\.\d{1,3})?", t):
        raise UsageError(f"malformed Python version {t!r}", hint="expected 3.X, e.g. 3.12")
    return short


@dataclass(frozen=True)
class Spec:
    """A version specifier in the PEP 440 subset users write for torch: ``>=2.6``, ``>=2.5,<2.8``, ``==2.7.*``.

    Matching is ``packaging``'s (:class:`packaging.specifiers.SpecifierSet`); this module only checks the text
    is in the subset above, so a typo is a one-line error rather than a surprise match.
    """

    text: str
    specifier: SpecifierSet

    def admits(self, release: str) -> bool:
        from packaging.version import Version

        return Version(normalise_release(release)) in self.specifier


@functools.lru_cache(maxsize=256)  # the knowledge base reads the same row specifiers for every build
def parse_spec(text: str) -> Spec:
    """Parse a specifier; a bare version (``2.7``) means ``==2.7.*``, ``2.7.1`` means ``==2.7.1``."""
    from packaging.specifiers import SpecifierSet

    t = _strict(text, "torch specifier").removeprefix("torch")
    clauses = []
    for raw in t.split(","):
        part = raw.strip()
        m = _SPEC_RE.fullmatch(part)
        if (
            not m
            or (m.group(3) and m.group(1) not in ("==", "!="))
            or (m.group(1) == "~=" and "." not in m.group(2))
        ):
            raise UsageError(
                f"malformed torch specifier {text.strip()!r}",
                hint="expected e.g. '>=2.6', '>=2.5,<2.8', '==2.7.*' or '2.7'",
            )
        op, version, wildcard = m.group(1), m.group(2), m.group(3) or ""
        if op is None:  # a bare version: 2.7 -> ==2.7.*, 2.7.1 -> ==2.7.1
            op, wildcard = "==", (".*" if version.count(".") < 2 else "")
        clauses.append(f"{op}{version}{wildcard}")
    return Spec(t.strip(), SpecifierSet(",".join(clauses)))
