"""How far each part of a training step is from the GPU's memory bandwidth, from Nsight Compute's counters.

`tools/gpu/step_roofline.sh` runs `torchrig train ... --profile-steps N --profiler cuda` under
`ncu --profile-from-start off`, so that ncu measures every kernel of those N steps and nothing else (not the
compile, not the warm-up): its time (`gpu__time_duration.sum`) and the bytes it read from and wrote to the
GPU's memory (`dram__bytes_read.sum`, `dram__bytes_write.sum`), and how busy its SMs were
(`sm__throughput.avg.pct_of_peak_sustained_elapsed`, optional). ncu runs the kernels one at a time, so the
times are each kernel's own, without the gaps between them.

For each part of the step (train/profile.py's kernel groups: matmul, attention, Inductor's Triton kernels,
the loss, the optimizer, ...) and for each kernel, this prints the time per step, the bytes per step, the
bandwidth reached, and the time those bytes would take at the card's datasheet bandwidth (the knowledge
base's `memory_bandwidth_gbps`). A kernel far above that floor can get faster by itself; a part at its floor
gets faster only by moving fewer bytes (fusing it into a neighbour, a smaller dtype).

usage: python3 tools/gpu/ncu_roofline.py NCU.csv --gpu 'NVIDIA H200' --steps N [--json]
NCU.csv: ncu's `--csv --print-units base` output (its default "details" page), e.g. from `--log-file`.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

TIME = "gpu__time_duration.sum"
READ = "dram__bytes_read.sum"
WRITE = "dram__bytes_write.sum"
METRICS = (TIME, READ, WRITE)
# optional: how busy the SMs were, as a share of their peak (Nsight Compute's "Speed Of Light" figure); for a
# GEMM near 100 % its kernel is at the compute roof, where only fewer FLOPs help
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
# ncu's units, to seconds and bytes: --print-units base gives second and byte (an empty unit is taken as
# that base unit); the others are its auto-scaled units, accepted all the same
SCALE = {
    "": 1.0, "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
    "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
    "KB": 1e3, "MB": 1e6, "GB": 1e9, "%": 0.01,
}  # fmt: skip
# the parts whose time is arithmetic, not bytes: their bandwidth floor says little
COMPUTE_BOUND = ("matmul", "attention")


class RooflineError(Exception):
    """The CSV is not ncu's output with the three metrics."""


@dataclass(frozen=True)
class Kernel:
    name: str
    seconds: float
    bytes: float
    sm_busy: float | None = None  # 0..1 (SM), when measured


@dataclass(frozen=True)
class Row:
    """One part (or one kernel name) per step."""

    name: str
    kernels: int
    ms: float
    gb: float
    tb_per_s: float
    share_of_peak: float  # the bandwidth reached, as a share of the datasheet's
    floor_ms: float  # the bytes at the datasheet bandwidth
    excess_ms: float  # ms - floor_ms
    sm_busy: float | None  # time-weighted SM throughput, 0..1, when measured


