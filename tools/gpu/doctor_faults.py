"""Fault campaign for ``torchrig doctor`` on a GPU machine: make each fault for real, run doctor, undo the fault,
and say whether doctor named it.

Run as root from the repository root (it changes device-node modes, renames /dev/nvidia-uvm, mounts a small
/dev/shm in a private mount namespace and starts a process that holds most of GPU 0's memory; every change is
undone, also when a step fails)::

    OUT=/tmp/out python3 tools/gpu/doctor_faults.py      # results in $OUT/doctor-faults.tar.gz + results.md
    DOCTOR_FAULTS=shm-64m,gpu-memory-hog DOCTOR_TIMINGS=0 ...  # some faults only, no timings

For each fault it writes ``<fault>.facts.json`` (doctor's facts, the fixture format of tests/fixtures/doctor/),
``<fault>.report.json`` and the doctor's exit status, then a table (``results.md``) of fault, how it was made,
the causes that name it, doctor's first problem and named/missed; then the wall time of doctor with its torch
probe against a bare ``python -c 'import torch'`` (``timings.txt``). Faults the machine cannot produce (no CUDA
toolkit stub, no forward-compatibility package) are listed as "not made", with the reason.

Nothing here touches the GPU's settings (persistence, clocks, power limits, MIG): those faults are not made.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import select
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PY = os.environ.get("PYTHON") or sys.executable
WORK = Path("/tmp/doctor-faults")
NOBODY = 65534
# Safety settings for every process on the shared GPU machine (HELPERS.md)
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass
class Run:
    """How to run doctor under a fault."""

    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    cwd: str | None = None
    as_nobody: bool = False
    prefix: tuple[str, ...] = ()  # e.g. unshare -m ... (the doctor command is appended)
    how: str = ""


@dataclass
class Fault:
    name: str
    expect: tuple[str, ...]  # finding ids that name it
    make: Callable[[], contextlib.AbstractContextManager[Run | str]]  # a Run, or why it cannot be made here


def module_version() -> str | None:
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except OSError:
        return None
    m = re.search(r"\b(\d{3}\.\d{1,3}(?:\.\d{1,3})?)\b", first)
    return m.group(1) if m else None


def ld_path(*dirs: str) -> dict[str, str]:
    old = os.environ.get("LD_LIBRARY_PATH", "")
    return {"LD_LIBRARY_PATH": ":".join([*dirs, *([old] if old else [])])}


def find(patterns: list[str]) -> list[str]:
    return sorted({os.path.realpath(p) for pat in patterns for p in glob.glob(pat) if os.path.isfile(p)})


def site_packages() -> list[str]:
    out = subprocess.run(
        [
            PY,
            "-c",
            "import site, sys; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))",
        ],
        capture_output=True,
        text=True,
    ).stdout
    return [p for p in out.splitlines() if os.path.isdir(p)]


STUB_DIRS = ["/usr/local/cuda*/lib64/stubs", "/usr/local/cuda*/targets/*/lib/stubs"]


def stub_of(name: str) -> list[str]:
    pats = [f"{d}/{name}" for d in STUB_DIRS]
    pats += [f"{sp}/nvidia/*/lib/stubs/{name}" for sp in site_packages()]
    return find(pats)


def other_libcuda(module: str | None) -> list[str]:
    """Real libcuda files of another driver version than the kernel module's (the compat package's first)."""
    cands = find(
        [
            "/usr/local/cuda*/compat/libcuda.so.*.*",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.*.*",
            "/usr/local/nvidia/lib64/libcuda.so.*.*",
            "/usr/lib64/libcuda.so.*.*",
        ]
    )
    return [c for c in cands if module and not c.endswith(module) and "/stubs/" not in c]


def linkdir(name: str, soname: str, target: str) -> str:
    d = WORK / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / soname).symlink_to(target)
    return str(d)


# ---------------------------------------------------------------- the faults
@contextlib.contextmanager
def stub_lib(soname: str, stub_name: str) -> Iterator[Run | str]:
    stubs = stub_of(stub_name)
    if not stubs:
        yield f"no CUDA toolkit stub {stub_name} on this machine ({', '.join(STUB_DIRS)})"
        return
    d = linkdir(f"stub-{stub_name}", soname, stubs[0])
    yield Run(env=ld_path(d), how=f"LD_LIBRARY_PATH={d} ({soname} -> {stubs[0]})")


@contextlib.contextmanager
def libcuda_other_version() -> Iterator[Run | str]:
    others = other_libcuda(module_version())
    if not others:
        yield "no libcuda of another driver version on this machine"
        return
    real = others[0]
    d = WORK / "old-driver"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    shutil.copy2(real, d / os.path.basename(real))  # a copy outside any compat directory
    (d / "libcuda.so.1").symlink_to(os.path.basename(real))
    try:
        yield Run(env=ld_path(str(d)), how=f"LD_LIBRARY_PATH={d} (a copy of {real})")
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def compat_package() -> Iterator[Run | str]:
    module = module_version()
    dirs = sorted({os.path.dirname(p) for p in glob.glob("/usr/local/cuda*/compat/libcuda.so.1")})
    if not dirs:
        yield "no CUDA forward-compatibility package (/usr/local/cuda*/compat) on this machine"
        return
    real = os.path.realpath(os.path.join(dirs[0], "libcuda.so.1"))
    if module and real.endswith(module):
        yield f"the compat package's libcuda ({real}) is the kernel module's own version: it fits"
        return
    yield Run(env=ld_path(dirs[0]), how=f"LD_LIBRARY_PATH={dirs[0]} ({real}; kernel module {module})")


@contextlib.contextmanager
def nccl_shadow() -> Iterator[Run | str]:
    libs = find([f"{sp}/nvidia/nccl/lib/libnccl.so.2" for sp in site_packages()])
    if not libs:
        yield "no pip NCCL (nvidia/nccl/lib/libnccl.so.2) beside torch"
        return
    d = WORK / "nccl"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    shutil.copy2(libs[0], d / "libnccl.so.2")
    try:
        yield Run(env=ld_path(str(d)), how=f"LD_LIBRARY_PATH={d} (a copy of {libs[0]})")
    finally:
        shutil.rmtree(d, ignore_errors=True)


NODES = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    *sorted(glob.glob("/dev/nvidia[0-9]*")),
]


@contextlib.contextmanager
def nodes_denied() -> Iterator[Run | str]:
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in NODES if os.path.exists(p)}
    try:
        for p in modes:
            os.chmod(p, 0o660)
        yield Run(as_nobody=True, how="chmod 0660 " + " ".join(modes) + f"; doctor runs as uid {NOBODY}")
    finally:
        for p, m in modes.items():
            os.chmod(p, m)


# Where libcuda runs nvidia-modprobe (setuid root) to load nvidia_uvm and create /dev/nvidia-uvm on first use
MODPROBE_PATHS = ("/usr/bin/nvidia-modprobe", "/usr/sbin/nvidia-modprobe", "/bin/nvidia-modprobe")


@contextlib.contextmanager
def uvm_missing(recreatable: bool = False) -> Iterator[Run | str]:
    """/dev/nvidia-uvm moved aside. By default nvidia-modprobe is also made to fail inside doctor's own mount
    namespace (``/bin/false`` bound over it, nothing changed outside), as in a container that was started
    without the node and has no nvidia-modprobe: CUDA cannot recreate it and fails. ``recreatable``: the
    node only, so CUDA's first use recreates it (the host case)."""
    node, aside = "/dev/nvidia-uvm", "/dev/nvidia-uvm.doctor-fault"
    if not os.path.exists(node):
        yield "/dev/nvidia-uvm does not exist here"
        return
    prefix: tuple[str, ...] = ()
    how = f"mv {node} {aside}"
    if not recreatable:
        tools = sorted({os.path.realpath(p) for p in MODPROBE_PATHS if os.path.exists(p)})
        if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
            yield "no mount namespaces here (unshare -m refused)"
            return
        binds = "".join(f"mount --bind /bin/false {shlex.quote(t)} && " for t in tools)
        prefix = ("unshare", "-m", "sh", "-c", binds + 'exec "$@"', "sh")
        how += "; in doctor's mount namespace " + (
            ", ".join(f"/bin/false bound over {t}" for t in tools) + " (CUDA cannot recreate the node)"
            if tools
            else "(no nvidia-modprobe installed: CUDA cannot recreate the node)"
        )
    else:
        how += " (nvidia-modprobe left in place: CUDA's first use recreates it)"
    os.rename(node, aside)
    try:
        yield Run(prefix=prefix, how=how)
    finally:
        if os.path.exists(node):  # recreated meanwhile: the original goes back in its place
            os.unlink(node)
        os.rename(aside, node)


