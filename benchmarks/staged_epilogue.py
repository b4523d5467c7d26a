"""The staged elementwise epilogue (emit/templates/staged_epilogue.h) against CUTLASS's
TMA epilogue with its fusion callbacks, on the GPU and in nvcc.

emit/staged.ENABLED swaps the sm90 GEMM kernels' TMA epilogue for one that
stages the output in shared memory and stores it in 16-byte row chunks: about half
the nvcc time per kernel. This times, per problem (the built-in and zoo models' GEMMs
with their epilogues; the heuristic's kernel config, select.sm90.choose):

* ``cublas``: the PyTorch ops the region replaces (addmm / mm, then the epilogue op
  by op: tune/profile.Operands.torch_ops), the anchor;
* ``ours_tma`` / ``ours_staged``: the same kernel config with either epilogue.

Each of ours is checked against a float32 reference on a NaN-poisoned output and
timed as tune/profile.py times candidates (launches captured in one CUDA graph over
operand copies that exceed the L2, median of the replays, us per call). It also
prints each library's build time (both built here, one nvcc job per core, empty
kernel cache unless CUTLASS_OFFLOAD_CACHE_DIR holds them). Prints a table with the
ratios; writes JSON (``--json``).

    python benchmarks/staged_epilogue.py [--json out.json]

Needs a CUDA GPU (exit 2 without one) and nvcc.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "src"))

# (model, M, N, K, epilogue fields): fp16, B a Linear weight (N, K)
PROBLEMS = [
    ("bert-base qkv", 4096, 2304, 768, {"bias": True}),
    ("bert-base fc1", 4096, 3072, 768, {"bias": True, "activation": "gelu_erf"}),
    ("bert-base fc2", 4096, 768, 3072, {"bias": True, "residual": "add"}),
    ("gpt2 fc1", 1024, 3072, 768, {"bias": True, "activation": "gelu_tanh"}),
    ("llama o_proj", 2048, 2048, 2048, {"residual": "add"}),
    ("llama down", 2048, 2048, 5632, {"residual": "add"}),
    ("whisper q", 6000, 768, 768, {"bias": True}),
    ("sd-unet proj_in", 8192, 320, 320, {"bias": True}),
    ("sd-unet ff out", 8192, 320, 1280, {"bias": True, "residual": "add"}),
    ("sd-unet attn 64", 512, 1280, 1280, {}),
    ("resnet-style", 25088, 256, 64, {"bias": True, "activation": "relu", "residual": "add",
                                      "post_activation": "relu"}),
    ("swiglu-style", 2048, 5632, 2048, {"activation": "silu", "residual": "mul"}),
]


def _epilogue(fields):
    from cutlass_offload.ir import GemmEpilogue
    return GemmEpilogue(**fields)


def plan_for(num_sms, form):
    """(Plan, rows): one region per problem with the heuristic's config and launch."""
    from cutlass_offload.ir import GemmKernel, GemmProblem, GemmRegion, Plan
    from cutlass_offload.select import sm90
    pairs, rows = [], []
    for i, (name, m, n, k, fields) in enumerate(PROBLEMS):
        ep = _epilogue(fields)
        p = GemmProblem(n=n, k=k, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                        epilogue=ep, m=m, m_hint=m)
        cfg, launch = sm90.choose(p, num_sms)
        kernel = GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                            epilogue=ep, config=cfg)
        region = f"epilogue_{form}_{i}"
        pairs.append((GemmRegion(name=region, form="linear", nodes=(region,), a="a", b="b", problem=p), kernel))
        rows.append({"problem": i, "region": region, "kernel": kernel.name, "launch": dataclasses.asdict(launch)})
    return Plan.from_pairs("sm90a", pairs), rows


def build_libraries(num_sms):
    """{form: (library path, rows, build seconds, staged kernels)} for "tma" and "staged"."""
    from cutlass_offload import build
    from cutlass_offload.emit import gemm_sm90, staged
    out, default = {}, staged.ENABLED
    try:
        for form in ("tma", "staged"):
            staged.ENABLED = form == "staged"
            plan, rows = plan_for(num_sms, form)
            applies = sum(gemm_sm90.staged_epilogue_applies(k) for k in plan.kernels)
            t = time.perf_counter()
            res = build.build(plan, "sharded")
            if res.failures:
                raise SystemExit(res.format())
            secs = time.perf_counter() - t
            print(f"built the {form} library: {len(plan.kernels)} kernels ({applies} with the staged "
                  f"epilogue) in {secs:.0f} s", flush=True)
            out[form] = (res.library, rows, secs, applies)
    finally:
        staged.ENABLED = default
    return out


def bench(libs, device) -> list:
    from cutlass_offload.emit import region_symbol
    from cutlass_offload.runtime.library import Library
    from cutlass_offload.tune import profile as prof
    loaded = {form: Library(path) for form, (path, *_) in libs.items()}
    out = []
    for i, (name, m, n, k, fields) in enumerate(PROBLEMS):
        ep = {"bias": False, "activation": "identity", "residual": "none", "post_activation": "identity",
              **fields}
        spec = {"m": m, "n": n, "k": k, "batch": 1, "dtype": "f16", "layout_b": "col", "epilogue": ep}
        copies = prof.operand_copies(spec, device)
        ref = copies[0].reference()
        torch_us, _ = prof.time_us(prof._torch_launches(copies), prof.launches_for(spec))
        row = {"problem": i, "name": name, "m": m, "n": n, "k": k, "epilogue": ep, "cublas_us": torch_us}
        for form, (_, rows, _, _) in libs.items():
            r = rows[i]
            rec = prof.profile_job(loaded[form], {"symbol": region_symbol(r["region"]), "launch": r["launch"]},
                                   copies, ref)
            rec.pop("fatal", None)
            row[form] = {"kernel": r["kernel"], **rec}
        out.append(row)
        t, s = row["tma"].get("us"), row["staged"].get("us")
        print(f"{name:18s} {m}x{n}x{k}: cublas {torch_us:8.2f}  tma {t or row['tma']['status']!s:>8}  "
              f"staged {s or row['staged']['status']!s:>8} us", flush=True)
    return out


def _fmt(us):
    return f"{us:.2f}" if us else "-"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default="staged_epilogue.json")
    a = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    libs = build_libraries(num_sms)
    from cutlass_offload.tune import profile as prof
    prof._warm_up(device)
    rows = bench(libs, device)
    print("\n| problem | M x N x K | epilogue | cuBLAS us | TMA us | staged us | staged vs TMA | "
          "staged vs cuBLAS |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    ratios = []
    for r in rows:
        t, s = r["tma"].get("us"), r["staged"].get("us")
        if t and s:
            ratios.append(t / s)
        tag, cublas = _epilogue(r["epilogue"]).tag, r["cublas_us"]
        vs_tma = f"{t / s:.2f}x" if t and s else "-"
        vs_cublas = f"{cublas / s:.2f}x" if s else "-"
        print(f"| {r['name']} | {r['m']}x{r['n']}x{r['k']} | {tag} | {cublas:.2f} | {_fmt(t)} | {_fmt(s)} | "
              f"{vs_tma} | {vs_cublas} |")
    if ratios:
        print(f"geomean staged vs TMA: {statistics.geometric_mean(ratios):.3f}x over {len(ratios)} problems")
    for form, (_, _, secs, applies) in libs.items():
        print(f"build {form}: {secs:.0f} s ({applies} staged kernels)")
    Path(a.json).write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(device), "num_sms": num_sms, "torch": torch.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "build_s": {form: v[2] for form, v in libs.items()}, "rows": rows}, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
