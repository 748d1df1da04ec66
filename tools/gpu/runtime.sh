#!/usr/bin/env bash
# Environments area on the GPU machine: record this host's GPU inventory through torchrig's NVML adapter,
# check it field by field against nvidia-smi, and show the board and a pre-flight from the real record.
# Run from the repository root with PYTHONPATH=src; results under $OUT/runtime/.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-/tmp/out}/runtime"
mkdir -p "$out"
export TORCHRIG_STATE_DIR="$out/state"
py=python3

echo "== nvidia-smi"
nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,utilization.gpu,compute_cap,driver_version,mig.mode.current \
  --format=csv,noheader,nounits | tee "$out/nvidia-smi.csv"
nvidia-smi topo -m >"$out/topo.txt" 2>&1

echo "== torchrig gpus --record (NVML through torchrig.hw.nvml, as torchrig.hw.gpus records it)"
$py -m torchrig gpus --record "$out/inventory-recorded.json"; rc_record=$?
cat "$out/inventory-recorded.json" 2>/dev/null | head -40

echo "== adapter vs nvidia-smi"
$py - "$out" <<'PY' | tee "$out/compare.txt"
import csv, json, sys
out = sys.argv[1]
inv = json.load(open(f"{out}/inventory-recorded.json"))["nvml"]  # a recording: NVML's facts in "nvml"
rows = list(csv.reader(open(f"{out}/nvidia-smi.csv")))
bad = 0
for row, g in zip(rows, inv["gpus"]):
    row = [c.strip() for c in row]
    want = {"index": int(row[0]), "uuid": row[1], "name": row[2], "pci_bus_id": row[3],
            "memory_total_mib": int(row[4]), "compute_capability": row[7]}
    for k, v in want.items():
        got = g.get(k)
        ok = (str(got).lower() == str(v).lower())
        bad += not ok
        print(f"{'ok  ' if ok else 'DIFF'} gpu{row[0]} {k}: nvml={got!r} nvidia-smi={v!r}")
    print(f"     gpu{row[0]} numa_node={g.get('numa_node')} nvlink_domain={g.get('nvlink_domain')} mig={g.get('mig_mode')}")
print(f"driver: nvml={inv['driver_version']} nvidia-smi={rows[0][8].strip() if rows else None}; cuda={inv['cuda_driver_version']}")
print("RESULT", "match" if bad == 0 and len(rows) == len(inv["gpus"]) else f"{bad} differences")
PY

echo "== board from NVML (live) and from the record"
$py -m torchrig gpus | tee "$out/board-live.txt"
$py -m torchrig gpus --inventory "$out/inventory-recorded.json" --json >"$out/board-recorded.json"

echo "== pre-flight on the recorded host: a cu130 build (driver 580 -> runs) and a CUDA newer than the driver"
$py - "$out" <<'PY' | tee "$out/preflight.txt"
import sys
from torchrig.runtime.inventory import load_snapshot
from torchrig.compat.kb import load_kb
from torchrig.runtime.preflight import preflight
inv = load_snapshot(f"{sys.argv[1]}/inventory-recorded.json")
units = inv.units()[:1]
for cuda, archs in (("13.0", "sm_90 sm_100 sm_120"), ("12.8", "sm_80 sm_86")):
    pf = preflight({"org.torchrig.torch": "x", "org.torchrig.cuda": cuda, "org.torchrig.arch-list": archs}, inv, units, load_kb)
    print(f"cuda {cuda} archs [{archs}]: ok={pf.ok}; " + "; ".join(f"{f.id}: {f.summary}" for f in pf.findings))
PY

if docker info >/dev/null 2>&1; then
  echo "== docker present: plan for one GPU (dry run)"
  $py -m torchrig up --image "${TORCHRIG_GPU_IMAGE:-ubuntu:22.04}" --gpus 1 --no-ssh --dry-run 2>&1 | tee "$out/up-dry-run.txt"
else
  echo "== no Docker engine here: container start not exercised" | tee "$out/up-dry-run.txt"
fi
echo "== summary: record rc=$rc_record; $(tail -n 1 "$out/compare.txt" 2>/dev/null)"
