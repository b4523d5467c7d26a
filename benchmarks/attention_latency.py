"""Median latency of each attention region of a model against PyTorch's
scaled_dot_product_attention, on a GPU.

Each model (a built-in name, or package.module:factory) is captured and only its
attention regions are offloaded (one library: just the attention kernels, so the
build is quick). One forward pass records every region's inputs; regions with the
same kernel and input shapes are timed once (``count`` says how many there are):

* cutlass_offload: the region module (its mapping, ctypes launch and kernel): on
  sm_90a the Hopper kernel (emit/attention_sm90.py) where it takes the region;
* cutlass_sm80: on sm_90a, for those regions, the same region on the sm80 kernel
  (examples/41, compiled for sm_90a in a second library): the Hopper kernel's gain;
* pytorch: the region's own PyTorch subgraph (for an SDPA region: the
  ``aten.scaled_dot_product_attention`` call PyTorch dispatches itself);
* pytorch_<backend>: the same under torch.nn.attention.sdpa_kernel(<backend>)
  (flash, efficient, cudnn, math), where that backend takes the inputs.

eager = one call from Python; graph = 20 calls captured in one CUDA graph,
replayed: device time per call. Medians from triton.testing.do_bench when triton
is installed, else CUDA events. Prints a table and writes JSON to
$OUT/attention_latency.json (default ./out).

    python benchmarks/attention_latency.py [MODEL ...] [--arch sm_90a] [--dtype fp16|bf16]
                                           [--batch N] [--seq S]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))              # _timing
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cutlass_offload import build as build_stage                      # noqa: E402
from cutlass_offload.api import resolve_arch                          # noqa: E402
from cutlass_offload.capture import capture                           # noqa: E402
from cutlass_offload.emit import attention                            # noqa: E402
from cutlass_offload.ir import AttentionRegion, PartitionResult       # noqa: E402
from cutlass_offload.models import load_model                         # noqa: E402
from cutlass_offload.partition import partition                       # noqa: E402
from cutlass_offload.runtime.attention_region import AttentionRegionModule  # noqa: E402
from cutlass_offload.runtime.compiled_model import offload            # noqa: E402
from cutlass_offload.select import select                             # noqa: E402
from _timing import graph_ms, median_ms     # noqa: E402


def _backends():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return []
    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
             "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
    return [(n, sdpa_kernel, getattr(SDPBackend, b)) for n, b in names.items() if hasattr(SDPBackend, b)]


def attention_only(model, inputs, arch, sm80_only=False):
    """(graph module with only its attention regions offloaded, plan, build seconds);
    ``sm80_only``: every region on the sm80 kernel, even where sm_90a has the Hopper one."""
    cap = capture(model, inputs)
    part = partition(cap.graph_module)
    part = PartitionResult(tuple(r for r in part.regions if isinstance(r, AttentionRegion)), ())
    plan = select(part, arch)
    if sm80_only:
        kernels = tuple(k if k.config.family == "cutlass2x_sm80"
                        else replace(attention.choose(r.kernel_problem, "sm80"), arch=k.arch)
                        for r, k in zip(plan.regions, plan.kernels))
        plan = replace(plan, kernels=kernels)
    if not plan.regions:
        return cap.graph_module, plan, 0.0
    res = build_stage.build(plan)
    return offload(cap.graph_module, res.plan, res.library), res.plan, res.seconds


def flops(mod, xs) -> float:
    """2 * B * H * Lq * S * (E + Ev), halved for causal attention (the masked half is skipped)."""
    r = mod.region
    q, k, v = xs[mod._iq], xs[mod._ik], xs[mod._iv]
    if r.k_transposed:
        k = k.transpose(-1, -2)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n = 1
    for d in lead:
        n *= d
    f = 2.0 * n * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    return f / 2 if r.problem.causal != "none" else f


def bench_model(name, a, arch, rows):
    model, inputs = load_model(name, a.dtype, batch=a.batch, seq=a.seq)
    model = model.cuda()
    inputs = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs)
    gm, plan, build_s = attention_only(model, inputs, arch)
    mods = [m for m in gm.modules() if isinstance(m, AttentionRegionModule)]
    print(f"{name}: {len(mods)} attention regions, {len(plan.distinct_kernels)} kernels, "
          f"build {build_s:.1f} s")
    sm80 = {}                     # region name -> the same region on the sm80 kernel
    if any(k.config.family != "cutlass2x_sm80" for k in plan.kernels):
        gm80, _plan80, build80_s = attention_only(model, inputs, arch, sm80_only=True)
        sm80 = {m.region.name: m for m in gm80.modules() if isinstance(m, AttentionRegionModule)}
        print(f"{name}: sm80 kernels for comparison, build {build80_s:.1f} s")
    seen = {}
    hooks = [m.register_forward_pre_hook(lambda m, xs: seen.setdefault(m, xs) and None) for m in mods]
    with torch.no_grad():
        gm(*inputs)
    for h in hooks:
        h.remove()
    groups = {}
    for m, xs in seen.items():
        key = (m.kernel.name, m.region.problem.causal, m.region.bias_kind,
               tuple((tuple(x.shape), tuple(x.stride())) for x in xs if isinstance(x, torch.Tensor)))
        groups.setdefault(key, []).append((m, xs))
    for key, members in groups.items():
        m, xs = members[0]
        calls_before = m.fallback_calls
        with torch.no_grad():
            ours_out, ref_out = m(*xs), m.fallback(*xs)
            err = float((ours_out.double() - ref_out.double()).norm()
                        / ref_out.double().norm().clamp_min(1e-30))
            impls = [("cutlass_offload", lambda m=m, xs=xs: m(*xs))]
            m80 = sm80.get(m.region.name) if m.kernel.config.family != "cutlass2x_sm80" else None
            if m80 is not None:
                impls.append(("cutlass_sm80", lambda m80=m80, xs=xs: m80(*xs)))
            impls.append(("pytorch", lambda m=m, xs=xs: m.fallback(*xs)))
            if m.region.form == "sdpa":
                for bname, ctx, backend in _backends():
                    def fn(m=m, xs=xs, ctx=ctx, backend=backend):
                        with ctx([backend]):
                            return m.fallback(*xs)
                    try:
                        fn()
                        impls.append((f"pytorch_{bname}", fn))
                    except RuntimeError:
                        pass                              # this backend does not take the inputs
            p = m.region.problem
            q = xs[m._iq]
            shape = {"batch": int(q.shape[0]), "heads": p.heads,
                     "seq_q": int(q.shape[-2]), "seq_kv": int(xs[m._ik].shape[-1 if m.region.k_transposed else -2]),
                     "head_dim": p.head_dim, "head_dim_v": p.head_dim_v}
            f = flops(m, xs)
            for impl, fn in impls:
                eager, graph = median_ms(fn), graph_ms(fn)
                rows.append({"model": name, "region": m.region.name, "count": len(members),
                             "form": m.region.form, "causal": p.causal, "bias": m.region.bias_kind,
                             **shape, "kernel": {"cutlass_offload": m.kernel.name,
                                                 "cutlass_sm80": m80.kernel.name if m80 else ""}.get(impl, ""),
                             "impl": impl, "eager_us": eager * 1e3, "graph_us": graph * 1e3,
                             "graph_tflops": f / (graph * 1e-3) / 1e12, "rel_err_vs_pytorch": err})
        assert m.fallback_calls == calls_before, f"{m.region.name}: a call fell back to PyTorch"
        assert m80 is None or m80.fallback_calls == 0, f"{m.region.name}: the sm80 run fell back"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["bert-base", "gpt2", "sd-unet"])
    p.add_argument("--arch", default=None, help="sm_90a / sm_80 (default: the visible GPU)")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("attention_latency: needs a CUDA GPU")
        sys.exit(2)
    arch = resolve_arch(a.arch)
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    torch.manual_seed(0)
    for name in a.models:
        bench_model(name, a, arch, rows)
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, {a.dtype}; eager = one Python call, graph = device time per call")
    print(f"{'model':<10} {'x':>3} {'B,H,Lq,S,E,Ev':<24} {'mask':<10} {'impl':<20} "
          f"{'eager us':>9} {'graph us':>9} {'TFLOP/s':>8} {'rel err':>8}")
    for r in rows:
        shape = ",".join(str(r[k]) for k in ("batch", "heads", "seq_q", "seq_kv", "head_dim", "head_dim_v"))
        mask = r["causal"] if r["bias"] == "none" else f"{r['causal']}+{r['bias']}"
        impl = r["impl"] + ("[sm90]" if r["kernel"].startswith("cutlass3x_sm90") else "")
        print(f"{r['model']:<10} {r['count']:>3} {shape:<24} {mask:<10} {impl:<20} "
              f"{r['eager_us']:>9.1f} {r['graph_us']:>9.2f} {r['graph_tflops']:>8.1f} "
              f"{r['rel_err_vs_pytorch']:>8.1e}")
    path = out_dir / "attention_latency.json"
    path.write_text(json.dumps({"gpu": gpu, "dtype": a.dtype, "arch": arch, "torch": torch.__version__,
                                "results": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
