"""Every Hopper attention config of one problem's search space, timed against PyTorch.

The problem is causal SDPA with grouped K/V heads read in place (``enable_gqa=True``;
``--kv-heads`` = ``--heads`` for plain multi-head attention). Each config of
``families/attention_sm90.search_space`` is forced (select's ``tuned``), the model
compiled (every candidate kernel prebuilt first, so a compile only links) and its
call timed (median ms, ``_timing.median_ms``), its output checked against SDPA's.
Anchors in the same run: SDPA with ``enable_gqa`` and SDPA on K/V repeated per query
head (PyTorch's own choice of backend for each). Ratios = anchor / config (above 1:
ours faster); the learned table's choice is marked. Prints a table and writes
$OUT/attention_sweep.json (default ./out).

    python benchmarks/attention_sweep.py [--batch 1] [--heads 32] [--kv-heads 4]
        [--seq 8192] [--head-dim 64] [--dtype fp16|bf16]
    python benchmarks/attention_sweep.py --prebuild-only ...   # no GPU: fill the cache
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _attention_search import _tag, compile_regions, prebuild_all            # noqa: E402
from _timing import median_ms, write_result                                                 # noqa: E402
from cutlass_offload.families import attention_sm90                           # noqa: E402
from cutlass_offload.ir import AttentionKernelSm90, AttentionProblem          # noqa: E402
from cutlass_offload.select import attention_tuning_id                        # noqa: E402


class CausalGqa(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=k.shape[1] != q.shape[1])


def problem(a) -> AttentionProblem:
    """The kernel problem partition makes of the form (checked against the compile's)."""
    return AttentionProblem(heads=a.heads, seq_q=a.seq, seq_kv=a.seq, head_dim=a.head_dim,
                            head_dim_v=a.head_dim, dtype={"fp16": "f16", "bf16": "bf16"}[a.dtype],
                            scale=a.head_dim ** -0.5, batch=a.batch, causal="top_left",
                            batch_hint=a.batch, kv_group=a.heads // a.kv_heads)


def kernels(p: AttentionProblem) -> dict:
    out = {}
    for c in attention_sm90.search_space(p):
        k = AttentionKernelSm90(arch="sm90a", dtype=p.dtype, config=c, causal=True,
                                kv_group=p.kv_group)
        out[k.name] = k
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    ap.add_argument("--prebuild-only", action="store_true")
    a = ap.parse_args(argv)
    p = problem(a)
    build_s, failed = prebuild_all(kernels(p))
    print(f"prebuilt {len(kernels(p))} kernels in {build_s:.0f} s; failed: {sorted(failed) or 'none'}",
          flush=True)
    if a.prebuild_only:
        return
    if not torch.cuda.is_available():
        sys.exit("attention_sweep.py needs a CUDA GPU (or --prebuild-only)")
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(a.batch, a.heads, a.seq, a.head_dim, generator=g, device="cuda").to(dt)
    k, v = (torch.randn(a.batch, a.kv_heads, a.seq, a.head_dim, generator=g, device="cuda").to(dt)
            for _ in range(2))
    form, rep = CausalGqa(), a.heads // a.kv_heads
    kr, vr = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    with torch.no_grad():
        want = form(q, k, v).float()
        anchors = {"sdpa_gqa": median_ms(lambda: form(q, k, v)),
                   "sdpa_repeated": median_ms(lambda: F.scaled_dot_product_attention(
                       q, kr, vr, is_causal=True))}
    default = attention_sm90.choose(p).config
    (region,) = compile_regions(form, (q, k, v)).plan.regions
    tid = attention_tuning_id(region.kernel_problem)    # as select keys it
    rows = []
    for c in attention_sm90.search_space(p):
        compiled = compile_regions(form, (q, k, v), {tid: c})
        (kern,) = compiled.plan.distinct_kernels
        if kern.config != c:
            rows.append({"config": _tag(c), "error": f"not taken ({kern.name})"})
            continue
        with torch.no_grad():
            out = compiled(q, k, v)
            out = out[0] if isinstance(out, (tuple, list)) else out
            err = float((out.float() - want).norm() / want.norm())
            ms = median_ms(lambda m=compiled: m(q, k, v))
        row = {"config": _tag(c), "kernel": kern.name, "ms": ms, "rel_err_vs_sdpa": err,
               "table_choice": c == default,
               "ratio": {n: t / ms for n, t in anchors.items()}}
        rows.append(row)
        print(f"{row['config']:28s} {ms:.3f} ms  " + "  ".join(f"{n}/ours {r:.2f}x"
              for n, r in row["ratio"].items()) + f"  err {err:.1e}" +
              ("  (the table's choice)" if row["table_choice"] else ""), flush=True)
        del compiled
    print("anchors: " + "  ".join(f"{n} {t:.3f} ms" for n, t in anchors.items()))
    write_result("attention_sweep", {"anchors": anchors, "rows": rows}, problem=vars(a), tuning_id=tid)


if __name__ == "__main__":
    main()
