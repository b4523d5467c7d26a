#!/usr/bin/env bash
# Issue 15 / 16: our attention kernels inside each model against PyTorch's SDPA in the
# same compiled graph (glue_profile.py variant attention_in_pytorch), in
# reduce-overhead beside torch.compile, timed in interleaved rounds. The kernel
# benchmark times attention alone; whisper-encoder's, at parity there, ran 20% slower
# than cuDNN's inside the model (docs/measured.md, session 20). A model whose forward
# gains from attention_in_pytorch is a candidate for the measured-faster list (Inductor
# glue), with this run's kernel times as its evidence. Logs and JSON to $OUT, one pair
# per model, so a killed run keeps the models it finished.
# Usage (GPU machine, README install): OUT=dir bash benchmarks/gpu_attention_in_model.sh [models...]
set -u
OUT=${OUT:-$PWD/attention_in_model_out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
models=${*:-gpt2 bert-base llama sd-unet vae-decoder}
export PYTHONUNBUFFERED=1
start=$(date +%s)
timeout ${PREBUILD_TIMEOUT_S:-240} $PY -m cutlass_offload.cli prebuild --arch sm_90a --dtype fp16 \
  --models "$(echo $models | tr ' ' ',')" -q > "$OUT/prebuild.log" 2>&1
echo "prebuild rc=$? $(( $(date +%s) - start )) s"; tail -n 2 "$OUT/prebuild.log"
for m in $models; do
  timeout ${MODEL_TIMEOUT_S:-300} $PY benchmarks/glue_profile.py "$m" --mode reduce-overhead \
    --variants torch_compile,ours,attention_in_pytorch --reps 20 --profile-reps 3 --rounds 5 --top 5 \
    --json "$OUT/attention_in_model_$m.json" > "$OUT/attention_in_model_$m.log" 2>&1
  echo "$m rc=$? $(( $(date +%s) - start )) s"
  grep -E "interleaved|ratio|attention  " "$OUT/attention_in_model_$m.log" | head -12
done
