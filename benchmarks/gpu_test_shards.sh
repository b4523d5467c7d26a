#!/usr/bin/env bash
# The GPU test suite (tests/gpu) in SHARDS parallel pytest processes, for a GPU machine
# whose commands are time-limited: each shard runs under `timeout` of LIMIT seconds and
# writes its log and JUnit XML to OUT; the summary lists each shard's exit status and
# its failures. Files go to shards round-robin in size order (largest first), so the
# shards take about equally long; FILES overrides the list (paths, space-separated).
# Kernel builds share CUTLASS_OFFLOAD_CACHE_DIR (its entries are published under a lock),
# so shards that need one kernel build it once.
# Usage (GPU machine, README install): OUT=dir LIMIT=540 SHARDS=4 bash benchmarks/gpu_test_shards.sh
set -u
OUT=${OUT:-$PWD/gpu_tests_out}; mkdir -p "$OUT"
LIMIT=${LIMIT:-540}; SHARDS=${SHARDS:-4}; PY=${PYTHON:-python3}
files=${FILES:-$(ls -S tests/gpu/test_*.py)}
declare -a shard
i=0
for f in $files; do shard[$((i % SHARDS))]+=" $f"; i=$((i + 1)); done
: > "$OUT/rc.txt"
for n in $(seq 0 $((SHARDS - 1))); do
  [ -n "${shard[$n]:-}" ] || continue
  (timeout "$LIMIT" $PY -X faulthandler -m pytest -q -p no:cacheprovider --durations=8 \
     --junitxml="$OUT/shard$n.xml" ${shard[$n]} > "$OUT/shard$n.log" 2>&1
   echo "shard$n rc=$? files:${shard[$n]}" >> "$OUT/rc.txt") &
done
wait
cat "$OUT/rc.txt"
for n in $(seq 0 $((SHARDS - 1))); do
  [ -e "$OUT/shard$n.log" ] || continue
  echo "== shard$n"; tail -n 2 "$OUT/shard$n.log"; grep -E "^(FAILED|ERROR)" "$OUT/shard$n.log" | head -20
done
! grep -qv " rc=0 " "$OUT/rc.txt"
