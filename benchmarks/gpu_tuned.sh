#!/usr/bin/env bash
# Compile the built-in models for sm_90a twice, with the heuristic kernels and with
# --tune (profiled on this GPU), into $DEST/co_MODEL and $DEST/co_tuned_MODEL, for
#   python benchmarks/runtime.py --from "$DEST/co_{model}" --tuned-from "$DEST/co_tuned_{model}"
# The models build side by side (CUTLASS_OFFLOAD_JOBS nvcc each, default 4: four
# models x 4 x ~4.5 GiB fits 128 GiB); tuned compiles profile one at a time (a lock
# per GPU in the cache), and the heuristic compile after each reuses its objects.
# A folder that is already complete is skipped, so an interrupted run resumes.
# Usage: bash benchmarks/gpu_tuned.sh [models...]; logs in $OUT (default ./gpu_tuned_out).
set -u
DEST=${DEST:-/tmp}
LOGS=${OUT:-$PWD/gpu_tuned_out}; mkdir -p "$LOGS"
models=${*:-bert-base gpt2 resnet50 sd-unet}
PY=${PYTHON:-python3}
export CUTLASS_OFFLOAD_JOBS=${CUTLASS_OFFLOAD_JOBS:-4} PYTHONUNBUFFERED=1
for m in $models; do
  (
    t0=$(date +%s)
    [ -f "$DEST/co_tuned_$m/manifest.json" ] || $PY -m cutlass_offload.cli compile "$m" --tune \
      --out "$DEST/co_tuned_$m" --arch sm_90a > "$LOGS/tuned_$m.log" 2>&1
    t1=$(date +%s)
    [ -f "$DEST/co_$m/manifest.json" ] || $PY -m cutlass_offload.cli compile "$m" \
      --out "$DEST/co_$m" --arch sm_90a > "$LOGS/heuristic_$m.log" 2>&1
    echo "$m: tuned $((t1 - t0)) s, heuristic $(($(date +%s) - t1)) s" | tee -a "$LOGS/times.txt"
  ) &
done
wait
