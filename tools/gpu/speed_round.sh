#!/usr/bin/env bash
# One device call of the training-speed work (GPT-2 small, one GPU), fitted into the call's limit:
#   0. the GPU tests named in TESTS, if any (with torchao from .whl/ where its wheel was carried);
#   1. where Nsight Compute can read the counters (not under gVisor: docs/results/training-speed.md), the
#      default's step against the card's bandwidth (tools/gpu/step_roofline.sh);
#   2. the GELU and bias-gradient epilogues and the Triton GELU backward against the compiled kernels
#      (tools/gpu/lt_epilogue_bench.py 16 64);
#   3. the fused loss's row kernel by each autotuning choice (tools/gpu/loss_bench.py 16 64);
#   3b. with GEMMS=1, each GEMM of the step by every cuBLASLt algorithm against PyTorch's (tools/gpu/gemm_algos.py);
#   3c. with FLOOR=1, the step's GEMMs and attention alone in CUDA graphs at the power limit (tools/gpu/step_floor.py);
#   4. the timed runs, alternating (tools/gpu/train_levers.sh), with the time that is left.
# Usage (repository root, the baseline carried as .baselines/gpt_ddp.py):
#   OUT=/some/dir bash tools/gpu/speed_round.sh
# Settings:
#   LIMIT_S (570): the whole call;
#   TESTS (""): pytest paths for part 0; TESTS_S (300): its time limit;
#   ROOFLINE (auto): 1 to run part 1, 0 not to, auto where the card is an H100 (Firecracker machines, where
#     ncu reads counters); ROOFLINE_S (380): its time limit (the compile and ncu's replay of ~1,000 kernels);
#   EPILOGUES (1): 0 skips part 2, EPILOGUE_MBS ("16 64") its micro-batches; LOSS (1): 0 skips part 3;
#     GEMMS (0): 1 runs part 3b at the micro-batches GEMM_MBS ("16 64"); FLOOR (0): 1 runs part 3c at the
#     micro-batches FLOOR_MBS ("16"), SECONDS_EACH (8) a graph;
#   RUNS: train_levers' runs (default: the baseline, the default, the default without the fused MLP and,
#     without a roofline, the Triton backward).
# Each part's output: $OUT/<part>.txt, and train_levers' own $OUT/train_levers/; at the end
# $OUT/inductor-code.tgz holds the Python modules Inductor wrote (its Triton kernels' source, by the names
# the profiles print).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/build/inductor-cache}"
out="${OUT:-/tmp/gpu-out}"
mkdir -p "$out"
start=$(date +%s) limit="${LIMIT_S:-570}"
left() { echo $((limit - ($(date +%s) - start))); }
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
echo "speed_round: $gpu, $(date -u +%FT%TZ)"
if [ -n "${TESTS:-}" ]; then
  site=""
  if compgen -G ".whl/*.whl" >/dev/null; then
    site=/tmp/speed-round-site
    python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl >"$out/tests.txt" 2>&1
  fi
  # shellcheck disable=SC2086  # TESTS is a list of paths
  PYTHONPATH="$PWD/src${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=10 "${TESTS_S:-300}" \
    python3 -m pytest -v -rs -p no:cacheprovider $TESTS >>"$out/tests.txt" 2>&1
  echo "== tests rc=$? at $(( $(date +%s) - start ))s"; grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$out/tests.txt" | tail -n 60
fi
roof="${ROOFLINE:-auto}"
[ "$roof" = auto ] && { case "$gpu" in *H100*) roof=1 ;; *) roof=0 ;; esac; }
if [ "$roof" = 1 ]; then
  timeout --kill-after=10 "${ROOFLINE_S:-380}" bash tools/gpu/step_roofline.sh >"$out/roofline.txt" 2>&1
  echo "== roofline rc=$? at $(( $(date +%s) - start ))s"; tail -n 45 "$out/roofline.txt"
fi
if [ "${EPILOGUES:-1}" = 1 ]; then
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=10 170 \
    python3 tools/gpu/lt_epilogue_bench.py ${EPILOGUE_MBS:-16 64} >"$out/epilogues.txt" 2>&1
  echo "== epilogues rc=$? at $(( $(date +%s) - start ))s"; tail -c 3000 "$out/epilogues.txt"; echo
fi
if [ "${LOSS:-1}" = 1 ]; then
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=10 90 \
    python3 tools/gpu/loss_bench.py 16 64 >"$out/loss.txt" 2>&1
  echo "== loss rc=$? at $(( $(date +%s) - start ))s"; tail -n 14 "$out/loss.txt"
fi
if [ "${GEMMS:-0}" = 1 ]; then
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=10 "${GEMMS_S:-150}" \
    python3 tools/gpu/gemm_algos.py ${GEMM_MBS:-16 64} >"$out/gemms.txt" 2>&1
  echo "== gemms rc=$? at $(( $(date +%s) - start ))s"
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    r = json.loads(l); r.pop("by_algo", None); print(json.dumps(r))' "$out/gemms.txt" | tail -n 30
fi
if [ "${FLOOR:-0}" = 1 ]; then
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=10 "${FLOOR_S:-120}" \
    python3 tools/gpu/step_floor.py ${FLOOR_MBS:-16} >"$out/floor.txt" 2>&1
  echo "== floor rc=$? at $(( $(date +%s) - start ))s"; tail -n 12 "$out/floor.txt"
fi
rem=$(left)
[ "$roof" = 1 ] && runs="base cg nofmlp base cg nofmlp" || runs="base cg nofmlp fmlpt base cg nofmlp fmlpt"
export RUNS="${RUNS:-$runs}" BUDGET_S=$((rem - 75)) DEADLINE_S=$((rem - 25))
echo "== levers: RUNS=\"$RUNS\" BUDGET_S=$BUDGET_S DEADLINE_S=$DEADLINE_S"
bash tools/gpu/train_levers.sh >"$out/levers.txt" 2>&1
echo "== levers rc=$? at $(( $(date +%s) - start ))s"; tail -c 5000 "$out/levers.txt"
find "$TORCHINDUCTOR_CACHE_DIR" -name '*.py' -size -4M -print0 2>/dev/null |
  tar czf "$out/inductor-code.tgz" --null -T - 2>/dev/null
echo "== inductor code: $(du -h "$out/inductor-code.tgz" 2>/dev/null | cut -f1)"
