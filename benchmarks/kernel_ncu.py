"""One model forward's GEMM kernels under Nsight Compute: ours against torch.compile's
cuBLAS, kernel by kernel, each timed alone (issue 15 / 16: "the profile that shows it").

torch.profiler inside a CUDA graph (benchmarks/glue_profile.py) times each kernel from
its first block's start to its last block's end: a kernel launched with programmatic
dependent launch (PDL) starts while its predecessor drains and waits at
``griddepcontrol.wait``, so that wait is counted as its own time, and a neighbour can
share the SMs. ncu serializes the kernels and replays each one alone, so these are
the kernels' own durations, with the L2 left as the forward left it
(``--cache-control none``) and the clocks as the GPU sets them (``--clock-control
none``, as METHOD.md advises). Per kernel: duration, SM and memory throughput (% of
peak), DRAM throughput, L2 hit rate, grid, registers, shared memory, SM clock and
warp cycles per issued instruction.

The parent process runs ncu on a child (``--child``) that compiles the model twice,
ours (Inductor glue, default mode, the learned table) and ``torch.compile`` default,
warms both up, and runs one forward of each between cudaProfilerStart / Stop.

    python benchmarks/kernel_ncu.py whisper-encoder [--layers 1] [--filter REGEX]
        [--ncu ncu] [--json kernel_ncu.json]
    python benchmarks/kernel_ncu.py --gemm 512x3840x1280,512x1280x1280 [--dtype fp16]

``--gemm MxNxK,...`` profiles plain GEMMs instead of a model's: per problem, a bias-free
Linear (N, K) on an (M, K) input, ours (the learned table's kernels, one build) then
PyTorch's (``F.linear``: cuBLAS), so the misses of issue 15's plain-GEMM class show why.

Needs a CUDA GPU and ncu (exit 2 without either). Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import collections
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "MemoryWorkloadAnalysis")
# the GEMM kernels: CUTLASS's (ours) and cuBLAS's (nvjet / sm90_xmma gemm / cutlass kernels)
DEFAULT_FILTER = "regex:GemmUniversal|nvjet|gemm"
METRICS = {"Duration": "us", "Compute (SM) Throughput": "sm_pct", "Memory Throughput": "mem_pct",
           "DRAM Throughput": "dram_pct", "Registers Per Thread": "regs",
           "Grid Size": "grid", "Dynamic Shared Memory Per Block": "dyn_smem",
           "Achieved Occupancy": "occupancy", "L2 Hit Rate": "l2_hit_pct",
           "Elapsed Cycles": "cycles", "SM Frequency": "sm_mhz",
           "L1/TEX Cache Throughput": "l1_pct", "L2 Cache Throughput": "l2_pct",
           "Cluster Size": "cluster", "Waves Per SM": "waves"}
WARP_METRICS = {"Warp Cycles Per Issued Instruction": "cycles_per_issue",
                 "Avg. Active Threads Per Warp": "active_threads"}


def gemm_child(a) -> None:
    """The --gemm problems as bias-free Linears of one module (one build): ours, then
    F.linear, each called once between cudaProfilerStart / Stop after warm-up calls."""
    import torch
    sys.path.insert(0, str(HERE.parents[0] / "src"))
    from cutlass_offload.api import compile_captured, resolve_arch
    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions

    class Linears(torch.nn.Module):
        def __init__(self, shapes):
            super().__init__()
            self.lins = torch.nn.ModuleList(torch.nn.Linear(k, n, bias=False) for _, n, k in shapes)

        def forward(self, *xs):
            return tuple(lin(x) for lin, x in zip(self.lins, xs))

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    shapes = gemm_shapes(a.gemm)
    model = Linears(shapes).to("cuda", dtype).eval()
    xs = tuple(torch.randn(m, k, device="cuda", dtype=dtype) for m, _, k in shapes)
    ours = compile_captured(capture(model, xs), CompileOptions(arch=resolve_arch(None)))
    weights = [lin.weight for lin in model.lins]
    with torch.no_grad():
        for _ in range(3):
            ours(*xs)
            [torch.nn.functional.linear(x, w) for x, w in zip(xs, weights)]
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        ours(*xs)
        torch.cuda.synchronize()
        for x, w in zip(xs, weights):
            torch.nn.functional.linear(x, w)
            torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def gemm_shapes(text: str) -> list:
    """"512x3840x1280,6000x768x768" -> [(512, 3840, 1280), (6000, 768, 768)] (M, N, K)."""
    shapes = []
    for item in filter(None, text.split(",")):
        dims = item.lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"--gemm: {item!r} is not MxNxK with positive integers")
        shapes.append(tuple(int(d) for d in dims))
    return shapes


def child(a) -> None:
    import torch
    sys.path.insert(0, str(HERE.parents[0] / "src"))
    from cutlass_offload.api import compile_captured, resolve_arch
    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions
    from cutlass_offload.models import load_model

    config = {"num_hidden_layers": a.layers} if a.layers else {}
    model, inputs = load_model(a.model, **config)
    model = model.cuda().eval()
    inputs = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs)
    ours = compile_captured(capture(model, inputs), CompileOptions(arch=resolve_arch(None)),
                            glue="inductor")
    theirs = torch.compile(model)
    with torch.no_grad():
        for _ in range(3):
            ours(*inputs)
            theirs(*inputs)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        ours(*inputs)
        torch.cuda.synchronize()
        theirs(*inputs)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def _num(s: str):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return s


def parse(text: str) -> list:
    """ncu's ``--csv --page details`` output -> one dict per kernel launch, in order."""
    start = text.find('"ID"')
    if start < 0:
        return []
    kernels = collections.OrderedDict()
    for row in csv.DictReader(io.StringIO(text[start:])):
        k = kernels.setdefault(row["ID"], {"id": int(row["ID"]), "name": row["Kernel Name"],
                                           "block": row.get("Block Size"), "grid_xyz": row.get("Grid Size")})
        metric, unit, value = row["Metric Name"], row["Metric Unit"], _num(row["Metric Value"])
        # the first section naming a metric wins (Memory Throughput is a % in
        # SpeedOfLight, bytes/s in MemoryWorkloadAnalysis)
        if metric in METRICS and METRICS[metric] not in k:
            if metric == "Duration":            # ncu scales its unit to the value
                value = value * {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0,
                                 "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
            elif metric == "SM Frequency" and isinstance(value, float):
                value = value / {"hz": 1e6, "cycle/second": 1e6, "cycle/nsecond": 1e-3,
                                 "ghz": 1e-3, "mhz": 1.0}.get(unit.lower(), 1.0)
            k[METRICS[metric]] = value
        elif row["Section Name"].startswith("WarpStateStats") and metric in WARP_METRICS:
            k[WARP_METRICS[metric]] = value
    return list(kernels.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="a built-in model name (or --gemm)")
    p.add_argument("--gemm", default="", metavar="MxNxK,...",
                   help="profile these plain GEMMs (bias-free Linear) instead of a model's")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"], help="with --gemm")
    p.add_argument("--layers", type=int, default=1,
                   help="num_hidden_layers for llama / whisper-encoder (0: the model's own; default 1)")
    p.add_argument("--filter", default=DEFAULT_FILTER, help="ncu --kernel-name (default: %(default)s)")
    p.add_argument("--ncu", default=shutil.which("ncu") or "ncu")
    p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "kernel_ncu.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if bool(a.model) == bool(a.gemm):
        p.error("give one of: a built-in model name, or --gemm MxNxK,...")
    if a.gemm:
        try:
            gemm_shapes(a.gemm)         # a bad list fails here, not in ncu's child
        except ValueError as e:
            p.error(str(e))
    if a.child:
        gemm_child(a) if a.gemm else child(a)
        return 0
    import torch
    sys.path.insert(0, str(HERE))
    from glue_profile import classify           # ours / PyTorch's by kernel name
    if not torch.cuda.is_available() or not shutil.which(a.ncu):
        print("needs a CUDA GPU and Nsight Compute (ncu)", file=sys.stderr)
        return 2
    cmd = [a.ncu, "--profile-from-start", "off", "--kernel-name-base", "demangled", "--clock-control", "none", "--cache-control", "none",
           "--kernel-name", a.filter, "--csv", "--page", "details"]
    for s in SECTIONS:
        cmd += ["--section", s]
    cmd += [sys.executable, __file__, "--child", "--layers", str(a.layers)]
    cmd += ["--gemm", a.gemm, "--dtype", a.dtype] if a.gemm else [a.model]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rows = parse(proc.stdout)
    if proc.returncode or not rows:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
        if not rows:
            return 1
    what = f"GEMMs {a.gemm} ({a.dtype}; ours, then cuBLAS, per problem)" if a.gemm else \
        f"{a.model} ({a.layers or 'all'} layers)"
    print(f"{what}: {len(rows)} GEMM kernels under ncu (clocks and L2 as the calls left them)")
    print("| # | owner | us | SM % | mem % | DRAM % | L2 % | L1 % | L2 hit % | grid | cluster | regs | "
          "dyn. smem | MHz | cycles / issue | kernel |")
    print("| --- " * 16 + "|")
    for r in rows:
        r["owner"] = "ours" if classify(r["name"]).startswith("ours") else "pytorch"
        print(f"| {r['id']} | {r['owner']} | {r.get('us', 0):.2f} | {r.get('sm_pct', 0):.0f} | "
              f"{r.get('mem_pct', 0):.0f} | {r.get('dram_pct', 0):.0f} | {r.get('l2_pct', 0):.0f} | "
              f"{r.get('l1_pct', 0):.0f} | {r.get('l2_hit_pct', 0):.0f} | "
              f"{r.get('grid_xyz')} | {r.get('cluster')} | {r.get('regs')} | {r.get('dyn_smem', 0)} | {r.get('sm_mhz')} | "
              f"{r.get('cycles_per_issue')} | "
              f"{r['name'][:90]} |")
    with open(a.json, "w") as f:
        json.dump({"model": a.model, "gemm": a.gemm, "dtype": a.dtype, "layers": a.layers, "gpu": torch.cuda.get_device_name(0),
                   "torch": torch.__version__, "kernels": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
