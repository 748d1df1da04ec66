#!/usr/bin/env bash
# One GPU, one call (under 9 minutes with compiles): the hand-written baseline (.baselines/gpt_ddp.py),
# `torchrig train`'s default and each speed lever, alternating, at micro-batch 16 and 64: tokens/s, MFU and
# the loss curve's largest difference from the default's. Tags and run items: tools/gpu/train_levers.py.
# Usage (repository root): OUT=/some/dir bash tools/gpu/train_levers.sh
#   RUNS="base cg w16 ..." the timed runs in order; PROFILE="cg w16+pdl" profiled runs at the end;
#   BUDGET_S (480): timed runs that would start later are skipped; WARM_UNITS (from the card's memory: 8
#   on an H200, 4 on an H100): compiles at once, in units of 16 GB of GPU memory (micro-batch 16: 1; 64: 2,
#   the baseline 3); DEADLINE_S (520): any run
#   still going then is stopped (a 540 s call keeps its last seconds for the summary).
# Inductor's cache goes to build/inductor-cache (ignored by git): a second call on the same warm machine
# finds it there; $OUT gets summary.txt, results.json and log.txt only.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/build/inductor-cache}"
mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
echo "train_levers: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader)," \
  "$(python3 -c 'import torch, torch._inductor.config as c; print("torch", torch.__version__, "inductor triton.enable_pdl:", hasattr(c.triton, "enable_pdl"))'), $(date -u +%FT%TZ)"
exec python3 tools/gpu/train_levers.py