@contextlib.contextmanager
def visible(value: str) -> Iterator[Run | str]:
    yield Run(env={"CUDA_VISIBLE_DEVICES": value}, how=f"CUDA_VISIBLE_DEVICES={value!r}")


@contextlib.contextmanager
def small_shm() -> Iterator[Run | str]:
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        yield "no mount namespaces here (unshare -m refused)"
        return
    yield Run(
        prefix=("unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "sh"),
        how="unshare -m; mount -t tmpfs -o size=64m tmpfs /dev/shm (Docker's default)",
    )


HOG = """
import sys, time, torch
free, total = torch.cuda.mem_get_info(0)
keep = torch.empty(int(free * 0.85), dtype=torch.uint8, device="cuda:0")
print("ready", keep.numel() // 2**20, "MiB of", total // 2**20, flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def memory_hog() -> Iterator[Run | str]:
    proc = subprocess.Popen(
        [PY, "-c", HOG], stdout=subprocess.PIPE, text=True, env={**os.environ, **SAFE_ENV}
    )
    assert proc.stdout is not None
    try:
        ready, _w, _x = select.select([proc.stdout], [], [], 90)  # torch import + allocation; never hang here
        line = proc.stdout.readline().strip() if ready else ""
        if not line.startswith("ready"):
            yield f"the memory hog did not start: {line or proc.poll()}"
            return
        yield Run(how=f"another process (pid {proc.pid}) holds {line.split(None, 1)[1]} of GPU 0")
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def torch_folder_in_cwd() -> Iterator[Run | str]:
    init = subprocess.run([PY, "-c", "import torch; print(torch.__file__)"], capture_output=True, text=True)
    if init.returncode != 0:
        yield f"torch does not import here: {init.stderr.strip()[-200:]}"
        return
    d = WORK / "checkout"
    shutil.rmtree(d, ignore_errors=True)
    (d / "torch").mkdir(parents=True)
    shutil.copy2(init.stdout.strip(), d / "torch" / "__init__.py")
    try:
        yield Run(
            cwd=str(d), how=f"doctor run in {d}, which holds torch/__init__.py (as a source checkout does)"
        )
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def python_without_torch() -> Iterator[Run | str]:
    system = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)), None)
    if system is None:
        yield "no system interpreter here"
        return
    if subprocess.run([system, "-c", "import torch"], capture_output=True).returncode == 0:
        yield f"{system} has torch"
        return
    d = WORK / "venv-bin"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "python").symlink_to(system)
    try:
        yield Run(
            cwd=str(d),
            args=("--python", "python"),
            how=f"--python python (relative) in {d}, -> {system} (no torch)",
        )
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def env_fault(name: str, value: str) -> Iterator[Run | str]:
    """A variable in doctor's environment only (nothing on the machine changes)."""
    yield Run(env={name: value}, how=f"{name}={value!r}")


@contextlib.contextmanager
def profile_fault(name: str, value: str) -> Iterator[Run | str]:
    """The variable set in /etc/profile.d as an administrator would, and in the environment as a login shell
    would carry it: doctor should say which file sets it. The file is removed afterwards."""
    path = Path("/etc/profile.d/zz-torchrig-doctor-fault.sh")
    try:
        path.write_text(f"export {name}={value}\n")
    except OSError as e:
        yield f"cannot write {path}: {e.strerror}"
        return
    try:
        yield Run(env={name: value}, how=f"export {name}={value} in {path}")
    finally:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def ib_hca_missing() -> Iterator[Run | str]:
    """NCCL_IB_HCA naming a device this host lacks: a fault only where it has InfiniBand/RoCE devices."""
    try:
        devices = os.listdir("/sys/class/infiniband")
    except OSError:
        devices = []
    if not devices:
        yield "no InfiniBand/RoCE device here (NCCL uses sockets whatever NCCL_IB_HCA says)"
        return
    yield Run(env={"NCCL_IB_HCA": "=doctorfault_9"}, how=f"NCCL_IB_HCA='=doctorfault_9' (devices: {devices})")


FAULTS = [
    Fault("libcuda-stub", ("driver.stub_library",), lambda: stub_lib("libcuda.so.1", "libcuda.so")),
    Fault(
        "libnvidia-ml-stub",
        ("driver.stub_library",),
        lambda: stub_lib("libnvidia-ml.so.1", "libnvidia-ml.so"),
    ),
    Fault(
        "libcuda-other-version",
        ("driver.library_mismatch", "driver.cuda_compat_mismatch"),
        libcuda_other_version,
    ),
    Fault("cuda-compat", ("driver.cuda_compat_mismatch",), compat_package),
    Fault("libnccl-shadow", ("env.shadowed_libraries",), nccl_shadow),
    Fault("device-nodes-denied", ("driver.device_nodes_denied",), nodes_denied),
    Fault("uvm-node-missing", ("driver.uvm_node_missing",), uvm_missing),
    Fault("uvm-node-recreated", ("driver.uvm_node_missing",), lambda: uvm_missing(recreatable=True)),
    Fault("cuda-visible-devices-minus1", ("env.cuda_visible_devices",), lambda: visible("-1")),
    Fault("cuda-visible-devices-7", ("env.cuda_visible_devices",), lambda: visible("7")),
    Fault("cuda-visible-devices-empty", ("env.cuda_visible_devices",), lambda: visible("")),
    Fault(
        "cuda-visible-devices-bad-uuid",
        ("env.cuda_visible_devices",),
        lambda: visible("GPU-00000000-0000-0000-0000-000000000000"),
    ),
    Fault("cuda-visible-devices-0-7", ("env.cuda_visible_devices",), lambda: visible("0,7")),
    Fault("shm-64m", ("limits.shm",), small_shm),
    Fault("gpu-memory-hog", ("gpu.busy",), memory_hog),
    Fault("torch-folder-in-cwd", ("torch.import_failed",), torch_folder_in_cwd),
    Fault("python-without-torch", ("torch.not_installed",), python_without_torch),
    # the environment a user carries (issue 34)
    Fault(
        "nccl-socket-ifname-missing",
        ("env.nccl_socket_ifname", "nccl.bootstrap_failed"),
        lambda: profile_fault("NCCL_SOCKET_IFNAME", "doctorfault9"),
    ),
    Fault(
        "gloo-socket-ifname-missing",
        ("env.gloo_socket_ifname",),
        lambda: env_fault("GLOO_SOCKET_IFNAME", "doctorfault9"),
    ),
    Fault(
        "alloc-conf-malformed",
        ("env.alloc_conf", "env.breaks_torch"),
        lambda: env_fault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:maybe,max_split_size_mb=64"),
    ),
    Fault(
        "alloc-conf-unknown-key",
        ("env.alloc_conf", "env.breaks_torch"),
        lambda: env_fault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segment:True"),
    ),
    Fault("torch-logs-invalid", ("env.breaks_torch",), lambda: env_fault("TORCH_LOGS", "no_such_log_name")),
    Fault("cuda-launch-blocking", ("env.debug_setting",), lambda: env_fault("CUDA_LAUNCH_BLOCKING", "1")),
    Fault("nccl-debug-trace", ("env.debug_setting",), lambda: env_fault("NCCL_DEBUG", "TRACE")),
    Fault("nccl-ib-hca-missing", ("env.nccl_ib_hca",), ib_hca_missing),
    Fault("ld-preload-libcudart", ("env.ld_preload",), lambda: env_fault("LD_PRELOAD", "libcudart.so.12")),
]


# ---------------------------------------------------------------- running doctor
def public_src() -> str:
    """A copy of src/ every user may read (the non-root run)."""
    dst = WORK / "src"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(ROOT / "src", dst, ignore=shutil.ignore_patterns("__pycache__"))
    for dirpath, _dirnames, filenames in os.walk(WORK):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    os.chmod(WORK, 0o755)
    path = str(dst)
    # NVML's Python bindings: the machine's own, else a carried copy (.gpu-deps/pynvml.py) behind src/
    if subprocess.run([PY, "-c", "import pynvml"], capture_output=True).returncode != 0:
        carried = ROOT / ".gpu-deps" / "pynvml.py"
        if carried.exists():
            (WORK / "deps").mkdir(mode=0o755)
            shutil.copy2(carried, WORK / "deps" / "pynvml.py")
            os.chmod(WORK / "deps" / "pynvml.py", 0o644)
            path += os.pathsep + str(WORK / "deps")
            print("using the carried pynvml.py (nvidia-ml-py is not installed here)", flush=True)
    return path


def drop_to_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def doctor(run: Run, src: str) -> tuple[int, dict[str, Any] | None, str, float]:
    env = {**os.environ, **SAFE_ENV, "PYTHONPATH": src}
    env.update(run.env)
    if run.as_nobody:
        env["HOME"] = "/tmp"
    argv = [*run.prefix, PY, "-m", "torchrig", "doctor", "--json", "--timeout", "40", *run.args]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env,
            cwd=run.cwd or ("/tmp" if run.as_nobody else str(ROOT)),
            timeout=300,  # a failed torch probe is traced: up to 90 s of re-runs
            preexec_fn=drop_to_nobody if run.as_nobody else None,
        )
    except subprocess.TimeoutExpired:
        return 124, None, "doctor did not finish in 300 s", 300.0
    wall = time.perf_counter() - t0
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr[-2000:], wall
    except ValueError:
        return proc.returncode, None, (proc.stderr or proc.stdout)[-2000:], wall


