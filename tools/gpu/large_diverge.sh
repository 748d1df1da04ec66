#!/usr/bin/env bash
# One GPU: why GPT-2 large diverges under `torchrig train --precision bf16 --compile` (loss 11 -> 27-31 in
# 30 steps) while medium, and large with --precision fp8, train. Each variant changes one thing from the
# finding's command and prints its loss and gradient norm at every step (step 1's loss is the model at
# init: about 11.08 for large). Variants (VARIANTS, in this order by default):
#   ref     the finding's command (compiled, CUDA graphs, fused loss)
#   nomix   TORCHINDUCTOR_MIX_ORDER_REDUCTION=0: Inductor's fused row/column reductions (LayerNorm backward)
#           off; it has had silent wrong-gradient bugs (https://github.com/pytorch/pytorch/issues/193061)
#   eager   --no-compile (no Inductor, no CUDA graphs)
#   nocg    --compile-mode default (Inductor without CUDA graphs)
#   plain   --loss plain (the head's F.cross_entropy instead of the fused loss)
#   scaled  GPT-2's residual scaling at init (std 0.02/sqrt(2*layers) for proj and out), through
#           tools/gpu/large_diverge_scaled.py
#   fp32    --precision fp32 (TF32 matmuls, compiled): bf16 numerics against the rest of the path
# Usage (repository root): OUT=/some/dir bash tools/gpu/large_diverge.sh   (about 90 s a variant: two calls
#   of 10 minutes, VARIANTS="ref nomix eager nocg" then VARIANTS="plain scaled fp32")
#   VARIANTS="ref nomix" to run fewer; STEPS (30); SIZE (large); MICRO_BATCH (16); EXTRA: more options
#   (a CPU smoke run: SIZE=tiny EXTRA="--device cpu --no-compile" VARIANTS="eager scaled")
# tools/gpu/large_grads.py compares the first step's gradients, eager against compiled, parameter by parameter.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/build/inductor-cache}"  # shared with train_levers.sh
R="${OUT:-/tmp/gpu-out}/large_diverge"
W="${WORK:-/tmp/large_diverge}"
mkdir -p "$R" "$W"
STEPS="${STEPS:-30}" SIZE="${SIZE:-large}" MB="${MICRO_BATCH:-16}"
echo "large_diverge: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)," \
  "$(python3 -c 'import torch; print("torch", torch.__version__)'), $(date -u +%FT%TZ)" | tee "$R/summary.txt"
COMMON=(train --model gpt --size "$SIZE" --data generated --precision bf16 --warmup-steps 5
  --micro-batch "$MB" --steps "$STEPS" --clip-grad 1.0 --log-every 1 --no-ckpt-final --no-tensorboard
  --no-preflight --overwrite)
for v in ${VARIANTS:-ref nomix eager nocg plain scaled fp32}; do
  env=() opts=(--compile) entry=(python3 -m torchrig)
  case "$v" in
    ref) ;;
    nomix) env=(TORCHINDUCTOR_MIX_ORDER_REDUCTION=0) ;;
    eager) opts=(--no-compile) ;;
    nocg) opts=(--compile --compile-mode default) ;;
    plain) opts=(--compile --loss plain) ;;
    scaled) entry=(python3 tools/gpu/large_diverge_scaled.py) ;;
    fp32) opts=(--compile --precision fp32) ;;
    *) echo "large_diverge: unknown variant $v"; continue ;;
  esac
  t0=$(date +%s)
  env "${env[@]}" timeout 280 "${entry[@]}" "${COMMON[@]}" "${opts[@]}" ${EXTRA:-} --out "$W/$v" >"$R/$v.log" 2>&1
  rc=$?
  python3 - "$v" "$rc" "$(( $(date +%s) - t0 ))" "$W/$v/metrics.jsonl" <<'PY' | tee -a "$R/summary.txt"
import json, sys
v, rc, wall, path = sys.argv[1:]
try:
    rows = [json.loads(x) for x in open(path)]
except OSError:
    rows = []
steps = [r for r in rows if r.get("loss") is not None and "event" not in r]
loss = [r["loss"] for r in steps]
means = [sum(loss[i:i + 5]) / len(loss[i:i + 5]) for i in range(0, len(loss), 5)]
print(f"{v}: rc={rc} {wall}s  mean loss per 5 steps: " + " ".join(f"{m:.2f}" for m in means))
print("   loss: " + " ".join(f"{x:.2f}" for x in loss))
print("   grad_norm: " + " ".join(f"{r.get('grad_norm') or 0:.2f}" for r in steps))
PY
done
