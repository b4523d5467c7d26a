"""Depthwise conv2d: our direct depthwise kernel (families/depthwise.py) against
cuDNN on the depthwise convs of convnext-tiny and efficientnet-b0 (issue 19 / 16).

All problems go into one model and one library (``cutlass_offload.compile``); each
region module is then timed alone against PyTorch's same math: ``F.conv2d(groups=C)``
on channels_last input (cuDNN) plus the unfused epilogue (EfficientNet's depthwise
convs carry their folded BatchNorm as a bias and a SiLU). Device time per call as
CUDA-graph replays (benchmarks/_timing.graph_ms), fresh random data, each output
checked against float32 first. Prints a table (us, ratio = cuDNN / ours, GB/s of
the compulsory traffic: x read once, y written once) and writes JSON. Needs a GPU.

cuDNN's conv is also timed alone, without bias or activation ("conv alone"): what
PyTorch's side costs where Inductor compiles the glue, which folds the epilogue into
a neighbouring kernel (torch.compile runs EfficientNet's BatchNorm + SiLU inside the
squeeze-excite mean's reduction, for one). ``--write-pytorch-faster`` writes the
problems where that conv alone beats our fused kernel (conv-alone / ours below
select/pytorch_faster.DEFER_BELOW) to the measured-faster list, so they stay in
PyTorch; ``--merge-pytorch-faster`` keeps the list's entries for other problems.

    python benchmarks/depthwise_latency.py [--batch 32] [--dtype fp16] [--json FILE]
        [--write-pytorch-faster FILE [--merge-pytorch-faster]]
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

# (model, C, H = W, R = S, stride, SiLU after): every distinct depthwise conv of the two
# architectures at 224 x 224 (timm's convnext_tiny and efficientnet_b0)
PROBLEMS = [("convnext-tiny", 96, 56, 7, 1, False), ("convnext-tiny", 192, 28, 7, 1, False),
            ("convnext-tiny", 384, 14, 7, 1, False), ("convnext-tiny", 768, 7, 7, 1, False),
            ("efficientnet-b0", 32, 112, 3, 1, True), ("efficientnet-b0", 96, 112, 3, 2, True),
            ("efficientnet-b0", 144, 56, 3, 1, True), ("efficientnet-b0", 144, 56, 5, 2, True),
            ("efficientnet-b0", 240, 28, 5, 1, True), ("efficientnet-b0", 240, 28, 3, 2, True),
            ("efficientnet-b0", 480, 14, 3, 1, True), ("efficientnet-b0", 480, 14, 5, 1, True),
            ("efficientnet-b0", 672, 14, 5, 1, True), ("efficientnet-b0", 672, 14, 5, 2, True),
            ("efficientnet-b0", 1152, 7, 5, 1, True), ("efficientnet-b0", 1152, 7, 3, 1, True)]


def pytorch_op(x, w, b, stride, silu):
    y = F.conv2d(x, w, b, stride=stride, padding=w.shape[-1] // 2, groups=x.shape[1])
    return F.silu(y) if silu else y


class AllDepthwise(torch.nn.Module):
    """Every problem's conv (weights held by the model, as in the real ones), each on
    its own input."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            torch.nn.Conv2d(c, c, r, stride=stride, padding=r // 2, groups=c)
            for _, c, _, r, stride, _ in PROBLEMS)

    def forward(self, *xs):
        return tuple(pytorch_op(x, conv.weight, conv.bias, p[4], p[5])
                     for x, conv, p in zip(xs, self.convs, PROBLEMS))


