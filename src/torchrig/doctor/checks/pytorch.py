"""The installed PyTorch against this machine: installed at all, a CUDA build, a driver new enough for its CUDA
runtime, kernels for this GPU's architecture, its own CUDA libraries loaded (not shadowed), and whether it works."""

from __future__ import annotations

import os
from collections.abc import Iterator

from torchrig.doctor import kb as kbmod
from torchrig.doctor.checks.common import Context
from torchrig.doctor.facts import ProbeStatus
from torchrig.doctor.findings import Finding, Severity


def _python(ctx: Context) -> str:
    return ctx.facts.torch.python_executable or "python"


def _suggestion(ctx: Context, *, with_driver: bool = True) -> tuple[str, ...]:
    """The pip command for the build `torchrig resolve` picks here, or how to ask for it."""
    t = ctx.facts.torch
    s = None
    if ctx.gpu_names:  # the knowledge base is loaded only when there is a GPU to resolve for
        s = kbmod.suggest(
            ctx.kb, ctx.gpu_names, ctx.driver_version if with_driver else None, t.python_version
        )
    if s is not None:
        return (f"{_python(ctx)} -m {s.pip_command}   # {s.why}",)
    if not ctx.gpu_names and not ctx.has_gpu_hardware:  # no GPU here: the CPU build is the one that works
        return (
            "torchrig resolve   # without --gpu: prints the pip command of the CPU build for this machine",
        )
    gpu = f' --gpu "{ctx.gpu_names[0]}"' if ctx.gpu_names else ' --gpu "<your GPU>"'
    drv = f" --driver {ctx.driver_version}" if ctx.driver_version and with_driver else ""
    return (f"torchrig resolve{gpu}{drv}   # prints the pip command of the build that works here",)


def _torch_line(ctx: Context) -> str:
    t = ctx.facts.torch
    return f"torch {t.version} (CUDA {t.cuda_version or 'none'}) in {t.python_executable} (Python {t.python_version})"


def not_installed(ctx: Context) -> Iterator[Finding]:
    t = ctx.facts.torch
    if t.status is ProbeStatus.MISSING:
        yield Finding(
            "torch.not_installed",
            Severity.WARNING,
            f"PyTorch is not installed in {_python(ctx)}",
            "there is no torch module for this interpreter (use --python to inspect another one)",
            _suggestion(ctx),
            (t.error or "",),
        )
    elif t.status is ProbeStatus.TIMEOUT:
        yield Finding(
            "torch.hangs",
            Severity.ERROR,
            "PyTorch hangs initialising CUDA",
            "'import torch; torch.cuda.init()' did not finish: the driver is wedged (a GPU fell off the bus, "
            "an Xid error) or a GPU is stuck in reset",
            (
                "sudo dmesg | grep -i -e NVRM -e Xid   # the driver's own account",
                "nvidia-smi   # hangs too if the driver is wedged",
                "sudo reboot   # or reset the GPU: sudo nvidia-smi -r -i <index>",
            ),
            (t.error or "",),
        )
    elif t.status is ProbeStatus.FAILED:
        origin = t.origin or ""
        installed = any(d in origin for d in ("site-packages", "dist-packages"))
        if origin and not installed:
            folder = os.path.dirname(origin) if origin.endswith(".py") else origin
            yield Finding(
                "torch.import_failed",
                Severity.ERROR,
                "import torch finds a torch folder that is not the installed PyTorch",
                f"{folder} comes first on sys.path (the working directory, or PYTHONPATH), so 'import torch' "
                "loads it instead of the installed package: a PyTorch source checkout, or a folder of your "
                "own named torch",
                (
                    f"cd ~ && {_python(ctx)} -c 'import torch; print(torch.__file__)'   # elsewhere the installed "
                    "torch loads",
                    f"or rename {folder} if it is yours, or take it off PYTHONPATH",
                ),
                (t.error or "", f"import torch found: {origin}"),
            )
            return
        traced = list(_traced(ctx))
        if traced:
            yield from traced
            return
        yield Finding(
            "torch.import_failed",
            Severity.ERROR,
            "import torch fails",
            "the torch package is present but importing it raised an error (a broken install or a missing "
            "shared library)",
            (
                f"{_python(ctx)} -c 'import torch'   # the full error",
                f"{_python(ctx)} -m pip install --force-reinstall torch   # or the resolve command",
            ),
            (t.error or "", *((f"import torch found: {origin}",) if origin else ())),
        )


