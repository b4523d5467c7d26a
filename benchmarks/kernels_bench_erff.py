"""benchmarks/kernels_bench.py with CUTLASS's own GELU functor
(cutlass::epilogue::thread::GELU, which calls erff) in place of ours
(co_act::GELU, emit/templates/activations.h): the A/B baseline of session 26's
GELU epilogue change. Same arguments as kernels_bench.py; the GELU kernels get
their own cache keys, so both variants can share one cache.

    python benchmarks/kernels_bench_erff.py --kinds gemm --dtypes fp16,bf16 --no-grid \\
        --gemm-shapes 6000x3072x768,6272x1536x384 --search heuristic --json erff.json
"""
import runpy
import sys
from pathlib import Path

import cutlass_offload.emit.activations as activations
import cutlass_offload.emit.evt_sm90 as evt_sm90

activations.FUNCTOR["gelu_erf"] = "cutlass::epilogue::thread::GELU"
assert evt_sm90.ACTIVATION is activations.FUNCTOR      # the 3.x EVT reads the same table

if __name__ == "__main__":
    sys.argv = [str(Path(__file__).with_name("kernels_bench.py"))] + sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
