"""The script the torch probe runs in the inspected interpreter (``python -c <this file's text>``).

It must run on any Python 3.8+ with only the standard library and (maybe) torch: it never imports torchrig.
It prints one JSON object on stdout. Kept as a real module so that it is linted and tested like the rest.
"""

import glob
import json
import os
import sys
import time
import warnings

# The loaded CUDA libraries to report. Beside env.py's list of the wheels' libraries (plus the driver's own
# libcuda and libnvidia-ml): this script runs with the standard library alone, so it cannot import that one.
CUDA_LIB_PREFIXES = (
    "libcudnn",
    "libcublas",
    "libnccl",
    "libcudart",
    "libcuda.",
    "libnvrtc",
    "libcusparse",
    "libcufft",
    "libcurand",
    "libcusolver",
    "libnvJitLink",
    "libnvidia-ml",
    "libcupti",
)


def wheel_libraries():
    """The CUDA libraries pip installed beside torch (site-packages/nvidia/*/lib, e.g. nvidia/cudnn/lib)."""
    found = set()
    for base in sys.path:
        root = os.path.join(base or ".", "nvidia")
        if os.path.isdir(root):
            for path in glob.glob(os.path.join(root, "*", "lib", "*.so*")):
                found.add(path)
                found.add(os.path.realpath(path))  # /proc/self/maps shows real paths
    return sorted(found)


def loaded_libraries():
    """CUDA libraries mapped into this process (what the loader really picked), from /proc/self/maps."""
    paths = set()
    try:
        with open("/proc/self/maps") as fh:  # raw-read: runs without torchrig; this process's own maps
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    if os.path.basename(path).startswith(CUDA_LIB_PREFIXES):
                        paths.add(path)
    except OSError:
        pass
    return sorted(paths)


def warm_cuda():
    """Create each GPU's primary CUDA context through the driver API (``cuInit``, ``cuDevicePrimaryCtxRetain``)
    while ``import torch`` runs: torch later uses the same primary contexts, so their creation (a large part of
    the first CUDA call) overlaps the import instead of following it. Any failure is left for torch to report
    in its own words."""
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        if lib.cuInit(0) != 0:
            return
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return
        for i in range(count.value):
            dev = ctypes.c_int(0)
            if lib.cuDeviceGet(ctypes.byref(dev), i) == 0:
                lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctypes.c_void_p()), dev)
    except Exception:
        return


def cudnn_text(v):
    if not v:
        return None
    v = int(v)
    if v >= 90000:  # cuDNN 9: MAJOR*10000 + MINOR*100 + PATCH
        return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
    return f"{v // 1000}.{(v % 1000) // 100}.{v % 100}"  # cuDNN 8: MAJOR*1000 + MINOR*100 + PATCH


def err_text(e):
    return f"{type(e).__name__}: {e}".strip()[:2000]


def probe_devices(torch, out, count):
    devices = []
    for i in range(count):
        dev: dict = {
            "index": i,
            "name": None,
            "compute_capability": None,
            "kernel_ok": None,
            "kernel_error": None,
        }
        try:
            dev["name"] = torch.cuda.get_device_name(i)
            major, minor = torch.cuda.get_device_capability(i)
            dev["compute_capability"] = f"{major}.{minor}"
            x = torch.ones(4, device=f"cuda:{i}")
            dev["kernel_ok"] = float((x * 2).sum().item()) == 8.0
        except Exception as e:
            dev["kernel_ok"] = False
            dev["kernel_error"] = err_text(e)
        devices.append(dev)
    out["devices"] = devices


def probe_peers(torch, out, count):
    peers = []
    for a in range(count):
        for b in range(a + 1, count):
            try:
                peers.append({"a": a, "b": b, "can_access": bool(torch.cuda.can_device_access_peer(a, b))})
            except Exception:  # a pair CUDA cannot answer about is simply left out
                continue
    out["peer_access"] = peers


def alloc_conf_error(torch):
    """Ask torch's own parser about PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF (it raises on a malformed value);
    None when accepted, unset, or this torch has no such call."""
    if not (os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")):
        return None
    get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if get is None:
        return None
    try:
        get()
    except Exception as e:
        return err_text(e).splitlines()[0][:500]
    return None


def nccl_one(torch, dist, index, root, keep=False):
    """A one-process NCCL communicator on GPU ``index``: init over a FileStore, one all_reduce, destroy.
    ``keep``: left alive (the last GPU's): the probe leaves with ``os._exit`` right after, and the kernel
    releases it with the process: its tear-down is not waited for."""
    t0 = time.perf_counter()
    rec = {"index": index, "ok": False, "error": None, "elapsed_ms": None}
    try:
        store = dist.FileStore(os.path.join(root, f"store-{index}"), 1)
        dev = torch.device("cuda", index)
        torch.cuda.set_device(dev)
        try:
            dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=dev)
        except TypeError:  # torch before 2.3: no device_id (the communicator starts at the first collective)
            dist.init_process_group("nccl", store=store, rank=0, world_size=1)
        try:
            x = torch.ones(1, device=dev)
            dist.all_reduce(x)
            torch.cuda.synchronize(dev)
            rec["ok"] = float(x.item()) == 1.0
            if not rec["ok"]:
                rec["error"] = f"all_reduce of 1 on one rank gave {float(x.item())}"
        finally:
            if not keep:
                dist.destroy_process_group()
    except Exception as e:
        rec["error"] = err_text(e)
    rec["elapsed_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    return rec


def start_nccl_check(torch, count):
    """Start each visible GPU's one-process communicator in a thread (it overlaps the kernels and the peer
    queries that follow); :func:`finish_nccl_check` waits for it, TORCHRIG_DOCTOR_NCCL_TIMEOUT seconds at most."""
    import tempfile
    import threading

    env_used = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith(("NCCL_", "GLOO_")))
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_nccl_available()):
            return None, {
                "status": "skipped",
                "error": "this torch has no NCCL backend",
                "env_used": env_used,
            }
    except Exception as e:
        return None, {"status": "skipped", "error": err_text(e), "env_used": env_used}
    devices: list = []
    result: dict = {"status": "timeout", "devices": devices, "env_used": env_used}

    def work():
        with tempfile.TemporaryDirectory(prefix="torchrig-nccl-") as root:
            for i in range(count):
                devices.append(nccl_one(torch, dist, i, root, keep=i == count - 1))
        result["status"] = "ok" if all(d["ok"] for d in devices) else "failed"

    t = threading.Thread(target=work, name="nccl-check", daemon=True)
    t.start()
    return (t, time.perf_counter()), result