def problems(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["severity"] in ("error", "warning")]


def table(rows: list[tuple[str, str, tuple[str, ...], str, str]], base: dict | None, stamp: str) -> list[str]:
    made = [r for r in rows if r[4] != "not made"]
    lines = [
        f"# doctor fault campaign, {stamp}",
        "",
        f"machine: {base and base['machine']}",
        f"command: OUT=$OUT {Path(PY).name} tools/gpu/doctor_faults.py (as root, from the repository root)",
        "",
        "| fault | how it was made | named by | doctor's first problem | result |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, how, expect, top, verdict in rows:
        lines.append(f"| `{name}` | {how} | {', '.join(f'`{e}`' for e in expect)} | {top} | {verdict} |")
    lines += [
        "",
        f"{sum(r[4] == 'named' for r in made)} of {len(made)} faults made were named; "
        f"{len(rows) - len(made)} could not be made here.",
    ]
    return lines


def flush(out: Path, res: Path, lines: list[str]) -> None:
    """results.md and the tarball of everything so far into $OUT (a run cut short still brings back its part)."""
    (res / "results.md").write_text("\n".join(lines) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(res / "results.md", out / "results.md")
    with tarfile.open(out / "doctor-faults.tar.gz", "w:gz") as tar:
        tar.add(res, arcname="doctor-faults")


def run_fault(fault: Fault, src: str, res: Path) -> tuple[str, str, tuple[str, ...], str, str]:
    try:
        with fault.make() as made:
            if isinstance(made, str):
                print(f"{fault.name}: not made ({made})", flush=True)
                return (fault.name, f"not made: {made}", fault.expect, "", "not made")
            code, report, err, wall = doctor(made, src)
    except Exception as e:  # a fault that cannot be made or undone is reported, the rest still run
        print(f"{fault.name}: failed: {e}", flush=True)
        return (fault.name, f"failed to make: {type(e).__name__}: {e}", fault.expect, "", "not made")
    if report is None:
        print(f"{fault.name}: doctor failed: {err[-500:]}", flush=True)
        return (fault.name, made.how, fault.expect, f"doctor failed (exit {code}): {err[-300:]}", "missed")
    facts = report["facts"]
    facts["source"] = (
        f"recorded by tools/gpu/doctor_faults.py ({fault.name}: {made.how}) at {facts['recorded_at']}"
    )
    (res / f"{fault.name}.facts.json").write_text(json.dumps(facts, indent=2) + "\n")
    (res / f"{fault.name}.report.json").write_text(json.dumps(report, indent=2) + "\n")
    first = next(iter(problems(report)), None)
    ids = [f["id"] for f in report["findings"] if f["severity"] != "ok"]
    named = any(i in fault.expect for i in ids) and code != 0
    top = f"`{first['id']}`: {first['summary']}" if first else "no problem found"
    print(f"{fault.name}: {'NAMED' if named else 'MISSED'} -> {ids} (exit {code}, {wall:.1f} s)", flush=True)
    return (fault.name, made.how, fault.expect, f"{top} (exit {code})", "named" if named else "missed")


def timings(src: str) -> dict[str, Any]:
    """doctor with its torch probe against a bare import torch, each in a fresh interpreter."""
    times: dict[str, list[float]] = {
        "python -m torchrig doctor --json": [],
        "the same, GPU contexts not created during the import (TORCHRIG_DOCTOR_WARM_CUDA=0)": [],
        "python -c 'import torch'": [],
    }
    keys = list(times)
    for _ in range(3):
        times[keys[0]].append(round(doctor(Run(), src)[3], 2))
        times[keys[1]].append(round(doctor(Run(env={"TORCHRIG_DOCTOR_WARM_CUDA": "0"}), src)[3], 2))
        t0 = time.perf_counter()
        subprocess.run([PY, "-c", "import torch"], capture_output=True, env={**os.environ, **SAFE_ENV})
        times[keys[2]].append(round(time.perf_counter() - t0, 2))
    return times


def main() -> int:
    out = Path(os.environ.get("OUT", "/tmp/torchrig-out"))
    res = WORK / "results"
    shutil.rmtree(WORK, ignore_errors=True)
    res.mkdir(parents=True)
    os.environ.update(SAFE_ENV)
    src = public_src()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    base_code, base, err, wall = doctor(Run(), src)
    if base is not None:
        (res / "healthy.facts.json").write_text(json.dumps(base["facts"], indent=2) + "\n")
        (res / "healthy.report.json").write_text(json.dumps(base, indent=2) + "\n")
    print(
        f"healthy: exit {base_code}, {wall:.1f} s; {base and base['machine']}; problems: "
        f"{[f['id'] for f in problems(base)] if base else err}",
        flush=True,
    )
    rows: list[tuple[str, str, tuple[str, ...], str, str]] = []
    only = {n for n in os.environ.get("DOCTOR_FAULTS", "").split(",") if n}  # a subset, by name
    unknown = only - {f.name for f in FAULTS}
    if unknown:
        print(
            f"DOCTOR_FAULTS names no fault: {sorted(unknown)}; known: {[f.name for f in FAULTS]}", flush=True
        )
        return 2
    for fault in FAULTS:
        if only and fault.name not in only:
            continue
        rows.append(run_fault(fault, src, res))
        flush(out, res, table(rows, base, stamp))
    times = timings(src) if os.environ.get("DOCTOR_TIMINGS", "1") != "0" else {}
    steps = base["facts"]["torch"].get("steps_ms") if base else None
    (res / "timings.json").write_text(
        json.dumps({"times_s": times, "healthy_torch_steps_ms": steps}, indent=2)
    )
    lines = [
        *table(rows, base, stamp),
        "",
        "wall time, seconds, 3 runs each: "
        + "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in times.items()),
        f"torch probe steps of the healthy run (ms): {steps}",
    ]
    flush(out, res, lines)
    print("\n".join(lines), flush=True)
    made = [r for r in rows if r[4] != "not made"]
    return 0 if all(r[4] == "named" for r in made) else 1


if __name__ == "__main__":
    sys.exit(main())
