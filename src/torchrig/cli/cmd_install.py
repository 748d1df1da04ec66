"""Install the right PyTorch build for this machine: resolve it (this machine's GPUs and driver through NVML,
or --gpu/--driver/--platform), find the newest such build the index really serves this interpreter, install it
with pip (or uv where it is on PATH) into this interpreter or --python, verify it with a real kernel
(torch.ones(1, device="cuda").add_(1) for a CUDA build, an op on the CPU for the CPU build), then print
doctor's verdict.

examples:
  torchrig install                                  # this machine: its GPUs and driver, or the CPU build
  torchrig install --dry-run                        # the exact command; nothing is changed
  torchrig install --gpu "RTX 4090" --driver 550.54.14 --dry-run
  torchrig install --torch 2.13.0+cpu --python .venv/bin/python
  torchrig install --torch '>=2.8,<2.10' --constraint constraints.txt
  torchrig install --index-url https://download.pytorch.org/whl/cu128 --yes

The index is the build's own: PyPI for what `pip install torch` gets there, download.pytorch.org/whl/cuXYZ or
/whl/cpu for the others, the Jetson AI Lab index on a JetPack 6 Jetson; --index-url points at a mirror. pip's own configuration (pip config list: extra
indexes, find-links) still applies. A working torch is never replaced without --yes (a broken one is).
--constraint FILE passes FILE to the installer when it exists and writes torch's exact pin into it afterwards,
so that 'pip install -c FILE ...' keeps the build.
exit status: 0 installed, verified and doctor healthy; 1 verification failed or doctor found problems;
2 bad input or a missing piece (no python at --python, no pip, the index unreachable), with what to do.
"""

from __future__ import annotations

import argparse
from typing import Any

from torchrig.argtypes import MAX_SECONDS, float_in


def configure(parser: argparse.ArgumentParser) -> None:
    from torchrig.cli.cmd_check import add_gpu_driver_arguments

    add_gpu_driver_arguments(parser, gpu_required=False)
    parser.add_argument(
        "--torch",
        metavar="SPEC|BUILD",
        help="a range such as '>=2.6' or '==2.8.*', or one build such as 2.13.0+cpu (default: the newest that works)",
    )
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="the interpreter to install into, as given (never looked up on PATH; default: this one)",
    )
    parser.add_argument(
        "--index-url", metavar="URL", help="install from this index (a mirror) instead of the build's own"
    )
    parser.add_argument(
        "--constraint",
        metavar="FILE",
        help="a pip constraints file: used when it exists, torch's pin written into it",
    )
    parser.add_argument(
        "--installer",
        choices=("auto", "pip", "uv"),
        default="auto",
        help="auto: uv where it is on PATH, else pip",
    )
    parser.add_argument("--yes", action="store_true", help="replace a torch build that works")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan and the exact command; change nothing"
    )
    parser.add_argument(
        "--verify-timeout",
        metavar="SECONDS",
        type=float_in(0, MAX_SECONDS, lo_open=True),
        default=300.0,
        help="limit for the verification (import torch and one kernel), default 300",
    )


def run(args: argparse.Namespace) -> Any:
    from torchrig.install import InstallRequest, run_install

    req = InstallRequest(
        gpus=tuple(args.gpu or ()),
        driver=args.driver,
        platform=args.platform,
        torch=args.torch,
        python=args.python,
        index_url=args.index_url,
        constraint=args.constraint,
        installer=args.installer,
        yes=args.yes,
        dry_run=args.dry_run,
        verify_timeout_s=args.verify_timeout,
    )
    return run_install(req)