def read_ncu_csv(text: str) -> list[Kernel]:
    """Kernels from ncu's ``--csv`` details page: one row per (kernel launch, metric). Lines before the
    header (ncu's ``==PROF==`` messages, the program's own output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise RooflineError(
            'no ncu CSV header (a line starting with "ID") in the input; was it run with --csv?'
        )
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    need = ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
    missing = [c for c in need if c not in (reader.fieldnames or [])]
    if missing:
        raise RooflineError(f"the ncu CSV has no column {missing[0]!r}: use the details page (ncu's default)")
    launches: dict[str, dict[str, float]] = {}
    names: dict[str, str] = {}
    for row in reader:
        metric = row["Metric Name"]
        if metric not in (*METRICS, SM):
            continue
        unit = row["Metric Unit"]
        if unit not in SCALE:
            raise RooflineError(f"unknown unit {unit!r} of {metric}; run ncu with --print-units base")
        try:
            value = float(row["Metric Value"].replace(",", "")) * SCALE[unit]
        except ValueError:
            raise RooflineError(
                f"{metric} of kernel {row['ID']} is not a number: {row['Metric Value']!r}"
            ) from None
        launches.setdefault(row["ID"], {})[metric] = value
        names[row["ID"]] = row["Kernel Name"]
    kernels = []
    for launch, values in launches.items():
        if not set(METRICS) <= set(values):
            absent = sorted(set(METRICS) - set(values))
            raise RooflineError(
                f"kernel {launch} lacks {', '.join(absent)}: pass --metrics {','.join(METRICS)}"
            )
        kernels.append(Kernel(names[launch], values[TIME], values[READ] + values[WRITE], values.get(SM)))
    if not kernels:
        raise RooflineError(
            "the ncu CSV holds no kernel: was the window empty (--profiler cuda, --profile-steps)?"
        )
    return kernels


def part_of(name: str) -> str:
    from torchrig.train.profile import KERNEL_GROUPS

    low = name.lower()
    return next((g for g, pats in KERNEL_GROUPS if any(p in low for p in pats)), "other")


def rows(kernels: list[Kernel], key, steps: int, peak_gbps: float) -> list[Row]:
    """One :class:`Row` per value of ``key(kernel)``, per step, the most time first."""
    grouped: dict[str, list[Kernel]] = {}
    for k in kernels:
        grouped.setdefault(key(k), []).append(k)
    out = []
    for name, ks in grouped.items():
        s = sum(k.seconds for k in ks) / steps
        b = sum(k.bytes for k in ks) / steps
        floor = b / (peak_gbps * 1e9)
        busy = [k for k in ks if k.sm_busy is not None]
        busy_s = sum(k.seconds for k in busy)
        out.append(
            Row(
                name=name,
                kernels=len(ks) // steps if len(ks) % steps == 0 else round(len(ks) / steps, 1),
                ms=round(s * 1e3, 4),
                gb=round(b / 1e9, 4),
                tb_per_s=round(b / s / 1e12, 3) if s > 0 else 0.0,
                share_of_peak=round(b / s / (peak_gbps * 1e9), 3) if s > 0 else 0.0,
                floor_ms=round(floor * 1e3, 4),
                excess_ms=round((s - floor) * 1e3, 4),
                sm_busy=round(sum(k.sm_busy * k.seconds for k in busy) / busy_s, 3) if busy_s > 0 else None,
            )
        )
    return sorted(out, key=lambda r: -r.ms)


def report(kernels: list[Kernel], steps: int, peak_gbps: float, top: int = 25) -> dict:
    """The parts, the kernels with the most time above their bandwidth floor, and the totals."""
    parts = rows(kernels, lambda k: part_of(k.name), steps, peak_gbps)
    by_name = sorted(rows(kernels, lambda k: k.name, steps, peak_gbps), key=lambda r: -r.excess_ms)
    total = sum(r.ms for r in parts)
    memory_parts = [r for r in parts if r.name not in COMPUTE_BOUND]
    return {
        "steps": steps,
        "peak_gbps": peak_gbps,
        "kernel_ms": round(total, 3),
        "compute_bound_ms": round(sum(r.ms for r in parts if r.name in COMPUTE_BOUND), 3),
        "memory_parts_ms": round(sum(r.ms for r in memory_parts), 3),
        "memory_parts_floor_ms": round(sum(r.floor_ms for r in memory_parts), 3),
        "parts": [asdict(r) for r in parts],
        "kernels_above_floor": [asdict(r) for r in by_name[:top]],
    }


def render(rep: dict) -> str:
    head = f"{'':<44} {'ms/step':>8} {'GB/step':>8} {'TB/s':>6} {'of peak':>8} {'floor ms':>9} {'SM busy':>8}"
    out = [
        f"per step, {rep['steps']} step(s) measured; datasheet bandwidth {rep['peak_gbps']:,.0f} GB/s",
        head,
    ]
    for r in rep["parts"]:
        out.append(
            f"{r['name'][:44]:<44} {r['ms']:>8.3f} {r['gb']:>8.3f} {r['tb_per_s']:>6.2f} "
            f"{r['share_of_peak']:>8.0%} {r['floor_ms']:>9.3f} {_share(r['sm_busy']):>8}"
        )
    out.append(
        f"all kernels {rep['kernel_ms']:.3f} ms: matmul + attention {rep['compute_bound_ms']:.3f} ms; the rest "
        f"{rep['memory_parts_ms']:.3f} ms, {rep['memory_parts_floor_ms']:.3f} ms of it at the datasheet bandwidth"
    )
    out.append("kernels with the most time above their bandwidth floor (ms/step, floor, count):")
    for r in rep["kernels_above_floor"]:
        out.append(f"  {r['excess_ms']:8.4f} above {r['floor_ms']:.4f}  x{r['kernels']}  {r['name'][:100]}")
    return "\n".join(out)


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", type=Path)
    p.add_argument("--gpu", required=True, help="the GPU's name, as nvidia-smi gives it")
    p.add_argument("--steps", type=int, required=True, help="the steps in the window (--profile-steps)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from torchrig.compat.kb import load_kb
    from torchrig.errors import InputError

    try:
        if a.steps < 1:
            raise RooflineError("--steps must be 1 or more")
        gpu = load_kb().find_gpu(a.gpu)
        peak = gpu.peaks.memory_bandwidth_gbps
        if not peak:
            raise RooflineError(f"the knowledge base has no memory bandwidth for {gpu.name}")
        rep = report(read_ncu_csv(a.csv.read_text(errors="replace")), a.steps, float(peak))
    except (RooflineError, InputError, OSError) as err:
        print(f"ncu_roofline: {err}", file=sys.stderr)
        return 2
    print(json.dumps(rep) if a.json else render(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