def list_row(r: dict, dtype: str) -> dict:
    """A measured-faster list row (benchmarks/kernels.write_pytorch_faster's shape:
    ConvProblem fields, heuristic_us / _speedup, anchor / _us) of a result row: the
    depthwise conv's problem as the partitioner states it, against cuDNN's conv alone."""
    pad = r["r"] // 2
    return {"kind": "conv2d", "n": r["n"], "c": r["c"], "k": r["c"], "h": r["h"], "w": r["h"],
            "r": r["r"], "s": r["r"], "pad": [pad] * 4, "stride": [r["stride"]] * 2,
            "dilation": [1, 1], "dtype": {"fp16": "f16", "bf16": "bf16"}[dtype], "groups": r["c"],
            "heuristic_us": r["ours_us"], "heuristic_speedup": r["conv_speedup"],
            "anchor": "cudnn conv alone", "anchor_us": r["cudnn_conv_us"],
            "bench": "benchmarks/depthwise_latency.py"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--json", default=None, help="default $OUT/depthwise_latency.json")
    ap.add_argument("--write-pytorch-faster", default=None, metavar="FILE",
                    help="write the problems cuDNN's conv alone runs faster (select/pytorch_faster.py)")
    ap.add_argument("--merge-pytorch-faster", action="store_true",
                    help="keep FILE's entries for problems this run does not measure")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    cl = torch.channels_last

    def inputs(batch):
        return [torch.randn(batch, c, h, h, device="cuda").to(dt).contiguous(memory_format=cl)
                for _, c, h, _, _, _ in PROBLEMS]
    torch.manual_seed(0)
    model = AllDepthwise().to(dt)
    compiled, build_s = compile_problems(model, tuple(x.cpu() for x in inputs(2)), len(PROBLEMS))
    model = model.cuda()
    xs = inputs(a.batch)
    calls = region_calls(compiled, xs)
    rows = []
    for i, (name, c, h, r, stride, silu) in enumerate(PROBLEMS):
        x, w, b = xs[i], model.convs[i].weight.detach(), model.convs[i].bias.detach()
        mod, args = calls[i]
        out, timed = conv_row(mod, args, lambda: pytorch_op(x, w, b, stride, silu),
                              lambda: F.conv2d(x, w, None, stride=stride, padding=r // 2, groups=c),
                              lambda: pytorch_op(x.float(), w.float(), b.float(), stride, silu))
        p = out.shape[-1]
        traffic = (x.numel() + a.batch * c * p * p) * x.element_size()
        rows.append({"model": name, "n": a.batch, "c": c, "h": h, "r": r, "stride": stride, "silu": silu,
                     **timed, "ours_gbs": traffic / timed["ours_us"] / 1e3})
    gm, gm_conv = geomean(r["speedup"] for r in rows), geomean(r["conv_speedup"] for r in rows)
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, {a.dtype}, batch {a.batch}; "
          f"one library of {len(PROBLEMS)} kernels built in {build_s:.0f} s")
    print("| model | C | H | RxS | stride | SiLU | ours us | cuDNN us | cuDNN / ours | cuDNN conv alone us "
          "| conv alone / ours | ours GB/s | rel. err |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['c']} | {r['h']} | {r['r']}x{r['r']} | {r['stride']} | {r['silu']} | "
              f"{r['ours_us']:.1f} | {r['cudnn_us']:.1f} | {r['speedup']:.2f} | {r['cudnn_conv_us']:.1f} | "
              f"{r['conv_speedup']:.2f} | {r['ours_gbs']:.0f} | {r['rel_err']:.1e} |")
    print(f"geomean cuDNN / ours: {gm:.2f}x (min {min(r['speedup'] for r in rows):.2f}x); "
          f"cuDNN's conv alone / ours: {gm_conv:.2f}x (min {min(r['conv_speedup'] for r in rows):.2f}x)")
    if a.write_pytorch_faster:
        data = write_pytorch_faster([list_row(r, a.dtype) for r in rows], Path(a.write_pytorch_faster),
                                    torch.cuda.get_device_name(),
                                    torch.cuda.get_device_properties(0).multi_processor_count,
                                    f"benchmarks/depthwise_latency.py run of {time.strftime('%Y-%m-%d')} "
                                    f"({a.dtype}, batch {a.batch}; anchor: cuDNN's conv alone)",
                                    merge=a.merge_pytorch_faster)
        print(f"{sum(e.get('groups', 1) == e['c'] == e['k'] > 1 for e in data['conv2d'])} depthwise problems stay in "
              f"PyTorch -> {a.write_pytorch_faster}")
    out = Path(a.json or Path(os.environ.get("OUT", ".")) / "depthwise_latency.json")
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "date": time.strftime("%Y-%m-%d"), "dtype": a.dtype, "build_s": build_s,
                               "geomean_speedup": gm, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
