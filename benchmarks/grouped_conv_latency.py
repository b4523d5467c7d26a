"""Grouped conv2d (channel groups, not depthwise): our CUTLASS 2.x grouped fprop
kernels (families/grouped_conv.py) against cuDNN on the grouped 3x3 convs we take
(K / groups a multiple of 32) from ResNeXt and RegNetY (issue 19).

All problems go into one model and one library (``cutlass_offload.compile`` with
CUTLASS_OFFLOAD_GROUPED_CONV=1); each region module is then timed alone against
PyTorch's same math: ``F.conv2d(groups=g)`` on channels_last input (cuDNN) plus the
unfused bias + ReLU (a folded BatchNorm and its ReLU), and cuDNN's conv alone (what
PyTorch's side costs where Inductor fuses the epilogue elsewhere). Device time per
call as CUDA-graph replays (benchmarks/_timing.graph_ms), fresh random data, each
output checked against float32 first. Prints a table (us, ratios = cuDNN / ours,
TFLOP/s of ours) and writes JSON. Needs a GPU.

``--write-pytorch-faster FILE`` merges the problems where cuDNN's conv alone beats our
fused kernel (below select/pytorch_faster.DEFER_BELOW) into the measured-faster list,
so they stay in PyTorch at that batch; with ``--from-json`` it writes them from a saved
run's JSON instead (no GPU).

    python benchmarks/grouped_conv_latency.py [--batch 32] [--dtype fp16] [--json FILE]
        [--write-pytorch-faster FILE [--from-json RUN.json]]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _timing import compile_problems, conv_row, region_calls  # noqa: E402
from kernels_bench import geomean, write_pytorch_faster  # noqa: E402

# (model, C = K, input H = W, stride, groups): 3x3 grouped convs at 224 x 224 whose
# K / groups is a multiple of 32. ResNeXt (Xie et al. 2017, torchvision's
# resnext50_32x4d / resnext101_32x8d: width 4 / 8 per group at 64 base channels,
# doubling per stage; the stride-2 conv opens stages 2-4). RegNetY-4.0GF (Radosavovic
# et al. 2020, timm's regnety_040: widths 128 / 192 / 512 / 1088, group width 64).
PROBLEMS = [("resnext50_32x4d", 1024, 14, 2, 32), ("resnext50_32x4d", 1024, 7, 1, 32),
            ("resnext101_32x8d", 1024, 28, 2, 32), ("resnext101_32x8d", 1024, 14, 1, 32),
            ("resnext101_32x8d", 2048, 14, 2, 32), ("resnext101_32x8d", 2048, 7, 1, 32),
            ("regnety_040", 128, 56, 1, 2), ("regnety_040", 192, 28, 1, 3),
            ("regnety_040", 512, 14, 1, 8), ("regnety_040", 1088, 7, 1, 17)]


def pytorch_op(x, w, b, stride, groups):
    return torch.relu(F.conv2d(x, w, b, stride=stride, padding=1, groups=groups))


class AllGrouped(torch.nn.Module):
    """Every problem's conv (weights held by the model), each on its own input."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(c, c, 3, stride=s, padding=1, groups=g)
                                         for _, c, _, s, g in PROBLEMS)

    def forward(self, *xs):
        return tuple(pytorch_op(x, conv.weight, conv.bias, p[3], p[4])
                     for x, conv, p in zip(xs, self.convs, PROBLEMS))


def list_row(r: dict, dtype: str) -> dict:
    """A measured-faster list row (kernels_bench.write_pytorch_faster's shape) of a
    result row: the grouped conv's problem as the partitioner states it, against
    cuDNN's conv alone."""
    return {"kind": "conv2d", "n": r["n"], "c": r["c"], "k": r["c"], "h": r["h"], "w": r["h"],
            "r": 3, "s": 3, "pad": [1] * 4, "stride": [r["stride"]] * 2, "dilation": [1, 1],
            "dtype": {"fp16": "f16", "bf16": "bf16"}[dtype], "groups": r["groups"],
            "heuristic_us": r["ours_us"], "heuristic_speedup": r["conv_speedup"],
            "anchor": "cudnn conv alone", "anchor_us": r["cudnn_conv_us"],
            "bench": "benchmarks/grouped_conv_latency.py"}


