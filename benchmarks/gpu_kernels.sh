#!/usr/bin/env bash
# GPU: the kernel corpus benchmark (issue 15) with the GPU's identity and the
# toolchain's, logs and JSON to $OUT (default ./gpu_kernels_out).
# Usage (on an H100/H200 with nvcc): bash benchmarks/gpu_kernels.sh [benchmarks/kernels_bench.py args]
#   e.g. bash benchmarks/gpu_kernels.sh --kinds gemm --search full --write-table "$OUT/sm90a_h200.json"
set -u
OUT=${OUT:-$PWD/gpu_kernels_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}   # e.g. PYTHON=.venv/bin/python after the README install
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -2; $PY -c "import torch; print('torch', torch.__version__)"; } | tee "$OUT/gpu.txt"
$PY benchmarks/kernels_bench.py --json "$OUT/kernels.json" "$@" 2>&1 | tee "$OUT/kernels.log"
