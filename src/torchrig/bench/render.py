"""The human views of a bench run: the summary text for the terminal and the Markdown report.

Pure functions of the measurements and the findings; the same data ``--json`` prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchrig.bench.busbw import format_size
from torchrig.bench.records import Grade, GradedFigure, Measurements
from torchrig.report import table

MARK = {
    Grade.PASS: "pass",
    Grade.WARN: "WARN",
    Grade.FAIL: "FAIL",
    Grade.NO_GPU: "no GPU",
    Grade.UNKNOWN: "unknown",
    Grade.INFO: "info",
}


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if 0 < abs(value) < 1:
        return f"{value:.3g}"  # the CPU path's small figures keep three significant digits
    return f"{value:,.{digits}f}" if abs(value) < 1e4 else f"{value:,.0f}"


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


def gpu_state_text(clock_mhz: int | None, temperature_c: int | None, power_w: float | None) -> str:
    """The GPU's SM clock, temperature and power as a GEMM's timed repeats ended ("-" without NVML)."""
    parts = [
        f"{clock_mhz} MHz" if clock_mhz is not None else "",
        f"{temperature_c} °C" if temperature_c is not None else "",
        f"{power_w:.0f} W" if power_w is not None else "",
    ]
    return ", ".join(p for p in parts if p) or "-"


def header_lines(m: Measurements) -> list[str]:
    meta = m.meta
    names = sorted({g.name for g in m.gpus})
    what = (
        f"{len(m.gpus)}x {', '.join(names)}"
        if meta.device_kind == "cuda"
        else f"{meta.world_size} CPU processes (gloo)"
    )
    stack = f"torch {meta.torch_version}" + (
        f", CUDA {meta.cuda_version}, NCCL {meta.nccl_version}" if meta.cuda_version else ""
    )
    lines = [
        f"machine: {meta.hostname}, {what}",
        f"date: {meta.date_utc}   {stack}   backend: {meta.backend}",
        f"command: {meta.command_line or '-'}   ({'quick, ' if meta.quick else ''}{meta.elapsed_s:.0f} s)",
    ]
    if meta.env:
        lines.append("env: " + " ".join(f"{k}={v}" for k, v in sorted(meta.env.items())))
    return lines


def findings_rows(findings: Sequence[GradedFigure]) -> list[list[Any]]:
    return [
        [
            f.figure,
            f"{_num(f.value)} {f.unit}",
            _num(f.expected, 0) if f.expected else "-",
            _pct(f.fraction),
            MARK[f.grade],
        ]
        for f in findings
    ]


def collective_rows(m: Measurements) -> tuple[list[str], list[list[Any]]]:
    """busbw (GB/s) by size (rows) and collective (columns); a trailing ``!`` marks a failed check."""
    ops = list(dict.fromkeys(c.op for c in m.collectives))
    sizes = sorted({c.size_bytes for c in m.collectives})
    cell = {(c.op, c.size_bytes): c for c in m.collectives}
    rows = []
    for s in sizes:
        row: list[Any] = [format_size(s)]
        for op in ops:
            c = cell.get((op, s))
            row.append(
                "-"
                if c is None
                else _num(c.busbw_gbps, 2 if c.busbw_gbps < 10 else 1) + ("" if c.check_ok else " !")
            )
        rows.append(row)
    return ["size", *ops], rows


def p2p_rows(m: Measurements, attr: str = "oneway_gbps") -> tuple[list[str], list[list[Any]]]:
    ranks = sorted({p.src for p in m.p2p} | {p.dst for p in m.p2p})
    cell = {(p.src, p.dst): getattr(p, attr) for p in m.p2p}
    who = "GPU" if m.meta.device_kind == "cuda" else "rank"
    rows = [[f"{who} {s}"] + [("-" if s == d else _num(cell.get((s, d)))) for d in ranks] for s in ranks]
    return ["src \\ dst"] + [f"{who} {d}" for d in ranks], rows


def scaling_rows(m: Measurements) -> list[list[Any]]:
    return [[s.gpus, _num(s.tokens_per_s, 0), _num(s.step_ms), _pct(s.efficiency)] for s in m.scaling]


def attention(findings: Sequence[GradedFigure]) -> list[str]:
    return [
        f"{MARK[f.grade]}: {f.figure}: {f.message}" for f in findings if f.grade in (Grade.WARN, Grade.FAIL)
    ]


def verdict(counts: dict[str, int], m: Measurements) -> str:
    if m.meta.device_kind != "cuda":
        return "no GPU: the CPU/gloo path ran; nothing is graded against a datasheet"
    parts = [
        f"{counts[g.value]} {g.value}"
        for g in (Grade.PASS, Grade.WARN, Grade.FAIL, Grade.UNKNOWN, Grade.INFO)
        if counts.get(g.value)
    ]
    return ", ".join(parts) or "nothing graded"


def render_text(
    m: Measurements, findings: Sequence[GradedFigure], counts: dict[str, int], files: Sequence[str]
) -> str:
    out = [
        *header_lines(m),
        "",
        table(["figure", "measured", "expected", "%", "grade"], findings_rows(findings)),
    ]
    if m.collectives:
        heads, rows = collective_rows(m)
        out += [
            "",
            f"collectives: busbw GB/s ({m.collectives[0].dtype}, {m.collectives[0].ranks} ranks)",
            table(heads, rows),
        ]
    if m.p2p:
        heads, rows = p2p_rows(m)
        out += ["", "P2P one way, GB/s", table(heads, rows)]
    if m.scaling:
        out += [
            "",
            f"training scaling: {m.meta.scaling_model}",
            table(["GPUs", "tokens/s", "step ms", "efficiency"], scaling_rows(m)),
        ]
    for s in m.skipped:
        out.append(f"skipped {s.part}: {s.reason}")
    notes = attention(findings)
    if notes:
        out += ["", *notes]
    out += ["", f"verdict: {verdict(counts, m)}"]
    out += [f"wrote {f}" for f in files]
    return "\n".join(out)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(
    m: Measurements, findings: Sequence[GradedFigure], counts: dict[str, int], plot_file: str | None
) -> str:
    title = "GPU" if m.meta.device_kind == "cuda" else "CPU/gloo"
    out = [f"# torchrig bench: {title} report", ""] + [f"- {line}" for line in header_lines(m)]
    out += [
        f"- verdict: {verdict(counts, m)}",
        "",
        "## Graded figures",
        "",
        md_table(["figure", "measured", "expected", "% of expected", "grade"], findings_rows(findings)),
    ]
    notes = attention(findings)
    if notes:
        out += ["", "Needs attention:", ""] + [f"- {n}" for n in notes]
    if plot_file:
        out += ["", f"![bench plots]({plot_file})"]
    gemm = [
        [
            g.rank,
            g.dtype,
            g.n,
            _num(g.tflops),
            _num(g.median_ms, 3),
            g.repeats,
            "ok" if g.check_ok else "WRONG",
            f"{g.max_rel_err:.1e}" if g.max_rel_err is not None else "-",
            gpu_state_text(g.sm_clock_mhz, g.temperature_c, g.power_w),
        ]
        for g in m.gemm
    ]
    if gemm:
        heads = ["GPU", "dtype", "n", "TFLOP/s", "median ms", "repeats", "check", "max rel err", "GPU at end"]
        out += ["", "## GEMM", "", md_table(heads, gemm)]
    mem = [
        [r.rank, r.kind, format_size(r.size_bytes), _num(r.gbps), "ok" if r.check_ok else "WRONG"]
        for r in m.memory
    ]
    mem += [
        [
            h.rank,
            f"{h.direction} {'pinned' if h.pinned else 'pageable'}",
            format_size(h.size_bytes),
            _num(h.gbps),
            "ok" if h.check_ok else "WRONG",
        ]
        for h in m.host
    ]
    if mem:
        out += [
            "",
            "## Memory and host transfers",
            "",
            md_table(["GPU", "kind", "size", "GB/s", "check"], mem),
        ]
    if m.p2p:
        for attr, label in (
            ("oneway_gbps", "one way, GB/s"),
            ("bidir_gbps", "both ways, GB/s"),
            ("latency_us", "latency, µs"),
        ):
            heads, rows = p2p_rows(m, attr)
            out += ["", f"## P2P {label}", "", md_table(heads, rows)]
    if m.collectives:
        heads, rows = collective_rows(m)
        out += [
            "",
            f"## Collectives: busbw GB/s ({m.collectives[0].dtype}, {m.collectives[0].ranks} ranks)",
            "",
            md_table(heads, rows),
        ]
    if m.scaling:
        out += [
            "",
            "## Training scaling",
            "",
            m.meta.scaling_model,
            "",
            md_table(["GPUs", "tokens/s", "step ms", "efficiency"], scaling_rows(m)),
        ]
    if m.skipped:
        out += ["", "## Skipped", ""] + [f"- {s.part}: {s.reason}" for s in m.skipped]
    return "\n".join(out) + "\n"
