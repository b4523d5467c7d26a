"""Where a conv region's time goes, kernel by kernel (issue 15: "the profile that
shows it"): each conv is compiled alone (fp16, channels_last, with a bias, eager
glue) and run under torch.profiler; per forward it prints the CUDA time of every
kernel ours launches (a lowered conv's im2col pack and GEMM separately:
families/conv_gemm_sm90.py) beside cuDNN's for the same conv + bias, and writes
JSON. ``--table FILE``: select with that learned GEMM table (select/sm90.py).

    python benchmarks/conv_profile.py [--convs stem,effnet_stem,pointwise16,...] [--table FILE]
        [--json FILE]

Needs a CUDA GPU (exits 2 without one).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# name -> (N, C, H, W, K, R, stride, pad): the lowered convs below 0.80x cuDNN in
# benchmarks/results/kernels_lowered_2026-12-01_h200.log, and two that win
CONVS = {
    "stem": (8, 3, 224, 224, 64, 7, 2, 3),            # ResNet-50 (im2col)
    "effnet_stem": (32, 3, 224, 224, 32, 3, 2, 1),    # EfficientNet-B0 (im2col)
    "patchify": (32, 3, 224, 224, 96, 4, 4, 0),       # ConvNeXt (im2col)
    "pointwise16": (32, 32, 112, 112, 16, 1, 1, 0),   # EfficientNet-B0 (direct)
    "pointwise24": (32, 96, 56, 56, 24, 1, 1, 0),     # EfficientNet-B0 (direct)
    "vae_out": (1, 128, 512, 512, 3, 3, 1, 1),        # VAE decoder, 3 output channels (2.x)
}
REPS = 20


def kernel_times(fn) -> dict:
    """{kernel name: us per call} over REPS calls of ``fn`` (after warm-up)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            out[e.key] = e.device_time_total / REPS
    return out


def profile(name: str, spec: tuple) -> dict:
    import cutlass_offload as co
    n, c, h, w, k, r, stride, pad = spec
    torch.manual_seed(0)
    m = torch.nn.Conv2d(c, k, r, stride=stride, padding=pad).half().cuda().to(memory_format=torch.channels_last).eval()
    x = torch.randn(n, c, h, w, device="cuda").half().contiguous(memory_format=torch.channels_last)
    compiled = co.compile(m, (x,), glue="eager", strict=True)
    kernels = [kk.name for kk in compiled.plan.kernels]
    with torch.no_grad():
        ours = kernel_times(lambda: compiled(x))
        cudnn = kernel_times(lambda: m(x))
        ref = copy.deepcopy(m).float()(x.float())
        err = float((compiled(x).float() - ref).norm() / ref.norm())
    row = {"conv": name, "shape": spec, "kernel": kernels, "ours_us": ours, "cudnn_us": cudnn,
           "ours_total_us": sum(ours.values()), "cudnn_total_us": sum(cudnn.values()), "rel_err": err}
    print(f"\n{name} n{n} {h}x{w}x{c} -> {k} {r}x{r}/s{stride}: ours {row['ours_total_us']:.1f} us "
          f"vs cuDNN {row['cudnn_total_us']:.1f} us (rel. err {err:.1e}); {kernels}")
    for label, times in (("ours", ours), ("cudnn", cudnn)):
        for kname, us in sorted(times.items(), key=lambda t: -t[1]):
            print(f"  {label:6s} {us:8.2f} us  {kname[:110]}")
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--convs", default=",".join(CONVS))
    p.add_argument("--table", default=None, help="a learned GEMM table for select (select/sm90.py)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.table:
        from cutlass_offload.select import sm90
        sm90.use_table(Path(args.table))
    if not torch.cuda.is_available():
        print("conv_profile.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = [profile(name, CONVS[name]) for name in args.convs.split(",")]
    out = Path(args.json or (Path(os.environ["OUT"]) / "conv_profile.json" if os.environ.get("OUT")
                             else Path(__file__).parent / "results" / "conv_profile.json"))
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                               "rows": rows}, indent=1))
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
