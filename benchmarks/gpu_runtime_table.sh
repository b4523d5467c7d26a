#!/usr/bin/env bash
# Issue 16's table in one run of benchmarks/runtime.py (the nine models, ours with
# Inductor glue plain and reduce-overhead against torch.compile default and
# reduce-overhead, errors at two batch sizes), cut into calls of at most
# BUDGET_S seconds for machines whose commands are time-limited: each call resumes
# the JSON where the last one stopped (runtime.py --resume) and exits 3 while models
# remain, 0 when the table is complete. The first call also compiles every model's
# kernels in one parallel build (`cutlass-offload prebuild --models ...`), so the
# per-model compiles find them cached; a later call on the same machine (same
# CUTLASS_OFFLOAD_CACHE_DIR) skips what is built.
# MAX_AUTOTUNE=none (or a model list) overrides runtime.py's max-autotune anchors
# (bert-base and llama by default: minutes of Inductor autotuning each);
# RUNTIME_ARGS adds runtime.py options (e.g. "--no-eager-glue --paired-only": the
# targets need only the Inductor glue and the anchors, timed in the paired rounds).
# Usage (GPU machine, README install): OUT=dir BUDGET_S=480 bash benchmarks/gpu_runtime_table.sh [models...]
set -u
OUT=${OUT:-$PWD/runtime_table_out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-480}
models=${*:-bert-base gpt2 resnet50 sd-unet llama whisper-encoder convnext-tiny efficientnet-b0 vae-decoder}
export PYTHONUNBUFFERED=1
start=$(date +%s)
if [ ! -e "$OUT/prebuilt" ]; then
  # bounded by the budget: units it finished stay cached, the next call goes on
  # done once it reached its summary line, also when it skipped a model whose package
  # is missing here (exit 1; that model then fails in runtime.py with the reason)
  timeout "$BUDGET_S" $PY -m cutlass_offload.cli prebuild --arch sm_90a --dtype fp16 \
    --models "$(echo $models | tr ' ' ',')" -q > "$OUT/prebuild.log" 2>&1
  grep -q "^prebuilt " "$OUT/prebuild.log" && touch "$OUT/prebuilt"
  tail -n 5 "$OUT/prebuild.log"
fi
left=$(( BUDGET_S - ($(date +%s) - start) ))
[ "$left" -lt 60 ] && { echo "prebuild used the budget: run again"; exit 3; }
resume=""; [ -e "$OUT/runtime.json" ] && resume="--resume"
$PY benchmarks/runtime.py $models --quick --json "$OUT/runtime.json" $resume --budget-s "$left" \
  ${MAX_AUTOTUNE:+--max-autotune-models "$MAX_AUTOTUNE"} ${RUNTIME_ARGS:-} \
  >> "$OUT/runtime.log" 2>&1
rc=$?
tail -n 40 "$OUT/runtime.log"
exit $rc
