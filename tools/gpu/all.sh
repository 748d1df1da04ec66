#!/usr/bin/env bash
# Run every area's GPU script on the GPU machine in one call, and pack the results into one archive.
# Usage (repository root, on the GPU machine): AREAS="doctor bench train" tools/gpu/all.sh
# Each area script writes under $OUT/<area>/; only the archive and the summary log come back.
set -uo pipefail
# NVLink multicast stays off in every process (it can take a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
FINAL_OUT="${OUT:-/tmp/gpu-final}"
export OUT=/tmp/gpu-stage
rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL_OUT"
{
  date -u; nvidia-smi; nvidia-smi topo -m
  python3 -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.cuda.get_arch_list())'
} >"$OUT/machine.txt" 2>&1
head -n 3 "$OUT/machine.txt"
for area in ${AREAS:-doctor kb bench train}; do
  [ -f "tools/gpu/$area.sh" ] || { echo "=== $area: no script"; continue; }
  limit_var="LIMIT_${area^^}"; limit="${!limit_var:-420}"
  echo "=== $area (limit ${limit}s)"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" bash "tools/gpu/$area.sh" >"$OUT/$area.log" 2>&1
  rc=$?
  tail -n "${TAIL:-30}" "$OUT/$area.log"
  echo "=== $area rc=$rc in $(( $(date +%s) - start ))s"
done
tar -C "$OUT" -czf "$FINAL_OUT/results.tgz" .
ls -la "$FINAL_OUT"
