"""``torchrig install``'s adapters: the only code here that runs a process or opens a connection. Each returns
a plain record or raises one of torchrig's errors with what to do next.

Equivalent shell: ``python -c 'import sys; print(sys.version)'``; ``python -m pip index versions torch
--index-url URL``; ``curl -I URL/torch/``; ``python -m pip install torch==X --index-url URL``;
``python -c 'import torch; torch.ones(1, device="cuda").add_(1)'``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchrig.errors import EngineUnavailable, InputError
from torchrig.install.plan import PYPI_SIMPLE, PythonFacts

# Runs in the target interpreter: its version, pip, the installed torch's version (torch is not imported).
_FACTS = r"""
import importlib.util, json, os, sys, sysconfig
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except Exception:
        return None
marker = os.path.join(sysconfig.get_path("stdlib") or "", "EXTERNALLY-MANAGED")
print(json.dumps({
    "executable": sys.executable,
    "version": "%d.%d.%d" % sys.version_info[:3],
    "pip": version("pip") if importlib.util.find_spec("pip") else None,
    "torch": version("torch"),
    "externally_managed": os.path.exists(marker) and sys.prefix == sys.base_prefix,
}))
"""

# Runs in the target interpreter after the install: a real kernel on the GPU for a CUDA build, an op on the
# CPU for the CPU build. One JSON line; any failure is its text, never a traceback.
_VERIFY = r"""
import json, sys
out = {"ok": False}
try:
    import torch
    out["version"] = torch.__version__
    out["cuda"] = torch.version.cuda
    if sys.argv[1] == "cuda":
        x = torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        out["device"] = torch.cuda.get_device_name(0)
        out["ok"] = float(x.item()) == 2.0
    else:
        out["ok"] = float(torch.ones(2).add(1).sum()) == 4.0
        out["device"] = "cpu"
except BaseException as err:
    out["error"] = ("%s: %s" % (type(err).__name__, err))[:500]
print(json.dumps(out))
"""


def python_facts(python: str | None, timeout_s: float = 60.0) -> PythonFacts:
    """The interpreter at ``python`` (as given, never looked up on PATH; None: this one)."""
    exe = sys.executable if python is None else os.path.abspath(os.path.expanduser(python))
    if python is not None:
        path = Path(exe)
        if not path.exists():
            raise InputError(f"no python at --python {python!r}", hint="give the path of a python executable")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise InputError(
                f"--python {python!r} is not an executable file", hint="give a python executable"
            )
    try:
        r = subprocess.run([exe, "-c", _FACTS], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise InputError(
            f"cannot run {exe}: {err}", hint="give the path of a working python executable"
        ) from None
    try:
        data = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(
            f"{exe} is not a Python 3 interpreter torchrig can use ({last[:200]})",
            hint="give the path of a python3 executable (3.9 or newer)",
        ) from None
    # Keep the path as given (a venv's bin/python is a link: resolving it would leave the venv).
    return PythonFacts(exe, data["version"], data["pip"], data["torch"], bool(data["externally_managed"]))


def which_installer(wanted: str, facts: PythonFacts) -> str:
    """``pip`` or ``uv`` (auto: uv where it is on PATH, else the interpreter's pip)."""
    if wanted in ("uv", "auto") and shutil.which("uv"):
        return "uv"
    if wanted == "uv":
        raise EngineUnavailable(
            "uv is not on PATH", hint="install it (pip install uv) or use --installer pip"
        )
    if facts.pip is None:
        raise EngineUnavailable(
            f"{facts.executable} has no pip",
            hint=f"run '{facts.executable} -m ensurepip --upgrade' (or install uv), then run torchrig install again",
        )
    return "pip"


def index_unreachable(index_url: str | None, timeout_s: float = 10.0) -> str | None:
    """Why ``index_url``'s torch page cannot be read (DNS, refused, HTTP status), None: it answers.
    Proxies come from the environment, as pip takes them."""
    import urllib.error
    import urllib.request

    url = (index_url or PYPI_SIMPLE).rstrip("/") + "/torch/"
    if url.startswith("file://"):
        return None if os.path.isdir(url[len("file://") :]) else f"{url} does not exist"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s) as resp:
            return None if resp.status < 400 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return str(reason)[:200]


_AVAILABLE = re.compile(r"Available versions:\s*(.+)")


def served_versions(
    facts: PythonFacts, installer: str, index_url: str | None, timeout_s: float = 300.0
) -> list[str] | None:
    """The torch versions ``index_url`` (None: PyPI) serves this interpreter, with pip's own configured
    sources (``pip config list``: extra indexes, find-links); [] when none; None when it cannot be asked
    (no pip: uv has no such query)."""
    if installer != "pip" or facts.pip is None:
        return None
    argv = [facts.executable, "-m", "pip", "index", "versions", "torch"]
    if index_url:
        argv += ["--index-url", index_url]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=_quiet_env())
    except subprocess.TimeoutExpired:
        raise EngineUnavailable(
            f"asking {index_url or PYPI_SIMPLE} for torch's versions took over {timeout_s:.0f} s",
            hint="check the network or proxy, or pass --index-url with a reachable mirror",
        ) from None
    m = _AVAILABLE.search(r.stdout)
    if not m:
        return []
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


def _quiet_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return env


@dataclass(frozen=True)
class Ran:
    returncode: int
    tail: str  # the installer's last lines (stdout and stderr)


def run_installer(argv: Sequence[str], timeout_s: float = 3600.0) -> Ran:
    """The installer, its progress going to our stderr as it comes (the data on stdout stays ours)."""
    try:
        proc = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_quiet_env()
        )
    except OSError as err:
        raise EngineUnavailable(
            f"cannot run {argv[0]}: {err.strerror or err}", hint="check the installer"
        ) from None
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        lines.append(line.rstrip("\n"))
        del lines[:-40]
    proc.wait(timeout=timeout_s)
    return Ran(proc.returncode, "\n".join(lines))


@dataclass(frozen=True)
class Verified:
    ok: bool
    version: str | None
    cuda: str | None
    device: str | None
    error: str | None
    what: str  # what was run


def verify(python: str, cuda: bool, timeout_s: float = 300.0) -> Verified:
    """Import torch in ``python`` and run a kernel: on the GPU for a CUDA build, on the CPU otherwise."""
    what = 'torch.ones(1, device="cuda").add_(1)' if cuda else "torch.ones(2).add(1).sum()"
    try:
        r = subprocess.run(
            [python, "-c", _VERIFY, "cuda" if cuda else "cpu"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return Verified(False, None, None, None, f"import torch and {what} took over {timeout_s:.0f} s", what)
    try:
        d = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return Verified(False, None, None, None, last[:500], what)
    return Verified(bool(d.get("ok")), d.get("version"), d.get("cuda"), d.get("device"), d.get("error"), what)
