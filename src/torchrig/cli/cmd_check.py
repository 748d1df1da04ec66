"""Will these GPUs, with this NVIDIA driver, run this PyTorch build? Answers works / works_with_caveats /
fails, with every reason (GPU architecture vs the build's kernels, driver vs the build's CUDA runtime,
driver branch vs the GPU) and, when it fails, the nearest fix as a pip command or a driver branch.

examples:
  torchrig check --gpu "RTX 5090" --driver 570.86.10 --torch 2.6.0+cu124     # fails: no sm_120 kernels
  torchrig check --gpu "RTX 5090" --driver 570.86.10 --torch 2.7.0+cu128     # works
  torchrig check --gpu "GTX 1080 Ti" --driver 550.54.14 --torch 2.8.0         # the PyPI build
  torchrig check --gpu A100 --gpu "RTX 4090" --driver 535.104.05 --torch 2.8.0+cu126 --json
  torchrig check --gpu V100 --torch 2.9.0+cu130                              # arch only, no driver check

--torch takes VERSION (the build `pip install torch==VERSION` gets from PyPI), VERSION+cuXYZ or VERSION+cpu.
--driver is the version nvidia-smi prints (e.g. 535.104.05); without it only the architecture is checked.
exit status: 0 works or works_with_caveats, 1 fails, 2 bad input (unknown GPU, malformed or unpublished version).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine is imported by run(), so that --help stays light
    from torchrig.compat.check import CheckResult

MARK = {"info": "ok  ", "caveat": "warn", "fail": "FAIL"}
TITLE = {"works": "WORKS", "works_with_caveats": "WORKS WITH CAVEATS", "fails": "FAILS"}


def add_gpu_driver_arguments(parser: argparse.ArgumentParser) -> None:
    """``--gpu`` (repeatable) and ``--driver``: the hardware half that check and resolve share."""
    parser.add_argument(
        "--gpu",
        action="append",
        required=True,
        metavar="GPU",
        help="GPU name as nvidia-smi or the datasheet spells it (repeat for several GPUs)",
    )
    parser.add_argument("--driver", metavar="VERSION", help="NVIDIA driver version, e.g. 535.104.05")


def configure(parser: argparse.ArgumentParser) -> None:
    add_gpu_driver_arguments(parser)
    parser.add_argument(
        "--torch", required=True, metavar="VERSION[+cuXYZ|+cpu]", help="PyTorch build, e.g. 2.8.0+cu126"
    )


@dataclass(frozen=True)
class CheckReport:
    result: CheckResult

    @property
    def exit_code(self) -> int:
        return 1 if self.result.verdict.value == "fails" else 0

    def to_json(self) -> dict[str, Any]:
        return self.result.to_json()

    def render_text(self) -> str:
        r = self.result
        gpus = ", ".join(f"{g.name} ({g.sm})" for g in r.gpus)
        driver = f"driver {r.driver}" if r.driver else "driver not given"
        lines = [f"torch {r.build.label} on {gpus}, {driver}: {TITLE[r.verdict.value]}", ""]
        for reason in r.reasons:
            lines.append(f"  {MARK[reason.severity.value]}  {reason.message}  [{reason.code}]")
        if r.fixes:
            lines += ["", "fixes (nearest first):"]
            for i, fix in enumerate(r.fixes, 1):
                lines.append(f"  {i}. {fix.summary}")
                if fix.pip_command:
                    lines.append(f"     {fix.pip_command}")
        for note in r.notes:
            lines += ["", f"note: {note}"]
        return "\n".join(lines)


def run(args: argparse.Namespace) -> CheckReport:
    from torchrig.compat import check, load_kb
    from torchrig.compat import versions as V

    if args.driver is not None:
        V.parse_driver(args.driver)
    kb = load_kb()
    build = kb.find_build(args.torch)
    gpus = list({g.id: g for g in (kb.find_gpu(name) for name in args.gpu)}.values())  # 8x the same GPU: once
    return CheckReport(check(kb, gpus=gpus, driver=args.driver, build=build))
