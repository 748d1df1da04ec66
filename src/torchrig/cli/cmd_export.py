"""Export a torchrig checkpoint to a torch.export program (.pt2) and to ONNX, verified against PyTorch.

CHECKPOINT is a run folder (its latest checkpoint is used), its checkpoints/ folder, or one step-N folder.
Sharded FSDP checkpoints and checkpoints saved by any number of ranks load in this one process (DCP
reshards them). Both outputs are run on the same input as the eager model (the .onnx through onnxruntime)
and the largest absolute difference is reported; above --tolerance the command exits 1. The checkpoint's
files are checked against the SHA-256 sums saved with it and its DCP .metadata is read without running
code (docs/checkpoints.md): a damaged or refused checkpoint is one line naming the file, exit 2.

examples:
  torchrig export torchrig-run                       # -> torchrig-run/export/model.pt2 and model.onnx
  torchrig export run1/checkpoints/step-000500 --out exported --format onnx
  torchrig export run1 --json                        # paths, sizes and max abs differences as JSON
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.argtypes import float_in, int_in
from torchrig.report import jsonable, table

# An example input only needs to exercise the model: larger ones just cost memory.
MAX_BATCH = 1024
MAX_SEQ = 1 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run folder, checkpoints/ folder or step-N folder")
    parser.add_argument("--out", help="output folder (default: CHECKPOINT's run folder /export)")
    parser.add_argument("--format", choices=("all", "pt2", "onnx"), default="all", help="what to write (all)")
    parser.add_argument(
        "--batch", type=int_in(1, 2**16), default=2, help="batch size of the example input (2)"
    )
    parser.add_argument(
        "--seq-len",
        type=int_in(1, 2**24),
        help="GPT: sequence length of the example input (default: the context, at most 2048)",
    )
    parser.add_argument(
        "--tolerance",
        type=float_in(0, 1e30, lo_open=True),
        default=1e-3,
        help="max abs difference allowed (1e-3)",
    )


@dataclass(frozen=True)
class ExportReport:
    result: Any

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.result.ok, **jsonable(self.result)}

    @property
    def exit_code(self) -> int:
        return 0 if self.result.ok else 1

    def render_text(self) -> str:
        r = self.result
        rows = [
            [
                a.format,
                a.path,
                f"{a.size_bytes / 1e6:.2f} MB",
                f"{a.max_abs_diff:.2e}",
                a.runtime,
                "ok" if a.ok else f"FAIL (> {r.tolerance:g})",
            ]
            for a in r.artifacts
        ]
        head = f"exported {r.model} from {r.checkpoint} (step {r.step}), input {list(r.input_shape)}"
        notes = [
            f"{a.path} keeps its weights in {extra}: copy both, side by side (the size is of both)"
            for a in r.artifacts
            for extra in a.extra_files
        ]
        return "\n".join(
            [
                head,
                table(["format", "file", "size", "max |diff| vs eager", "checked with", "verdict"], rows),
                *notes,
            ]
        )


def run(args: argparse.Namespace) -> ExportReport:
    from torchrig.errors import UsageError
    from torchrig.export import export_checkpoint

    if not 1 <= args.batch <= MAX_BATCH or (args.seq_len is not None and not 1 <= args.seq_len <= MAX_SEQ):
        raise UsageError(f"--batch must be 1..{MAX_BATCH} and --seq-len 1..{MAX_SEQ}")
    if not (math.isfinite(args.tolerance) and args.tolerance > 0):
        raise UsageError(f"--tolerance must be a positive number, got {args.tolerance}")
    src = Path(args.checkpoint)
    run_dir = src
    while run_dir.name.startswith("step-") or run_dir.name == "checkpoints":
        run_dir = run_dir.parent
    out = Path(args.out) if args.out else run_dir / "export"
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is not a folder", hint="give a folder for model.pt2 and model.onnx")
    formats = ("pt2", "onnx") if args.format == "all" else (args.format,)
    return ExportReport(
        export_checkpoint(
            src, out, formats=formats, batch=args.batch, seq_len=args.seq_len, tolerance=args.tolerance
        )
    )
