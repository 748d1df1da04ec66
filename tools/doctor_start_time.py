"""How long ``torchrig doctor --json`` takes from a cold process to its report, run after run.

    python tools/doctor_start_time.py --runs 5                  # this interpreter (its torch probed)
    python tools/doctor_start_time.py --runs 5 --without-torch  # a fresh venv holding torchrig alone

After one warm-up run (not counted: it leaves the compiled modules, as ``pip install`` does), each run is a
fresh ``python -m torchrig doctor --json`` (exit 0 or 1: a healthy or a flagged machine; any
other status stops the tool). With the torch probe, ``python -c 'import torch'`` runs between the doctor runs
in the same interpreter, as the baseline doctor is judged against. ``--without-torch`` makes a venv (in a
temporary folder, removed after) with only this checkout installed (``pip install -e``; PyPI or a local
index must be reachable for its dependencies) and times doctor there: the CPU-only machine without torch.

It prints each run's wall time, then one row for docs/results/README.md (claim, figure, baseline, machine,
date, command). Targets (issue 34): under 5 s on a healthy H200, under 0.5 s without torch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    return time.perf_counter() - t0, proc


def fresh_venv(where: Path) -> str:
    venv.EnvBuilder(with_pip=True).create(where)
    python = str(where / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "-e", str(ROOT)], check=True, cwd=where)
    return python


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f}, {len(values)} runs)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of doctor (default 5)")
    ap.add_argument("--without-torch", action="store_true", help="time doctor in a fresh venv without torch")
    ap.add_argument(
        "--src",
        help="the src/ folder whose torchrig to time (default: this checkout's; an older "
        "commit's, extracted with git archive, for a before/after)",
    )
    args = ap.parse_args()
    if not 1 <= args.runs <= 100:
        ap.error("--runs must be 1 to 100")
    # as an installed torchrig runs: from its compiled modules (pip writes them; PYTHONDONTWRITEBYTECODE, set on
    # some development machines, would make every run compile torchrig's ~100 modules again: ~0.1 s)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    with tempfile.TemporaryDirectory(prefix="doctor-start-") as tmp:
        python = fresh_venv(Path(tmp) / "venv") if args.without_torch else sys.executable
        # this checkout's code (or --src's), whatever is installed
        env["PYTHONPATH"] = os.path.abspath(args.src) if args.src else str(ROOT / "src")
        doctor = [python, "-m", "torchrig", "doctor", "--json"]
        timed(doctor, env)  # a warm-up, not counted: it writes the compiled modules
        times: list[float] = []
        base: list[float] = []
        beyond: list[float] = []  # doctor's own time: its wall time less the torch probe's
        machine = None
        label = "pass"
        for i in range(args.runs):
            wall, proc = timed(doctor, env)
            if proc.returncode not in (0, 1):
                print(f"doctor exited {proc.returncode}: {proc.stderr.strip()[-500:]}", file=sys.stderr)
                return 1
            report = json.loads(proc.stdout)
            machine = machine or report.get("machine")
            times.append(wall)
            probe_ms = report["facts"].get("probe_ms", {})
            if probe_ms.get("torch") is not None:
                beyond.append(wall - probe_ms["torch"] / 1000)
            label = "import torch" if report["facts"]["torch"]["status"] == "ok" else "pass"
            b, _p = timed([python, "-c", label], env)
            base.append(b)
            print(
                f"run {i + 1}: doctor {wall:.2f} s (exit {proc.returncode}; torch probe {probe_ms.get('torch')} "
                f"ms); python -c '{label}' {b:.2f} s",
                flush=True,
            )
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    claim = "doctor, CPU-only machine without torch" if args.without_torch else "doctor with the torch probe"
    vs = f"`python -c '{label}'` {spread(base)}"
    opts = (" --without-torch" if args.without_torch else "") + (f" --src {args.src}" if args.src else "")
    cmd = f"`python3 tools/doctor_start_time.py --runs {args.runs}{opts}`"
    if beyond:
        print(f"doctor beyond its torch probe: {spread(beyond)}")
    print(f"| {claim} | {spread(times)} | {vs} | {machine}, {os.cpu_count()} CPUs | {date} | {cmd} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
