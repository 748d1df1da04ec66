#!/usr/bin/env bash
# Each kernel of one training step against the GPU's memory bandwidth (Nsight Compute's counters), for the
# trainer's default run (GPT-2 small, bf16, compiled, micro-batch 16 unless MICRO_BATCH says otherwise).
# `--profiler cuda` opens cudaProfilerStart/Stop around the last --profile-steps, and `ncu
# --profile-from-start off` measures only those: no compile, no warm-up. Then tools/gpu/ncu_roofline.py.
# Usage (repository root, on the GPU machine): OUT=/some/dir bash tools/gpu/step_roofline.sh
#   MICRO_BATCH (16), STEPS (12: the run), PROF_STEPS (1: the steps measured), EXTRA ("": more train options,
#   e.g. "--step-graph on"), KERNELS ("": every kernel; a regular expression such as "triton|_ce_rows|multi_tensor"
#   measures only the kernels it matches, fewer replays). Writes $OUT/step_roofline/{ncu.csv,roofline.txt,
#   roofline.json,train.log} and inductor-code.tgz: the Python modules Inductor wrote for this run (its
#   Triton kernels' source, by the names the roofline prints), where the cache held nothing before.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/build/inductor-cache}"
out="${OUT:-/tmp/gpu-out}/step_roofline"
mkdir -p "$out" "$TORCHINDUCTOR_CACHE_DIR"
mb="${MICRO_BATCH:-16}" steps="${STEPS:-12}" prof="${PROF_STEPS:-1}"
command -v ncu >/dev/null || { echo "step_roofline: no ncu (Nsight Compute) on PATH" >&2; exit 1; }
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
echo "step_roofline: $gpu, $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)," \
  "$(ncu --version | tail -n 1), torch $(python3 -c 'import torch; print(torch.__version__)'), $(date -u +%FT%TZ)"
# shellcheck disable=SC2086  # EXTRA is a list of options
filter=()
[ -n "${KERNELS:-}" ] && filter=(--kernel-name "regex:${KERNELS}")
ncu --profile-from-start off --clock-control none --print-units base --csv --log-file "$out/ncu.csv" "${filter[@]}" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed \
  python3 -m torchrig train --model gpt --size small --data generated --precision bf16 --compile \
  --micro-batch "$mb" --steps "$steps" --profile-steps "$prof" --profiler cuda --log-every 5 \
  --warmup-steps 5 --clip-grad 0 --no-ckpt-final --no-tensorboard --no-preflight \
  --out "$out/run" --overwrite ${EXTRA:-} >"$out/train.log" 2>&1 || {
  # ncu's own messages (a refused counter access: ERR_NVGPUCTRPERM) are in its --log-file
  tail -n 30 "$out/train.log"; grep -v '^"' "$out/ncu.csv" | tail -n 20; exit 1; }
tail -n 3 "$out/train.log"
python3 tools/gpu/ncu_roofline.py "$out/ncu.csv" --gpu "$gpu" --steps "$prof" | tee "$out/roofline.txt"
python3 tools/gpu/ncu_roofline.py "$out/ncu.csv" --gpu "$gpu" --steps "$prof" --json >"$out/roofline.json"
# the kernels' source, small enough to bring back (the compiled cubins stay behind)
find "$TORCHINDUCTOR_CACHE_DIR" -name '*.py' -size -4M -print0 2>/dev/null |
  tar czf "$out/inductor-code.tgz" --null -T - 2>/dev/null || true
