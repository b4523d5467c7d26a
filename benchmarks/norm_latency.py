"""Median latency of the offloaded norm kernels against PyTorch's, on a GPU.

Cases: bert-base's LayerNorm (8*128 x 768, eps 1e-12) and a Llama-like RMS norm
(4096 x 4096, eps 1e-6), the latter both as ``nn.RMSNorm`` (aten.rms_norm) and as
transformers writes it (LlamaRMSNorm: several PyTorch kernels). Each model is
compiled with cutlass_offload (one region) and timed against the same module in
PyTorch:

* eager: one call from Python (ours: the compiled model, i.e. the region module
  and its ctypes launch; PyTorch: the module's forward);
* graph: 20 calls captured in one CUDA graph, replayed: device time per call.

Medians from triton.testing.do_bench when triton is installed, else CUDA events.
Prints a table and writes JSON to $OUT/norm_latency.json (default ./out).

    python benchmarks/norm_latency.py [--arch sm_90a] [--dtype fp16|bf16]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))              # _timing
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # norm_cases.py

import cutlass_offload as co     # noqa: E402
from _timing import graph_ms, median_ms     # noqa: E402
from norm_cases import LlamaRMSNorm     # noqa: E402


CASES = [  # name, module factory, input shape
    ("bert_layer_norm_1024x768_eps1e-12", lambda: nn.LayerNorm(768, eps=1e-12), (8, 128, 768)),
    ("llama_rms_norm_4096x4096_eps1e-6", lambda: nn.RMSNorm(4096, eps=1e-6), (4096, 4096)),
    ("llama_written_out_rms_4096x4096", lambda: LlamaRMSNorm(4096, eps=1e-6), (4096, 4096)),
]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None, help="sm_90a / sm_80 (default: the visible GPU)")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("norm_latency: needs a CUDA GPU")
        sys.exit(2)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    torch.manual_seed(0)
    for name, make, shape in CASES:
        model = make().to(dtype).cuda().eval()
        with torch.no_grad():
            for p_ in model.parameters():
                p_.normal_(1.0, 0.1)
        x = torch.randn(shape, dtype=dtype, device="cuda")
        compiled = co.compile(model, (x,), arch=a.arch)
        assert len(compiled.plan.regions) == 1, compiled.report.format()
        (mod,) = compiled.region_modules()
        nbytes = 2 * x.numel() * x.element_size() + sum(t.numel() * t.element_size()
                                                        for t in model.parameters())
        with torch.no_grad():
            err = float((compiled(x).double() - model(x).double()).norm() / model(x).double().norm())
            for impl, fn in (("cutlass_offload", lambda c=compiled, x=x: c(x)),
                             ("pytorch", lambda m=model, x=x: m(x))):
                eager, graph = median_ms(fn), graph_ms(fn)
                rows.append({"case": name, "impl": impl, "kernel": mod.kernel.name if impl != "pytorch" else "",
                             "eager_us": eager * 1e3, "graph_us": graph * 1e3,
                             "graph_gb_per_s": nbytes / (graph * 1e-3) / 1e9, "rel_err_vs_pytorch": err})
        assert mod.fallback_calls == 0, f"{name}: the region fell back to PyTorch"
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, {a.dtype}; eager = one Python call, graph = device time per call")
    print(f"{'case':<36} {'impl':<16} {'eager us':>9} {'graph us':>9} {'GB/s':>7}")
    for r in rows:
        print(f"{r['case']:<36} {r['impl']:<16} {r['eager_us']:>9.1f} {r['graph_us']:>9.2f} "
              f"{r['graph_gb_per_s']:>7.0f}")
    path = out_dir / "norm_latency.json"
    path.write_text(json.dumps({"gpu": gpu, "dtype": a.dtype, "torch": torch.__version__,
                                "results": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
