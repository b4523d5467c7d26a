"""A gated MLP's up projection as ONE GEMM (issue 16/21): D = silu(x Wg^T) * (x Wu^T)
from the CuTe DSL GEMM with a gated epilogue (emit/dsl_gemm_sm90.py, ``gated``),
against what PyTorch runs for LLaMA's ``silu(gate_proj(x)) * up_proj(x)``.

The DSL kernel reads one (2N, K) weight whose rows interleave Wg and Wu (gate_0,
up_0, gate_1, ...), so each thread holds a gate value and its up value in adjacent
accumulator registers, and writes only the (M, N) product: the two (M, N)
projections never reach memory. Anchors, in the same run, each timed as CUDA-graph
replays (benchmarks/_timing.graph_ms; device time):

* eager: two cuBLAS GEMMs, then silu and mul (PyTorch's kernels);
* torch.compile (default mode): the GEMMs as cuBLAS extern calls, silu * mul one
  fused Triton kernel;
* torch.compile over one concatenated (2N, K) weight (one GEMM, then the fused
  elementwise kernel);
* the cuBLAS GEMM of the concatenated weight alone (the elementwise part free).

Every DSL config is checked against the float32 reference (PyTorch's rounding
points) on fresh random inputs with the output poisoned first. Prints a table,
writes JSON (``--json``; default $OUT/dsl_gated_mlp.json or benchmarks/results/).
Needs an sm_90 GPU, nvcc and the ``[dsl]`` extra (exit 2 without them).

    python benchmarks/dsl_gated_mlp.py [--shapes 2048x5632x2048] [--configs 128x256:1x1]
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

DEFAULT_SHAPES = "2048x5632x2048,512x5632x2048,2048x14336x4096"   # M x N x K: LLaMA / TinyLlama / Mistral MLPs
DEFAULT_CONFIGS = "128x256:1x1,128x256:2x1,128x128:1x1,128x128:2x1,128x192:1x1,64x256:1x1"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from _timing import graph_ms
    from dsl_gemm import json_path, missing, parse_configs
    from kernels_bench import _rel_err as rel_err
    why = missing()
    if why:
        print(why, file=sys.stderr)
        return 2

    from cutlass_offload.build import dsl as dsl_build
    from cutlass_offload.emit.dsl_gemm_sm90 import DslGemmConfig
    from cutlass_offload.runtime.library import CoGemmArgs, Library

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    configs = [DslGemmConfig(t, c, {"fp16": "f16", "bf16": "bf16"}[args.dtype], "silu", gated=True)
               for t, c in parse_configs(args.configs)]
    tmp = tempfile.mkdtemp(prefix="co_dsl_gated_")
    compiled = dsl_build.compile_objects(configs, Path(tmp), jobs=min(len(configs), os.cpu_count() or 1))
    good = [c for c in configs if not isinstance(compiled[c.name], Exception)]
    for c in configs:
        if c not in good:
            print(f"compile failed: {c.name}: {compiled[c.name]!r}"[:400])
    lib = Library(str(dsl_build.link_library(Path(tmp), good)))
    runs = {c.name: lib.launcher(dsl_build.symbol(c))[0] for c in good}

    rows = []
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        x = torch.randn(m, k, generator=g, device="cuda").to(dt)
        wg = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(dt)
        wu = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(dt)
        w_inter = torch.stack([wg, wu], dim=1).reshape(2 * n, k).contiguous()
        w_cat = torch.cat([wg, wu]).contiguous()
        ref = (F.silu((x.float() @ wg.float().T).to(dt).float()).to(dt).float()
               * (x.float() @ wu.float().T).to(dt).float())
        out = torch.empty(m, n, device="cuda", dtype=dt)
        cargs = CoGemmArgs(a=x.data_ptr(), b=w_inter.data_ptr(), d=out.data_ptr(), m=m, n=n, k=k, l=1,
                           lda=k, ldb=k, ldc=n, ldd=n)
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
        row = {"m": m, "n": n, "k": k, "dtype": args.dtype, "dsl": {}}
        for name, run in runs.items():
            out.fill_(float("nan"))
            status = run(ctypes.byref(cargs), stream())
            torch.cuda.synchronize()
            err = rel_err(out, ref)
            rec = {"status": status, "rel_err": err}
            if status == 0 and err < 2e-2:
                rec["us"] = graph_ms(lambda: run(ctypes.byref(cargs), stream())) * 1e3
            row["dsl"][name] = rec
        ok = {nm: r["us"] for nm, r in row["dsl"].items() if "us" in r}
        row["dsl_best"] = min(ok, key=ok.get) if ok else None
        row["dsl_best_us"] = ok.get(row["dsl_best"]) if ok else None

        def eager():
            return F.silu(F.linear(x, wg)) * F.linear(x, wu)

        def concat():
            y = F.linear(x, w_cat)
            return F.silu(y[:, :n]) * y[:, n:]
        compiled_two = torch.compile(eager)
        compiled_cat = torch.compile(concat)
        anchors = {"eager": eager, "compile": compiled_two, "compile_concat": compiled_cat,
                   "cublas_gemm_only": lambda: F.linear(x, w_cat)}
        for name, fn in anchors.items():
            fn()
            torch.cuda.synchronize()
            row[f"{name}_us"] = graph_ms(fn) * 1e3
        err_c = rel_err(compiled_two(), ref)
        row["compile_rel_err"] = err_c
        best_anchor = min(row["eager_us"], row["compile_us"], row["compile_concat_us"])
        row["best_anchor_us"] = best_anchor
        row["dsl_vs_best_anchor"] = best_anchor / row["dsl_best_us"] if row["dsl_best_us"] else None
        rows.append(row)
        print(f"{m}x{n}x{k} {args.dtype}: DSL gated {row['dsl_best_us']} us ({row['dsl_best']}); "
              f"eager {row['eager_us']:.1f}, torch.compile {row['compile_us']:.1f}, compile concat "
              f"{row['compile_concat_us']:.1f}, cuBLAS GEMM alone {row['cublas_gemm_only_us']:.1f}; "
              f"speedup over the best anchor {row['dsl_vs_best_anchor']}", flush=True)
        for nm, r in row["dsl"].items():
            print(f"    {nm}: {r}")

    import cutlass
    props = torch.cuda.get_device_properties(0)
    result = {"benchmark": "dsl_gated_mlp", "date": datetime.date.today().isoformat(), "gpu": props.name,
              "torch": torch.__version__, "cutlass_dsl": getattr(cutlass, "__version__", None),
              "compile_s": {k: (v if not isinstance(v, Exception) else repr(v)) for k, v in compiled.items()},
              "rows": rows}
    out_path = json_path(args.json, "dsl_gated_mlp")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