def _traced(ctx: Context) -> Iterator[Finding]:
    """The failed probe's trace (``probes/trace.py``): the variables without which it works, or the clean
    environment failing too (then, and only then, the install is the suspect)."""
    t = ctx.facts.torch
    tr = t.trace
    if tr is None or tr.clean_ok is not True:
        return  # not traced, or a clean environment fails too: the install is the suspect
    evidence = (
        f"the torch probe: {tr.failure}",
        f"with only {', '.join(tr.essentials)} set: it works",
        f"{tr.runs} runs, {(tr.elapsed_ms or 0) / 1000:.1f} s" + (f"; {tr.note}" if tr.note else ""),
    )
    if not tr.culprits:
        yield Finding(
            "env.breaks_torch",
            Severity.ERROR,
            "import torch fails in this environment but works in a clean one",
            "a variable of this environment breaks it; the bisection did not narrow it to one or two"
            + (f" ({tr.note})" if tr.note else ""),
            (
                f"env -i PATH=$PATH HOME=$HOME {_python(ctx)} -c 'import torch'   # works: add your variables back "
                "one by one",
            ),
            evidence,
        )
        return
    names = [c.partition("=")[0] for c in tr.culprits]
    yield Finding(
        "env.breaks_torch",
        Severity.ERROR,
        f"{' together with '.join(names)} makes the torch probe fail ({tr.failure.split(':')[0]})",
        f"with {' and '.join(names)} removed the probe works, with it back it fails: the variable's value, "
        "not the install, is the cause (bisected over the environment)",
        tuple(
            f"unset {n}   # then find where it is set: grep -n {n} ~/.bashrc ~/.profile /etc/profile.d/* /etc/environment"
            for n in names
        ),
        (*(f"{c}" for c in tr.culprits), *evidence),
    )


def cpu_build(ctx: Context) -> Iterator[Finding]:
    t = ctx.facts.torch
    if t.status is not ProbeStatus.OK or t.cuda_version or t.hip_version:
        return
    evidence = (
        _torch_line(ctx),
        f"torch.cuda.init(): {t.init_error}" if t.init_error else "torch.version.cuda is None",
    )
    if not ctx.has_gpu_hardware:  # the right build for a machine without a GPU
        yield Finding(
            "torch.cpu_build",
            Severity.INFO,
            f"PyTorch {t.version} is a CPU build: the one that works on this machine, which has no NVIDIA GPU",
            "it runs on the CPU; on a machine with an NVIDIA GPU it would not use the GPU",
            ('torchrig resolve --gpu "<the GPU>"   # on a GPU machine: the CUDA build to install there',),
            evidence,
        )
        return
    yield Finding(
        "torch.cpu_build",
        Severity.ERROR,
        f"PyTorch {t.version} is a CPU-only build",
        "it was built without CUDA, so torch.cuda.is_available() is False on any machine",
        (f"{_python(ctx)} -m pip uninstall -y torch", *_suggestion(ctx)),
        evidence,
    )


def driver_too_old(ctx: Context) -> Iterator[Finding]:
    t = ctx.facts.torch
    driver_errors = any(f.id.startswith(("driver.", "container.")) for f in ctx.blocking())
    if not ctx.torch_cuda_build or driver_errors:  # a broken driver explains CUDA's errors first
        return
    driver = ctx.driver_version
    err = (t.init_error or "") + " " + " ".join(t.warnings)
    says = any(
        s in err
        for s in (
            "driver on your system is too old",
            "CUDA driver version is insufficient",
            "Error 803",
            "Error 804",
            "Error 35:",
        )
    )
    support = kbmod.driver_support(ctx.kb, driver, t.cuda_version or "") if (ctx.kb and driver) else None
    kind = getattr(getattr(support, "kind", None), "value", None)
    if support is not None and kind == "minor_compat" and not says:
        yield Finding(
            "torch.driver_minor_compat",
            Severity.INFO,
            f"driver {driver} runs CUDA {t.cuda_version} only under minor-version compatibility",
            support.caveat or support.message,
            ("upgrade the driver to ≥ " + str(support.min_driver),),
            (support.message,),
        )
        return
    if kind != "unsupported" and not says:
        return
    floor = getattr(support, "min_driver", None)
    fix = (*_suggestion(ctx), f"or upgrade the driver to ≥ {floor}" if floor else "or upgrade the driver")
    evidence = [
        _torch_line(ctx),
        f"driver {driver or '?'} supports up to CUDA {ctx.facts.nvml.cuda_driver_version or '?'}",
    ]
    if support is not None:
        evidence.append(support.message)
    if says:
        evidence.append(f"torch: {(t.init_error or next(w for w in t.warnings if w)).strip()[:300]}")
    yield Finding(
        "torch.driver_too_old",
        Severity.ERROR,
        f"driver {driver or '?'} is too old for PyTorch's CUDA {t.cuda_version} runtime",
        f"the installed build bundles CUDA {t.cuda_version}, which needs a newer driver than {driver or 'this one'}"
        + (f" ({support.message})" if support is not None else ""),
        fix,
        tuple(evidence),
    )


