"""Check the hardware knowledge base (gpus.toml, cuda.toml, drivers.toml) against the GPUs of this machine.

Run on the GPU machine from the repository root (``PYTHONPATH=src``); writes ``$OUT/kb/hardware.json`` and
prints one line per finding. Exit status 1 when a fact in the data files disagrees with the hardware:

* the NVML name resolves to exactly one ``[[gpu]]`` row;
* that row's compute capability is what NVML and torch report;
* its ``memory_gb`` is within 10% of what NVML reports;
* the driver's branch is listed and nvidia-smi's "CUDA Version" is the branch's ``max_cuda`` (or ``reports_cuda``);
* torch's CUDA toolkit is listed, its driver floor is met, and its nvcc can build for this compute capability.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from torchrig.data import load

PREFIXES = ("nvidia ", "geforce ", "tesla ", "quadro ")


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def _keys(name: str) -> set[str]:
    text = " ".join(name.replace("_", " ").replace("-", " ").split())
    keys = {_norm(text)}
    while text.lower().startswith(PREFIXES):
        text = text.split(" ", 1)[1]
        keys.add(_norm(text))
    return keys


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _resolve(name: str) -> list[dict[str, Any]]:
    wanted = _keys(name)
    hits = []
    for gpu in load("gpus")["gpu"]:
        spellings = [gpu["id"], gpu["name"], *gpu["aliases"]]
        if any(wanted & _keys(s) for s in spellings):
            hits.append(gpu)
    return hits


def _smi() -> tuple[list[dict[str, str]], str]:
    fields = "index,name,driver_version,memory.total,compute_cap"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    rows = [
        dict(zip(fields.split(","), (c.strip() for c in line.split(",")), strict=True))
        for line in out.splitlines()
    ]
    banner = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=True, timeout=60).stdout
    match = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    return rows, match.group(1) if match else ""


def _check_gpu(row: dict[str, str], smi_cuda: str, problems: list[str]) -> dict[str, Any]:
    name = row["name"]
    hits = _resolve(name)
    result: dict[str, Any] = {"nvml": row, "kb_ids": [h["id"] for h in hits]}
    if len(hits) != 1:
        problems.append(f"GPU {row['index']}: {name!r} resolves to {len(hits)} rows {result['kb_ids']}")
        return result
    gpu = hits[0]
    if gpu["compute_capability"] != row["compute_cap"]:
        problems.append(
            f"{gpu['id']}: compute capability {gpu['compute_capability']} != NVML {row['compute_cap']}"
        )
    memory_gb = float(row["memory.total"]) * 1024**2 / 1e9
    result["memory_gb_nvml"] = round(memory_gb, 1)
    if abs(memory_gb - gpu["memory_gb"]) > 0.1 * gpu["memory_gb"]:
        problems.append(f"{gpu['id']}: memory_gb {gpu['memory_gb']} vs NVML {memory_gb:.1f} GB")
    branch = row["driver_version"].split(".")[0]
    rows = {b["branch"]: b for b in load("drivers")["branch"]}
    if branch not in rows:
        problems.append(f"driver {row['driver_version']}: branch {branch} not in drivers.toml")
    else:
        expected = {rows[branch]["max_cuda"], rows[branch].get("reports_cuda")}
        result["branch"] = rows[branch]
        if smi_cuda not in expected:
            problems.append(
                f"branch {branch}: nvidia-smi says CUDA {smi_cuda}, drivers.toml {sorted(expected - {None})}"
            )
    return result


def _check_torch(driver: str, problems: list[str]) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch": None}
    cuda = torch.version.cuda or ""
    if not cuda:
        return {"torch": torch.__version__, "cuda": None}
    major_minor = ".".join(cuda.split(".")[:2])
    toolkits = {t["version"]: t for t in load("cuda")["toolkit"]}
    found: dict[str, Any] = {"torch": torch.__version__, "cuda": cuda, "devices": []}
    toolkit = toolkits.get(major_minor)
    if toolkit is None:
        problems.append(f"torch's CUDA {cuda} is not in cuda.toml")
    elif _version(driver) < _version(toolkit["min_driver_minor_compat"]):
        problems.append(
            f"driver {driver} is below CUDA {major_minor}'s floor {toolkit['min_driver_minor_compat']}"
        )
    for index in range(torch.cuda.device_count()):
        name = torch.cuda.get_device_name(index)
        cc = "{}.{}".format(*torch.cuda.get_device_capability(index))
        found["devices"].append({"name": name, "cc": cc})
        hits = _resolve(name)
        if len(hits) == 1 and hits[0]["compute_capability"] != cc:
            problems.append(f"{hits[0]['id']}: torch reports compute capability {cc}")
        if toolkit is not None and cc not in toolkit["compute_capabilities"]:
            problems.append(f"CUDA {major_minor} in cuda.toml cannot build for {name} ({cc})")
    return found


def main() -> int:
    out_dir = Path(os.environ.get("OUT", "/tmp")) / "kb"
    out_dir.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    rows, smi_cuda = _smi()
    report: dict[str, Any] = {
        "nvidia_smi_cuda": smi_cuda,
        "gpus": [_check_gpu(r, smi_cuda, problems) for r in rows],
    }
    if rows:
        report["torch"] = _check_torch(rows[0]["driver_version"], problems)
    report["problems"] = problems
    (out_dir / "hardware.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for gpu in report["gpus"]:
        print(f"kb: {gpu['nvml']['name']!r} -> {gpu['kb_ids']} (driver {gpu['nvml']['driver_version']})")
    for problem in problems:
        print(f"kb: MISMATCH {problem}")
    print(
        f"kb: {len(rows)} GPU(s) checked, {len(problems)} mismatch(es); details in {out_dir / 'hardware.json'}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
