#!/usr/bin/env bash
# Issue 17: what it takes to turn the region ops' C shims on by default (glue.REGION_C_SHIMS;
# session 45: 3.8 us a region call from Inductor's C++ wrapper against 11.1 us through the
# dispatcher, but two processes that used them died of a segfault before the extension
# exported only its init and the shims, csrc/fast_call.map). On any GPU, about 4 minutes:
#   1. the glue's GPU tests with CUTLASS_OFFLOAD_C_SHIMS=1 (several glue graphs in one process);
#   2. call_overhead.py --shims: the shim row against the dispatcher's and cuBLAS's mm.
# If both pass, set REGION_C_SHIMS = True (runtime/glue.py) and time a model
# (glue_profile.py --variants ours_cpp_wrapper,ours_cpp_dispatcher).
#   PYTHONPATH=$PWD/src:/tmp/site OUT=... bash benchmarks/gpu_c_shims_check.sh
set -u
OUT=${OUT:-$PWD/c_shims_out}; PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
CUTLASS_OFFLOAD_C_SHIMS=1 $PY -X faulthandler -m pytest -q tests/gpu/test_inductor_glue.py \
  tests/gpu/test_load_inductor_glue.py tests/gpu/test_cpp_path_causal.py -p no:cacheprovider \
  > "$OUT/gpu_tests_c_shims.log" 2>&1
echo "glue GPU tests with the shims: rc=$?"; tail -n 3 "$OUT/gpu_tests_c_shims.log"
(cd benchmarks && $PY -X faulthandler call_overhead.py --shims --json "$OUT/call_overhead.json" \
  > "$OUT/call_overhead.log" 2>&1; echo "call_overhead.py --shims: rc=$?")
grep -E "cpp_wrapper_us|cpp_shim_us|bare_launch" "$OUT/call_overhead.log"
