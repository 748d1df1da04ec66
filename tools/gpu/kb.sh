#!/usr/bin/env bash
# Knowledge base on the GPU machine: check gpus.toml / cuda.toml / drivers.toml against the real GPUs, driver
# and torch build (NVML name resolves to one row, compute capability, memory, driver branch and its CUDA
# version, torch's toolkit floor and targets). Results: $OUT/kb/hardware.json. Needs no network.
# Usage (repository root): OUT=/tmp/out bash tools/gpu/kb.sh
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "${OUT:-/tmp}/kb"
python3 tools/gpu/kb_hardware_check.py
