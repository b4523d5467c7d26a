"""Sliding-window causal attention (transformers' ``sliding_window``): our Hopper region
against what PyTorch offers.

The attention is SDPA with grouped K/V heads (``enable_gqa``) and the boolean mask
transformers builds for a sliding layer, query i seeing keys i - W < j <= i, computed
in the model from its sizes. Shapes: Gemma 3's sliding layers (1B: 4 / 1 heads, head
dim 256, W 512; 4B: 8 / 4 heads, W 1024) and Mistral 7B v0.1's (32 / 8 heads, head dim
128, W 4096), at prefill lengths beyond the window. Per shape:

* ours: ``co.compile(...)`` of the form, the window folded into the sm_90a kernel
  (``AttentionProblem.window``, emit/attention_sm90.py's WindowFusion);
* ours_bias: the same with the fold off (``attention_forms.SLIDING_WINDOW = False``):
  the mask is the sm80 kernel's bias, what this project ran before;
* sdpa: the form in PyTorch (SDPA with the mask: its memory-efficient or cuDNN kernel);
* flex: ``torch.compile(flex_attention)`` with a sliding-window block mask
  (transformers' ``attn_implementation="flex_attention"``).

Median ms (``_timing.median_ms``), ratios = anchor / ours (above 1: ours faster), and
each one's norm-wise error against the form in float32. Prints a table and writes
$OUT/window_attention.json (default ./out). ``--prebuild-only`` compiles both of ours
for every shape (CPU tensors, no GPU) into the kernel cache.

    python benchmarks/window_attention.py [--dtype fp16|bf16] [--prebuild-only]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))              # _timing
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import cutlass_offload as co                                          # noqa: E402
from cutlass_offload.partition import attention_forms                 # noqa: E402

# name: (query heads, K/V heads, head dim, window, [(batch, seq), ...])
SHAPES = {"gemma3-1b": (4, 1, 256, 512, [(2, 2048), (1, 8192)]),
          "gemma3-4b": (8, 4, 256, 1024, [(1, 4096)]),
          "mistral-7b": (32, 8, 128, 4096, [(1, 8192)])}


class SlidingWindowSdpa(torch.nn.Module):
    """(B, H, L, D) q, (B, Hkv, L, D) k, v -> (B, H, L, D): SDPA with the sliding mask."""

    def __init__(self, window):
        super().__init__()
        self.window = window

    def forward(self, q, k, v):
        L = q.shape[-2]
        i = torch.arange(L, device=q.device)[:, None]
        j = torch.arange(L, device=q.device)[None, :]
        mask = (j <= i) & (j > i - self.window)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              enable_gqa=k.shape[1] != q.shape[1])


def _compile(form, xs, fold: bool):
    before = attention_forms.SLIDING_WINDOW
    attention_forms.SLIDING_WINDOW = fold
    try:
        return co.compile(form, xs, arch="sm_90a", glue="eager")
    finally:
        attention_forms.SLIDING_WINDOW = before


def _flex(L, window, groups):
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    block_mask = create_block_mask(lambda b, h, qi, ki: (ki <= qi) & (ki > qi - window),
                                   None, None, L, L, device="cuda")
    flex = torch.compile(flex_attention)
    return lambda q, k, v: flex(q, k, v, block_mask=block_mask, enable_gqa=groups > 1)


def _inputs(b, h, hkv, L, d, dtype, device):
    g = torch.Generator(device=device).manual_seed(L + h)
    return tuple(torch.randn(b, n, L, d, generator=g, device=device).to(dtype)
                 for n in (h, hkv, hkv))


def _rel(out, want):
    return float((out.float() - want).norm() / want.norm())


def run(dtype, prebuild_only=False):
    from _timing import median_ms
    rows = []
    for name, (h, hkv, d, w, sizes) in SHAPES.items():
        for b, L in sizes:
            form = SlidingWindowSdpa(w)
            xs = _inputs(b, h, hkv, L, d, dtype, "cpu" if prebuild_only else "cuda")
            ours, bias = _compile(form, xs, True), _compile(form, xs, False)
            kernels = {n: [str(k.name) for k in m.plan.distinct_kernels]
                       for n, m in (("ours", ours), ("ours_bias", bias))}
            if prebuild_only:
                print(name, b, L, kernels, flush=True)
                continue
            fns = {"ours": lambda: ours(*xs), "ours_bias": lambda: bias(*xs),
                   "sdpa": lambda: form(*xs)}
            flex = _flex(L, w, h // hkv)
            if flex is not None:
                fns["flex"] = lambda: flex(*xs)
            with torch.no_grad():
                want = form(*(x.float() for x in xs))      # fp32 SDPA: no L x L matrix in memory
                errs = {n: _rel(f(), want) for n, f in fns.items()}
                ms = {n: median_ms(f) for n, f in fns.items()}
            row = {"shape": name, "batch": b, "heads": h, "kv_heads": hkv, "seq": L, "head_dim": d,
                   "window": w, "kernels": kernels, "ms": ms, "rel_err": errs,
                   "ratio": {n: ms[n] / ms["ours"] for n in ms if n != "ours"}}
            rows.append(row)
            print(f"{name:10s} B={b} L={L:5d} W={w}  " +
                  "  ".join(f"{n} {ms[n]:.3f} ms" for n in ms) + "  |  " +
                  "  ".join(f"{n}/ours {r:.2f}x" for n, r in row["ratio"].items()) +
                  "  |  err " + " ".join(f"{n} {e:.1e}" for n, e in errs.items()), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    ap.add_argument("--prebuild-only", action="store_true")
    a = ap.parse_args(argv)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    if a.prebuild_only:
        run(dtype, prebuild_only=True)
        return
    if not torch.cuda.is_available():
        sys.exit("window_attention.py needs a CUDA GPU (or --prebuild-only)")
    from _timing import write_result
    write_result("window_attention", {"rows": run(dtype)}, dtype=a.dtype)


if __name__ == "__main__":
    main()
