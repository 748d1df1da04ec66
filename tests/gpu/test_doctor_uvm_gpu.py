"""doctor on a real GPU whose /dev/nvidia-uvm is gone or wrong, made for real inside doctor's own mount namespace
(``unshare -m``, as root): nothing outside it changes, so other GPU work on the machine goes on.

* missing: /dev replaced by a tmpfs holding every entry of the real /dev but the uvm nodes, as a container
  started without ``--device /dev/nvidia-uvm``;
* another device: /dev/null bound over /dev/nvidia-uvm, as a node made with the wrong major number (a CDI spec
  written with a fixed one).

In both, ``/bin/false`` is bound over ``nvidia-modprobe`` (which CUDA's first use runs to recreate the node),
as in a container without it. doctor must name ``driver.uvm_node_missing``.

    sudo python3 -m pytest -q -s tests/gpu/test_doctor_uvm_gpu.py
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuenv import SAFE, cuda_in_child  # tests/gpuenv.py

ROOT = Path(__file__).resolve().parents[2]
MODPROBE = ("/usr/bin/nvidia-modprobe", "/usr/sbin/nvidia-modprobe", "/bin/nvidia-modprobe")
UVM = "/dev/nvidia-uvm"


def _namespaces() -> bool:
    return (
        os.geteuid() == 0
        and shutil.which("unshare") is not None
        and (subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0)
    )


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.path.exists(UVM), reason="no /dev/nvidia-uvm here"),
    pytest.mark.skipif(not _namespaces(), reason="needs root and mount namespaces (unshare -m)"),
    pytest.mark.skipif(not cuda_in_child(), reason="needs CUDA"),
]


def _no_modprobe() -> str:
    tools = sorted({os.path.realpath(p) for p in MODPROBE if os.path.exists(p)})
    return "".join(f"mount --bind /bin/false {shlex.quote(t)}; " for t in tools)


# /dev rebuilt on a tmpfs from a bind of the real one ($ORIG_DEV), leaving out the uvm nodes (a container's /dev)
WITHOUT_UVM = """set -e
orig=$ORIG_DEV
mount --rbind /dev "$orig"
mount -t tmpfs -o mode=755 tmpfs /dev
for e in "$orig"/* "$orig"/.[!.]*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  n=$(basename "$e")
  case "$n" in nvidia-uvm|nvidia-uvm-tools) continue ;; esac
  if [ -L "$e" ]; then cp -P "$e" "/dev/$n"
  elif [ -d "$e" ]; then mkdir "/dev/$n"; mount --rbind "$e" "/dev/$n"
  else : > "/dev/$n"; mount --bind "$e" "/dev/$n"
  fi
done
"""


def doctor_in_namespace(setup: str, tmp_path: Path) -> tuple[int, dict]:
    (tmp_path / "dev").mkdir()  # where the real /dev stays reachable inside the namespace
    env = {**os.environ, **SAFE, "PYTHONPATH": str(ROOT / "src"), "ORIG_DEV": str(tmp_path / "dev")}
    script = setup + _no_modprobe() + 'exec "$@"'
    argv = ["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m", "torchrig", "doctor", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=400)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def _named(report: dict) -> dict:
    found = [f for f in report["findings"] if f["id"] == "driver.uvm_node_missing"]
    t = report["facts"]["torch"]
    print(f"torch: available={t.get('is_available')} init_error={t.get('init_error')!r}")
    print("findings:", [(f["id"], f["severity"]) for f in report["findings"] if f["severity"] != "ok"])
    assert found, [f["id"] for f in report["findings"]]
    return found[0]


def test_a_missing_uvm_node_is_named(tmp_path):
    code, report = doctor_in_namespace(WITHOUT_UVM, tmp_path)
    finding = _named(report)
    assert code == 1 and "missing" in finding["summary"]
    assert UVM not in [n["path"] for n in report["facts"]["kernel"]["device_nodes"]]
    if finding["severity"] == "error":  # CUDA could not start: the host's fix and its source are given
        assert any("nvidia-modprobe -u -c=0" in step for step in finding["fix"])
        assert any("source:" in step for step in finding["fix"])


def test_a_uvm_node_of_another_device_is_named(tmp_path):
    code, report = doctor_in_namespace(f"mount --bind /dev/null {UVM}; ", tmp_path)
    finding = _named(report)
    assert code == 1 and "another device (1:3)" in finding["summary"], finding