def arch_not_covered(ctx: Context) -> Iterator[Finding]:
    t = ctx.facts.torch
    if not ctx.torch_cuda_build or not t.arch_list:
        return
    gpus = {(g.name, g.compute_capability) for g in ctx.facts.nvml.gpus if g.compute_capability}
    gpus |= {(d.name, d.compute_capability) for d in t.devices if d.compute_capability}
    no_image = [d for d in t.devices if d.kernel_error and "no kernel image" in d.kernel_error]
    for name, cc in sorted(gpus, key=lambda x: (x[1] or "", x[0] or "")):
        cov = kbmod.coverage(cc or "", t.arch_list)
        kind = getattr(getattr(cov, "kind", None), "value", None)
        if kind == "not_covered" or (kind is None and no_image):
            yield Finding(
                "torch.arch_not_covered",
                Severity.ERROR,
                f"PyTorch {t.version} has no kernels for {name} (compute capability {cc})",
                f"{cov.why if cov else 'the build was not compiled for this GPU'}; CUDA ops fail with "
                "'no kernel image is available for execution on the device'",
                _suggestion(ctx),
                (
                    _torch_line(ctx),
                    "torch.cuda.get_arch_list(): " + " ".join(t.arch_list),
                    *(f"GPU {d.index}: {d.kernel_error}" for d in no_image),
                ),
            )
        elif cov is not None and kind == "ptx_jit":
            yield Finding(
                "torch.arch_ptx_jit",
                Severity.WARNING,
                f"PyTorch {t.version} runs on {name} only through PTX JIT compilation",
                f"{cov.why}: the first use of each kernel is compiled by the driver (slow start-up) "
                "and the code is not tuned for this GPU",
                _suggestion(ctx),
                ("torch.cuda.get_arch_list(): " + " ".join(t.arch_list),),
            )


def shadowed_libraries(ctx: Context) -> Iterator[Finding]:
    """A CUDA library on LD_LIBRARY_PATH with the same name as one the pip wheels ship replaces it."""
    t, e = ctx.facts.torch, ctx.facts.env
    wheel = {os.path.basename(p): p for p in t.wheel_libraries}
    if not wheel:
        return
    shadows = [p for p in e.ld_library_libs if os.path.basename(p) in wheel]
    wheel_dirs = {os.path.dirname(p) for p in t.wheel_libraries}
    loaded_wrong = [
        p for p in t.loaded_libraries if os.path.basename(p) in wheel and os.path.dirname(p) not in wheel_dirs
    ]
    if not shadows and not loaded_wrong:
        return
    bad_dirs = sorted({os.path.dirname(p) for p in shadows + loaded_wrong})
    keep = [
        d for d in e.ld_library_path if os.path.normpath(d) not in {os.path.normpath(b) for b in bad_dirs}
    ]
    severity = Severity.ERROR if (loaded_wrong and ctx.torch_cuda_build) else Severity.WARNING
    cause = (
        "LD_LIBRARY_PATH is searched before the wheels' RUNPATH (ld.so(8)), so these system copies load "
        "instead of the versions the installed packages were built and tested with: a version mismatch "
        "('cuDNN version incompatibility', 'undefined symbol', NCCL hangs)"
    )
    if loaded_wrong:
        cause += "; the torch process really loaded them"
    evidence = [f"{p} shadows {wheel[os.path.basename(p)]}" for p in shadows]
    evidence += [f"loaded by torch: {p} (not {wheel[os.path.basename(p)]})" for p in loaded_wrong]
    yield Finding(
        "env.shadowed_libraries",
        severity,
        f"LD_LIBRARY_PATH shadows the wheel's CUDA libraries ({', '.join(sorted({os.path.basename(p) for p in shadows + loaded_wrong}))})",
        cause,
        (
            f"export LD_LIBRARY_PATH={':'.join(keep)}" if keep else "unset LD_LIBRARY_PATH",
            "and remove "
            + ", ".join(bad_dirs)
            + " from where LD_LIBRARY_PATH is set (~/.bashrc, the image's ENV)",
        ),
        tuple(evidence),
    )


