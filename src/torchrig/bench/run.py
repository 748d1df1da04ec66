"""One bench run end to end, for the CLI: measure (or load), grade, render, write the report files."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

from torchrig.bench import grading, render
from torchrig.bench.records import Grade, GradedFigure, Measurements, measurements_to_json

JSON_NAME, MARKDOWN_NAME, PLOT_NAME = "bench.json", "bench.md", "bench.png"


@dataclasses.dataclass(frozen=True)
class BenchReport:
    measurements: Measurements
    findings: tuple[GradedFigure, ...]
    files: tuple[str, ...] = ()

    @property
    def counts(self) -> dict[str, int]:
        return grading.summary(list(self.findings))

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": self.counts,
            "verdict": render.verdict(self.counts, self.measurements),
            "findings": [dataclasses.asdict(f) | {"grade": f.grade.value} for f in self.findings],
            "measurements": measurements_to_json(self.measurements),
            "files": list(self.files),
        }

    def render_text(self) -> str:
        return render.render_text(self.measurements, self.findings, self.counts, self.files)

    @property
    def exit_code(self) -> int:
        return 1 if any(f.grade is Grade.FAIL for f in self.findings) else 0


def build_report(
    m: Measurements, peaks: Mapping[int, grading.Peaks | None], out_dir: str | None, plots: bool
) -> BenchReport:
    findings = tuple(grading.grade(m, peaks))
    report = BenchReport(m, findings)
    if not out_dir:
        return report
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    plot_name = None
    if plots:
        from torchrig.bench.plots import render_png

        files.append(render_png(m, peaks, str(out / PLOT_NAME)))
        plot_name = PLOT_NAME
    (out / MARKDOWN_NAME).write_text(render.render_markdown(m, findings, report.counts, plot_name))
    files.append(str(out / MARKDOWN_NAME))
    report = dataclasses.replace(report, files=(str(out / JSON_NAME), *files))
    from torchrig.report import dump_json

    (out / JSON_NAME).write_text(dump_json("bench", report) + "\n")
    return report


class ProgressDisplay:
    """A live progress bar on stderr (rich, when stderr is a terminal), else one plain line per step."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._task: Any = None
        if sys.stderr.isatty():
            try:
                from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

                self._bar = Progress(
                    TextColumn("bench"),
                    BarColumn(),
                    TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(),
                    TextColumn("{task.description}"),
                    transient=True,
                )
            except ImportError:
                self._bar = None

    def __enter__(self) -> ProgressDisplay:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, done: int, total: int, label: str) -> None:
        if self._bar is None:
            print(f"[{done + 1}/{total}] {label}", file=sys.stderr, flush=True)
            return
        if self._task is None:
            self._task = self._bar.add_task(label, total=total)
        self._bar.update(self._task, completed=done, description=label)


@dataclasses.dataclass(frozen=True)
class _ReportFile:
    """``bench.json`` as :meth:`BenchReport.to_json` writes it (under ``dump_json``'s header); its summary and
    verdict are derived from the findings again when read back."""

    findings: tuple[GradedFigure, ...]
    measurements: Any  # read by measurements_from_json, which checks its schema_version
    files: tuple[str, ...] = ()


def read_report(path: str | pathlib.Path, *, max_bytes: int) -> BenchReport:
    """A ``bench.json`` that ``torchrig bench --out DIR`` wrote, as the report it was (the dashboard's bench
    panel); an :class:`~torchrig.errors.InputError` of one line naming the file, and the key that does not fit."""
    from torchrig.bench.records import measurements_from_json
    from torchrig.errors import InputError
    from torchrig.inputfiles import read_json
    from torchrig.jsonrecords import RecordError, structure

    data = read_json(path, "bench report", max_bytes=max_bytes)  # bounded: a FIFO or /dev/zero never waits
    try:
        doc = structure(data, _ReportFile, "bench.json")
        return BenchReport(measurements_from_json(doc.measurements), doc.findings, doc.files)
    except RecordError as err:
        raise InputError(
            f"{path} is not a torchrig bench report ({err})", hint="run 'torchrig bench --out DIR' again"
        ) from None


def load_measurements(path: str) -> Measurements:
    """Measurements from a worker file or a ``--json`` / ``bench.json`` report (its ``measurements`` key)."""
    from torchrig.bench.records import measurements_from_json
    from torchrig.errors import InputError
    from torchrig.inputfiles import read_json
    from torchrig.jsonrecords import RecordError

    hint = "pass the bench.json that 'torchrig bench --out DIR' wrote"
    if not pathlib.Path(path).exists():
        raise InputError(f"no such file: {path}", hint=hint)
    try:
        data = read_json(path, "bench report")  # bounded size and depth, UTF-8, no NaN
    except InputError as err:
        raise InputError(f"cannot read {path}: {err.message}", hint=hint) from None
    data = data.get("measurements", data) if isinstance(data, dict) else data
    try:
        return measurements_from_json(data)
    except RecordError as err:
        raise InputError(
            f"{path} is not a torchrig bench result ({err})",
            hint="pass a bench.json written by torchrig bench",
        ) from None
