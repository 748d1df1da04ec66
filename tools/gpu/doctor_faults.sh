#!/usr/bin/env bash
# The doctor fault campaign in one call on the GPU machine: each fault made for real, `torchrig doctor --json`
# run under it, its verdict recorded, the fault undone (tools/gpu/doctor_faults.py), then doctor's wall time
# on the healthy machine, and the GPU tests of the environment checks and of the uvm node
# (tests/gpu/test_doctor_env_gpu.py, tests/gpu/test_doctor_uvm_gpu.py).
#
#   OUT=/tmp/out bash tools/gpu/doctor_faults.sh      # as root, from anywhere; results under $OUT
#   DOCTOR_FAULTS=nccl-socket-ifname-missing,alloc-conf-malformed bash tools/gpu/doctor_faults.sh   # a subset
#
# Writes $OUT/results.md (the table for docs/results/doctor-faults.md), $OUT/doctor-faults.tar.gz (facts and
# report of every fault), $OUT/healthy-wall.txt (5 runs of doctor on the healthy machine, seconds) and
# $OUT/test_doctor_env_gpu.txt and $OUT/test_doctor_uvm_gpu.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-$(command -v python3 || command -v python)}
OUT=${OUT:-/tmp/torchrig-out}
mkdir -p "$OUT"
rc=0

: > "$OUT/healthy-wall.txt"
for i in 1 2 3 4 5; do
    t0=$(date +%s%N)
    "$PY" -m torchrig doctor --json > "$OUT/healthy-$i.json" 2> "$OUT/healthy-$i.err"
    code=$?
    t1=$(date +%s%N)
    echo "run $i: exit $code, $(( (t1 - t0) / 1000000 )) ms" | tee -a "$OUT/healthy-wall.txt"
done
"$PY" - "$OUT/healthy-1.json" <<'PY' >> "$OUT/healthy-wall.txt" 2>&1
import json, sys
r = json.load(open(sys.argv[1]))
t = r["facts"]["torch"]
print("torch steps (ms):", t.get("steps_ms"), "probe_ms:", r["facts"].get("probe_ms"))
print("nccl:", json.dumps(t.get("nccl")))
print("problems:", [f["id"] for f in r["findings"] if f["severity"] in ("error", "warning")])
PY

OUT="$OUT" "$PY" tools/gpu/doctor_faults.py || rc=1
"$PY" -m pytest -q -s -p no:randomly tests/gpu/test_doctor_env_gpu.py > "$OUT/test_doctor_env_gpu.txt" 2>&1 || rc=1
tail -5 "$OUT/test_doctor_env_gpu.txt"
"$PY" -m pytest -q -s -p no:randomly tests/gpu/test_doctor_uvm_gpu.py > "$OUT/test_doctor_uvm_gpu.txt" 2>&1 || rc=1
tail -5 "$OUT/test_doctor_uvm_gpu.txt"
cat "$OUT/healthy-wall.txt"
exit $rc
