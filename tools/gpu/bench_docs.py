"""Put a GPU run's bench results into docs/benchmarks.md: one command per results folder.

Usage (repository root):
    python3 tools/gpu/bench_docs.py RESULTS [RESULTS ...] [--label TEXT] [--docs docs/benchmarks.md]

RESULTS is a folder holding ``bench-<N>gpu.json`` and ``bench-<N>gpu.png`` (what tools/gpu/bench.sh writes
under ``$OUT/bench``; an unpacked tools/gpu/all.sh archive's ``bench/``), with the run's ``machine.txt``
there or one level up. For each run found it writes the section between the markers
``<!-- bench-results:<gpu>x<N>:begin -->`` and ``<!-- bench-results:<gpu>x<N>:end -->`` of the docs page
(e.g. ``h200x1``) and copies the plot to ``docs/img/bench-<gpu>x<N>.png``. The section holds the machine and
date, the commands exactly as they ran, torchrig against the plain-PyTorch anchor, the graded figures
(the saved measurements graded by this checkout, as ``torchrig bench --from-json`` does), the GEMM and
transfer tables, collectives and scaling when measured, the diagnostics probe, and the plot.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_compare  # noqa: E402

from torchrig.bench import grading, render  # noqa: E402
from torchrig.bench.busbw import format_size  # noqa: E402
from torchrig.bench.records import Measurements, measurements_from_json  # noqa: E402

BEGIN, END = "<!-- bench-results:{key}:begin -->", "<!-- bench-results:{key}:end -->"


def find_runs(folder: Path) -> list[tuple[int, Path]]:
    """(GPU count, bench-<N>gpu.json) for every run in the folder (or its bench/ subfolder)."""
    runs = []
    for base in (folder, folder / "bench"):
        for p in sorted(base.glob("bench-*gpu.json")):
            m = re.fullmatch(r"bench-(\d+)gpu\.json", p.name)
            if m:
                runs.append((int(m.group(1)), p))
    return runs


def machine_facts(folder: Path) -> dict[str, str]:
    """Driver and Python version from the run's machine.txt (nvidia-smi's banner, python3 -c sys.version)."""
    for p in (folder / "machine.txt", folder.parent / "machine.txt"):
        if p.exists():
            text = p.read_text(errors="replace")
            facts = {}
            if m := re.search(r"Driver Version:\s*([\d.]+)\s+CUDA Version:\s*([\d.]+)", text):
                facts["driver"], facts["driver_cuda"] = m.group(1), m.group(2)
            if m := re.search(r"^(3\.\d+\.\d+) ", text, re.M):
                facts["python"] = m.group(1)
            return facts
    return {}


def slug(m: Measurements) -> str:
    name = (m.gpus[0].name if m.gpus else "gpu").lower().removeprefix("nvidia ").strip()
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def _comparison(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| figure | torchrig | anchor | ratio | |", "|---|---:|---:|---:|---|"]
    for r in rows:
        t = "-" if r["torchrig"] is None else f"{r['torchrig']:,.1f} {r['unit']}"
        a = "-" if r["anchor"] is None else f"{r['anchor']:,.1f} {r['unit']}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        verdict = ("ok" if r["ok"] else "LOW") + ("" if r["required"] else " (info)")
        out.append(f"| {r['figure']} | {t} | {a} | {ratio} | {verdict} |")
    return out


def _tables(m: Measurements) -> list[str]:
    out = []
    if m.gemm:
        rows = [
            [
                g.rank,
                g.dtype,
                g.n,
                render._num(g.tflops),
                render._num(g.median_ms, 3),
                g.repeats,
                "ok" if g.check_ok else "WRONG",
                render.gpu_state_text(g.sm_clock_mhz, g.temperature_c, g.power_w),
            ]
            for g in m.gemm
        ]
        heads = ["GPU", "dtype", "n", "TFLOP/s", "median ms", "repeats", "check", "GPU at end"]
        out += ["GEMM, in the order measured:", "", render.md_table(heads, rows), ""]
    mem = [[r.rank, r.kind, format_size(r.size_bytes), render._num(r.gbps)] for r in m.memory]
    mem += [
        [
            h.rank,
            f"{h.direction} {'pinned' if h.pinned else 'pageable'}",
            format_size(h.size_bytes),
            render._num(h.gbps),
        ]
        for h in m.host
    ]
    if mem:
        out += [
            "Device memory and host transfers:",
            "",
            render.md_table(["GPU", "kind", "size", "GB/s"], mem),
            "",
        ]
    if m.collectives:
        heads, rows = render.collective_rows(m)
        c = m.collectives[0]
        out += [
            f"Collectives, busbw GB/s ({c.dtype}, {c.ranks} ranks):",
            "",
            render.md_table(heads, rows),
            "",
        ]
    if m.p2p:
        heads, rows = render.p2p_rows(m)
        out += ["P2P one way, GB/s:", "", render.md_table(heads, rows), ""]
    if m.scaling:
        rows = render.scaling_rows(m)
        out += [
            f"Training scaling ({m.meta.scaling_model}):",
            "",
            render.md_table(["GPUs", "tokens/s", "step ms", "efficiency"], rows),
            "",
        ]
    return out


def _quick_gemm(quick: dict[str, Any] | None, anchor: dict[str, Any] | None) -> list[str]:
    """The --quick run's GEMM figures next to the full run's anchor: the same code, a second sample."""
    rows = [g for g in ((quick or {}).get("measurements") or {}).get("gemm", []) if g.get("rank") == 0]
    if not rows:
        return []
    cells = []
    for g in rows:
        base = (anchor or {}).get(f"gemm_{g['dtype']}_tflops")
        ratio = f" ({g['tflops'] / base:.3f} of the anchor)" if base else ""
        cells.append(f"{g['dtype']} {g['tflops']:,.1f}{ratio}")
    return ["The `--quick` run's GEMM, 8192³, TFLOP/s: " + "; ".join(cells) + ".", ""]


def section(data: dict[str, Any], ngpu: int, img: str, label: str, facts: dict[str, str]) -> tuple[str, str]:
    """(marker key, Markdown section) for one run's bench-<N>gpu.json."""
    full = data.get("full") or {}
    if "measurements" not in full:
        raise SystemExit(f"bench_docs: the run has no full torchrig report (bench-{ngpu}gpu.json 'full')")
    m = measurements_from_json(full["measurements"])
    key = f"{slug(m)}x{ngpu}"
    findings = grading.grade(m, grading.kb_peaks(m))
    counts = grading.summary(findings)
    meta = m.meta
    gpu_name = m.gpus[0].name if m.gpus else "?"
    driver = f", driver {facts['driver']} (CUDA {facts.get('driver_cuda', '?')})" if "driver" in facts else ""
    python = f", Python {facts['python']}" if "python" in facts else ""
    lines = [
        f"#### {ngpu}× {gpu_name}: {label}",
        "",
        f"Machine `{meta.hostname}`: {ngpu}× {gpu_name}{driver}; torch {meta.torch_version}, CUDA "
        f"{meta.cuda_version}, NCCL {meta.nccl_version}{python}. Full run finished {meta.date_utc}.",
        "Environment: " + " ".join(f"`{k}={v}`" for k, v in sorted(meta.env.items())) + ".",
        "",
        "Commands exactly as they ran (`tools/gpu/bench.sh`, repository root, `PYTHONPATH=src`), "
        "with exit status and seconds:",
        "",
        "```",
        *[f"{s['command']}    # rc={s['rc']} {s['seconds']}s" for s in data.get("steps", [])],
        "```",
        "",
        "torchrig against the plain-PyTorch anchor in the same call (a required figure is ok at ≥ 95% "
        "of the anchor's; `(info)` rows are shown, not required):",
        "",
        *_comparison(data.get("comparison", [])),
        "",
    ]
    if data.get("quick_seconds") is not None:
        lines += [f"`torchrig bench --quick` took {data['quick_seconds']:.1f} s end to end.", ""]
    lines += _quick_gemm(data.get("quick"), data.get("anchor_single"))
    lines += [
        f"Graded figures of the full run (verdict: {render.verdict(counts, m)}; the saved measurements "
        "graded by this version, as `torchrig bench --from-json` does):",
        "",
        render.md_table(
            ["figure", "measured", "expected", "% of expected", "grade"], render.findings_rows(findings)
        ),
        "",
        *_tables(m),
        *bench_compare.probe_lines(data.get("probe")),
        f"![torchrig bench plots, {ngpu}× {gpu_name}]({img})",
    ]
    return key, "\n".join(lines)


