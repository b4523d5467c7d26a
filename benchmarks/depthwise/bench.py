"""Is CUTLASS's 2.x depthwise direct conv worth offloading? A standalone check (issue 19).

dw.cu instantiates ``cutlass::conv::kernel::DefaultDepthwiseDirect2dConvFprop``
(SIMT, fixed stride / dilation, fp16 NHWC, fp32 accumulation, bias epilogue; the
filter reordered into the workspace by the kernel's ReorderKernel each call) for
the depthwise convs of convnext-tiny (7x7) and efficientnet-b0 (3x3 / 5x5, stride
1 and 2) at batch 32; this script checks each against F.conv2d in float32 and
times it against cuDNN (F.conv2d channels_last, groups = C) as CUDA-graph replays.
Build, then run on the GPU (writes $OUT/dw_bench.json):

    CL=$(python -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))")/source
    nvcc -std=c++17 -O3 -arch=sm_90a -Xcompiler -fPIC -shared benchmarks/depthwise/dw.cu \
        -o benchmarks/depthwise/libdw.so -I$CL/include --expt-relaxed-constexpr -w
    python benchmarks/depthwise/bench.py

H200, 2026-12-01 (benchmarks/results/depthwise_direct_conv_2026-12-01_h200.json):
correct (rel. error 2.5e-4) but 2.3x to 155x slower than cuDNN (7x7 at 56 x 56 x 96:
14.2 ms against 91 us), so depthwise convs stay in PyTorch.
"""
import ctypes, json, os, sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _timing import graph_ms  # noqa: E402

lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libdw.so"))
lib.dw_run.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4 + [ctypes.c_void_p]
CASES = [  # (variant, R, stride, N, H, C)
    (0, 7, 1, 32, 56, 96), (1, 7, 1, 32, 56, 96), (0, 7, 1, 32, 28, 192), (0, 7, 1, 32, 14, 384),
    (0, 7, 1, 32, 7, 768), (6, 7, 1, 32, 7, 768), (6, 7, 1, 32, 14, 384),
    (2, 3, 1, 32, 112, 32), (7, 3, 1, 32, 112, 32), (3, 3, 2, 32, 112, 96), (2, 3, 1, 32, 56, 144),
    (7, 3, 1, 32, 56, 144), (5, 5, 2, 32, 56, 144), (4, 5, 1, 32, 28, 240), (3, 3, 2, 32, 28, 240),
    (2, 3, 1, 32, 14, 480), (4, 5, 1, 32, 14, 480), (4, 5, 1, 32, 14, 672), (5, 5, 2, 32, 14, 672),
    (4, 5, 1, 32, 7, 1152), (2, 3, 1, 32, 7, 1152), (8, 3, 1, 32, 7, 1152),
]


def graph_us(fn):
    return graph_ms(fn) * 1000         # per call, CUDA-graph replays (benchmarks/_timing.py)


rows = []
for v, r, st, n, h, c in CASES:
    x = torch.randn(n, c, h, h, device="cuda").half().contiguous(memory_format=torch.channels_last)
    w = (torch.randn(c, 1, r, r, device="cuda") / r).half()
    bias = torch.randn(c, device="cuda").half()
    pad = r // 2
    p = (h + 2 * pad - r) // st + 1
    y = torch.full((n, p, p, c), float("nan"), device="cuda", dtype=torch.half)
    wr = torch.empty_like(w)
    call = lambda: lib.dw_run(v, x.data_ptr(), w.data_ptr(), bias.data_ptr(), y.data_ptr(), wr.data_ptr(), n, h, h, c,
                              torch.cuda.current_stream().cuda_stream)
    rc = call(); torch.cuda.synchronize()
    ref = F.conv2d(x.float(), w.float(), bias.float(), st, pad, 1, c)
    out = y.permute(0, 3, 1, 2)
    err = float((out.float() - ref).norm() / ref.norm()) if rc == 0 else None
    ours = graph_us(lambda: call()) if rc == 0 else None
    cud = graph_us(lambda: F.conv2d(x, w, bias, st, pad, 1, c))
    row = dict(variant=v, r=r, stride=st, n=n, h=h, c=c, rc=rc, rel_err=err, ours_us=ours, cudnn_us=cud,
               speedup=(cud / ours) if ours else None)
    rows.append(row)
    print(row, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "dw_bench.json"), "w"), indent=1)
