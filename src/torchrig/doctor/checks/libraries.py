"""The driver's user-space libraries this process loads: ``libcuda.so.1`` and ``libnvidia-ml.so.1`` must be the
kernel module's own version. Three ways they are not:

* a copy of another driver version first on the loader's path (``LD_LIBRARY_PATH``, a stale ``ld.so.cache``
  entry): CUDA fails with error 803, "system has unsupported display driver / cuda driver combination"
  (cudaErrorSystemDriverMismatch: "a mismatch between the versions of the display driver and the CUDA
  driver"), and NVML with "Driver/library version mismatch";
* the CUDA forward-compatibility package (``/usr/local/cuda-X.Y/compat``) on a driver it does not fit: it
  is a newer branch's libcuda for data-center GPUs on an *older* supported driver; on a driver as new as it
  (or of its own branch but another release) it is a mismatch (803); on a GPU outside its support it fails
  with error 804, "forward compatibility was attempted on non supported HW"
  (cudaErrorCompatNotSupportedOnDevice);
* the CUDA toolkit's link-time stub (``lib64/stubs/libcuda.so``): every call fails with error 34, "CUDA
  driver is a stub library" (cudaErrorStubLibrary).

Sources: https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html (which GPUs, which
package, where it installs) and the CUDA Runtime API's error list,
https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html (803, 804, 34); both read 2026-12-01.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

from torchrig.doctor.checks.common import Context, branch
from torchrig.doctor.facts import DriverLibrary, driver_version_in
from torchrig.doctor.findings import Finding, Severity

# the texts CUDA prints for these errors (PyTorch: "... Error 803: system has unsupported display driver /
# cuda driver combination")
CUDA_MISMATCH = ("Error 803", "unsupported display driver / cuda driver combination")
CUDA_COMPAT_HW = ("Error 804", "forward compatibility was attempted on non supported HW")
CUDA_STUB = ("Error 34", "CUDA driver is a stub library")
LOADER_PICKS = ("ld_library_path", "ld_cache", "default_dir")  # origins the loader searches by itself


def _says(text: str, words: tuple[str, ...]) -> bool:
    return any(w.lower() in text.lower() for w in words)


def _version_of(path: str) -> str | None:
    return driver_version_in(os.path.basename(path))  # as the kernel probe reads file names


def _is_compat(path: str) -> bool:
    return "/compat/" in f"{os.path.dirname(path)}/"


def chosen(ctx: Context, soname: str) -> tuple[DriverLibrary | None, str | None]:
    """The copy of ``soname`` this process loads: the one the torch child had mapped (/proc/self/maps), else
    the first in the loader's order; and how that is known."""
    libs = [lib for lib in ctx.facts.kernel.driver_libraries if lib.soname == soname]
    stem = soname.split(".so", 1)[0] + ".so"
    loaded = [p for p in ctx.facts.torch.loaded_libraries if os.path.basename(p).startswith(stem)]
    if loaded:
        real = loaded[0]
        match = next((lib for lib in libs if lib.real_path == real), None)
        if match is not None:
            return match, "loaded by the torch probe"
        return (
            DriverLibrary(soname, real, real, _version_of(real), "loaded", None, "/stubs/" in real),
            "loaded by the torch probe",
        )
    first = next((lib for lib in libs if lib.origin in LOADER_PICKS), None)
    return first, ("first on the loader's path" if first else None)


def _dir_fix(ctx: Context, lib: DriverLibrary) -> tuple[str, ...]:
    bad = os.path.dirname(lib.path)
    if lib.origin == "ld_library_path" or (lib.origin == "loaded" and bad in ctx.facts.env.ld_library_path):
        keep = [d for d in ctx.facts.env.ld_library_path if os.path.normpath(d) != os.path.normpath(bad)]
        return (
            f"export LD_LIBRARY_PATH={':'.join(keep)}" if keep else "unset LD_LIBRARY_PATH",
            f"and remove {bad} from where LD_LIBRARY_PATH is set (~/.bashrc, the image's ENV, a module file)",
        )
    return (
        f"grep -rl {bad} /etc/ld.so.conf /etc/ld.so.conf.d/   # the file that adds it to the loader's cache",
        "then remove that line or file and run: sudo ldconfig",
    )


def _evidence(ctx: Context, soname: str, lib: DriverLibrary, how: str) -> list[str]:
    k = ctx.facts.kernel
    out = [
        f"kernel module (/proc/driver/nvidia/version): {k.module_version}",
        f"{soname} {how}: {lib.path}"
        + (f" -> {lib.real_path}" if lib.real_path != lib.path else "")
        + f" (version {lib.version or 'not in its name'}"
        + (f", {lib.size_bytes} bytes" if lib.size_bytes is not None else "")
        + ")",
    ]
    others, seen = [], {lib.real_path}
    for x in k.driver_libraries:  # one line per file, however many names lead to it
        if x.soname == soname and x.real_path not in seen:
            seen.add(x.real_path)
            others.append(x)
    out += [f"also: {x.path} ({x.origin}, version {x.version or 'not in its name'})" for x in others[:4]]
    errors = [ctx.facts.torch.init_error or "", ctx.facts.nvml.error or ""]
    out += [f"error: {e[:300]}" for e in errors if e]
    return out


def driver_libraries(ctx: Context) -> Iterator[Finding]:
    """libcuda / libnvidia-ml of another version than the kernel module, the compat package misplaced, a stub."""
    k = ctx.facts.kernel
    if k.wsl or k.module_version is None:
        return
    said = f"{ctx.facts.torch.init_error or ''} {' '.join(ctx.facts.torch.warnings)}"
    named = list(_named(ctx, said))
    yield from named
    upgraded = {k.nvml_library_version, k.cuda_library_version} - {None, k.module_version}
    nvml_mismatch = "version mismatch" in (ctx.facts.nvml.error or "").lower()
    if not (upgraded or nvml_mismatch or named):
        # (the system's own libraries of another version: the driver was upgraded, driver.version_mismatch)
        yield from _unexplained_compat_errors(ctx, said)


