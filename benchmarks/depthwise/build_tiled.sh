#!/usr/bin/env bash
# Build libdwtiled.so (tiled_bench.py's variants) from tiled.cu: one nvcc per filter
# in parallel, then the entry, linked into one shared library next to this script.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
CL=$($PY -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))")/source
TPL=$HERE/../../src/cutlass_offload/emit/templates
TMP=$(mktemp -d)
flags="-std=c++17 -O3 -arch=sm_90a -Xcompiler -fPIC -I$CL/include -I$TPL"
for part in -1 0 1 2 3 4; do
  nvcc $flags -DDW_PART=$part -c "$HERE/tiled.cu" -o "$TMP/part$part.o" &
done
wait
nvcc -arch=sm_90a -shared "$TMP"/part*.o -o "$HERE/libdwtiled.so"
rm -rf "$TMP"
echo "built $HERE/libdwtiled.so"
