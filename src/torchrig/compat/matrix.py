"""The support matrix: GPU families (one row per family and compute capability) x PyTorch builds.

The matrix is for one platform (``--platform``): its builds' kernels and PyPI defaults (platforms.toml). Jetson
modules (segment "embedded") are rows only for ``--platform jetson``: elsewhere they run NVIDIA's JetPack builds.

Each cell is the :func:`~torchrig.compat.evaluate.evaluate` verdict of the row's representative GPU on the
column's build (with ``driver`` if given, else the architecture alone). Rendered as a plain table,
Markdown, or a standalone HTML page.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from torchrig.compat import versions as V
from torchrig.compat.evaluate import evaluate
from torchrig.compat.kb import Build, Gpu, KnowledgeBase
from torchrig.compat.platforms import Platform
from torchrig.compat.reasons import Severity, Verdict, verdict_of

LEGEND = {
    Verdict.WORKS: "native kernels for the GPU (or binary-compatible ones of the same major)"
    " and, with --driver, a driver that runs the build's CUDA natively",
    Verdict.WORKS_WITH_CAVEATS: "runs, but with a caveat: PTX JIT at first start, kernels not tuned for the GPU"
    " while another variant has them, or the driver only under minor-version compatibility",
    Verdict.FAILS: "no kernel image for the GPU, a CPU-only build, or a driver that cannot run it",
}
TEXT = {Verdict.WORKS: "works", Verdict.WORKS_WITH_CAVEATS: "caveats", Verdict.FAILS: "FAILS"}
MARKDOWN = {Verdict.WORKS: "✅ works", Verdict.WORKS_WITH_CAVEATS: "⚠️ caveats", Verdict.FAILS: "❌ fails"}
COLOUR = {Verdict.WORKS: "#c8e6c9", Verdict.WORKS_WITH_CAVEATS: "#fff3b0", Verdict.FAILS: "#ffcdd2"}


@dataclass(frozen=True)
class Row:
    family: str
    arch: str
    compute_capability: str
    gpus: tuple[str, ...]  # the family's GPUs of this compute capability; the first is the one checked

    @property
    def label(self) -> str:
        return f"{self.family} ({self.arch}, {self.compute_capability})"


@dataclass(frozen=True)
class Cell:
    verdict: Verdict
    code: str  # the deciding reason's code
    message: str


@dataclass(frozen=True)
class Matrix:
    rows: list[Row]
    columns: list[Build]
    cells: list[list[Cell]]
    driver: str | None
    platform: str = "linux-x86_64"

    def to_json(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "driver": self.driver,
            "columns": [b.to_json() for b in self.columns],
            "rows": [
                {
                    "family": r.family,
                    "arch": r.arch,
                    "compute_capability": r.compute_capability,
                    "gpus": list(r.gpus),
                    "cells": [
                        {"build": b.label, "verdict": c.verdict.value, "code": c.code, "message": c.message}
                        for b, c in zip(self.columns, cells, strict=True)
                    ],
                }
                for r, cells in zip(self.rows, self.cells, strict=True)
            ],
            "legend": {v.value: text for v, text in LEGEND.items()},
        }


def family_rows(kb: KnowledgeBase, platform: Platform | None = None) -> list[tuple[Row, Gpu]]:
    jetson = platform is not None and platform.id == "jetson"
    groups: dict[tuple[str, str], list[Gpu]] = {}
    for g in kb.gpus:
        if (g.segment == "embedded") is not jetson:  # Jetson modules only on --platform jetson, and only they
            continue
        groups.setdefault((g.family, g.compute_capability), []).append(g)
    rows = [
        (Row(fam, gpus[0].arch, cc, tuple(g.name for g in gpus)), gpus[0])
        for (fam, cc), gpus in groups.items()
    ]
    return sorted(rows, key=lambda rg: (V.parse_cc(rg[0].compute_capability), rg[0].family))


def _cell(kb: KnowledgeBase, gpu: Gpu, driver: str | None, build: Build, platform: Platform) -> Cell:
    reasons, _ = evaluate(kb, [gpu], driver, build, platform)
    verdict = verdict_of(reasons)
    order = {Severity.FAIL: 2, Severity.CAVEAT: 1, Severity.INFO: 0}
    deciding = max(reasons, key=lambda r: (order[r.severity], r.code != "driver_not_checked"))
    return Cell(verdict, deciding.code, deciding.message)


def build_matrix(
    kb: KnowledgeBase,
    torch: str | None = None,
    driver: str | None = None,
    newest: int = 4,
    platform: Platform | None = None,
) -> Matrix:
    """Columns: ``torch``'s variants, or the PyPI builds of the ``newest`` releases, on ``platform``."""
    plat = platform or Platform()
    if driver is not None:
        V.parse_driver(driver)
    if torch:
        parsed = V.parse_torch_build_text(torch)
        columns = (
            [kb.find_build(torch, plat)] if parsed.variant else kb.builds_for_release(parsed.release, plat)
        )
    else:
        columns = [kb.find_build(r.version, plat) for r in kb.releases[:newest]]
    rows = family_rows(kb, plat)
    cells = [[_cell(kb, gpu, driver, b, plat) for b in columns] for _, gpu in rows]
    return Matrix([r for r, _ in rows], columns, cells, driver, plat.label)


