"""Median latency of the offloaded group_norm (+ SiLU) kernels against PyTorch's, on
a GPU, for the group norms of the Stable Diffusion 1.5 UNet (batch 2, 32 groups).

Inputs are channels_last, as in the UNet (``cutlass-offload compile sd-unet``
runs every conv NHWC). Every case is one region of a single compiled suite model
(one library); each region module is timed on its own against the same
GroupNorm (+ SiLU) module in PyTorch:

* ours: the region module (its ctypes launch; output channels_last);
* pytorch: nn.GroupNorm then F.silu (PyTorch returns an NCHW-contiguous tensor
  for a channels_last CUDA input);
* pytorch+nhwc: the same followed by ``.contiguous(memory_format=channels_last)``,
  the copy the conv after it pays (the UNet's layout conversions).

Each is measured as one Python call (eager) and as the device time of 20 calls
replayed in one CUDA graph (graph). Medians from triton.testing.do_bench when
triton is installed, else CUDA events. ``count`` is how often the shape occurs in
one UNet forward; the last line sums count x graph time. Prints a table and
writes JSON to $OUT/group_norm_latency.json (default ./out).

    python benchmarks/group_norm_latency.py [--arch sm_90a] [--dtype fp16|bf16] [--batch 2]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))              # _timing
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import cutlass_offload as co     # noqa: E402
from cutlass_offload.ir import GroupNormRegion     # noqa: E402
from _timing import graph_ms, median_ms     # noqa: E402

CL = torch.channels_last

# (C, H, W, eps, silu, occurrences in one SD 1.5 UNet forward), from partitioning
# the built-in sd-unet: 61 group norms, 45 followed by SiLU (ResnetBlock2D), 16
# without (Transformer2DModel, eps 1e-6)
SD_GROUP_NORMS = [
    (320, 64, 64, 1e-5, True, 8), (320, 64, 64, 1e-6, False, 5), (320, 32, 32, 1e-5, True, 1),
    (640, 64, 64, 1e-5, True, 2), (640, 32, 32, 1e-5, True, 6), (640, 32, 32, 1e-6, False, 5),
    (640, 16, 16, 1e-5, True, 1), (960, 64, 64, 1e-5, True, 1), (960, 32, 32, 1e-5, True, 1),
    (1280, 32, 32, 1e-5, True, 1), (1280, 16, 16, 1e-5, True, 6), (1280, 16, 16, 1e-6, False, 5),
    (1280, 8, 8, 1e-5, True, 11), (1280, 8, 8, 1e-6, False, 1), (1920, 32, 32, 1e-5, True, 1),
    (1920, 16, 16, 1e-5, True, 1), (2560, 16, 16, 1e-5, True, 2), (2560, 8, 8, 1e-5, True, 3),
]


class GnSilu(nn.Module):
    def __init__(self, c, eps, silu):
        super().__init__()
        self.norm = nn.GroupNorm(32, c, eps=eps)
        self.silu = silu

    def forward(self, x):
        y = self.norm(x)
        return F.silu(y) if self.silu else y


class Suite(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, *xs):
        return tuple(m(x) for m, x in zip(self.blocks, xs))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None, help="sm_90a / sm_80 (default: the visible GPU)")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--batch", type=int, default=2)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("group_norm_latency: needs a CUDA GPU")
        sys.exit(2)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    blocks, xs = [], []
    for c, h, w, eps, silu, _ in SD_GROUP_NORMS:
        m = GnSilu(c, eps, silu)
        with torch.no_grad():
            m.norm.weight.normal_(1.0, 0.2)
            m.norm.bias.normal_(0.0, 0.2)
        blocks.append(m.to(dtype).cuda().eval())
        xs.append(torch.randn(a.batch, c, h, w, dtype=dtype, device="cuda").contiguous(memory_format=CL))
    suite = Suite(blocks)
    compiled = co.compile(suite, tuple(xs), arch=a.arch)
    mods = [m for m in compiled.region_modules() if isinstance(m.region, GroupNormRegion)]
    assert len(mods) == len(SD_GROUP_NORMS) and not compiled.plan.fallbacks, compiled.report.format()
    rows = []
    with torch.no_grad():
        for (c, h, w, eps, silu, count), m, mod, x in zip(SD_GROUP_NORMS, blocks, mods, xs):
            wt, b = m.norm.weight, m.norm.bias
            ours = mod(x, wt, b)
            ref = m(x)
            err = float((ours.double() - ref.double()).norm() / ref.double().norm())
            assert ours.is_contiguous(memory_format=CL)
            name = f"{c}x{h}x{w}" + ("_silu" if silu else "")
            nbytes = 2 * x.numel() * x.element_size()
            for impl, fn in (("cutlass_offload", lambda mod=mod, x=x, wt=wt, b=b: mod(x, wt, b)),
                             ("pytorch", lambda m=m, x=x: m(x)),
                             ("pytorch+nhwc", lambda m=m, x=x: m(x).contiguous(memory_format=CL))):
                eager, graph = median_ms(fn), graph_ms(fn)
                rows.append({"case": name, "shape": [a.batch, c, h, w], "eps": eps, "silu": silu,
                             "count_per_unet": count, "impl": impl,
                             "kernel": mod.kernel.name if impl == "cutlass_offload" else "",
                             "eager_us": eager * 1e3, "graph_us": graph * 1e3,
                             "graph_gb_per_s": nbytes / (graph * 1e-3) / 1e9, "rel_err_vs_pytorch": err})
            assert mod.fallback_calls == 0, f"{name}: the region fell back to PyTorch"
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, {a.dtype}, batch {a.batch}, channels_last inputs; eager = one Python call, "
          "graph = device time per call")
    print(f"{'case':<18} {'x/UNet':>6} {'impl':<16} {'eager us':>9} {'graph us':>9} {'GB/s':>7} {'rel err':>8}")
    for r in rows:
        print(f"{r['case']:<18} {r['count_per_unet']:>6} {r['impl']:<16} {r['eager_us']:>9.1f} "
              f"{r['graph_us']:>9.2f} {r['graph_gb_per_s']:>7.0f} {r['rel_err_vs_pytorch']:>8.1e}")
    totals = {}
    for r in rows:
        totals[r["impl"]] = totals.get(r["impl"], 0.0) + r["count_per_unet"] * r["graph_us"]
    print("per UNet forward (sum of count x graph us): " +
          ", ".join(f"{k} {v:.1f} us" for k, v in totals.items()))
    path = out_dir / "group_norm_latency.json"
    path.write_text(json.dumps({"gpu": gpu, "dtype": a.dtype, "batch": a.batch, "torch": torch.__version__,
                                "results": rows, "unet_total_graph_us": totals}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
