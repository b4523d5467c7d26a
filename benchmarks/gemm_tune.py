"""Tune GEMM problems on the GPU (the ``--tune`` machinery, without a model) and
check the speed targets of issue 6 against PyTorch.

Shape sets (fp16 by default, A (M, K) row-major, B a Linear weight (N, K)):

* ``bert``: bert-base at batch 8, sequence 128 (M = 1024): the Q/K/V projections
  (768 -> 768, bias), the attention output (768 -> 768, bias + residual add), the
  FFN up (768 -> 3072, bias + GELU) and down (3072 -> 768, bias + residual add);
* ``design``: ../shared/design.md's kernel-speed table, bias + relu:
  77x1280x768, 4096x4096x4096, 8192x5120x1280;
* ``small``: small-M problems (decode-like M = 16, 64, 128 against 4096 x 4096);
* ``effnet``: EfficientNet-b0's three 1x1-conv GEMMs at 112 x 112 (batch 32, 401408
  rows) with the epilogues the model fuses (folded BatchNorm's bias, SiLU), which the
  corpus search times as plain proxies.

For each problem: every candidate's time, the winner, the heuristic's choice and
the PyTorch ops the region replaces (addmm + epilogue ops, timed the same way:
20 launches in a CUDA graph, median of 15 replays, us per launch; tune/profile.py).
Target (H200, fp16): the winner at least as fast as PyTorch for M >= 256, within
1.2x for smaller M. With ``--search full`` (the default) results are remembered in
the tuning cache like ``--tune``'s (a second run profiles nothing;
CUTLASS_OFFLOAD_CACHE_DIR picks the cache); the other searches cache nothing.
Prints the candidate table and a target table; writes JSON to
$OUT/gemm_tune.json (default ./out).

    python benchmarks/gemm_tune.py [--shapes bert|design|small|effnet|all] [--dtype fp16|bf16]
        [--search full|fitted|heuristic]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cutlass_offload.config import CompileOptions
from cutlass_offload.ir import GemmEpilogue, GemmProblem, GemmRegion
from cutlass_offload.select import select
from cutlass_offload.tune import tune

BIAS = GemmEpilogue(bias=True)
BIAS_ADD = GemmEpilogue(bias=True, residual="add")
BIAS_GELU = GemmEpilogue(bias=True, activation="gelu_erf")
BIAS_RELU = GemmEpilogue(bias=True, activation="relu")
BIAS_SILU = GemmEpilogue(bias=True, activation="silu")

SHAPES = {
    "bert": [(1024, 768, 768, BIAS), (1024, 768, 768, BIAS_ADD), (1024, 3072, 768, BIAS_GELU),
             (1024, 768, 3072, BIAS_ADD)],
    "design": [(77, 1280, 768, BIAS_RELU), (4096, 4096, 4096, BIAS_RELU),
               (8192, 5120, 1280, BIAS_RELU)],
    "small": [(16, 4096, 4096, BIAS), (64, 4096, 4096, BIAS), (128, 4096, 4096, BIAS)],
    "effnet": [(401408, 96, 16, BIAS_SILU), (401408, 16, 32, BIAS), (401408, 32, 32, BIAS_SILU)],
}
SMALL_M = 256          # below: within 1.2x of PyTorch; from here: at least as fast (issue 6)


def _partition(shapes, dtype):
    from cutlass_offload.ir import PartitionResult
    regions = []
    for i, (m, n, k, ep) in enumerate(shapes):
        p = GemmProblem(n=n, k=k, dtype=dtype, layout_b="col", align_a=8, align_b=8, align_c=8,
                        epilogue=ep, m=m, m_hint=m)
        regions.append(GemmRegion(name=f"g{i}", form="linear", nodes=(f"g{i}",), a="a", b="b",
                                  problem=p))
    return PartitionResult(tuple(regions), ())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="bert", choices=[*SHAPES, "all"])
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--search", default="full", choices=["full", "fitted", "heuristic"],
                    help="tune's search: the sm90 space; the heuristic's choice against the "
                         "wave-fitted, swap-AB and skinny tiles (fewer compiles); or the "
                         "heuristic's kernel alone (a measurement)")
    a = ap.parse_args()
    shapes = [s for name in (SHAPES if a.shapes == "all" else [a.shapes]) for s in SHAPES[name]]
    options = CompileOptions(arch="sm90a", tune=True)
    part = _partition(shapes, {"fp16": "f16", "bf16": "bf16"}[a.dtype])
    report = tune(select(part, "sm90a", options), options, search=a.search)
    print(report.format())
    rows, met_all = [], True
    print(f"\n{'M x N x K':<20} {'epilogue':<14} {'heuristic':>10} {'tuned':>10} {'PyTorch':>10} "
          f"{'speedup':>8}  target")
    for p in report.problems:
        d = p.problem
        times = {c.tag: c.us for c in p.candidates if c.status == "ok"}
        h, w, t = times.get(p.heuristic), times.get(p.winner), p.torch_us
        need = 1.0 if d["m"] >= SMALL_M else 1 / 1.2
        speedup = t / w if (t and w) else None
        met = speedup is not None and speedup >= need
        met_all &= met
        rows.append({"m": d["m"], "n": d["n"], "k": d["k"], "epilogue": p.label.split()[-1],
                     "heuristic": p.heuristic, "heuristic_us": h, "winner": p.winner, "winner_us": w,
                     "pytorch_us": t, "speedup": speedup, "target": need, "met": met})

        def fmt(x):
            return f"{x:10.2f}" if x is not None else f"{'-':>10}"
        shape = f"{d['m']}x{d['n']}x{d['k']}"
        print(f"{shape:<20} {rows[-1]['epilogue']:<14} {fmt(h)} {fmt(w)} {fmt(t)} "
              f"{(f'{speedup:7.2f}x' if speedup else '      -')}  {'met' if met else 'MISSED'} "
              f"(>= {need:.2f}x)")
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm_tune.json").write_text(json.dumps({"dtype": a.dtype, "shapes": a.shapes, "search": a.search,
                                                    "targets": rows, "tuning": report.to_dict()},
                                                   indent=1))
    print(f"wrote {out / 'gemm_tune.json'}; all targets met: {met_all}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
