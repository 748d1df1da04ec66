"""The best PyTorch build for these GPUs and this driver: the newest release within --torch and --python whose
best variant works on ALL the GPUs (a CUDA the driver runs natively first, then minor-version
compatibility; the newest CUDA; the PyPI default on a tie), with the exact pip command and what comes
with it (torchvision, torchaudio, cuDNN, NCCL, the minimum driver).

examples:
  torchrig resolve --gpu "RTX 5090" --driver 570.86.10
  torchrig resolve --gpu "Tesla V100-SXM2-32GB" --driver 535.104.05 --python 3.11
  torchrig resolve --gpu A100 --gpu "RTX 4090" --driver 550.54.14 --torch '>=2.6,<2.9'
  torchrig resolve --gpu "GTX 1080 Ti" --driver 580.65.06 --torch '==2.8.*' --json
  torchrig resolve                                  # no GPU: the CPU build for this machine
  torchrig resolve --gpu GH200 --driver 570.133.20 --platform linux-aarch64

Without --driver the choice ignores the driver and `min_driver` says what it must be. Without --gpu: the CPU
build for the platform. With a driver, the newest build it runs natively ranks first; a newer one that needs
CUDA minor-version compatibility is shown beside it ("newer") with its caveat (docs/knowledge-base.md).
exit status: 0 a build was found, 1 none works (the reason per GPU and what would change it), 2 bad input.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine is imported by run(), so that --help stays light
    from torchrig.compat.resolve import NoBuildFound, Resolution


def configure(parser: argparse.ArgumentParser) -> None:
    from torchrig.cli.cmd_check import add_gpu_driver_arguments

    add_gpu_driver_arguments(parser, gpu_required=False)
    parser.add_argument(
        "--torch", metavar="SPEC", help="torch version range, e.g. '>=2.6' or '==2.7.*' (default: any)"
    )
    parser.add_argument("--python", metavar="X.Y", help="the Python the wheel must support, e.g. 3.12")


@dataclass(frozen=True)
class ResolveReport:
    resolution: Resolution | None
    failure: NoBuildFound | None = None
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return 0 if self.resolution else 1

    def to_json(self) -> dict[str, Any]:
        if self.resolution:
            return {"found": True, **self.resolution.to_json(), "notes": list(self.notes)}
        f = self.failure
        assert f is not None
        return {
            "found": False,
            "notes": list(self.notes),
            "message": f.message,
            "blockers": [{"code": r.code, "gpu": r.gpu, "message": r.message} for r in f.blockers],
            "suggestions": [
                {"kind": s.kind, "pip_command": s.pip_command, "summary": s.summary} for s in f.suggestions
            ],
        }

    def render_text(self) -> str:
        if self.resolution is None:
            f = self.failure
            assert f is not None
            lines = [f"no build found: {f.message}", ""]
            lines += [f"  FAIL  {r.message}  [{r.code}]" for r in f.blockers]
            if f.suggestions:
                lines += ["", "what would change it:"]
                for s in f.suggestions:
                    lines.append(f"  - {s.summary}" + (f"\n    {s.pip_command}" if s.pip_command else ""))
            lines += [f"\nnote: {n}" for n in self.notes]
            return "\n".join(lines)
        r = self.resolution
        rows = [
            ("torch", r.build.label + (" (the PyPI default)" if r.build.is_pypi_default else "")),
            ("platform", r.platform),
            ("verdict", r.verdict.value),
            ("CUDA", r.cuda),
            ("torchvision", r.torchvision),
            ("torchaudio", r.torchaudio),
            ("cuDNN", r.cudnn),
            ("NCCL", r.nccl),
            (
                "min driver",
                f"{r.min_driver} (native); {r.min_driver_minor_compat} (minor-version compatibility)"
                if r.min_driver_minor_compat
                else f"{r.min_driver} (native; CUDA {r.cuda} has no minor-version compatibility)",
            ),
            ("index", r.index_url),
        ]
        if r.alternatives:
            rows.append(("also works", ", ".join(b.label for b in r.alternatives)))
        if r.native_alternative:
            rows.append(
                ("native", f"{r.native_alternative.label} is the newest build this driver runs natively")
            )
        if r.newer_alternative:
            rows.append(("newer", f"{r.newer_alternative.label} (works with caveats, below)"))
        if r.cuda is None:
            rows = [row for row in rows if row[0] not in ("CUDA", "cuDNN", "NCCL", "min driver")]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v if v is not None else 'unknown'}" for k, v in rows]
        if r.why:
            lines += ["", f"why: {r.why}"]
        lines += ["", r.pip_command_full]
        caveats = [x for x in r.reasons if x.severity.cautions]
        if caveats:
            lines += ["", "caveats:"] + [f"  warn  {c.message}  [{c.code}]" for c in caveats]
        if r.newer_alternative:
            lines += ["", f"also: {r.newer_alternative.pip_command}", f"  warn  {r.newer_caveat}"]
        lines += [f"\nnote: {n}" for n in self.notes]
        return "\n".join(lines)


def run(args: argparse.Namespace) -> ResolveReport:
    from torchrig.compat import load_kb, resolve
    from torchrig.compat import versions as V
    from torchrig.compat.resolve import NoBuildFound

    if args.driver is not None:
        V.parse_driver(args.driver)
    if args.torch is not None:
        V.parse_spec(args.torch)
    if args.python is not None:
        V.parse_python(args.python)
    from torchrig.cli.cmd_check import platform_and_note

    kb = load_kb()
    gpus = list({g.id: g for g in (kb.find_gpu(name) for name in args.gpu or [])}.values())
    plat, inferred = platform_and_note(args, gpus)
    notes = (inferred,) if inferred else ()
    try:
        return ResolveReport(
            resolve(
                kb, gpus=gpus, driver=args.driver, torch_spec=args.torch, python=args.python, platform=plat
            ),
            notes=notes,
        )
    except NoBuildFound as err:
        return ResolveReport(None, err, notes)
