#!/usr/bin/env bash
# Knowledge base on the GPU machine: check gpus.toml / cuda.toml / drivers.toml against the real GPUs, driver
# and torch build (NVML name resolves to one row, compute capability, memory, driver branch and its CUDA
# version, torch's toolkit floor and targets). Results: $OUT/kb/hardware.json. Needs no network.
# Usage (repository root): OUT=/tmp/out bash tools/gpu/kb.sh
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "${OUT:-/tmp}/kb"
# torch.toml: the installed wheel's compiled arch list, CUDA, cuDNN and NCCL, next to its torch.toml row
# (written to $OUT/kb/torch-<version>.json; a difference is printed, not fatal).
python3 - <<'PY' || echo "kb: torch build facts could not be read"
import json, os, torch
from torchrig.data import load
ver, _, var = torch.__version__.partition("+")
got = {"torch": torch.__version__, "cuda": torch.version.cuda, "arch_list": torch.cuda.get_arch_list(),
       "cudnn": torch.backends.cudnn.version(), "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
rows = [v for r in load("torch")["release"] if r["version"] == ver
        for v in r["variant"] if v["name"] == (var or r["pypi_variant"])]
row = rows[0] if rows else {}
got["torch_toml"] = {k: row.get(k) for k in ("cuda", "arch_list", "ptx", "cudnn", "nccl")}
got["arch_list_matches"] = sorted(got["arch_list"]) == sorted(row.get("arch_list", []) + row.get("ptx", []))
with open(os.path.join(os.environ.get("OUT", "/tmp"), "kb", f"torch-{ver}.json"), "w") as f:
    json.dump(got, f, indent=2)
print(f"kb: torch {torch.__version__} arch list {got['arch_list']} "
      f"{'matches' if got['arch_list_matches'] else 'DIFFERS FROM'} torch.toml; cuDNN {got['cudnn']}, NCCL {got['nccl']}")
PY
python3 tools/gpu/kb_hardware_check.py