def write_list(run: dict, path: Path, num_sms: int) -> None:
    data = write_pytorch_faster([list_row(r, run["dtype"]) for r in run["rows"]], path, run["gpu"],
                                num_sms, f"benchmarks/grouped_conv_latency.py run of {run['date']} "
                                f"({run['dtype']}, batch {run['rows'][0]['n']}; anchor: cuDNN's conv alone)",
                                merge=True)
    print(f"{sum(e.get('groups', 1) not in (1, e['c']) for e in data['conv2d'])} grouped conv "
          f"problems stay in PyTorch -> {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--json", default=None, help="default $OUT/grouped_conv_latency.json")
    ap.add_argument("--write-pytorch-faster", default=None, metavar="FILE",
                    help="merge the problems cuDNN's conv alone runs faster into FILE "
                         "(select/pytorch_faster.py)")
    ap.add_argument("--from-json", default=None, metavar="RUN",
                    help="with --write-pytorch-faster: take the rows from this saved run (no GPU)")
    a = ap.parse_args(argv)
    if a.from_json:
        if not a.write_pytorch_faster:
            ap.error("--from-json needs --write-pytorch-faster")
        run = json.loads(Path(a.from_json).read_text())
        sms = run.get("num_sms")
        if sms is None:               # runs of session 32 did not record it: the list's, same GPU
            old = json.loads(Path(a.write_pytorch_faster).read_text())
            if old.get("gpu") != run["gpu"]:
                ap.error(f"{a.from_json} has no SM count and {a.write_pytorch_faster} is for "
                         f"{old.get('gpu')}, not {run['gpu']}")
            sms = old["num_sms"]
        write_list(run, Path(a.write_pytorch_faster), sms)
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ["CUTLASS_OFFLOAD_GROUPED_CONV"] = "1"
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    cl = torch.channels_last

    def inputs(batch):
        return [torch.randn(batch, c, h, h, device="cuda").to(dt).contiguous(memory_format=cl)
                for _, c, h, _, _ in PROBLEMS]
    torch.manual_seed(0)         # compiled at the timed batch: its tiles are chosen for it
    model = AllGrouped().to(dt)
    compiled, build_s = compile_problems(model, tuple(x.cpu() for x in inputs(a.batch)), len(PROBLEMS))
    model = model.cuda()
    xs = inputs(a.batch)
    calls = region_calls(compiled, xs)
    rows = []
    for i, (name, c, h, stride, g) in enumerate(PROBLEMS):
        x, w, b = xs[i], model.convs[i].weight.detach(), model.convs[i].bias.detach()
        mod, args = calls[i]
        out, timed = conv_row(mod, args, lambda: pytorch_op(x, w, b, stride, g),
                              lambda: F.conv2d(x, w, None, stride=stride, padding=1, groups=g),
                              lambda: pytorch_op(x.float(), w.float(), b.float(), stride, g))
        p = out.shape[-1]
        flops = 2 * a.batch * p * p * c * (c // g) * 9
        rows.append({"model": name, "n": a.batch, "c": c, "h": h, "stride": stride, "groups": g,
                     **timed, "ours_tflops": flops / timed["ours_us"] / 1e6})
    gm, gm_conv = geomean(r["speedup"] for r in rows), geomean(r["conv_speedup"] for r in rows)
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, {a.dtype}, batch {a.batch}; "
          f"one library of {len(PROBLEMS)} kernels built in {build_s:.0f} s")
    print("| model | C = K | H | stride | groups | kernel | ours us | cuDNN + bias + ReLU us | ratio "
          "| cuDNN conv alone us | ratio | ours TFLOP/s | rel. err |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['c']} | {r['h']} | {r['stride']} | {r['groups']} | {r['kernel']} | "
              f"{r['ours_us']:.1f} | {r['cudnn_us']:.1f} | {r['speedup']:.2f} | {r['cudnn_conv_us']:.1f} | "
              f"{r['conv_speedup']:.2f} | {r['ours_tflops']:.0f} | {r['rel_err']:.1e} |")
    print(f"geomean cuDNN / ours: {gm:.2f}x (min {min(r['speedup'] for r in rows):.2f}x); "
          f"cuDNN's conv alone / ours: {gm_conv:.2f}x (min {min(r['conv_speedup'] for r in rows):.2f}x)")
    out = Path(a.json or Path(os.environ.get("OUT", ".")) / "grouped_conv_latency.json")
    run = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "num_sms": torch.cuda.get_device_properties(0).multi_processor_count,
           "date": time.strftime("%Y-%m-%d"), "dtype": a.dtype, "build_s": build_s,
           "geomean_speedup": gm, "geomean_conv_speedup": gm_conv, "rows": rows}
    out.write_text(json.dumps(run, indent=1))
    print(f"wrote {out}")
    if a.write_pytorch_faster:
        write_list(run, Path(a.write_pytorch_faster), run["num_sms"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
