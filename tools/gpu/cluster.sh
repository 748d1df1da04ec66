#!/usr/bin/env bash
# Cluster renders on the GPU machine (2 GPUs): the node command of a rendered sbatch script
# (`torchrig cluster slurm --nodes 2 --gpus-per-node 1`) run as two "nodes" of one GPU each with NCCL,
# against a one-node `torchrig launch --gpus 2` run of the same training; losses compared step by step.
# Results: $OUT/cluster/two-node.json, job.sbatch, node0.log, node1.log, one-node.log.
# Usage (repository root): OUT=/some/dir tools/gpu/cluster.sh      (STEPS=60 by default)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "${OUT:-/tmp/gpu-out}/cluster"
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if [ "$NGPU" -lt 2 ]; then
  echo "cluster: needs 2 GPUs, found $NGPU" | tee "${OUT:-/tmp/gpu-out}/cluster/skipped.txt"
  exit 0
fi
timeout --kill-after=10 900 python3 tools/gpu/cluster_two_node.py
rc=$?
echo "cluster: two-node render run rc=$rc"
exit $rc
