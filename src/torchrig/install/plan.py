"""``torchrig install``'s pure half: the request, the choice of build among those the index really serves, and
the installer's argv. No subprocess, no network: what the host says comes in as records and callables.

>>> from torchrig.compat import load_kb                                   # doctest: +SKIP
>>> req = InstallRequest(torch="2.13.0+cpu")                              # doctest: +SKIP
>>> choose_build(load_kb(), req, host_python_facts, available=lambda url: None).build.label  # doctest: +SKIP
'2.13.0+cpu'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchrig.compat import versions as V
from torchrig.compat.kb import Build, Gpu, KnowledgeBase
from torchrig.compat.platforms import Platform
from torchrig.compat.reasons import Verdict
from torchrig.errors import InputError, UsageError

PYPI_SIMPLE = "https://pypi.org/simple"
INSTALLERS = ("auto", "pip", "uv")
# A local version label PyTorch's own indexes put on their wheels: +cpu, +cu126, +rocm6.4, +xpu.
_LOCAL = re.compile(r"[a-z][a-z0-9.]*")


@dataclass(frozen=True)
class InstallRequest:
    """What the user asked: ``--gpu``/``--driver``/``--platform`` (default: this machine's), ``--torch``
    (a range such as ``'>=2.6'``, or one build such as ``2.13.0+cpu``), ``--python`` (an interpreter's path;
    default: the one running torchrig), ``--index-url``, ``--constraint``, ``--installer``, ``--yes``,
    ``--dry-run``."""

    gpus: tuple[str, ...] = ()
    driver: str | None = None
    platform: str | None = None
    torch: str | None = None
    python: str | None = None
    index_url: str | None = None
    constraint: str | None = None
    installer: str = "auto"
    yes: bool = False
    dry_run: bool = False
    verify_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.installer not in INSTALLERS:
            raise UsageError(
                f"unknown --installer {self.installer!r}", hint=f"choose from {', '.join(INSTALLERS)}"
            )
        if self.driver is not None:
            V.parse_driver(self.driver)
        if self.driver is not None and not self.gpus:
            raise UsageError("--driver needs --gpu", hint="pass --gpu NAME too, or neither (this machine's)")
        if self.torch is not None:
            exact_build_text(self.torch) if "+" in self.torch else V.parse_spec(self.torch)
        if self.index_url is not None and not re.match(r"(https?|file)://\S+$", self.index_url):
            raise UsageError(
                f"--index-url {self.index_url!r} is not a URL",
                hint="give the index's http(s):// or file:// URL, e.g. https://download.pytorch.org/whl/cu128",
            )

    @property
    def exact(self) -> bool:
        """``--torch`` names one build (``2.13.0+cpu``, ``2.8.0+cu128``), not a range."""
        return self.torch is not None and "+" in self.torch


def exact_build_text(text: str) -> str:
    release, variant = V.parse_torch_build(text)
    if variant is None:
        raise UsageError(f"malformed torch build {text!r}", hint="expected VERSION+cuXYZ or VERSION+cpu")
    return f"{release}+{variant}"


@dataclass(frozen=True)
class PythonFacts:
    """The target interpreter, as it describes itself (``python -c 'import sys, importlib.metadata ...'``)."""

    executable: str
    version: str  # 3.11.7
    pip: str | None  # pip's version, None: no pip module
    torch: str | None  # the installed torch distribution's version (not imported), None: none
    externally_managed: bool = False  # a distribution's Python that refuses pip outside a venv (PEP 668)

    @property
    def short_version(self) -> str:
        return ".".join(self.version.split(".")[:2])


def pin_of(version: str) -> tuple[str, str | None]:
    """``2.13.0+cpu`` -> (``2.13.0``, ``cpu``); ``2.14.1`` -> (``2.14.1``, None)."""
    public, _, local = version.partition("+")
    return public, (local or None)


def served_version(build: Build, available: Sequence[str]) -> str | None:
    """The version string among ``available`` (what the index and pip's configured sources list) that is this
    build: ``X+variant`` from PyTorch's indexes, a bare ``X`` only where the build is what PyPI serves there."""
    for text in available:
        public, local = pin_of(text)
        try:
            same = V.normalise_release(public) == V.normalise_release(build.release.version)
        except UsageError:  # a pre-release or a nightly in the list: never the build asked for
            continue
        if not same:
            continue
        if local == build.variant.name or (local is None and build.is_pypi_default):
            return text
    return None


def index_for(build: Build, override: str | None) -> str | None:
    """The index to install from: ``--index-url``, else the build's own (None: PyPI, for the PyPI default)."""
    if override:
        return override
    if build.is_pypi_default and build.pypi_confirmed:
        return None
    return build.variant.index_url


@dataclass(frozen=True)
class Choice:
    build: Build
    requirement: str  # torch==2.13.0+cpu
    index_url: str | None  # None: PyPI (the installer's default index)
    verdict: Verdict
    caveats: tuple[str, ...]
    skipped: tuple[str, ...] = ()  # newer builds passed over, each with why
    why: str = ""


Available = Callable[
    [str | None], "Sequence[str] | None"
]  # index URL (None: PyPI) -> versions; None: unknown


def choose_build(
    kb: KnowledgeBase,
    req: InstallRequest,
    gpus: Sequence[Gpu],
    driver: str | None,
    platform: Platform,
    python: str | None,
    available: Available,
) -> Choice:
    """The build to install: ``resolve``'s pick (or ``check``'s verdict on the one ``--torch`` names), walking
    down to the next working build while the index does not serve it. ``available(index)`` lists the versions
    the index (with the installer's own configured sources) serves this interpreter; None: unknown (trusted)."""
    from torchrig.compat import check, resolve

    jetson = _jetson_choice(kb, req, gpus, driver, platform, available)
    if jetson is not None:
        return jetson
    if req.exact:
        build = kb.find_build(exact_build_text(req.torch or ""), platform)
        verdict, reasons = Verdict.WORKS, []
        if gpus:
            result = check(kb, gpus=gpus, driver=driver, build=build, platform=platform)
            if result.verdict is Verdict.FAILS:
                first = next(r for r in result.reasons if r.severity.blocks)
                hint = result.fixes[0].summary if result.fixes else "run torchrig resolve for one that works"
                raise InputError(f"torch {build.label} fails here: {first.message}", hint=hint)
            verdict, reasons = result.verdict, result.reasons
        elif build.cuda is not None:
            raise InputError(
                f"torch {build.label} is a CUDA build but no NVIDIA GPU was given or found",
                hint="pass --gpu NAME --driver VERSION for the machine it is for, or --torch VERSION+cpu",
            )
        index = index_for(build, req.index_url)
        listed = available(index)
        served = served_version(build, listed) if listed is not None else build_pin(build)
        if served is None:
            raise _not_served(build, index, listed)
        caveats = tuple(r.message for r in reasons if r.severity.cautions)
        return Choice(build, f"torch=={served}", index, verdict, caveats, why=f"--torch {req.torch}")
    excluded: list[str] = []
    skipped: list[str] = []
    while True:
        spec = ",".join([*([req.torch] if req.torch else []), *(f"!={v}" for v in excluded)]) or None
        try:
            res = resolve(kb, gpus, driver, torch_spec=spec, python=python, platform=platform)
        except InputError:
            if not skipped:
                raise
            raise InputError(
                f"no build in range is served to this interpreter: {'; '.join(skipped[:3])}",
                hint="check the network or proxy, pass --index-url with a mirror that has it, or widen --torch",
            ) from None
        for build in [res.build, *res.alternatives]:
            index = index_for(build, req.index_url)
            listed = available(index)
            served = served_version(build, listed) if listed is not None else build_pin(build)
            if served is None:
                skipped.append(f"{build.label} from {index or PYPI_SIMPLE}")
                continue
            caveats = tuple(r.message for r in res.reasons if r.severity.cautions)
            why = res.why or ""
            if skipped:
                why = f"the newest build served to this interpreter; not served: {', '.join(skipped)}"
            return Choice(build, f"torch=={served}", index, res.verdict, caveats, tuple(skipped), why)
        excluded.append(res.build.release.version)


def _jetson_choice(
    kb: KnowledgeBase,
    req: InstallRequest,
    gpus: Sequence[Gpu],
    driver: str | None,
    platform: Platform,
    available: Available,
) -> Choice | None:
    """On a Jetson whose JetPack has an index of its own (JetPack 6: the Jetson AI Lab index), the newest version
    that index is known to serve (within ``--torch``) and serves now; None elsewhere (JetPack 7 runs the
    standard aarch64 wheels, which ``resolve`` picks)."""
    from torchrig.compat.evaluate import jetpack_for, platform_for
    from torchrig.compat.reasons import verdict_of
    from torchrig.compat.sources import SourcedBuild, judge, load_sources

    plat, _ = platform_for(gpus, platform)
    if plat.id != "jetson" or req.exact:
        return None
    jetpack = jetpack_for(kb, gpus, driver, plat)
    source = next(
        (
            s
            for s in load_sources()
            if s.family == "jetson-ai-lab" and jetpack and s.jetpack == jetpack.version
        ),
        None,
    )
    if source is None or (jetpack is not None and jetpack.torch == "sbsa"):
        return None
    spec = V.parse_spec(req.torch) if req.torch else None
    index = req.index_url or source.index_url
    listed = available(index)
    skipped = []
    for version in sorted(source.versions, key=V.parse_release, reverse=True):
        if spec is not None and not spec.admits(version):
            continue
        if listed is not None and not any(pin_of(x)[0] == version for x in listed):
            skipped.append(f"{version} from {index}")
            continue
        build, reasons, _ = judge(
            kb, SourcedBuild(source, version, version, f"JetPack {source.jetpack}"), gpus, driver, plat
        )
        verdict = verdict_of(reasons)
        if verdict is Verdict.FAILS:
            first = next(r for r in reasons if r.severity.blocks)
            raise InputError(f"torch {version} from {source.name} fails here: {first.message}")
        caveats = tuple(r.message for r in reasons if r.severity.cautions)
        why = f"JetPack {source.jetpack}: PyTorch for the Jetson's GPU comes from {source.name} ({source.source})"
        return Choice(build, f"torch=={version}", index, verdict, caveats, tuple(skipped), why)
    raise InputError(
        f"{index} serves no torch version torchrig knows for JetPack {source.jetpack} within the range",
        hint=f"known: {', '.join(source.versions)}; check the network, or pass --torch or --index-url",
    )


def build_pin(build: Build) -> str:
    """The version to pin when the index's list is unknown: bare for PyPI's default, else ``X+variant``."""
    if build.is_pypi_default and build.pypi_confirmed:
        return build.release.version
    return f"{build.release.version}+{build.variant.name}"


def _not_served(build: Build, index: str | None, listed: Sequence[str] | None) -> InputError:
    near = ", ".join(list(listed or [])[:5]) or "none"
    return InputError(
        f"{index or PYPI_SIMPLE} does not serve torch {build.label} to this interpreter (it lists: {near})",
        hint="check the network or proxy, pass --index-url with a mirror that has it, or choose another --torch",
    )


@dataclass(frozen=True)
class InstallPlan:
    """Everything ``run_install`` does, decided before it does any of it; ``--dry-run`` prints this."""

    python: PythonFacts
    choice: Choice
    installer: str  # pip or uv
    argv: tuple[str, ...]
    action: str  # install | replace | keep (the build is already installed)
    platform: str
    gpus: tuple[str, ...]
    driver: str | None
    target_why: str
    constraint: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def command(self) -> str:
        import shlex

        return shlex.join(self.argv)

    def to_json(self) -> dict[str, Any]:
        c = self.choice
        return {
            "python": self.python.executable,
            "python_version": self.python.version,
            "installed_torch": self.python.torch,
            "build": c.build.to_json(),
            "requirement": c.requirement,
            "index_url": c.index_url,
            "verdict": c.verdict.value,
            "caveats": list(c.caveats),
            "skipped": list(c.skipped),
            "why": c.why,
            "installer": self.installer,
            "command": self.command,
            "argv": list(self.argv),
            "action": self.action,
            "platform": self.platform,
            "gpus": list(self.gpus),
            "driver": self.driver,
            "target": self.target_why,
            "constraint": self.constraint,
            "notes": list(self.notes),
        }


def installer_argv(
    installer: str, python: str, requirement: str, index_url: str | None, constraint: str | None
) -> tuple[str, ...]:
    """The installer's command line: ``python -m pip install torch==X [--index-url URL] [-c FILE]`` or
    ``uv pip install --python PY ...``; each word a separate argument (no shell)."""
    if installer == "uv":
        argv = ["uv", "pip", "install", "--python", python, requirement]
    else:
        argv = [python, "-m", "pip", "install", requirement]
    if index_url:
        argv += ["--index-url", index_url]
    if constraint:
        argv += ["--constraint", constraint]
    return tuple(argv)


def constraint_text(existing: str, requirement: str) -> str:
    """``existing`` constraints with torch's line replaced by (or added as) ``requirement``."""
    lines = [
        ln
        for ln in existing.splitlines()
        if not re.match(r"\s*torch\s*(\[[^\]]*\])?\s*(==|>=|<=|~=|!=|<|>|$)", ln)
    ]
    return "\n".join([*lines, requirement]) + "\n"


def pinned_in(existing: str) -> str | None:
    """The torch requirement a constraints file already holds (``torch==2.8.0+cu128``), None: none."""
    for ln in existing.splitlines():
        text = ln.split("#", 1)[0].strip()
        if re.match(r"torch\s*(\[[^\]]*\])?\s*(==|>=|<=|~=|!=|<|>)", text):
            return text.replace(" ", "")
    return None
