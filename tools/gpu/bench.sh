#!/usr/bin/env bash
# torchrig bench on the GPU machine, side by side with the plain-PyTorch anchor in the same call.
#
# Runs, in order, each bounded by what is left of BENCH_BUDGET_S (default 400 s, inside tools/gpu/all.sh's 420 s):
#   1. the anchor alone (GEMM, device copy, host<->device)       .baselines/anchor_probe.py
#   2. the anchor under torchrun, 2 processes (when >= 2 GPUs)     all_reduce / all_gather busbw
#   3. torchrig bench (full), every GPU                          -> bench.json, bench.md, bench.png
#   4. torchrig bench --quick, timed
#   5. the bench GPU tests                                        tests/gpu/test_bench_*.py
#   6. tools/gpu/bench_probe.py: plain-PyTorch diagnostics (tf32 GEMM idle vs. right after a long fp32 run;
#      pageable h2d of a never-written vs. a written buffer; the host's one-thread memcpy), ~15 s
# then writes $OUT/bench/bench-<N>gpu.{json,md,png} (everything; the report; the plots) and
# bench-<N>gpu-full.json (torchrig's own bench.json: 'torchrig bench --from-json' re-renders it, plots too)
# and prints the comparison table last.
# Usage (repository root, .baselines/ holding the anchors): OUT=/tmp/out bash tools/gpu/bench.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DEST="${OUT:-/tmp/out}/bench"
WORK=$(mktemp -d /tmp/torchrig-bench.XXXXXX)
ANCHOR=${ANCHOR:-.baselines/anchor_probe.py}
BUDGET=${BENCH_BUDGET_S:-400}
START=$(date +%s)
mkdir -p "$DEST"
NGPU=$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
PLOTS=""
$PY -c 'import matplotlib' 2>/dev/null || PLOTS="--no-plots"  # then render the PNG later: --from-json
echo "bench.sh: $NGPU GPU(s), budget ${BUDGET}s, work $WORK${PLOTS:+ (no matplotlib: $PLOTS)}"

# step NAME MAX_SECONDS STDOUT_FILE CMD...: run with a timeout of min(MAX, what the budget has left - 20 s)
step() {
  local name=$1 max=$2 out=$3; shift 3
  local left=$(( BUDGET - ($(date +%s) - START) - 20 ))
  local limit=$(( max < left ? max : left ))
  if (( limit < 15 )); then
    echo "bench.sh: skip $name (budget spent)"; printf '%s\t%s\t%s\t%s\n' "$name" 124 0 "$*" >>"$WORK/steps.tsv"; return
  fi
  echo "bench.sh: $name (limit ${limit}s): $*"
  local t0; t0=$(date +%s.%N)
  timeout --kill-after=5 "$limit" "$@" >"$out" 2>"$WORK/$name.err"
  local rc=$?
  local secs; secs=$($PY -c "print(round($(date +%s.%N) - $t0, 1))")
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$*" >>"$WORK/steps.tsv"
  echo "bench.sh: $name rc=$rc ${secs}s"
  (( rc == 0 )) || tail -n 5 "$WORK/$name.err"
}

if [ -f "$ANCHOR" ]; then
  step anchor_single 150 "$WORK/anchor_single.out" $PY "$ANCHOR"
  if (( NGPU >= 2 )); then
    step anchor_coll 150 "$WORK/anchor_coll.out" $PY -m torch.distributed.run --standalone --nproc-per-node 2 "$ANCHOR"
  fi
else
  echo "bench.sh: no $ANCHOR: copy /work/shared/baselines to .baselines/ for the side-by-side"
fi
step probe 60 "$WORK/probe.out" $PY tools/gpu/bench_probe.py
step full 300 "$WORK/full.json" $PY -m torchrig bench --out "$WORK/full" --json $PLOTS
step quick 120 "$WORK/quick.json" $PY -m torchrig bench --quick --no-plots --json
step tests 150 "$WORK/tests.txt" $PY -m pytest -q -p no:cacheprovider tests/gpu -k bench
tail -n 3 "$WORK/tests.txt"
$PY tools/gpu/bench_compare.py --work "$WORK" --dest "$DEST" --ngpu "$NGPU"
echo "bench.sh: wrote $(ls "$DEST" | tr "\n" " ")"
