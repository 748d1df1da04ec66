"""Support table: GPU families (one row per family and compute capability) x PyTorch builds. Each cell says
works, caveats or fails for the family's representative GPU, with a legend. Columns are the variants of
--torch's release, or without --torch the PyPI builds of the newest releases. With --driver the driver is
checked too; without it, only the GPU architecture against the build's kernels.

examples:
  torchrig matrix                                   # newest releases' PyPI builds, architecture only
  torchrig matrix --torch 2.8.0 --format markdown   # every variant of 2.8.0
  torchrig matrix --torch 2.7.0 --driver 535.104.05
  torchrig matrix --torch 2.9.0 --format html > matrix.html
  torchrig matrix --platform linux-aarch64          # PyPI's aarch64 wheels: CPU-only up to 2.10
  torchrig matrix --platform jetson7 --torch 2.10.0 # Jetson Thor on JetPack 7

exit status: 0, or 2 for bad input (malformed or unpublished version).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchrig.argtypes import int_in

if TYPE_CHECKING:  # the engine is imported by run(), so that --help stays light
    from torchrig.compat.matrix import Matrix


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--torch", metavar="VERSION", help="a release (its variants as columns) or one build, e.g. 2.8.0"
    )
    parser.add_argument(
        "--driver", metavar="VERSION", help="NVIDIA driver version to check too, e.g. 535.104.05"
    )
    parser.add_argument(
        "--format", choices=("table", "markdown", "html"), default="table", help="output format"
    )
    from torchrig.cli.cmd_check import add_platform_argument

    add_platform_argument(parser)
    parser.add_argument(
        "--newest",
        type=int_in(1, 1000),
        default=4,
        metavar="N",
        help="without --torch: how many of the newest releases to show (default 4)",
    )


@dataclass(frozen=True)
class MatrixReport:
    matrix: Matrix
    fmt: str
    exit_code: int = 0

    def to_json(self) -> dict[str, Any]:
        return self.matrix.to_json()

    def render_text(self) -> str:
        from torchrig.compat import matrix as M

        return {"table": M.render_text, "markdown": M.render_markdown, "html": M.render_html}[self.fmt](
            self.matrix
        )


def run(args: argparse.Namespace) -> MatrixReport:
    from torchrig.compat import load_kb
    from torchrig.compat.matrix import build_matrix
    from torchrig.errors import UsageError

    if args.newest < 1:
        raise UsageError(f"--newest must be at least 1, got {args.newest}")
    from torchrig.cli.cmd_check import platform_from

    plat = platform_from(args)
    return MatrixReport(
        build_matrix(load_kb(), torch=args.torch, driver=args.driver, newest=args.newest, platform=plat),
        args.format,
    )
