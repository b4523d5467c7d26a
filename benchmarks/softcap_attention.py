"""Gemma 2's soft-capped causal attention: our Hopper region against what PyTorch offers.

The attention is transformers' Gemma2 eager_attention_forward: logits ``q @ k^T *
scale``, soft-capped ``cap * tanh(s / cap)``, a causal mask added, softmax in fp32,
``@ v`` (SDPA has no soft-cap, so transformers' SDPA path drops it). Shapes are
Gemma 2's attention (head dim 256, scale 256^-0.5 from query_pre_attn_scalar 256,
cap 50; 8 heads of the 2B model, 16 of the 9B) at prefill lengths. Per shape:

* ours: ``co.compile(...)`` of the form (one attention region on the sm_90a
  kernel's SoftcapFusion, emit/attention_sm90.py), called as a model;
* eager: the same form in PyTorch (two GEMMs, the tanh, the mask, the softmax);
* compile: ``torch.compile`` (default mode) of that form;
* flex: ``torch.compile(flex_attention)`` with a soft-cap ``score_mod`` and a causal
  block mask (transformers' ``attn_implementation="flex_attention"``).

Median ms (``_timing.median_ms``: triton's do_bench), ratios = anchor / ours (above
1: ours faster), and ours' norm-wise error against the float32 form next to eager
fp16's. Prints a table and writes $OUT/softcap_attention.json (default ./out).

    python benchmarks/softcap_attention.py [--dtype fp16|bf16] [--seqs 1024,4096]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))              # _timing
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import cutlass_offload as co                                          # noqa: E402
from _timing import median_ms, write_result                                         # noqa: E402

HEAD_DIM, CAP = 256, 50.0
SCALING = HEAD_DIM ** -0.5        # Gemma 2: query_pre_attn_scalar ** -0.5
SHAPES = {"gemma2-2b": 8, "gemma2-9b": 16}                             # query heads


class SoftcappedCausal(torch.nn.Module):
    """(B, H, L, 256) q, k, v -> (B, H, L, 256): Gemma 2's eager attention."""

    def forward(self, q, k, v):
        L = q.shape[-2]
        w = torch.matmul(q, k.transpose(2, 3)) * SCALING
        w = torch.tanh(w / CAP) * CAP
        keep = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        w = w + torch.zeros(L, L, dtype=w.dtype, device=q.device).masked_fill(
            ~keep, torch.finfo(w.dtype).min)
        p = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(p, v)


def _flex(L):
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None

    def softcap(score, b, h, qi, ki):
        return CAP * torch.tanh(score / CAP)

    block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, L, L, device="cuda")
    flex = torch.compile(flex_attention)
    return lambda q, k, v: flex(q, k, v, score_mod=softcap, block_mask=block_mask, scale=SCALING)


def _rel(out, want):
    return float((out.float() - want).norm() / want.norm())


def run(dtype, seqs, batch):
    rows = []
    for name, heads in SHAPES.items():
        for L in seqs:
            g = torch.Generator(device="cuda").manual_seed(L)
            q, k, v = (torch.randn(batch, heads, L, HEAD_DIM, generator=g, device="cuda").to(dtype) * 2
                       for _ in range(3))
            form = SoftcappedCausal()
            t0 = time.perf_counter()
            ours = co.compile(form, (q, k, v), arch="sm_90a", glue="eager")
            build_s = time.perf_counter() - t0
            kernels = [str(kk.name) for kk in ours.plan.distinct_kernels]
            fns = {"ours": lambda: ours(q, k, v), "eager": lambda: form(q, k, v)}
            comp = torch.compile(form)
            fns["compile"] = lambda: comp(q, k, v)
            flex = _flex(L)
            if flex is not None:
                fns["flex"] = lambda: flex(q, k, v)
            with torch.no_grad():
                want = form(q.double(), k.double(), v.double()).float()
                errs = {n: _rel(f(), want) for n, f in fns.items()}
                ms = {n: median_ms(f) for n, f in fns.items()}
            row = {"shape": name, "batch": batch, "heads": heads, "seq": L, "head_dim": HEAD_DIM,
                   "kernels": kernels, "build_s": round(build_s, 1), "ms": ms, "rel_err": errs,
                   "ratio": {n: ms[n] / ms["ours"] for n in ms if n != "ours"}}
            rows.append(row)
            print(f"{name:10s} B={batch} H={heads:2d} L={L:5d}  " +
                  "  ".join(f"{n} {ms[n]:.3f} ms" for n in ms) + "  |  " +
                  "  ".join(f"{n}/ours {r:.2f}x" for n, r in row["ratio"].items()) +
                  f"  |  err ours {errs['ours']:.1e} eager {errs['eager']:.1e}", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument("--batch", type=int, default=2)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("softcap_attention.py needs a CUDA GPU")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    rows = run(dtype, [int(s) for s in a.seqs.split(",")], a.batch)
    write_result("softcap_attention", {"rows": rows}, dtype=a.dtype)


if __name__ == "__main__":
    main()
