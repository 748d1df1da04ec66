"""Side by side: torchrig bench against the plain-PyTorch anchors (anchor_probe.py) measured in the same call.

Usage (from tools/gpu/bench.sh): python3 tools/gpu/bench_compare.py --work DIR --dest DIR --ngpu N
Reads DIR/anchor_single.out, DIR/anchor_coll.out (JSON lines the anchor printed), DIR/probe.out
(tools/gpu/bench_probe.py's diagnostics), DIR/full/bench.json and
DIR/quick.json (torchrig bench --json), DIR/steps.tsv (step, exit code, seconds, command); writes
DEST/bench-<N>gpu.json (everything together), DEST/bench-<N>gpu.md (the report with the comparison and the
commands) and copies the full run's PNG to DEST/bench-<N>gpu.png; prints the comparison table last.
A figure passes when torchrig's is at least 95% of the anchor's.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

MiB, GiB = 1 << 20, 1 << 30
RATIO_OK = 0.95
COLLECTIVE_SIZES = (256 * MiB, GiB, 4 * GiB)


def read_json(path: Path) -> dict[str, Any] | None:
    """The file as one JSON document, else its last line that parses as JSON (torchrun may add lines)."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(errors="replace"))
        return data if isinstance(data, dict) else None
    except ValueError:
        pass
    for line in reversed(path.read_text(errors="replace").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _pick(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def comparison(
    report: dict[str, Any] | None,
    single: dict[str, Any] | None,
    coll: dict[str, Any] | None,
    probe: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Rows (figure, unit, torchrig, anchor, ratio, ok, required) for every figure both sides measured.

    With the probe's diagnostics, two more rows compare against plain PyTorch measured the way torchrig
    measures: tf32 after 1 s idle, and pageable h2d from a buffer that holds data (the anchor's is never
    written, so its pages read the shared zero page).
    """
    m = (report or {}).get("measurements", {})
    rows: list[dict[str, Any]] = []

    def add(figure: str, unit: str, ours: float | None, anchor: float | None, required: bool) -> None:
        ratio = ours / anchor if ours is not None and anchor else None
        rows.append(
            {
                "figure": figure,
                "unit": unit,
                "torchrig": ours,
                "anchor": anchor,
                "ratio": ratio,
                "ok": ratio is not None and ratio >= RATIO_OK,
                "required": required,
            }
        )

    single = single or {}
    for dtype in ("bf16", "fp16", "tf32", "fp32"):
        g = _pick(m.get("gemm", []), rank=0, dtype=dtype, n=8192)
        add(
            f"GEMM {dtype} 8192³ (GPU 0)",
            "TFLOP/s",
            g and g["tflops"],
            single.get(f"gemm_{dtype}_tflops"),
            dtype == "bf16",
        )
    c = _pick(m.get("memory", []), rank=0, kind="copy")
    add("device copy, read+write (GPU 0)", "GB/s", c and c["gbps"], single.get("d2d_copy_GBps_rw"), True)
    for direction in ("h2d", "d2h"):
        for pinned in (True, False):
            h = _pick(m.get("host", []), rank=0, direction=direction, pinned=pinned)
            tag = "pinned" if pinned else "pageable"
            add(
                f"{direction} {tag} 1 GiB (GPU 0)",
                "GB/s",
                h and h["gbps"],
                single.get(f"{direction}_{tag}_GBps"),
                direction == "h2d" and pinned,
            )
    probe = probe or {}
    if probe:
        g = _pick(m.get("gemm", []), rank=0, dtype="tf32", n=8192)
        add(
            "GEMM tf32 8192³ vs. probe after 1 s idle",
            "TFLOP/s",
            g and g["tflops"],
            probe.get("tf32_allow_tf32_idle_tflops"),
            False,
        )
        h = _pick(m.get("host", []), rank=0, direction="h2d", pinned=False)
        add(
            "h2d pageable 1 GiB vs. probe, written buffer",
            "GB/s",
            h and h["gbps"],
            probe.get("h2d_pageable_written_GBps"),
            False,
        )
    anchor_rows = (coll or {}).get("collectives", [])
    for op, key in (("all_reduce", "allreduce_busbw"), ("all_gather", "allgather_busbw")):
        for size in COLLECTIVE_SIZES:
            ours = _pick(m.get("collectives", []), op=op, size_bytes=size)
            base = _pick(anchor_rows, bytes=size)
            if ours is None and base is None:
                continue
            label = f"{size // GiB} GiB" if size >= GiB else f"{size // MiB} MiB"
            add(
                f"{op} busbw {label} ({(coll or {}).get('world', '?')} GPUs)",
                "GB/s",
                ours and ours["busbw_gbps"],
                base and base[key],
                True,
            )
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    out = [f"{'figure':<46} {'torchrig':>10} {'anchor':>10} {'ratio':>7}  verdict"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        verdict = "ok" if r["ok"] else ("LOW" if r["ratio"] is not None else "missing")
        out.append(
            f"{r['figure']:<46} {num(r['torchrig']):>10} {num(r['anchor']):>10} {ratio:>7}  {verdict}"
            + ("" if r["required"] else " (info)")
        )
    return out


def markdown(
    rows: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    quick_s: float | None,
    full_md: str,
    quick: dict[str, Any] | None,
    ngpu: int,
    probe: dict[str, Any] | None = None,
) -> str:
    lines = [
        f"## {ngpu}x GPU: torchrig bench vs. the plain-PyTorch anchor (same call)",
        "",
        "| figure | torchrig | anchor | ratio | |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        t = "-" if r["torchrig"] is None else f"{r['torchrig']:,.1f} {r['unit']}"
        a = "-" if r["anchor"] is None else f"{r['anchor']:,.1f} {r['unit']}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(
            f"| {r['figure']} | {t} | {a} | {ratio} | {'ok' if r['ok'] else 'LOW'}{'' if r['required'] else ' (info)'} |"
        )
    lines += [
        "",
        f"`torchrig bench --quick` took {quick_s:.1f} s end to end." if quick_s is not None else "",
        "",
        "Commands, in the order they ran (exit status, seconds):",
        "",
        "```",
    ]
    lines += [f"{s['command']}    # rc={s['rc']} {s['seconds']}s" for s in steps]
    lines += ["```", ""]
    if quick:
        lines += ["Quick run verdict: " + str(quick.get("verdict")), ""]
    lines += probe_lines(probe)
    return "\n".join(lines) + "\n" + full_md


PROBE_ROWS = (
    ("tf32_allow_tf32_idle", "GEMM tf32 8192³, allow_tf32 = True, after 1 s idle", "TFLOP/s"),
    (
        "tf32_precision_high_idle",
        "GEMM tf32 8192³, set_float32_matmul_precision('high'), after 1 s idle",
        "TFLOP/s",
    ),
    (
        "tf32_precision_high_idle_2",
        "GEMM tf32 8192³, set_float32_matmul_precision('high') again, after 1 s idle",
        "TFLOP/s",
    ),
    ("tf32_allow_tf32_idle_2", "GEMM tf32 8192³, allow_tf32 = True again, after 1 s idle", "TFLOP/s"),
    ("tf32_right_after_fp32_16384", "GEMM tf32 8192³ right after 25 fp32 16384³ GEMMs", "TFLOP/s"),
    ("tf32_after_fp32_16384_and_1s_idle", "GEMM tf32 8192³ after those and 1 s idle", "TFLOP/s"),
    ("h2d_pageable_never_written", "h2d pageable 1 GiB, never-written torch.empty (as the anchor)", "GB/s"),
    ("h2d_pageable_written", "h2d pageable 1 GiB, the same buffer once written", "GB/s"),
    ("host_memcpy_1thread", "host memcpy 1 GiB, one thread (bounds pageable staging)", "GB/s"),
)


def probe_lines(probe: dict[str, Any] | None) -> list[str]:
    """The diagnostics of tools/gpu/bench_probe.py as a Markdown table (empty without them)."""
    if not probe:
        return []
    lines = [
        "Diagnostics (plain PyTorch, `tools/gpu/bench_probe.py`, same call):",
        "",
        "| probe | figure | SM clock at end |",
        "|---|---:|---:|",
    ]
    for key, label, unit in PROBE_ROWS:
        value = probe.get(f"{key}_tflops" if unit == "TFLOP/s" else f"{key}_GBps")
        if value is None:
            continue
        mhz = probe.get(f"{key}_sm_mhz")
        lines.append(f"| {label} | {value:,.1f} {unit} | {f'{mhz} MHz' if mhz else '-'} |")
    return [*lines, ""]


def read_steps(path: Path) -> list[dict[str, Any]]:
    steps = []
    if path.exists():
        for line in path.read_text().splitlines():
            name, rc, secs, cmd = line.split("\t", 3)
            steps.append({"step": name, "rc": int(rc), "seconds": float(secs), "command": cmd})
    return steps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--dest", required=True)
    ap.add_argument("--ngpu", type=int, required=True)
    args = ap.parse_args()
    work, dest = Path(args.work), Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    single, coll = read_json(work / "anchor_single.out"), read_json(work / "anchor_coll.out")
    full, quick = read_json(work / "full" / "bench.json"), read_json(work / "quick.json")
    probe = read_json(work / "probe.out")
    steps = read_steps(work / "steps.tsv")
    quick_s = next((s["seconds"] for s in steps if s["step"] == "quick"), None)
    rows = comparison(full, single, coll, probe)
    full_md_raw = (
        (work / "full" / "bench.md").read_text()
        if (work / "full" / "bench.md").exists()
        else "(full run wrote no report)\n"
    )
    logs = {p.name: p.read_text(errors="replace")[-4000:] for p in sorted(work.glob("*.err"))}
    stem = f"bench-{args.ngpu}gpu"
    full_md = full_md_raw.replace("](bench.png)", f"]({stem}.png)").replace(
        "# torchrig bench:", "### torchrig bench:", 1
    )
    (dest / f"{stem}.md").write_text(markdown(rows, steps, quick_s, full_md, quick, args.ngpu, probe))
    (dest / f"{stem}.json").write_text(
        json.dumps(
            {
                "comparison": rows,
                "steps": steps,
                "quick_seconds": quick_s,
                "anchor_single": single,
                "anchor_collectives": coll,
                "probe": probe,
                "full": full,
                "quick": quick,
                "stderr_tails": logs,
            },
            indent=1,
        )
    )
    if (work / "full" / "bench.json").exists():
        shutil.copy(work / "full" / "bench.json", dest / f"{stem}-full.json")
    if (work / "full" / "bench.png").exists():
        shutil.copy(work / "full" / "bench.png", dest / f"{stem}.png")
    for s in steps:
        print(f"step {s['step']}: rc={s['rc']} {s['seconds']}s")
    if full:
        print(f"torchrig verdict: {full.get('verdict')}")
    if quick_s is not None:
        print(f"quick run: {quick_s:.1f} s ({'under' if quick_s < 60 else 'OVER'} a minute)")
    print("\n".join(table(rows)))
    if probe:
        print("probe: " + json.dumps(probe))
    required = [r for r in rows if r["required"]]
    bad = [r for r in required if not r["ok"]]
    print(f"required figures within 5% of the anchor or above: {len(required) - len(bad)}/{len(required)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
