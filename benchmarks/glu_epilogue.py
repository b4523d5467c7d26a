"""Gated linear units on the GPU: our GLU epilogue (stored from registers or staged in
shared memory, emit/templates/glu_epilogue.h, or staged in TMA's boxes and stored by
TMA, staged_tma_epilogue.h) against what runs without it.

partition/gated_gemm.py rewrites a gated pair into one GEMM with a GLU epilogue at any K
since session 37 (``MIN_K`` 0; 2048 before: in session 23 the register-stored epilogue
ran the UNet's short-K GEGLU projections 2.3x slower than the plain GEMM with its TMA
store). This times, per problem (A (M, K) fp16, the pair's weights (2 N_out, K), output
(M, N_out)):

* ``pytorch``: the model's ops in eager PyTorch (diffusers' GEGLU: one linear over
  both halves, ``chunk(2, -1)``, ``up * gelu(gate)``; LLaMA's SwiGLU: two linears,
  ``silu(gate) * up``);
* ``torch_compile``: the same function under ``torch.compile`` (Inductor: cuBLAS
  plus a Triton kernel for the activation and product), torch.compile's anchor;
* ``ours_plain_glue``: our plain GEMM (with the bias) over both halves, then the
  activation and product compiled by Inductor: what our compile ran below MIN_K;
* ``ours_glu_registers`` / ``ours_glu_staged`` / ``ours_glu_tma``: one GEMM with the
  GLU epilogue, the product stored from registers / staged in shared memory and
  stored in 16-byte row chunks (glu_epilogue.h) / staged in TMA's swizzled boxes and
  stored by TMA (emit/glu_sm90.GLU_TMA, staged_tma_epilogue.h; tiles whose output
  width is not a multiple of 16 keep the row store); with the GLU problem's own kernel
  config (select.sm90.choose) and, where it differs, the plain problem's
  (``..._plain_tile``). ``--forms`` picks them (default: all three).

Each variant: fresh random operands (copies that exceed the L2 together), its output
poisoned with NaN and checked against a float32 reference (relative error), then
timed as tune/profile.py times candidates (launches captured in one CUDA graph,
median of the replays, us per call). Prints a table with each variant's ratio to
torch_compile; writes JSON (``--json``).

    python benchmarks/glu_epilogue.py [--shapes unet,llama] [--forms registers,staged,tma]
        [--json out.json]

Needs a CUDA GPU (exit 2 without one) and nvcc (builds the kernels, a library per form).
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import datetime
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "src"))

# (M, N_out, K, activation, bias, model form): the UNet's four GEGLU projections at
# batch 2 (64x64 .. 8x8 latents: 4096 .. 64 tokens per image, inner 1280 .. 5120) and
# LLaMA's gate / up pair at 2048 tokens
SHAPES = {
    "unet": [(8192, 1280, 320, "gelu_erf", True, "geglu"), (2048, 2560, 640, "gelu_erf", True, "geglu"),
             (512, 5120, 1280, "gelu_erf", True, "geglu"), (128, 5120, 1280, "gelu_erf", True, "geglu")],
    "llama": [(2048, 5632, 2048, "silu", False, "swiglu")],
}


def _problem(m, n, k, ep):
    from cutlass_offload.ir import GemmProblem
    return GemmProblem(n=n, k=k, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                       epilogue=ep, m=m, m_hint=m)


FORMS = ("registers", "staged", "tma")


def plan_for(shapes, form: str, num_sms: int, plain: bool = False):
    """(Plan, rows): per shape the GLU kernels and (with ``plain``) the plain GEMM over
    both halves; rows name each region's variant and shape. ``form``: one of FORMS
    (it names the regions; GLU_STAGED / GLU_TMA pick the epilogue)."""
    from cutlass_offload.ir import GemmEpilogue, GemmKernel, GemmRegion, Plan
    from cutlass_offload.select import sm90
    pairs, rows = [], []
    tag = form[0]
    for i, (m, n_out, k, act, bias, _) in enumerate(shapes):
        glu_ep = GemmEpilogue(bias=bias, activation=act, glu=True)
        plain_ep = GemmEpilogue(bias=bias)
        glu_p, plain_p = _problem(m, 2 * n_out, k, glu_ep), _problem(m, 2 * n_out, k, plain_ep)
        glu_cfg, glu_launch = sm90.choose(glu_p, num_sms)
        plain_cfg, plain_launch = sm90.choose(plain_p, num_sms)
        kinds = [("glu", glu_p, glu_ep, glu_cfg, glu_launch)]
        if plain_cfg != glu_cfg and sm90.takes(glu_p, plain_cfg) and not plain_cfg.n_split and not plain_cfg.swap_ab:
            kinds.append(("glu_plain_tile", glu_p, glu_ep, plain_cfg, plain_launch))
        if plain:
            kinds.append(("plain", plain_p, plain_ep, plain_cfg, plain_launch))
        for kind, p, ep, cfg, launch in kinds:
            name = f"glu_{tag}_{i}_{kind}"
            kernel = GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                                epilogue=ep, config=cfg)
            region = GemmRegion(name=name, form="linear", nodes=(name,), a="a", b="b", problem=p)
            pairs.append((region, kernel))
            rows.append({"shape": i, "kind": kind, "region": name, "kernel": kernel.name,
                         "launch": dataclasses.asdict(launch)})
    return Plan.from_pairs("sm90a", pairs), rows


def build_libraries(shapes, num_sms, forms=FORMS):
    """{form: (library path, rows)}: a build per form (GLU_STAGED, GLU_TMA set for it);
    the plain GEMMs go in the first form's of "staged" and "tma"."""
    from cutlass_offload import build
    from cutlass_offload.emit import glu_sm90, staged
    out, default = {}, (glu_sm90.GLU_STAGED, glu_sm90.GLU_TMA, staged.ENABLED)
    plain_in = next((f for f in forms if f in ("staged", "tma")), None)
    try:
        # the plain GEMMs keep CUTLASS's TMA epilogue whatever $CUTLASS_OFFLOAD_STAGED_EPILOGUE says
        staged.ENABLED = False
        for form in forms:
            glu_sm90.GLU_STAGED, glu_sm90.GLU_TMA = form != "registers", form == "tma"
            plan, rows = plan_for(shapes, form, num_sms, plain=form == plain_in)
            t = time.perf_counter()
            res = build.build(plan, "sharded")
            if res.failures:
                raise SystemExit(res.format())
            print(f"built the {form} GLU library: {len(plan.kernels)} kernels in {time.perf_counter() - t:.0f} s",
                  flush=True)
            out[form] = (res.library, rows)
    finally:
        glu_sm90.GLU_STAGED, glu_sm90.GLU_TMA, staged.ENABLED = default
    return out


