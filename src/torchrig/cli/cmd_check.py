"""Will these GPUs, with this NVIDIA driver, run this PyTorch build? Answers works / works_with_caveats /
fails, with every reason (GPU architecture vs the build's kernels, driver vs the build's CUDA runtime,
driver branch vs the GPU) and, when it fails, the nearest fix as a pip command or a driver branch.

examples:
  torchrig check --gpu "RTX 5090" --driver 570.86.10 --torch 2.6.0+cu124     # fails: no sm_120 kernels
  torchrig check --gpu "RTX 5090" --driver 570.86.10 --torch 2.7.0+cu128     # works
  torchrig check --gpu "GTX 1080 Ti" --driver 550.54.14 --torch 2.8.0         # the PyPI build
  torchrig check --gpu A100 --gpu "RTX 4090" --driver 535.104.05 --torch 2.8.0+cu126 --json
  torchrig check --gpu V100 --torch 2.9.0+cu130                              # arch only, no driver check
  torchrig check --gpu GB200 --driver 570.133.20 --torch 2.8.0 --platform linux-aarch64  # PyPI: CPU-only
  torchrig check --gpu "NVIDIA Thor" --driver 580.00 --torch 2.10.0+cu130 --platform jetson7
  torchrig check --gpu "RTX 4070 Laptop GPU" --driver 551.88 --torch 2.4.0+cu121 --platform wsl
  torchrig check --gpu H100 --driver 535.104.05 --torch 2.10.0a0+b4e4ee81d3.nv25.12   # NGC 25.12, CUDA 13.1
  torchrig check --gpu "RTX 4090" --driver 560.35.03 --torch 2.5.1 --index conda-forge
  torchrig check --collect-env report.txt     # the output of python -m torch.utils.collect_env, as pasted
  torchrig check --collect-env report.txt --driver 570.86.10    # an option given overrides what was read

--torch takes VERSION (the build `pip install torch==VERSION` gets from PyPI on the platform), VERSION+cuXYZ,
VERSION+cpu, or a nightly as torch prints it (2.10.0.dev20250915+cu128: judged as its release line); off a
Jetson an NGC container's build (2.5.0a0+e000cf0ad9.nv24.10) is that container's, judged by its CUDA.
--driver is the version nvidia-smi prints (e.g. 535.104.05; on Windows/WSL the Windows number, e.g. 566.36;
on Jetson the JetPack's, e.g. 540.4.0); without it only the architecture is checked.
--platform defaults to this machine's (a Jetson GPU implies jetson; a GPU that exists only on Arm hosts, GH200,
GB200, GB300 or GB10, implies linux-aarch64, and the note says it was inferred).
--collect-env FILE (- for standard input) reads the GPUs, torch build, driver, platform and wheel source from
PyTorch's collect_env report (every format since v1.4, quoted or indented as pasted); the answer is the one the
same options would get, and it says which lines it read and what it inferred (a conda channel's build, an NGC
container's torch, a CUDA-less build). A field the report lacks names the option to pass.
exit status: 0 works or works_with_caveats, 1 fails, 2 bad input (unknown GPU, malformed or unpublished version).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchrig.findings import Severity

if TYPE_CHECKING:  # the engine is imported by run(), so that --help stays light
    from torchrig.compat.check import CheckResult
    from torchrig.compat.collectenv import Report

# A collect_env report is a few kilobytes (a long pip list: tens); far more is not one.
MAX_REPORT_BYTES = 4 * 2**20

MARK = {Severity.INFO: "ok  ", Severity.CAVEAT: "warn", Severity.FAIL: "FAIL"}
TITLE = {"works": "WORKS", "works_with_caveats": "WORKS WITH CAVEATS", "fails": "FAILS"}


PLATFORM_HELP = (
    "linux-x86_64, linux-aarch64 (Grace, DGX Spark), jetson (jetson5/6/7 for a JetPack), windows or wsl "
    "(default: this machine's)"
)


def add_platform_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", metavar="PLATFORM", help=PLATFORM_HELP)


def add_gpu_driver_arguments(
    parser: argparse.ArgumentParser, gpu_required: bool = True, gpu_help_extra: str = ""
) -> None:
    """``--gpu`` (repeatable), ``--driver`` and ``--platform``: the hardware half that check and resolve share."""
    parser.add_argument(
        "--gpu",
        action="append",
        required=gpu_required,
        metavar="GPU",
        help="GPU name as nvidia-smi or the datasheet spells it (repeat for several GPUs)" + gpu_help_extra,
    )
    parser.add_argument(
        "--driver", metavar="VERSION", help="NVIDIA driver version as nvidia-smi prints it, e.g. 535.104.05"
    )
    add_platform_argument(parser)


def platform_from(args: argparse.Namespace) -> Any:
    """``--platform``, else this machine's (torchrig.compat.host)."""
    from torchrig.compat.platforms import parse_platform

    if getattr(args, "platform", None):
        return parse_platform(args.platform)
    from torchrig.compat.host import host_platform

    return host_platform()


def platform_and_note(args: argparse.Namespace, gpus: Any) -> tuple[Any, str | None]:
    """``--platform``; else the one the GPUs imply (a GH200, GB200, GB300 or GB10 exists only on linux-aarch64),
    with a note saying so; else this machine's."""
    from torchrig.compat.evaluate import infer_platform
    from torchrig.compat.platforms import parse_platform

    if getattr(args, "platform", None):
        return parse_platform(args.platform), None
    from torchrig.compat.host import host_platform

    return infer_platform(gpus, None, host_platform())


