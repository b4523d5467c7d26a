"""Which cuBLAS kernel PyTorch's ``torch.mm`` runs for a GEMM shape, and how long it
takes (issue 15: what the anchor does where ours is slower; cuBLAS's kernel names
carry its tile, stages and cluster, e.g. ``nvjet_sm90_hsh_128x128_64x6_2x4``:
128x128 tiles in cuBLAS's column-major view, 64-deep K, 6 stages, a 2x4 cluster).

Per ``MxNxK``: fp16 A (M, K) row-major times B^T with B (N, K) row-major (an
``nn.Linear``'s layout), 20 calls under torch.profiler (CUDA activity), every kernel
with its mean device time. Prints a table, writes JSON; needs a CUDA GPU (exit 2).

    python benchmarks/cublas_kernels.py 512x3840x1280 512x1280x1280 [--json cublas_kernels.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def kernels(m: int, n: int, k: int, calls: int = 20) -> list:
    """[(kernel name, mean us, calls)] of ``calls`` torch.mm(a, b.t()) on fresh fp16 data."""
    from torch.profiler import ProfilerActivity, profile
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    for _ in range(3):
        torch.mm(a, b.t())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(calls):
            torch.mm(a, b.t())
        torch.cuda.synchronize()
    return [(e.key, e.device_time_total / e.count, e.count) for e in prof.key_averages()
            if e.device_time_total > 0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shapes", nargs="+", help="MxNxK")
    p.add_argument("--json", default="cublas_kernels.json")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    print("| problem | kernel | us | calls |\n| --- | --- | --- | --- |")
    for spec in a.shapes:
        m, n, k = map(int, spec.lower().split("x"))
        rows = out["shapes"][spec] = kernels(m, n, k)
        for name, us, count in rows:
            print(f"| {spec} | {name[:110]} | {us:.2f} | {count} |")
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
