#!/usr/bin/env bash
# GPU end-to-end check: GPU + build test tiers, then compile/run of the built-in
# models with the CLI. Logs and JSON go to $OUT (default ./gpu_e2e_out).
# Usage (on a machine with an H100/H200 and nvcc): bash benchmarks/gpu_e2e.sh [models...]
set -u
OUT=${OUT:-$PWD/gpu_e2e_out}; mkdir -p "$OUT"
models=${*:-bert-base gpt2 resnet50 sd-unet}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}   # e.g. PYTHON=.venv/bin/python after the README install
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
for m in $models; do   # compiles run on the CPU, beside the GPU tests; several builds
  # at once each take a share of the cores (each CUTLASS nvcc needs several GiB)
  (CUTLASS_OFFLOAD_JOBS=${CUTLASS_OFFLOAD_JOBS:-6} \
   $PY -m cutlass_offload.cli compile "$m" --out "/tmp/co_$m" --arch sm_90a > "$OUT/$m.log" 2>&1) &
done
$PY -m pytest -q -rs tests/gpu tests/build 2>&1 | tee "$OUT/pytest.log"
wait
for m in $models; do   # one at a time, so latencies are not disturbed
  $PY -m cutlass_offload.cli run "/tmp/co_$m" --json "$OUT/$m.json" >> "$OUT/$m.log" 2>&1
  echo "== $m"; cat "$OUT/$m.log"
done
# eager / torch.compile / ours (plain, CUDA graph, cuda_graphed()) and the per-region table
$PY benchmarks/runtime.py $models --from '/tmp/co_{model}' --json "$OUT/runtime.json" > "$OUT/runtime.log" 2>&1
tail -n 60 "$OUT/runtime.log"
