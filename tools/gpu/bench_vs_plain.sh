#!/usr/bin/env bash
# torchrig bench against plain PyTorch and against torchrig train, in one call on the GPU machine.
#   1. tools/gpu/gemm_plain.py: bench's GEMM (bf16, fp8) vs. a plain matmul / torch._scaled_mm   -> gemm.json
#   2. torchrig bench --only scaling on one GPU (it runs torchrig train itself)                  -> bench.json
#   3. torchrig train with the same options, run directly                                        -> train.json
# Usage (repository root): OUT=/tmp/out bash tools/gpu/bench_vs_plain.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DEST=${OUT:-/tmp/out}
mkdir -p "$DEST"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee "$DEST/gpu.csv"
echo "== gemm: $PY tools/gpu/gemm_plain.py"
timeout 150 $PY tools/gpu/gemm_plain.py >"$DEST/gemm.json" || echo "gemm_plain failed: $?"
cat "$DEST/gemm.json"
echo "== bench scaling: torchrig bench --only scaling --nproc-per-node 1 --json"
( time timeout 240 $PY -m torchrig bench --only scaling --nproc-per-node 1 --json >"$DEST/bench.json" ) 2>&1 | tail -n 5
OPTS=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["measurements"]["meta"]["scaling_model"])' "$DEST/bench.json" 2>/dev/null | sed 's/^torchrig train //')
echo "== train: torchrig train $OPTS --gpus 0"
rm -rf /tmp/tr-direct
( time timeout 240 $PY -m torchrig train $OPTS --gpus 0 --out /tmp/tr-direct >"$DEST/train.log" 2>&1 ) 2>&1 | tail -n 3
cp /tmp/tr-direct/summary.json "$DEST/train.json" 2>/dev/null
$PY - "$DEST" <<'PY'
import json, sys
d = sys.argv[1]
b = json.load(open(f"{d}/bench.json"))["measurements"]["scaling"][0]["tokens_per_s"]
t = json.load(open(f"{d}/train.json"))["tokens_per_s"]
print(f"bench scaling 1 GPU {b:,.0f} tokens/s; torchrig train {t:,.0f}; bench/train {b / t:.3f}")
PY