def _header(b: Build) -> str:
    return b.label + (" (PyPI)" if b.is_pypi_default else "")


def render_text(m: Matrix) -> str:
    from torchrig.report import table

    headers = ["GPU family (arch, cc)", *(_header(b) for b in m.columns)]
    body = [[r.label, *(TEXT[c.verdict] for c in cells)] for r, cells in zip(m.rows, m.cells, strict=True)]
    driver = f"driver {m.driver}" if m.driver else "architecture only (no --driver)"
    legend = [f"  {TEXT[v]:<8} {text}" for v, text in LEGEND.items()]
    return "\n".join(
        [
            f"PyTorch support by GPU family on {m.platform}, {driver}",
            "",
            table(headers, body),
            "",
            "legend:",
            *legend,
        ]
    )


def render_markdown(m: Matrix) -> str:
    headers = ["GPU family (arch, compute capability)", *(f"`{_header(b)}`" for b in m.columns)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r, cells in zip(m.rows, m.cells, strict=True):
        lines.append("| " + " | ".join([r.label, *(MARKDOWN[c.verdict] for c in cells)]) + " |")
    driver = f"driver {m.driver}" if m.driver else "architecture only (no `--driver`)"
    legend = [f"- {MARKDOWN[v]}: {text}" for v, text in LEGEND.items()]
    return "\n".join([f"PyTorch support by GPU family on {m.platform}, {driver}.", "", *lines, "", *legend])


def render_html(m: Matrix) -> str:
    e = html.escape
    driver = f"driver {m.driver}" if m.driver else "architecture only (no --driver)"
    head = "".join(
        f"<th>{e(_header(b))}<br><small>{e(', '.join(b.variant.arch_list))}</small></th>" for b in m.columns
    )
    rows = []
    for r, cells in zip(m.rows, m.cells, strict=True):
        tds = "".join(
            f'<td class="{c.verdict.value}" title="{e(c.message)}">{e(TEXT[c.verdict])}</td>' for c in cells
        )
        rows.append(f'<tr><th scope="row" title="{e(", ".join(r.gpus))}">{e(r.label)}</th>{tds}</tr>')
    legend = "".join(
        f'<li><span class="{v.value}">{e(TEXT[v])}</span> {e(t)}</li>' for v, t in LEGEND.items()
    )
    css = " ".join(f"td.{v.value}, span.{v.value} {{ background: {c}; }}" for v, c in COLOUR.items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>torchrig matrix: PyTorch support by GPU family</title>
<style>body {{ font-family: sans-serif; margin: 2em; }} table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #999; padding: 4px 8px; text-align: center; }} th[scope=row] {{ text-align: left; }}
small {{ font-weight: normal; color: #555; }} span {{ padding: 0 6px; }} {css}</style></head>
<body><h1>PyTorch support by GPU family on {e(m.platform)}</h1><p>{e(driver)}; hover a cell for the reason.</p>
<table><thead><tr><th>GPU family (arch, compute capability)</th>{head}</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
<ul>{legend}</ul></body></html>"""