def unexplained(ctx: Context) -> Iterator[Finding]:
    """A CUDA build that cannot use the GPU, and no earlier check explains why: say so, with CUDA's own words."""
    t = ctx.facts.torch
    if not ctx.torch_cuda_build or ctx.blocking():
        return
    failed = [d for d in t.devices if d.kernel_ok is False]
    if t.is_available and not failed:
        return
    text = (
        t.init_error
        or next((d.kernel_error for d in failed if d.kernel_error), None)
        or (t.warnings[0] if t.warnings else None)
    )
    yield Finding(
        "torch.cuda_unavailable",
        Severity.ERROR,
        "PyTorch cannot use the GPU" if t.is_available else "torch.cuda.is_available() is False",
        f"CUDA initialisation says: {text or 'nothing'}; none of doctor's known causes matched",
        (
            "nvidia-smi   # does the driver itself see the GPUs?",
            "sudo dmesg | grep -i -e NVRM -e Xid   # driver errors",
            "torchrig doctor --record facts.json   # and attach facts.json to a bug report",
        ),
        (_torch_line(ctx), *(w[:300] for w in t.warnings)),
    )


def nvcc_mismatch(ctx: Context) -> Iterator[Finding]:
    t, e = ctx.facts.torch, ctx.facts.env
    if not ctx.torch_cuda_build or not e.nvcc_version or not t.cuda_version:
        return
    tm, nm = t.cuda_version.split("."), e.nvcc_version.split(".")
    if tm[:2] == nm[:2]:
        return
    major = tm[0] != nm[0]
    yield Finding(
        "env.nvcc_mismatch",
        Severity.WARNING if major else Severity.INFO,
        f"nvcc is CUDA {e.nvcc_version} but PyTorch was built with CUDA {t.cuda_version}",
        "building CUDA extensions (torch.utils.cpp_extension, pip packages with CUDA code) "
        + (
            "fails: it refuses a toolkit of another major version"
            if major
            else "works but warns; a toolkit of the same minor avoids surprises"
        ),
        (f"install CUDA toolkit {t.cuda_version} and export CUDA_HOME=/usr/local/cuda-{t.cuda_version}",),
        (f"{e.nvcc_path}: CUDA {e.nvcc_version}", _torch_line(ctx)),
    )


def _newer(candidate: str, installed: str) -> bool:
    from torchrig.compat.versions import parse_release
    from torchrig.errors import UsageError

    try:
        return parse_release(candidate.split("+")[0]) > parse_release(installed.split("+")[0])
    except UsageError:  # an unparseable local version (2.1.0a0+git…): no claim
        return False


def newer_build(ctx: Context) -> Iterator[Finding]:
    t = ctx.facts.torch
    if not ctx.torch_cuda_build or ctx.blocking() or not t.is_available:
        return
    s = kbmod.suggest(ctx.kb, ctx.gpu_names, ctx.driver_version, t.python_version)
    # Only a newer release that runs natively on this driver: never trade a working build for caveats.
    if s is None or s.verdict != "works" or not _newer(s.label, t.version or ""):
        return
    yield Finding(
        "torch.newer_build",
        Severity.INFO,
        f"a newer build suits this machine: {s.label} (installed {t.version})",
        s.why,
        (f"{_python(ctx)} -m {s.pip_command}",),
        (_torch_line(ctx),),
    )


def works(ctx: Context) -> Iterator[Finding]:
    t = ctx.facts.torch
    if (
        not ctx.torch_cuda_build
        or not t.is_available
        or not t.devices
        or any(d.kernel_ok is not True for d in t.devices)
    ):
        return
    yield Finding(
        "torch.ok",
        Severity.OK,
        f"torch {t.version} (CUDA {t.cuda_version}, cuDNN {t.cudnn_version}, NCCL {t.nccl_version}) "
        f"ran a kernel on each of {len(t.devices)} GPU(s)",
        evidence=(
            _torch_line(ctx),
            *(f"cuda:{d.index} {d.name} (cc {d.compute_capability})" for d in t.devices),
        ),
    )