def finish_nccl_check(started, result):
    if started is None:
        return result
    thread, t0 = started
    limit = float(os.environ.get("TORCHRIG_DOCTOR_NCCL_TIMEOUT", "20"))
    thread.join(max(0.0, limit - (time.perf_counter() - t0)))
    if thread.is_alive():
        result["error"] = f"the NCCL communicator did not come up in {limit:g} s"
    return result


def main():
    out = {
        "status": "ok",
        "pid": os.getpid(),
        "python_executable": sys.executable,
        "python_version": "{}.{}.{}".format(*sys.version_info[:3]),
        "wheel_libraries": wheel_libraries(),
    }
    try:  # where "import torch" looks first: a torch/ folder in the working directory shadows the installed one
        import importlib.util

        spec = importlib.util.find_spec("torch")
        out["torch_origin"] = spec and (
            spec.origin or next(iter(spec.submodule_search_locations or []), None)
        )
    except Exception:
        out["torch_origin"] = None
    if os.environ.get("TORCHRIG_DOCTOR_WARM_CUDA", "1") != "0":
        import threading

        threading.Thread(target=warm_cuda, name="warm-cuda", daemon=True).start()
    t0 = time.perf_counter()
    try:
        import torch
    except ImportError as e:
        missing = getattr(e, "name", None) == "torch"
        out.update(status="missing" if missing else "failed", error=err_text(e))
        out["loaded_libraries"] = loaded_libraries()
        print(json.dumps(out))
        return
    except Exception as e:
        out.update(status="failed", error=err_text(e))
        print(json.dumps(out))
        return
    if not hasattr(torch, "__version__"):  # a folder named torch without the package in it
        out.update(status="failed", error=f"'import torch' found {out['torch_origin']}, which is not PyTorch")
        print(json.dumps(out))
        return
    out["import_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    steps = {"import": out["import_ms"]}
    mark = [time.perf_counter()]

    def lap():
        now = time.perf_counter()
        ms = round((now - mark[0]) * 1000, 1)
        mark[0] = now
        return ms

    out["version"] = torch.__version__
    out["cuda_version"] = getattr(torch.version, "cuda", None)
    out["hip_version"] = getattr(torch.version, "hip", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["arch_list"] = list(torch.cuda.get_arch_list())
        except Exception:
            out["arch_list"] = []
        try:
            out["cudnn_version"] = cudnn_text(torch.backends.cudnn.version())
        except Exception:
            out["cudnn_version"] = None
        try:
            out["nccl_version"] = (
                ".".join(str(p) for p in torch.cuda.nccl.version()) if out["cuda_version"] else None
            )
        except Exception:
            out["nccl_version"] = None
        steps["versions"] = lap()
        out["is_available"] = bool(torch.cuda.is_available())
        count = int(torch.cuda.device_count())
        out["device_count"] = count
        try:
            torch.cuda.init()
            out["init_error"] = None
        except Exception as e:
            out["init_error"] = err_text(e)
        steps["cuda_init"] = lap()
        nccl = None
        if out["is_available"] and out["nccl_version"] and os.environ.get("TORCHRIG_DOCTOR_NCCL", "1") != "0":
            nccl = start_nccl_check(torch, count)
        if out["is_available"]:
            probe_devices(torch, out, count)
            steps["devices"] = lap()
            probe_peers(torch, out, count)
            steps["peers"] = lap()
    out["warnings"] = [str(w.message)[:2000] for w in caught]
    out["alloc_conf_error"] = alloc_conf_error(torch)
    out["loaded_libraries"] = loaded_libraries()
    steps["maps"] = lap()
    out["steps_ms"] = steps
    print(json.dumps(out), flush=True)  # the facts so far: a hang or crash in the NCCL check cannot lose them
    if nccl is not None:
        print(json.dumps({"nccl": finish_nccl_check(*nccl)}), flush=True)


if __name__ == "__main__":
    main()
    # Leave without tearing CUDA down: the GPU contexts' clean-up at interpreter exit would add to doctor's wall
    # time, and the kernel releases them with the process anyway.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