def _cuda_ran(ctx: Context) -> bool:
    t = ctx.facts.torch
    return bool(t.is_available and t.devices and all(d.kernel_ok for d in t.devices))


def _named(ctx: Context, said: str) -> Iterator[Finding]:
    """The findings for the libraries doctor can name (file and version). When CUDA ran kernels all the same,
    a version that differs is a warning: it works today, and breaks on the next driver update."""
    k = ctx.facts.kernel
    ran = _cuda_ran(ctx)
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        lib, how = chosen(ctx, soname)
        if lib is None or how is None:
            continue
        if lib.stub:
            yield Finding(
                "driver.stub_library",
                Severity.ERROR,
                f"{soname} is the CUDA toolkit's link-time stub, not the driver's library",
                f"{lib.path} is a stub that lets programs link without a driver; loaded at run time it fails "
                + (
                    "every CUDA call with error 34 'CUDA driver is a stub library'"
                    if soname.startswith("libcuda")
                    else "every NVML call, so nvidia-smi and doctor's GPU checks cannot read the GPUs"
                ),
                _dir_fix(ctx, lib),
                tuple(_evidence(ctx, soname, lib, how)),
            )
            continue
        compat = _is_compat(lib.path) or _is_compat(lib.real_path)
        if lib.version is None or lib.version == k.module_version:
            continue
        if compat and soname.startswith("libcuda"):
            found = _compat(ctx, lib, how, said)
            yield dataclasses.replace(found, severity=Severity.WARNING) if ran else found
            continue
        right = [
            x
            for x in k.driver_libraries
            if x.soname == soname and x.version == k.module_version and not x.stub
        ]
        if not right:  # every copy is of another version: the driver was upgraded (driver.version_mismatch)
            continue
        yield Finding(
            "driver.library_mismatch",
            Severity.WARNING if ran else Severity.ERROR,
            f"{soname} {lib.version} is loaded, but the kernel module is {k.module_version}",
            f"{lib.path} ({how}) belongs to driver {lib.version} and comes before the kernel module's own "
            f"copy ({right[0].path}); the user-space driver must be the kernel module's version, or "
            + (
                "CUDA fails with error 803 'system has unsupported display driver / cuda driver combination'"
                if soname.startswith("libcuda")
                else "NVML fails with 'Driver/library version mismatch'"
            ),
            _dir_fix(ctx, lib),
            tuple(_evidence(ctx, soname, lib, how)),
        )


def _newer_branch(a: str, b: str) -> bool:
    try:
        return int(branch(a) or 0) > int(branch(b) or 0)
    except ValueError:
        return False


def _compat(ctx: Context, lib: DriverLibrary, how: str, said: str) -> Finding:
    k = ctx.facts.kernel
    module = k.module_version or "?"
    if _says(said, CUDA_COMPAT_HW):
        why = (
            f"the forward-compatibility libcuda {lib.version} runs only on data-center GPUs (and select "
            "NGC-ready RTX, Jetson); on this GPU CUDA fails with error 804 'forward compatibility was "
            "attempted on non supported HW'"
        )
    elif _newer_branch(lib.version or "", module):
        why = (
            f"the forward-compatibility libcuda {lib.version} (a newer branch than the kernel module {module}) "
            "works only on data-center GPUs with a driver branch it supports; here CUDA refuses it (error 803 "
            "'system has unsupported display driver / cuda driver combination')"
        )
    else:
        why = (
            f"the forward-compatibility package brings libcuda {lib.version} for kernel modules older than "
            f"itself; this kernel module is {module}, so the package is not needed, and a libcuda of "
            "another version than the kernel module fails with error 803 'system has unsupported display "
            "driver / cuda driver combination'"
        )
    fix = (
        *_dir_fix(ctx, lib),
        "keep the compat directory off the loader's path unless the driver is older than the CUDA the "
        "program needs (NVIDIA's CUDA images add it only then)",
    )
    return Finding(
        "driver.cuda_compat_mismatch",
        Severity.ERROR,
        f"the CUDA forward-compatibility package (libcuda {lib.version}) does not fit kernel module {module}",
        why,
        fix,
        tuple(_evidence(ctx, "libcuda.so.1", lib, how)),
    )


def _unexplained_compat_errors(ctx: Context, said: str) -> Iterator[Finding]:
    """CUDA says 803/804/34 but the library facts do not show which file: name the error and where to look."""
    for words, fid, summary in (
        (
            CUDA_COMPAT_HW,
            "driver.cuda_compat_mismatch",
            "CUDA forward compatibility on a GPU without it (804)",
        ),
        (CUDA_MISMATCH, "driver.library_mismatch", "libcuda and the kernel module differ (CUDA error 803)"),
        (CUDA_STUB, "driver.stub_library", "libcuda is the toolkit's stub (CUDA error 34)"),
    ):
        if _says(said, words):
            yield Finding(
                fid,
                Severity.ERROR,
                summary,
                "CUDA's own error names a user-space driver that does not fit the kernel module; the file "
                "was not among those doctor found on the loader's path",
                (
                    "LD_DEBUG=libs python -c 'import torch; torch.cuda.init()' 2>&1 | grep -e 'trying file=.*libcuda' "
                    "-e 'calling init:.*libcuda'   # which libcuda the loader picks",
                    "ls -l /usr/local/cuda*/compat; echo $LD_LIBRARY_PATH; ldconfig -p | grep libcuda",
                ),
                (f"torch: {said.strip()[:300]}",),
            )
            return
