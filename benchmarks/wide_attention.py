"""Attention of head dim above 256 (the SD VAE's 512): ours as two GEMM regions and a
softmax (partition/wide_attention.py) against our fused sm80 kernel and every SDPA
backend, on a GPU.

Per problem (batch, heads, tokens, head dim) and dtype, one SDPA module compiled for
the visible GPU three ways (measured-faster lists off, so ours always runs ours):
``fused`` (decompose_wide_attention off: the sm80 memory-efficient kernel, which
keeps O in global memory at this head dim), ``gemms_eager`` (the two GEMM regions
with the softmax and q's scale in eager PyTorch) and ``gemms_inductor`` (the same
with the glue compiled by Inductor, default mode). Anchors: SDPA under each backend
that takes the inputs (flash, cuDNN, efficient, math), the fastest counted. Every
variant is timed as ``calls`` calls in one CUDA graph, replayed (device time per
call, _timing.graph_ms), on fresh random inputs, and checked against float64 SDPA
(norm-wise relative error; PyTorch's own fp16 SDPA error printed beside it).
Prints a table; writes JSON (``--json``, default $OUT/wide_attention.json).

    python benchmarks/wide_attention.py [--shapes 1x1x4096x512,1x1x1024x512] [--dtypes fp16,bf16]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))              # _timing
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _timing import graph_ms                                           # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
VARIANTS = {"fused": (False, "eager"), "gemms_eager": (True, "eager"), "gemms_inductor": (True, "inductor")}


class SDPA(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def compiled(decompose: bool, glue: str, inputs):
    from cutlass_offload.api import compile_captured, resolve_arch
    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions
    opts = CompileOptions(arch=resolve_arch(None), pytorch_when_faster=False,
                          decompose_wide_attention=decompose)
    return compile_captured(capture(SDPA(), inputs), opts, glue=glue)


def rel_err(got, want) -> float:
    return float((got.double() - want).norm() / want.norm())


def anchors(q, k, v, us=lambda fn: graph_ms(fn) * 1e3) -> dict:
    """{backend: us per call (``us``), or why it cannot run these inputs}."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = {}
    for name, b in (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"),
                    ("efficient", "EFFICIENT_ATTENTION"), ("math", "MATH")):
        backend = getattr(SDPBackend, b, None)
        if backend is None:
            continue

        def fn(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v)
        try:
            fn()
            out[name] = us(fn)
        except RuntimeError as e:
            out[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return out


def bench(shape, dtype_name) -> dict:
    b, h, s, e = shape
    dt = DTYPES[dtype_name]
    q, k, v = (torch.randn(b, h, s, e, device="cuda", dtype=dt) for _ in range(3))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    row = {"batch": b, "heads": h, "seq": s, "head_dim": e, "dtype": dtype_name,
           "gflop": 4.0 * b * h * s * s * e / 1e9,
           "pytorch_err": rel_err(F.scaled_dot_product_attention(q, k, v), want)}
    row["anchors_us"] = anchors(q, k, v)
    timed = {n: t for n, t in row["anchors_us"].items() if isinstance(t, float)}
    row["anchor"] = min(timed, key=timed.get)
    row["anchor_us"] = timed[row["anchor"]]
    for name, (decompose, glue) in VARIANTS.items():
        t0 = time.perf_counter()
        try:
            model = compiled(decompose, glue, (q, k, v))
            regions = [f"{r['form']}: {r['kernel']}" for r in model.report.regions]
            with torch.no_grad():
                fresh = tuple(torch.randn_like(x) for x in (q, k, v))
                out = model(*fresh)
                out = out[0] if isinstance(out, (tuple, list)) else out
                err = rel_err(out, F.scaled_dot_product_attention(*(x.double() for x in fresh)))
                us = graph_ms(lambda: model(q, k, v)) * 1e3
            row[name] = {"us": us, "rel_err": err, "speedup": row["anchor_us"] / us,
                         "compile_s": time.perf_counter() - t0, "regions": regions,
                         "kept_in_pytorch": [f["reason"] for f in model.report.fallbacks]}
        except Exception as ex:  # noqa: BLE001 - a benchmark row records why a variant failed
            row[name] = {"error": f"{type(ex).__name__}: {str(ex)[:300]}"}
    return row


def corpus_row(entry: dict, dtype: torch.dtype, us) -> dict:
    """The fields of benchmarks/kernels_bench.py's row for a corpus attention ``entry``
    that partition sends to two GEMMs (no attention region to time): ours is the
    SDPA module compiled with Inductor glue (the GEMMs and the softmax between them),
    timed by ``us`` (kernels_bench.graph_us) against each SDPA backend on the same
    fresh q / k / v; rel_err_vs_pytorch against PyTorch's own SDPA."""
    b, h = entry["batch"], entry["heads"]
    q = torch.randn(b, h, entry["seq_q"], entry["head_dim"], device="cuda", dtype=dtype)
    k = torch.randn(b, h, entry["seq_kv"], entry["head_dim"], device="cuda", dtype=dtype)
    v = torch.randn(b, h, entry["seq_kv"], entry["head_dim_v"], device="cuda", dtype=dtype)
    model = compiled(True, "inductor", (q, k, v))
    with torch.no_grad():
        row = {"kernel": "two GEMMs + softmax (partition/wide_attention.py, Inductor glue): "
                         + ", ".join(r["kernel"] for r in model.report.regions),
               "rel_err_vs_pytorch": rel_err(model(q, k, v), F.scaled_dot_product_attention(q, k, v).double()),
               "heuristic_us": us(lambda: model(q, k, v)), "fell_back": False}
    times = anchors(q, k, v, us)          # the same timer as ours
    row["anchors_us"] = {n: t if isinstance(t, float) else None for n, t in times.items()}
    errors = {n: t for n, t in times.items() if not isinstance(t, float)}
    if errors:
        row["anchor_errors"] = errors
    ok = {n: t for n, t in row["anchors_us"].items() if t}
    if ok:
        row["anchor"] = min(ok, key=ok.get)
        row["anchor_us"] = ok[row["anchor"]]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1x1x4096x512,1x1x1024x512,2x1x4096x512",
                   help="BxHxSxE,... (batch, heads, tokens, head dim)")
    p.add_argument("--dtypes", default="fp16,bf16")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(a.json or Path(os.environ.get("OUT", "out")) / "wide_attention.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": datetime.date.today().isoformat(), "rows": []}
    for shape in a.shapes.split(","):
        for dt in a.dtypes.split(","):
            row = bench(tuple(int(x) for x in shape.split("x")), dt)
            result["rows"].append(row)
            out.write_text(json.dumps(result, indent=1))
    print(f"{result['gpu']}, torch {result['torch']}; us per call (CUDA-graph replays), "
          "speedup = fastest SDPA backend / ours\n")
    print("| problem | dtype | best SDPA us | fused us | GEMMs eager us | GEMMs Inductor us "
          "| speedup fused / eager / Inductor | rel err ours (Inductor) / PyTorch's |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in result["rows"]:
        def us(n):
            v = r[n]
            return f"{v['us']:.1f}" if "us" in v else "error"

        def sp(n):
            v = r[n]
            return f"{v['speedup']:.2f}x" if "us" in v else "-"
        err = r["gemms_inductor"].get("rel_err")
        print(f"| b{r['batch']} h{r['heads']} {r['seq']} d{r['head_dim']} | {r['dtype']} | "
              f"{r['anchor_us']:.1f} {r['anchor']} | {us('fused')} | {us('gemms_eager')} | "
              f"{us('gemms_inductor')} | {sp('fused')} / {sp('gemms_eager')} / {sp('gemms_inductor')} | "
              f"{err if err is None else f'{err:.1e}'} / {r['pytorch_err']:.1e} |")
    for r in result["rows"]:
        for n in VARIANTS:
            if "error" in r[n]:
                print(f"{n} b{r['batch']} h{r['heads']} {r['seq']} d{r['head_dim']} {r['dtype']}: {r[n]['error']}")
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
