#!/usr/bin/env bash
# images area on the GPU machine (1 GPU): the facts an image's labels record (CUDA, arch list, cuDNN, NCCL,
# minimum driver) against what the installed torch reports on the real GPU, and the image the spec
# "this GPU, this driver" resolves to. No Docker or network needed. Results under $OUT/images/.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR="${OUT:-/tmp/out}/images"
mkdir -p "$OUT_DIR"
python3 tools/gpu/images_check.py "$OUT_DIR"
sed -n 1,3p "$OUT_DIR/Dockerfile"
