"""cuBLAS's own time for one GEMM, with its operands L2-hot and L2-cold: a check of the
corpus benchmark's anchor (benchmarks/kernels_bench.py times PyTorch's addmm / mm on
operand copies rotated past the L2).

For one (M, N, K) fp16 problem, a weight of (N, K) as nn.Linear stores it: torch.addmm
with a bias, torch.mm and F.linear with a bias, each replayed 24 times in one CUDA
graph, "hot" (one set of operands) and "cold" (12 sets, rotated); median us per call of
15 replays. Then the cuBLAS kernel each call runs (torch.profiler). Prints a table,
writes JSON. Needs a CUDA GPU.

    python benchmarks/anchor_l2.py [--shape 6000x768x768] [--json anchor_l2.json]
"""
import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import graph_ms  # noqa: E402

REPS, REPLAYS, COLD_COPIES = 24, 15, 12


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="6000x768x768", help="MxNxK")
    p.add_argument("--json", default="anchor_l2.json")
    a = p.parse_args()
    m, n, k = map(int, a.shape.split("x"))
    torch.manual_seed(0)

    def operands():
        return (torch.randn(m, k, device="cuda", dtype=torch.float16),
                torch.randn(n, k, device="cuda", dtype=torch.float16) * k ** -0.5,
                torch.randn(n, device="cuda", dtype=torch.float16) * 0.5)

    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "shape": [m, n, k]}
    print(f"{result['gpu']}, torch {torch.__version__}: {m}x{n}x{k} fp16, us per call")
    print("| operands | addmm + bias | mm | F.linear + bias |\n| --- | --- | --- | --- |")
    for label, copies in (("hot", 1), ("cold", COLD_COPIES)):
        sets = [operands() for _ in range(copies)]
        outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(copies)]
        calls = {
            "addmm_bias": lambda x, w, b, o: torch.addmm(b, x, w.t(), out=o),
            "mm": lambda x, w, b, o: torch.mm(x, w.t(), out=o),
            "linear_bias": lambda x, w, b, o: F.linear(x, w, b),
        }
        row = {}
        for name, call in calls.items():
            turn = itertools.count()

            def one(call=call, turn=turn):      # the captured calls rotate over the sets
                i = next(turn) % copies
                call(*sets[i], outs[i])
            row[name] = graph_ms(one, calls=REPS, reps=REPLAYS) * 1e3
        result[label] = row
        print(f"| {label} | {row['addmm_bias']:.2f} | {row['mm']:.2f} | {row['linear_bias']:.2f} |")
    x, w, b = operands()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.addmm(b, x, w.t())
        torch.mm(x, w.t())
        torch.cuda.synchronize()
    result["kernels"] = sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})
    for name in result["kernels"]:
        print("kernel:", name)
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