def configure(parser: argparse.ArgumentParser) -> None:
    add_gpu_driver_arguments(parser, gpu_required=False, gpu_help_extra="; required without --collect-env")
    parser.add_argument(
        "--torch",
        metavar="VERSION[+cuXYZ|+cpu]",
        help="PyTorch build, e.g. 2.8.0+cu126; required without --collect-env",
    )
    parser.add_argument(
        "--collect-env",
        metavar="FILE",
        help="read --gpu, --torch, --driver, --platform and the wheel source from the output of "
        "python -m torch.utils.collect_env (- reads standard input); options given override what it says",
    )
    parser.add_argument(
        "--index",
        metavar="URL|NAME",
        help="where the build comes from: pypi, pytorch, nvidia-jetpack5/6, jetson-ai-lab-jp6/-sbsa, ngc (NVIDIA's "
        "PyTorch containers), conda-forge, or the index URL (default: inferred from the version and platform where "
        "certain, else PyPI/download.pytorch.org)",
    )


@dataclass(frozen=True)
class CheckReport:
    result: CheckResult
    collect_env: Report | None = None  # what --collect-env read, None without it
    overridden: tuple[str, ...] = ()  # the options given over what the report said

    @property
    def exit_code(self) -> int:
        return 1 if self.result.verdict.value == "fails" else 0

    def to_json(self) -> dict[str, Any]:
        data = self.result.to_json()
        if self.collect_env is not None:
            data["collect_env"] = {
                **self.collect_env.to_json(),
                "overridden": list(self.overridden),
                "note": self.unexplained,
            }
        return data

    @property
    def unexplained(self) -> str | None:
        """What the report shows that the verdict does not explain: CUDA not available with a build that works."""
        rep = self.collect_env
        said = next((f.value for f in rep.read if f.label == "Is CUDA available"), None) if rep else None
        if said not in ("False", "No") or self.result.verdict.value == "fails":
            return None
        return (
            f"the report says Is CUDA available: {said}, yet this build, GPU and driver go together: the cause is "
            "on that machine (no driver loaded, a container started without GPUs, CUDA_VISIBLE_DEVICES empty); "
            "torchrig doctor run there names it"
        )

    def _read_lines(self) -> list[str]:
        rep = self.collect_env
        if rep is None:
            return []
        lines = ["read from the collect_env report:"]
        value = {"--torch": rep.torch, "--driver": rep.driver, "--platform": rep.platform}
        for f in rep.read:
            said = f"{f.option} {value[f.option]}" if f.option in value else f.option
            sep = " " if f.label.startswith("[") else ": "
            lines.append(f"  {f.label}{sep}{f.value}" + (f"  ({said})" if said else ""))
        lines += [f"  inferred: {note}" for note in rep.inferred]
        lines += [f"  overridden: {opt} as given" for opt in self.overridden]
        return [*lines, ""]

    def render_text(self) -> str:
        note = [f"\nnote: {self.unexplained}"] if self.unexplained else []
        return "\n".join([*self._read_lines(), self._verdict_text(), *note])

    def _verdict_text(self) -> str:
        r = self.result
        gpus = ", ".join(f"{g.name} ({g.sm})" for g in r.gpus)
        driver = f"driver {r.driver}" if r.driver else "driver not given"
        lines = [f"torch {r.build.label} on {gpus}, {driver}, {r.platform}: {TITLE[r.verdict.value]}", ""]
        for reason in r.reasons:
            lines.append(f"  {MARK[reason.severity]}  {reason.message}  [{reason.code}]")
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
    from torchrig.compat import load_kb
    from torchrig.compat import versions as V
    from torchrig.compat.bysource import check_text

    report: Report | None = None
    overridden: tuple[str, ...] = ()
    if getattr(args, "collect_env", None) is not None:
        report, overridden = _from_collect_env(args)
    elif not args.gpu or args.torch is None:
        from torchrig.errors import UsageError

        missing = [opt for opt, v in (("--gpu", args.gpu), ("--torch", args.torch)) if not v]
        raise UsageError(
            f"the following arguments are required: {', '.join(missing)}",
            hint="or read them from a report with --collect-env FILE",
        )
    if args.driver is not None:
        V.parse_driver(args.driver)
    kb = load_kb()
    gpus = list({g.id: g for g in (kb.find_gpu(name) for name in args.gpu)}.values())  # 8x the same GPU: once
    plat, inferred = platform_and_note(args, gpus)
    result = check_text(kb, gpus, args.driver, args.torch, args.index, plat)
    return CheckReport(_with_note(result, inferred), report, overridden)


def _from_collect_env(args: argparse.Namespace) -> tuple[Report, tuple[str, ...]]:
    """``args`` completed from the collect_env report (:func:`torchrig.compat.collectenv.request`): the options
    given stay, the report fills the rest; the report and the options that overrode it."""
    from torchrig.compat.collectenv import CheckRequest, read_report, request
    from torchrig.inputfiles import read_text_or_stdin

    text = read_text_or_stdin(args.collect_env, "collect_env report", max_bytes=MAX_REPORT_BYTES)
    report = read_report(text)
    given = CheckRequest(tuple(args.gpu or ()), args.torch, args.driver, args.platform, args.index)
    asked, overridden = request(report, given)
    args.gpu, args.torch, args.driver = list(asked.gpus), asked.torch, asked.driver
    args.platform, args.index = asked.platform, asked.index
    return report, overridden


def _with_note(result: CheckResult, inferred: str | None) -> CheckResult:
    """``result`` with the platform-inference note first."""
    if not inferred:
        return result
    import dataclasses

    return dataclasses.replace(result, notes=[inferred, *result.notes])