def torch_fns(form: str, act: str):
    """(eager function (x, w_cat, b_cat, gate_w, up_w) -> out, glue function y -> out):
    the model's ops, and the part of them after a GEMM over both halves."""
    import torch.nn.functional as F
    actf = {"gelu_erf": F.gelu, "silu": F.silu}[act]

    def glue(y):
        up, gate = y.chunk(2, dim=-1)
        return up * actf(gate)

    if form == "geglu":
        def model(x, w_cat, b_cat, gate_w, up_w):
            return glue(F.linear(x, w_cat, b_cat))
    else:
        def model(x, w_cat, b_cat, gate_w, up_w):
            return actf(F.linear(x, gate_w)) * F.linear(x, up_w)
    return model, glue


def bench_shape(idx, shape, libs, device) -> list:
    import torch

    from cutlass_offload.emit import region_symbol
    from cutlass_offload.runtime.library import Library
    from cutlass_offload.tune import profile as prof
    m, n_out, k, act, bias, form = shape
    spec = {"m": m, "n": 2 * n_out, "k": k, "batch": 1, "dtype": "f16", "layout_b": "col",
            "epilogue": {"bias": bias, "activation": act, "residual": "none", "post_activation": "none",
                         "glu": True}}
    copies = prof.operand_copies(spec, device)
    ref = copies[0].reference()[0]
    launches = prof.launches_for(spec)
    # the model's own (not interleaved) weights from the GLU operands: up first, as
    # diffusers' chunk reads them
    for c in copies:
        c.x = c.a[0]
        c.gate_w2, c.up_w2 = c.gate_w[0], c.up_w[0]
        c.w_cat = torch.cat([c.up_w2, c.gate_w2]).contiguous()
        c.b_cat = torch.cat([c.up_b, c.gate_b]).contiguous() if c.bias is not None else None
    model, glue = torch_fns(form, act)
    compiled_model, compiled_glue = torch.compile(model), torch.compile(glue)
    out = []

    def record(variant, fn_all, first):
        res = first()         # a fresh output (torch) or one poisoned before (ours_plain_glue)
        torch.cuda.synchronize()
        err = prof._rel_err(res, ref)
        us, how = prof.time_us(fn_all, launches)
        out.append({"shape": idx, "variant": variant, "us": us, "rel_err": err, "timing": how})
        print(f"  {variant:28s} {us:9.2f} us  rel. err {err:.2e}", flush=True)

    for name, fn in (("pytorch", model), ("torch_compile", compiled_model)):
        def first(fn=fn):
            c = copies[0]
            return fn(c.x, c.w_cat, c.b_cat, c.gate_w2, c.up_w2)

        def all_(stream, fn=fn):
            for i in range(launches):
                c = copies[i % len(copies)]
                fn(c.x, c.w_cat, c.b_cat, c.gate_w2, c.up_w2)
        record(name, all_, first)

    for form, (path, rows) in libs.items():
        lib = Library(path)
        for row in (r for r in rows if r["shape"] == idx):
            run, ws = lib.launcher(region_symbol(row["region"]))
            if row["kind"] == "plain":
                # over w_cat (up then gate, as diffusers' chunk): D (M, 2 N_out), then the glue
                ys = [torch.empty(m, 2 * n_out, dtype=torch.float16, device=device) for _ in copies]
                args = []
                for c, y in zip(copies, ys):
                    a = prof.CoGemmArgs()
                    a.a, a.b, a.d = c.x.data_ptr(), c.w_cat.data_ptr(), y.data_ptr()
                    a.bias = c.b_cat.data_ptr() if c.b_cat is not None else None
                    a.c = None
                    a.m, a.n, a.k, a.l = m, 2 * n_out, k, 1
                    a.lda, a.ldb, a.ldc, a.ldd = k, k, 2 * n_out, 2 * n_out
                    a.batch_stride_a = a.batch_stride_b = a.batch_stride_c = a.batch_stride_d = 0
                    a.set_launch(prof.GemmLaunch(**row["launch"]))
                    args.append(a)
                need = int(ws(ctypes.byref(args[0])))
                workspace = torch.empty(max(need, 1), dtype=torch.uint8, device=device)
                for a in args:
                    a.workspace, a.workspace_bytes = ((workspace.data_ptr(), need) if need > 0 else (None, 0))

                def first(args=args, ys=ys):
                    run(ctypes.byref(args[0]), torch.cuda.current_stream().cuda_stream)
                    return compiled_glue(ys[0])

                def all_(stream, args=args, ys=ys):
                    for i in range(launches):
                        j = i % len(copies)
                        run(ctypes.byref(args[j]), stream)
                        compiled_glue(ys[j])
                ys[0].fill_(float("nan"))
                record("ours_plain_glue", all_, first)
                continue
            variant = f"ours_glu_{form}" + (
                "_plain_tile" if row["kind"] == "glu_plain_tile" else "")
            job = {"symbol": region_symbol(row["region"]), "launch": row["launch"]}
            rec = prof.profile_job(lib, job, copies, ref.unsqueeze(0))
            rec.pop("fatal", None)
            out.append({"shape": idx, "variant": variant, "kernel": row["kernel"], **rec})
            us = rec.get("us")
            print(f"  {variant:28s} {us if us is None else round(us, 2)!s:>9} us  {rec['status']} "
                  f"rel. err {rec.get('rel_err')}", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="unet,llama", help="comma-separated: " + ",".join(SHAPES))
    p.add_argument("--forms", default=",".join(FORMS),
                   help="GLU store forms to build and time, comma-separated: " + ", ".join(FORMS))
    p.add_argument("--json", default="glu_epilogue.json")
    a = p.parse_args(argv)
    forms = tuple(f.strip() for f in a.forms.split(","))
    if not forms or any(f not in FORMS for f in forms):
        p.error(f"--forms: each of {', '.join(FORMS)}")
    import torch
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes = [s for name in a.shapes.split(",") for s in SHAPES[name]]
    device = torch.device("cuda", 0)
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    libs = build_libraries(shapes, num_sms, forms)
    from cutlass_offload.tune import profile as prof
    prof._warm_up(device)
    rows = []
    for i, s in enumerate(shapes):
        print(f"{s[0]}x{2 * s[1]}x{s[2]} {s[5]} ({s[3]}{', bias' if s[4] else ''}): output {s[0]}x{s[1]}",
              flush=True)
        rows += bench_shape(i, s, libs, device)
    print("\n| problem | variant | us | vs torch_compile | rel. err |\n| --- | --- | --- | --- | --- |")
    for i, s in enumerate(shapes):
        anchor = next((r["us"] for r in rows if r["shape"] == i and r["variant"] == "torch_compile"), None)
        for r in (r for r in rows if r["shape"] == i):
            ratio = f"{anchor / r['us']:.2f}x" if r.get("us") and anchor else "-"
            us = f"{r['us']:.2f}" if r.get("us") else r.get("status", "-")
            print(f"| {s[0]}x{2 * s[1]}x{s[2]} {s[5]} | {r['variant']} | {us} | {ratio} | "
                  f"{r.get('rel_err') or 0:.1e} |")
    Path(a.json).write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(device), "num_sms": num_sms, "torch": torch.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "shapes": [dict(zip(("m", "n_out", "k", "activation", "bias", "form"), s)) for s in shapes],
        "rows": rows}, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
