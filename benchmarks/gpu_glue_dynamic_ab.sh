#!/usr/bin/env bash
# The glue's dynamic policy alone, in one command per model (issue 16): ours captured
# with a dynamic batch as benchmarks/runtime.py compiles it, its Inductor glue compiled
# symbolic in the batch (ours_dynamic: dynamic="exported", the default) or specialized
# first (ours_dynamic_glue_auto: dynamic="auto", torch.compile's own policy), in
# interleaved rounds against torch.compile, reduce-overhead. Session 27 measured the
# dynamic capture against a static one (efficientnet-b0 0.898 against 0.862, llama 0.919
# against 0.905); this tells whether the specialized glue recovers that.
# One glue_profile.py JSON per model under OUT; a model whose JSON is there is skipped,
# and no model starts after BUDGET_S seconds (exit 3 while models remain, 0 when done).
# Usage (GPU machine, README install): OUT=dir BUDGET_S=480 bash benchmarks/gpu_glue_dynamic_ab.sh [models...]
set -u
OUT=${OUT:-$PWD/glue_dynamic_ab_out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-480}
ROUNDS=${ROUNDS:-5}
models=${*:-efficientnet-b0 llama whisper-encoder resnet50 convnext-tiny}
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
for m in $models; do
  [ -e "$OUT/glue_dynamic_$m.json" ] && continue
  left=$(( BUDGET_S - ($(date +%s) - start) ))
  if [ "$left" -lt 120 ]; then echo "budget used: run again for the rest"; exit 3; fi
  timeout "$left" $PY "$here/glue_profile.py" "$m" --variants torch_compile,ours_dynamic,ours_dynamic_glue_auto \
    --rounds "$ROUNDS" --json "$OUT/glue_dynamic_$m.json.part" > "$OUT/glue_dynamic_$m.log" 2>&1 \
    && mv "$OUT/glue_dynamic_$m.json.part" "$OUT/glue_dynamic_$m.json"
  tail -n 5 "$OUT/glue_dynamic_$m.log"
done
exit 0
