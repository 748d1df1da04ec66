"""``torchrig install``'s steps: plan (which build, from where, with which command) → install → verify →
doctor. ``--dry-run`` runs the same planning and stops before the installer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.errors import EngineUnavailable, InputError, UsageError
from torchrig.inputfiles import read_text
from torchrig.install import host
from torchrig.install.plan import (
    PYPI_SIMPLE,
    InstallPlan,
    InstallRequest,
    PythonFacts,
    choose_build,
    constraint_text,
    installer_argv,
    pin_of,
    pinned_in,
)

_MAX_CONSTRAINT_BYTES = 16 * 2**20  # a pip constraints file is a few KB


@dataclass(frozen=True)
class DoctorVerdict:
    status: str  # healthy | problems | broken
    exit_code: int
    line: str  # doctor's own verdict line
    problems: tuple[str, ...]  # the errors' and warnings' one-line summaries, with their ids


@dataclass(frozen=True)
class InstallResult:
    plan: InstallPlan
    dry_run: bool
    installed: bool = False
    verified: host.Verified | None = None
    doctor: DoctorVerdict | None = None
    constraint_written: str | None = None

    @property
    def exit_code(self) -> int:
        if self.dry_run:
            return 0
        if self.verified is None or not self.verified.ok:
            return 1
        return self.doctor.exit_code if self.doctor else 0

    def to_json(self) -> dict[str, Any]:
        v = self.verified
        return {
            "plan": self.plan.to_json(),
            "dry_run": self.dry_run,
            "installed": self.installed,
            "verified": None
            if v is None
            else {
                "ok": v.ok,
                "version": v.version,
                "cuda": v.cuda,
                "device": v.device,
                "error": v.error,
                "ran": v.what,
            },
            "doctor": None
            if self.doctor is None
            else {
                "status": self.doctor.status,
                "exit_code": self.doctor.exit_code,
                "problems": list(self.doctor.problems),
            },
            "constraint_written": self.constraint_written,
        }

    def render_text(self) -> str:
        p, c = self.plan, self.plan.choice
        rows = [
            ("torch", f"{c.build.label} ({c.verdict.value})"),
            ("for", f"{p.platform}; {p.target_why}"),
            (
                "python",
                f"{p.python.executable} (Python {p.python.version}; torch now: {p.python.torch or 'none'})",
            ),
            ("index", c.index_url or PYPI_SIMPLE),
        ]
        if c.why:
            rows.append(("why", c.why))
        rows.append(("action", p.action + (" (dry run: nothing changed)" if self.dry_run else "")))
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        lines += ["", p.command if p.action != "keep" else f"(already installed: {c.requirement})"]
        lines += [f"  warn  {x}" for x in c.caveats]
        lines += [f"note: {n}" for n in p.notes]
        if self.constraint_written:
            lines.append(
                f"pinned: {self.constraint_written} holds {c.requirement} (pip install -c {self.constraint_written} ...)"
            )
        v = self.verified
        if v is not None:
            got = f"torch {v.version}" + (f" on {v.device}" if v.device else "")
            lines += [
                "",
                f"verify: {v.what}: " + ("ok, " + got if v.ok else f"FAILED: {v.error or 'wrong result'}"),
            ]
        if self.doctor is not None:
            lines += [f"doctor: {self.doctor.line}"] + [f"  {x}" for x in self.doctor.problems]
            if self.doctor.exit_code:
                lines.append(f"  run 'torchrig doctor{_python_flag(p)}' for the causes and fixes")
        return "\n".join(lines)


def _python_flag(plan: InstallPlan) -> str:
    import shlex
    import sys

    return (
        "" if plan.python.executable == sys.executable else f" --python {shlex.quote(plan.python.executable)}"
    )


def make_plan(req: InstallRequest) -> InstallPlan:
    """Every decision, nothing changed: the interpreter, the machine, the build the index serves, the argv."""
    from torchrig.compat import load_kb
    from torchrig.compat.evaluate import infer_platform
    from torchrig.compat.host import detect_local_gpus, host_platform
    from torchrig.compat.platforms import parse_platform
    from torchrig.compat.target import choose_target

    facts = host.python_facts(req.python)
    if facts.externally_managed:
        raise UsageError(
            f"{facts.executable} is the system's Python, which refuses pip installs (externally managed, PEP 668)",
            hint="make a virtual environment: python3 -m venv .venv && . .venv/bin/activate, then torchrig install",
        )
    installer = host.which_installer(req.installer, facts)
    given_constraint = _read_constraint(req.constraint)  # a bad file is refused before any index is asked
    kb = load_kb()
    target = choose_target(list(req.gpus), req.driver, "auto", None if req.gpus else detect_local_gpus())
    gpus = list({g.id: g for g in (kb.find_gpu(n) for n in target.gpus)}.values())
    given = parse_platform(req.platform) if req.platform else None
    plat, inferred = infer_platform(gpus, given, given or host_platform())
    notes: list[str] = [inferred] if inferred else []
    listed_cache: dict[str | None, Sequence[str] | None] = {}
    unreachable: set[str | None] = set()

    def available(index: str | None) -> Sequence[str] | None:
        if index not in listed_cache:
            listed = host.served_versions(facts, installer, index)
            why_not = host.index_unreachable(index)
            if why_not and not listed:
                raise EngineUnavailable(
                    f"cannot reach {index or PYPI_SIMPLE} ({why_not}) and no configured source serves torch",
                    hint="check the network or proxy (HTTPS_PROXY), or pass --index-url with a reachable mirror",
                )
            if why_not:
                unreachable.add(index)
                notes.append(
                    f"{index or PYPI_SIMPLE} is unreachable ({why_not}): the versions come from the installer's "
                    "configured sources ('pip config list': extra indexes, find-links)"
                )
            listed_cache[index] = listed
        return listed_cache[index]

    choice = choose_build(kb, req, gpus, target.driver, plat, facts.short_version, available)
    constraint = _agreeing_constraint(req.constraint, given_constraint, choice.requirement)
    action = _action(facts, choice.requirement, choice.build.cuda is not None, req, notes)
    index_url = choice.index_url
    if index_url in unreachable and req.index_url is None:
        # the build's own index cannot be reached, so '--index-url' would leave the installer no place for
        # torch's dependencies either: its default index and configured sources serve both
        index_url = None
        notes.append("installing from the installer's default index and configured sources instead")
    argv = installer_argv(installer, facts.executable, choice.requirement, index_url, constraint)
    return InstallPlan(
        facts, choice, installer, argv, action, plat.label, tuple(g.name for g in gpus), target.driver,
        target.why, req.constraint, tuple(notes),
    )  # fmt: skip


def _read_constraint(path: str | None) -> tuple[str, str | None] | None:
    """The constraints file to pass to the installer (an existing one) and the torch pin it holds; None when
    there is none yet (it is written after the install)."""
    if path is None:
        return None
    file = Path(path).expanduser()
    if file.is_dir():
        raise InputError(
            f"--constraint {path!r} is a directory", hint="give a file path, e.g. constraints.txt"
        )
    if not file.exists():
        if not file.parent.is_dir():
            raise InputError(f"--constraint {path!r}: directory {str(file.parent)!r} does not exist")
        return None  # written after the install
    return str(file), pinned_in(read_text(file, "--constraint file", max_bytes=_MAX_CONSTRAINT_BYTES))


def _agreeing_constraint(
    path: str | None, given: tuple[str, str | None] | None, requirement: str
) -> str | None:
    """The constraints file for the installer, once its torch pin (if any) is known to be ``requirement``."""
    if given is None:
        return None
    file, pinned = given
    if pinned and pinned != requirement:
        raise InputError(
            f"{path} pins {pinned}, not {requirement}",
            hint=f"pass --torch to match it, or remove torch's line from {path} to pin the new build",
        )
    return file


def _action(facts: PythonFacts, requirement: str, cuda: bool, req: InstallRequest, notes: list[str]) -> str:
    """install, keep (that build is there) or replace (only a broken one, or with --yes)."""
    wanted = requirement.removeprefix("torch==")
    if facts.torch is None:
        return "install"
    if facts.torch == wanted or (pin_of(wanted)[1] is None and pin_of(facts.torch)[0] == wanted):
        return "keep"
    if req.yes:
        return "replace"
    works = host.verify(facts.executable, cuda, req.verify_timeout_s)
    if works.ok:
        raise UsageError(
            f"torch {facts.torch} already works in {facts.executable} ({works.what} ran)",
            hint=f"pass --yes to replace it with {wanted}",
        )
    notes.append(
        f"the installed torch {facts.torch} does not work here ({works.error or 'wrong result'}): replacing it"
    )
    return "replace"


def run_install(req: InstallRequest) -> InstallResult:
    """Plan, then (unless ``--dry-run``) install, pin, verify with a real kernel, and run doctor's checks."""
    plan = make_plan(req)
    if req.dry_run:
        return InstallResult(plan, dry_run=True)
    if plan.action != "keep":
        ran = host.run_installer(plan.argv)
        if ran.returncode != 0:
            errors = [ln for ln in ran.tail.splitlines() if ln.startswith("ERROR") or "error:" in ln.lower()]
            last = (errors or ran.tail.splitlines() or ["no output"])[-1].strip()
            raise EngineUnavailable(
                f"{plan.installer} could not install {plan.choice.requirement}: {last[:300]}",
                hint="fix what it says (network, disk space, Python version), then run torchrig install again",
            )
    written = None
    if req.constraint:
        file = Path(req.constraint).expanduser()
        old = read_text(file, "--constraint file", max_bytes=_MAX_CONSTRAINT_BYTES) if file.exists() else ""
        file.write_text(constraint_text(old, plan.choice.requirement))
        written = str(file)
    verified = host.verify(plan.python.executable, plan.choice.build.cuda is not None, req.verify_timeout_s)
    return InstallResult(
        plan, False, plan.action != "keep", verified, _doctor(plan.python.executable), written
    )


def _doctor(python: str) -> DoctorVerdict:
    """Doctor's checks on this machine and the interpreter just installed into."""
    import time

    from torchrig.doctor import diagnose
    from torchrig.doctor.probes import ProbeOptions, collect

    t0 = time.perf_counter()
    report = diagnose(
        collect(ProbeOptions(python=python, torch=True, timeout_s=120.0)), started=t0, strict=False
    )
    line = report.render_text().splitlines()[-1].removeprefix("verdict: ")
    problems = tuple(
        f"{f.severity.value}: {f.summary} [{f.id}]" for f in report.findings if f.severity.is_problem
    )
    return DoctorVerdict(report.status, report.exit_code, line, problems)
