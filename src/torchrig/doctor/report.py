"""The doctor's result: findings grouped by severity with their fixes (text), or the stable JSON schema
(``schema/doctor-report.schema.json``) with the facts they came from."""

from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

from torchrig.doctor.facts import Facts, ProbeStatus, facts_to_json
from torchrig.doctor.findings import LEVELS, Finding, Severity
from torchrig.report import jsonable

REPORT_SCHEMA_VERSION = 1
LABEL = {Severity.ERROR: "ERROR", Severity.WARNING: "WARNING", Severity.INFO: "INFO", Severity.OK: "OK"}
COLOR = {Severity.ERROR: "31", Severity.WARNING: "33", Severity.INFO: "36", Severity.OK: "32"}
WIDTH = 100


@dataclass(frozen=True)
class DoctorReport:
    facts: Facts
    findings: tuple[Finding, ...]
    elapsed_ms: float
    areas: tuple[str, ...] = ()
    knowledge_base: str = "not needed"  # "loaded" | "unavailable" | "not needed"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity is severity)

    @property
    def exit_code(self) -> int:
        return 1 if any(f.severity.is_problem for f in self.findings) else 0

    @property
    def status(self) -> str:
        if self.count(Severity.ERROR):
            return "broken"
        return "problems" if self.count(Severity.WARNING) else "healthy"

    def to_json(self) -> dict[str, Any]:
        return {
            "report_schema_version": REPORT_SCHEMA_VERSION,
            "verdict": {
                "status": self.status,
                "exit_code": self.exit_code,
                **{s.value: self.count(s) for s in LEVELS},
            },
            "machine": self.machine_line(),
            "areas": list(self.areas),
            "knowledge_base": self.knowledge_base,
            "elapsed_ms": round(self.elapsed_ms, 1),
            "findings": [jsonable(f) for f in self.findings],
            "notes": list(self.notes),
            "facts": facts_to_json(self.facts),
        }

    # ---- text
    def machine_line(self) -> str:
        """One line: OS, container, GPUs, driver, torch and the interpreter probed. Unknown stays a word,
        never "None"."""
        from torchrig.compat.platforms import platform_of_kernel

        f = self.facts
        parts = [f.kernel.os_pretty or f.kernel.os_id or "unknown OS"]
        plat = platform_of_kernel(
            f.kernel.machine, f.kernel.kernel_release, f.kernel.wsl, f.kernel.tegra_release
        )
        if plat is not None:
            parts.append(f"platform {plat.label}")
        elif f.kernel.wsl:
            parts.append("WSL")
        if f.container.in_container:
            parts.append(f"in a {f.container.runtime or ''} container".replace("  ", " "))
        if f.nvml.status is ProbeStatus.OK:
            names = sorted({g.name or "unnamed GPU" for g in f.nvml.gpus})
            parts.append(f"{len(f.nvml.gpus)}x {' + '.join(names)}" if f.nvml.gpus else "no GPU")
            cuda = (
                f"CUDA {f.nvml.cuda_driver_version}"
                if f.nvml.cuda_driver_version
                else "CUDA version unknown: NVML could not ask libcuda"
            )
            parts.append(f"driver {f.nvml.driver_version or 'of unknown version'} ({cuda})")
        elif f.kernel.module_version:
            parts.append(f"driver {f.kernel.module_version}")
        else:
            parts.append("no NVIDIA driver loaded")
        t = f.torch
        where = self.python_line()
        if t.status is ProbeStatus.OK:
            parts.append(f"torch {t.version or 'of unknown version'}{where}")
        elif t.status is ProbeStatus.MISSING:
            parts.append(f"no torch{where}")
        elif t.status in (ProbeStatus.FAILED, ProbeStatus.TIMEOUT):
            parts.append(f"torch probe {t.status.value}{where}")
        return ", ".join(parts)

    def python_line(self) -> str:
        """`` in PATH`` for the interpreter the torch probe ran, with its own sys.executable when that
        differs (a venv's python seen through a symlink); empty when unknown."""
        t = self.facts.torch
        ran = t.python_requested or t.python_executable
        if not ran:
            return ""
        if t.python_requested and t.python_executable and t.python_executable != t.python_requested:
            return f" in {ran} (sys.executable {t.python_executable})"
        return f" in {ran}"

    def render_text(self) -> str:
        use_color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")

        def paint(sev: Severity, text: str) -> str:
            return f"\033[{COLOR[sev]}m{text}\033[0m" if use_color else text

        src = "" if self.facts.source == "probed" else f"\n  facts: {self.facts.source}"
        out = [f"torchrig doctor: {self.machine_line()}{src}", ""]
        for f in self.findings:
            if f.severity.passed:
                continue
            out.append(paint(f.severity, f"{LABEL[f.severity]:<8}") + f"{f.summary}  [{f.id}]")
            if f.cause:
                out += _block("why", [f.cause])
            if f.fix:
                out += _block("fix", [_cmd(x) for x in f.fix], wrap=False)  # commands stay copy-pasteable
            if f.evidence:
                out += _block("seen", [e for e in f.evidence if e])
            out.append("")
        passed = [f for f in self.findings if f.severity.passed]
        if passed:
            out.append(paint(Severity.OK, "passed"))
            for f in passed:
                out.append(f"  ✓ {f.summary}")
                out += [f"      {e}" for e in f.evidence[:8] if e]
            out.append("")
        for note in self.notes:
            out.append(f"note: {note}")
        e, w, i = self.count(Severity.ERROR), self.count(Severity.WARNING), self.count(Severity.INFO)
        if e:
            tail = "CUDA cannot work here until the errors are fixed"
        elif w and self.facts.torch.status is not ProbeStatus.OK:  # torch not probed: CUDA not seen working
            tail = "the warnings will bite later"
        elif w:
            tail = "CUDA works; the warnings will bite later"
        elif any(f.id == "driver.no_gpu" for f in self.findings):
            tail = "healthy for work on the CPU (no NVIDIA GPU here)"
        else:
            tail = "healthy"
        out.append(
            f"verdict: {e} error(s), {w} warning(s), {i} note(s): {tail} "
            f"({self.elapsed_ms / 1000:.2f} s, exit {self.exit_code})"
        )
        return "\n".join(out)


def _cmd(text: str) -> str:
    """Commands get a '$ ' prompt; prose steps (with a space-separated first word that is not a tool) do not."""
    first = text.split(" ", 1)[0]
    prose = first in (
        "or",
        "and",
        "on",
        "if",
        "install",
        "sign",
        "bare",
        "VM:",
        "Kubernetes:",
        "(commands",
        "(source:",
        "long-term,",
        "restart",
        "upgrade",
        "add",
        "do",
        "then",
        "keep",
        "ask",
        "look",
        "reseat",
        "for",
    )
    return text if prose else f"$ {text}"


def _block(label: str, lines: list[str], wrap: bool = True) -> list[str]:
    out = []
    for n, line in enumerate(lines):
        head = f"  {label:<5} " if n == 0 else " " * 8
        wrapped = (
            textwrap.wrap(line, WIDTH - 8, break_long_words=False, break_on_hyphens=False) if wrap else [line]
        ) or [""]
        out.append(head + wrapped[0])
        out += [" " * 10 + more for more in wrapped[1:]]
    return out
