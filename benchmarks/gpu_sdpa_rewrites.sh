#!/usr/bin/env bash
# Session 35's SDPA rewrites on the GPU (runtime/glue_passes.py, and the layout copies
# that join an attention region): the GPU tests they touch, then whisper-encoder with
# and without the glue's rewrites beside torch.compile in reduce-overhead mode, timed
# in interleaved rounds (glue_profile.py variant ours_sdpa_copies). Logs and JSON to $OUT.
# Usage (GPU machine, README install): OUT=dir bash benchmarks/gpu_sdpa_rewrites.sh [models...]
set -u
OUT=${OUT:-$PWD/sdpa_rewrites_out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
models=${*:-whisper-encoder}
export PYTHONUNBUFFERED=1
start=$(date +%s)
timeout ${PREBUILD_TIMEOUT_S:-200} $PY -m cutlass_offload.cli prebuild --arch sm_90a --dtype fp16 \
  --models "$(echo $models | tr ' ' ',')" -q > "$OUT/prebuild.log" 2>&1 &
prebuild=$!
timeout ${TEST_TIMEOUT_S:-300} $PY -m pytest -q -x --durations=5 tests/gpu/test_glue_passes_gpu.py \
  tests/gpu/test_attention.py tests/gpu/test_attention_sm90.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - start )) s"; tail -n 3 "$OUT/tests.log"
wait $prebuild; echo "prebuild rc=$? $(( $(date +%s) - start )) s"; tail -n 2 "$OUT/prebuild.log"
timeout ${AB_TIMEOUT_S:-300} $PY benchmarks/glue_profile.py $models --mode reduce-overhead \
  --variants torch_compile,ours,ours_sdpa_copies --rounds 5 --top 12 --profile-reps 3 \
  --json "$OUT/glue_sdpa_rewrites.json" > "$OUT/glue_sdpa_rewrites.log" 2>&1
echo "glue_profile rc=$? $(( $(date +%s) - start )) s"
grep -E " / |ratio" "$OUT/glue_sdpa_rewrites.log" | head -20
