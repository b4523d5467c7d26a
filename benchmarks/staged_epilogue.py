"""The staged elementwise epilogue (emit/templates/staged_epilogue.h) against CUTLASS's
TMA epilogue with its fusion callbacks, on the GPU and in nvcc.

emit/staged.ENABLED swaps the sm90 GEMM kernels' TMA epilogue for one that
stages the output in shared memory and stores it in 16-byte row chunks: about half
the nvcc time per kernel. This times, per problem (the built-in and zoo models' GEMMs
with their epilogues; the heuristic's kernel config, select.sm90.choose):

* ``cublas``: the PyTorch ops the region replaces (addmm / mm, then the epilogue op
  by op: tune/profile.Operands.torch_ops), the anchor;
* ``tma`` / ``staged``: the same kernel config with either epilogue (``staged``:
  emit/staged.py's default form, the TMA store, what CUTLASS_OFFLOAD_STAGED_EPILOGUE=1
  builds; ``tma`` is CUTLASS's TMA epilogue whatever that variable says); with
  ``--staged-variants 12x1,32x1,12x2,tma64x2`` one staged library per variant, each
  timed against the TMA epilogue: GROUPSxBUFFERS, the row-store form with its widest
  staged chunk in 8-column groups and the chunks staged at once, 1 or 2
  (emit/staged.py's MAX_CHUNK_GROUPS and BUFFERS); tmaCOLSxBUFFERS, the TMA-store
  form (STORE = "tma") with its widest chunk in columns (64, 32 or 16) and chunks in
  flight, 1 to 4 (TMA_MAX_CHUNK_COLS, TMA_BUFFERS).

Each of ours is checked against a float32 reference on a NaN-poisoned output and
timed as tune/profile.py times candidates (launches captured in one CUDA graph over
operand copies that exceed the L2, median of the replays, us per call). It also
prints each library's build time (both built here, one nvcc job per core, empty
kernel cache unless CUTLASS_OFFLOAD_CACHE_DIR holds them). Prints a table with the
ratios; writes JSON (``--json``).

    python benchmarks/staged_epilogue.py [--staged-variants 12x1,32x1,tma64x2] [--json out.json]

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


def variant_forms(spec: str) -> dict:
    """{form name: (store, chunk, buffers)} of ``--staged-variants`` ("12x1,32x2,tma64x2"):
    "staged" for emit/staged.py's row-store defaults, "staged_g<groups>_b<buffers>" for
    other row-store forms, "staged_tma<cols>_b<buffers>" for TMA-store forms."""
    from cutlass_offload.emit import staged
    out = {}
    for item in spec.split(","):
        item = item.strip().lower()
        tma = item.startswith("tma")
        try:
            g, b = (int(x) for x in item[3 if tma else 0:].split("x"))
        except ValueError:
            raise SystemExit(f"--staged-variants: {item!r}: GROUPSxBUFFERS or tmaCOLSxBUFFERS") from None
        if tma:
            if g not in (16, 32, 64) or not 1 <= b <= 4:
                raise SystemExit(f"--staged-variants: {item!r}: columns 16, 32 or 64, buffers 1 to 4")
            out[f"staged_tma{g}_b{b}"] = ("tma", g, b)
            continue
        if g < 1 or b not in (1, 2):
            raise SystemExit(f"--staged-variants: {item!r}: groups >= 1, buffers 1 or 2")
        default = (g, b) == (staged.MAX_CHUNK_GROUPS, staged.BUFFERS)
        out["staged" if default else f"staged_g{g}_b{b}"] = ("rows", g, b)
    return out


def build_libraries(num_sms, variants=None):
    """{form: (library path, rows, build seconds, staged kernels)} for "tma" and each
    staged variant (``variant_forms``; default: the staged defaults alone)."""
    from cutlass_offload import build
    from cutlass_offload.emit import gemm_sm90, staged
    if not variants:       # emit/staged.py's default form
        knobs = ((staged.TMA_MAX_CHUNK_COLS, staged.TMA_BUFFERS) if staged.STORE == "tma"
                 else (staged.MAX_CHUNK_GROUPS, staged.BUFFERS))
        variants = {"staged": (staged.STORE, *knobs)}
    knob_names = ("STORE", "MAX_CHUNK_GROUPS", "BUFFERS", "TMA_MAX_CHUNK_COLS", "TMA_BUFFERS")
    out, saved = {}, (staged.ENABLED, *(getattr(staged, n) for n in knob_names))
    try:
        for form, knobs in {"tma": None, **variants}.items():
            staged.ENABLED = knobs is not None      # False: off whatever the environment says
            if knobs:
                store, chunk, buffers = knobs
                staged.STORE = store
                if store == "tma":
                    staged.TMA_MAX_CHUNK_COLS, staged.TMA_BUFFERS = chunk, buffers
                else:
                    staged.MAX_CHUNK_GROUPS, staged.BUFFERS = chunk, buffers
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
        staged.ENABLED = saved[0]
        for name, value in zip(knob_names, saved[1:]):
            setattr(staged, name, value)
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
        times = "  ".join(f"{form} {row[form].get('us') or row[form]['status']}" for form in libs)
        print(f"{name:18s} {m}x{n}x{k}: cublas {torch_us:8.2f}  {times} us", flush=True)
    return out


def _fmt(us):
    return f"{us:.2f}" if us else "-"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default="staged_epilogue.json")
    p.add_argument("--staged-variants", default=None,
                   help="staged forms to build and time, comma-separated: GROUPSxBUFFERS, row stores (the "
                        "widest chunk in 8-column groups, chunks staged at once: 1 or 2); tmaCOLSxBUFFERS, "
                        "TMA stores (the widest chunk: 16, 32 or 64 columns; chunks in flight: 1 to 4); "
                        "default: emit/staged.py's default form, the TMA store at 32 columns x 2")
    a = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    libs = build_libraries(num_sms, variant_forms(a.staged_variants) if a.staged_variants else None)
    from cutlass_offload.tune import profile as prof
    prof._warm_up(device)
    rows = bench(libs, device)
    forms = [f for f in libs if f != "tma"]
    print("\n| problem | M x N x K | epilogue | cuBLAS us | TMA us | " + " | ".join(f"{f} us" for f in forms) +
          " | " + " | ".join(f"{f} vs TMA" for f in forms) + " | best staged vs cuBLAS |")
    print("| --- " * (5 + 2 * len(forms) + 1) + "|")
    ratios = {f: [] for f in forms}
    for r in rows:
        t = r["tma"].get("us")
        us = {f: r[f].get("us") for f in forms}
        for f in forms:
            if t and us[f]:
                ratios[f].append(t / us[f])
        tag, cublas = _epilogue(r["epilogue"]).tag, r["cublas_us"]
        vs = [f"{t / us[f]:.2f}x" if t and us[f] else "-" for f in forms]
        best = min((u for u in us.values() if u), default=None)
        print(f"| {r['name']} | {r['m']}x{r['n']}x{r['k']} | {tag} | {cublas:.2f} | {_fmt(t)} | " +
              " | ".join(_fmt(us[f]) for f in forms) + " | " + " | ".join(vs) +
              f" | {f'{cublas / best:.2f}x' if best else '-'} |")
    for f in forms:
        if ratios[f]:
            print(f"geomean {f} vs TMA: {statistics.geometric_mean(ratios[f]):.3f}x over {len(ratios[f])} problems")
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