def replace_section(doc: str, key: str, body: str) -> str:
    begin, end = BEGIN.format(key=key), END.format(key=key)
    if begin not in doc or end not in doc:
        raise SystemExit(
            f"bench_docs: the docs page has no '{begin}' ... '{end}' markers: add them where it goes"
        )
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path, help="results folders (bench-<N>gpu.json inside)")
    ap.add_argument("--label", default="", help="the section's title after the GPUs, e.g. 'run 2'")
    ap.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = ap.parse_args(argv)
    doc = args.docs.read_text()
    img_dir = args.docs.parent / "img"
    done = 0
    for folder in args.results:
        facts = machine_facts(folder)
        for ngpu, path in find_runs(folder):
            data = json.loads(path.read_text())
            m = measurements_from_json(data["full"]["measurements"])
            img_name = f"bench-{slug(m)}x{ngpu}.png"
            label = args.label or m.meta.date_utc
            key, body = section(data, ngpu, f"img/{img_name}", label, facts)
            png = path.with_suffix(".png")
            if png.exists():
                img_dir.mkdir(parents=True, exist_ok=True)
                shutil.copy(png, img_dir / img_name)
            doc = replace_section(doc, key, body)
            print(
                f"bench_docs: {path} -> section {key}" + (f", {img_dir / img_name}" if png.exists() else "")
            )
            done += 1
    if not done:
        raise SystemExit("bench_docs: no bench-<N>gpu.json in " + ", ".join(map(str, args.results)))
    args.docs.write_text(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
