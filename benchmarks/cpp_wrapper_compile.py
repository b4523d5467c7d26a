"""What Inductor's C++ wrapper costs to compile, with and without
``cpp_wrapper_build_separate`` (the wrapper's entry at -O1, its C++ kernels apart at
-O3; pytorch#148773). Issues 16 / 17: with the C++ wrapper our sd-unet's glue took
122 s to compile on the H200 (torch 2.11) against 30 s with the Python wrapper.

Each configuration (``--variants``: "o3", cpp_wrapper alone; "separate", with
cpp_wrapper_build_separate; "ours", with glue.CPP_WRAPPER_EXTRA_OPTIONS, what our glue
passes; "ours_no_isa_check", the same with cpp.vec_isa_ok=False, so that torch 2.11 does
not check the host CPU's vector ISAs) runs in a fresh process with an empty Inductor cache
(TORCHINDUCTOR_CACHE_DIR in a temporary folder): ``torch.compile(model,
options={"cpp_wrapper": True, ...})`` of a built-in model, first call timed, and every host compiler call Inductor makes
(``cpp_builder.CppBuilder.build``) timed and labelled by its source (the wrapper's
``main``, the kernels' ``optimized``, other C++ kernels, precompiled header, link)
and its -O level. On a CUDA machine the model runs in fp16 on the GPU (Triton
kernels; the wrapper is the only host C++), else in fp32 on the CPU.

Usage: python benchmarks/cpp_wrapper_compile.py [models...] [--batch B] [--variants o3,separate]
       [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time


def call_kind(cmd: str) -> tuple[str, str]:
    """(kind, -O level) of one host compiler command line of Inductor's: "header"
    (precompiling), "main" (the wrapper), "optimized" (its C++ kernels when built
    apart), "kernel" (another compile-only source), "kernel+link" (a source compiled
    and linked in one step) or "link"; the level is the last -O flag's ("-" if none)."""
    opt = re.findall(r"\s-O([0-3s])\b", cmd)
    kind = ("header" if " -E " in cmd else "main" if ".main.cpp" in cmd
            else "optimized" if ".optimized.cpp" in cmd
            else "kernel" if " -c " in f"{cmd} " else "kernel+link" if ".cpp" in cmd
            else "link")
    return kind, opt[-1] if opt else "-"


def variant_options(variant: str) -> dict:
    """The Inductor options of one ``--variants`` name (ValueError for an unknown one)."""
    from cutlass_offload.runtime import glue
    ours = {"cpp_wrapper": True, **glue.CPP_WRAPPER_EXTRA_OPTIONS}
    table = {"o3": {"cpp_wrapper": True, "cpp_wrapper_build_separate": False},
             "separate": {"cpp_wrapper": True, "cpp_wrapper_build_separate": True},
             "ours": ours,
             "ours_no_isa_check": {**ours, "cpp.vec_isa_ok": False}}
    if variant not in table:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(table)}")
    return table[variant]


def _one(name: str, variant: str, batch: int) -> dict:
    import torch
    from torch._inductor import cpp_builder
    from cutlass_offload.models import load_model
    cuda = torch.cuda.is_available()
    model, inputs = load_model(name, dtype="fp16" if cuda else "fp32", batch=batch)
    if cuda:
        model = model.cuda()
        inputs = tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in inputs)
    calls = []
    real = cpp_builder.CppBuilder.build

    def timed(self, *a, **k):
        t0 = time.perf_counter()
        out = real(self, *a, **k)
        kind, opt = call_kind(self.get_command_line())
        calls.append({"kind": kind, "s": time.perf_counter() - t0, "opt": opt})
        return out

    cpp_builder.CppBuilder.build = timed
    options = variant_options(variant)
    from torch._inductor import cpu_vec_isa
    isa_checks = []
    real_check = cpu_vec_isa.VecISA.check_build

    def check_build(self, code):
        t0 = time.perf_counter()
        out = real_check(self, code)
        isa_checks.append({"isa": str(self), "s": time.perf_counter() - t0})
        return out

    cpu_vec_isa.VecISA.check_build = check_build
    fn = torch.compile(model.eval(), options=options)
    t0 = time.perf_counter()
    with torch.no_grad():
        fn(*inputs)
    if cuda:
        torch.cuda.synchronize()
    return {"model": name, "device": "cuda" if cuda else "cpu", "variant": variant,
            "options": options, "first_call_s": time.perf_counter() - t0,
            "torch": torch.__version__, "compiler_calls": calls, "isa_checks": isa_checks}


def _row(r: dict) -> str:
    by = {}
    for c in r["compiler_calls"]:
        key = f"{c['kind']} -O{c['opt']}"
        by[key] = by.get(key, 0.0) + c["s"]
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
    isa = sum(c["s"] for c in r["isa_checks"])
    return (f"| {r['model']} | {r['device']} | {r['variant']} | {r['first_call_s']:.1f} | "
            f"{sum(by.values()):.1f} | {isa:.1f} | {parts} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="One row per model and variant, each from a fresh process with an "
               "empty Inductor cache: the first call's seconds, the host compiler's seconds "
               "in all, the CPU ISA checks' seconds, and those per kind of compiler call (main: the wrapper; optimized: "
               "its C++ kernels when built apart; kernel / kernel+link: other C++ kernels; "
               "header: precompiled headers; link) with their -O level.")
    ap.add_argument("models", nargs="*", default=["bert-base"],
                    help="built-in model names (default: bert-base)")
    ap.add_argument("--batch", type=int, default=1, help="batch size (default: %(default)s)")
    ap.add_argument("--variants", default="o3,separate",
                    help="comma-separated: o3, separate, ours, ours_no_isa_check (default: %(default)s)")
    ap.add_argument("--json", help="also write the rows, every compiler call included, here")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(_one(a.one[0], a.one[1], a.batch)))
        return 0
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        variant_options(v)                  # an unknown name fails before any compile
    rows = []
    print("| model | device | variant | first call s | host compiler s | ISA checks s | by call kind |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in a.models:
        for variant in variants:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
                p = subprocess.run([sys.executable, __file__, "--one", name, variant,
                                    "--batch", str(a.batch)], env=env, capture_output=True, text=True)
            if p.returncode:
                tail = " / ".join(p.stderr.strip().splitlines()[-3:])
                print(f"| {name} | - | {variant} | failed (rc {p.returncode}): {tail} | | | |")
                continue
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(_row(rows[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
