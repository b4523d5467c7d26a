"""Grouped-query attention: K and V read in place against the repeat_kv copies.

The attention is transformers' SDPA path for a model with fewer K/V heads than query
heads: ``repeat_kv`` copies K and V per query head, then causal SDPA. Shapes: the zoo's
llama (TinyLlama's 32 query / 4 K/V heads, head dim 64) at its (4, 512) and at longer
prefills. Per shape, median ms (``_timing.median_ms``, triton's do_bench):

* ours: ``co.compile(...)`` of the form with ``kv_groups.GQA_IN_PLACE = True``: one
  attention region reading K and V in place (the Hopper kernel's GqaMainloop);
* ours_repeat: the same with ``kv_groups.GQA_IN_PLACE = False``: the copies run in
  PyTorch (eager glue), the region reads them (what the project did before);
* eager: the form in PyTorch (the copies, then SDPA's own choice of kernel);
* sdpa_gqa: ``F.scaled_dot_product_attention(..., enable_gqa=True)`` on K and V as
  they are (what PyTorch offers without the copies);
* compile: ``torch.compile`` (default mode) of the form.

Ratios = anchor / ours (above 1: ours faster) and norm-wise errors against float64.
Prints a table and writes $OUT/gqa_attention.json (default ./out).

    python benchmarks/gqa_attention.py [--dtype fp16|bf16] [--shapes 4x512,1x2048,1x8192]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))              # _timing
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import cutlass_offload as co                                          # noqa: E402
from cutlass_offload.partition import kv_groups                       # noqa: E402
from _timing import median_ms, write_result                                         # noqa: E402

HQ, HKV, D = 32, 4, 64           # TinyLlama-1.1B's attention


class RepeatedCausal(torch.nn.Module):
    """(B, 32, L, 64) q, (B, 4, L, 64) k, v -> (B, 32, L, 64): repeat_kv, causal SDPA."""

    def forward(self, q, k, v):
        def rep(x):
            b, h, s, d = x.shape
            return x[:, :, None].expand(b, h, HQ // HKV, s, d).reshape(b, HQ, s, d)
        return F.scaled_dot_product_attention(q, rep(k), rep(v), is_causal=True)


def _rel(out, want):
    return float((out.double() - want).norm() / want.norm())


def run(dtype, shapes):
    rows = []
    for batch, L in shapes:
        g = torch.Generator(device="cuda").manual_seed(L)
        q = torch.randn(batch, HQ, L, D, generator=g, device="cuda").to(dtype)
        k, v = (torch.randn(batch, HKV, L, D, generator=g, device="cuda").to(dtype) for _ in range(2))
        form = RepeatedCausal()
        saved = kv_groups.GQA_IN_PLACE
        try:
            kv_groups.GQA_IN_PLACE = True
            t0 = time.perf_counter()
            ours = co.compile(form, (q, k, v), arch="sm_90a", glue="eager")
            build_s = time.perf_counter() - t0
            kv_groups.GQA_IN_PLACE = False
            repeat = co.compile(form, (q, k, v), arch="sm_90a", glue="eager")
        finally:
            kv_groups.GQA_IN_PLACE = saved
        comp = torch.compile(form)
        fns = {"ours": lambda: ours(q, k, v), "ours_repeat": lambda: repeat(q, k, v),
               "eager": lambda: form(q, k, v),
               "sdpa_gqa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                  enable_gqa=True),
               "compile": lambda: comp(q, k, v)}
        with torch.no_grad():
            want = form(q.double(), k.double(), v.double())
            errs = {n: _rel(f(), want) for n, f in fns.items()}
            ms = {n: median_ms(f) for n, f in fns.items()}
        row = {"batch": batch, "seq": L, "heads": HQ, "kv_heads": HKV, "head_dim": D,
               "kernels": {"ours": [k.name for k in ours.plan.distinct_kernels],
                           "ours_repeat": [k.name for k in repeat.plan.distinct_kernels]},
               "build_s": round(build_s, 1), "ms": ms, "rel_err": errs,
               "ratio": {n: ms[n] / ms["ours"] for n in ms if n != "ours"}}
        rows.append(row)
        print(f"B={batch} L={L:5d}  " + "  ".join(f"{n} {ms[n]:.3f}" for n in ms) + " ms  |  " +
              "  ".join(f"{n}/ours {r:.2f}x" for n, r in row["ratio"].items()) +
              f"  |  err ours {errs['ours']:.1e} eager {errs['eager']:.1e}", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    ap.add_argument("--shapes", default="4x512,1x2048,1x8192", help="BATCHxSEQ,...")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("gqa_attention.py needs a CUDA GPU")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    rows = run(dtype, shapes)
    write_result("gqa_attention", {"rows": rows}, dtype=a.dtype)


if __name__ == "__main__":
    main()
