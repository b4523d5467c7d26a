#!/usr/bin/env bash
# Issue 16, default mode: ours with Inductor's Python wrapper against its C++ wrapper
# (glue.CPP_WRAPPER_IN_DEFAULT_MODE), beside torch.compile, timed in interleaved
# rounds (glue_profile.py --rounds), then the Inductor-glue GPU tests with the C++
# wrapper on ($CUTLASS_OFFLOAD_CPP_WRAPPER=1). Logs and JSON to $OUT.
# Usage (GPU machine, README install): OUT=dir bash benchmarks/gpu_cpp_wrapper_ab.sh [models...]
set -u
OUT=${OUT:-$PWD/cpp_wrapper_out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
models=${*:-convnext-tiny efficientnet-b0 whisper-encoder}
export PYTHONUNBUFFERED=1
start=$(date +%s)
timeout 150 $PY -m cutlass_offload.cli prebuild --arch sm_90a --dtype fp16 \
  --models "$(echo $models | tr ' ' ',')" -q > "$OUT/prebuild.log" 2>&1
echo "prebuild rc=$? $(( $(date +%s) - start )) s"; tail -n 3 "$OUT/prebuild.log"
timeout ${AB_TIMEOUT_S:-300} $PY benchmarks/glue_profile.py $models --mode default \
  --variants torch_compile,ours_python_wrapper,ours_cpp_wrapper --reps 20 --profile-reps 3 \
  --rounds 5 --top 6 ${HOST_PROFILE:+--host-profile $HOST_PROFILE} \
  --json "$OUT/glue_cpp_wrapper.json" > "$OUT/glue_cpp_wrapper.log" 2>&1
echo "glue_profile rc=$? $(( $(date +%s) - start )) s"
grep -E " / |interleaved|ratio" "$OUT/glue_cpp_wrapper.log" | head -40
CUTLASS_OFFLOAD_CPP_WRAPPER=1 timeout ${TEST_TIMEOUT_S:-400} $PY -m pytest -q -x --durations=0 \
  tests/gpu/test_inductor_glue.py tests/gpu/test_load_inductor_glue.py > "$OUT/test_glue_cpp_wrapper.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - start )) s"; tail -n 5 "$OUT/test_glue_cpp_wrapper.log"
