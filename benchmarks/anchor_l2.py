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
import json
import statistics

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

REPS, REPLAYS, COLD_COPIES = 24, 15, 12


def graph_us(fn, calls: int) -> float:
    """Median us per call of ``fn`` (which makes ``calls`` calls) replayed in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)


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
            def run(call=call):
                for i in range(REPS):
                    call(*sets[i % copies], outs[i % copies])
            row[name] = graph_us(run, REPS)
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
