"""Run every sm90a kernel choice of one conv problem (select/conv.py ``search_space``)
in isolation: each in its own process, with CUDA_LAUNCH_BLOCKING=1, so a choice
that fails to launch or faults is named with CUDA's own error and cannot take the
others down with it (the conv search times all choices of a round in one process).
Prints one line per choice: ok with the time and the error against cuDNN, or the
failure; writes JSON.

    python benchmarks/conv_choice_check.py N,H,W,C,K,R,S [N,H,W,C,K,R,S ...]
        [--pad P] [--stride S] [--dtype fp16|bf16] [--only PREFIX] [--json FILE]

Needs a CUDA GPU (sm_90) and nvcc; kernels come from (and go to) the kernel cache.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[0] / "src"))

DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def _model(n, h, w, c, k, r, s, pad, stride, dtype):
    import torch
    dt = getattr(torch, DTYPES[dtype])
    conv = torch.nn.Conv2d(c, k, (r, s), stride=stride, padding=pad).to(dt).cuda()
    x = torch.randn(n, c, h, w, device="cuda", dtype=dt).contiguous(memory_format=torch.channels_last)
    return conv.to(memory_format=torch.channels_last).eval(), x


def one(spec: dict, index: int) -> dict:
    """Compile the conv with its ``index``-th choice forced and run it once against
    cuDNN (called in a child process)."""
    import torch

    from _attention_search import compile_regions
    from _timing import graph_ms
    from cutlass_offload.select import conv_tuning_id
    from cutlass_offload.select.conv import pad_channels, search_space
    model, x = _model(**spec)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = compile_regions(model, (x,))
    region = base.region_modules()[0].region
    problem = pad_channels(region.problem, "sm90a")
    choice = search_space(problem, "sm90a", sms)[index]
    out = {"choice": choice.tag}
    compiled = compile_regions(model, (x,), {conv_tuning_id(problem): choice})
    mod = compiled.region_modules()[0]
    out["kernel"] = mod.kernel.name
    with torch.no_grad():
        try:
            y = compiled(x)
            torch.cuda.synchronize()
        except Exception as e:             # noqa: BLE001 - reported, this process ends
            out["error"] = f"{type(e).__name__}: {e}"[:400]
            try:
                torch.cuda.synchronize()
                out["sticky"] = False
            except Exception as e2:        # noqa: BLE001
                out["sticky"] = f"{e2}"[:200]
            return out
        ref = copy.deepcopy(model).float()(x.float())     # a copy: the compiled model shares its weights
        out["rel_err"] = float((y.double() - ref.double()).norm() / ref.double().norm())
        out["fell_back"] = mod.fallback_calls > 0
        out["us"] = graph_ms(lambda: compiled(x), calls=10, reps=10) * 1e3   # the model is the conv
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("problems", nargs="+", help="N,H,W,C,K,R,S")
    p.add_argument("--pad", type=int, default=1)
    p.add_argument("--stride", type=int, default=1)
    p.add_argument("--dtype", default="fp16", choices=sorted(DTYPES))
    p.add_argument("--only", default="", metavar="PREFIX",
                   help="choices whose tag starts with PREFIX (e.g. im2col)")
    p.add_argument("--json", default=None)
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    specs = []
    for text in args.problems:
        n, h, w, c, k, r, s = map(int, text.split(","))
        specs.append(dict(n=n, h=h, w=w, c=c, k=k, r=r, s=s, pad=args.pad, stride=args.stride,
                          dtype=args.dtype))
    if args.one is not None:
        print(json.dumps(one(specs[0], args.one)))
        return 0
    import torch

    from cutlass_offload.ir import ConvProblem, GemmEpilogue
    from cutlass_offload.select.conv import search_space
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    for text, spec in zip(args.problems, specs):
        probe = ConvProblem(c=spec["c"], k=spec["k"], h=spec["h"], w=spec["w"], r=spec["r"],
                            s=spec["s"], dtype="f16" if spec["dtype"] == "fp16" else "bf16",
                            align_a=8, align_b=8, align_c=8, pad=(spec["pad"],) * 4,
                            stride=(spec["stride"],) * 2, epilogue=GemmEpilogue(bias=True),
                            n_hint=spec["n"])
        for i, choice in enumerate(search_space(probe, "sm90a", sms)):
            if not choice.tag.startswith(args.only):
                continue
            run = subprocess.run([sys.executable, __file__, text, "--pad", str(args.pad), "--stride",
                                  str(args.stride), "--dtype", args.dtype, "--one", str(i)],
                                 capture_output=True, text=True, env=env, timeout=600)
            lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"error": (run.stderr or "no output")[-400:]}
            row.update(problem=text, index=i, rc=run.returncode)
            results.append(row)
            what = (f"ok {row['us']:8.2f} us  rel err {row['rel_err']:.1e}"
                    f"{'  FELL BACK' if row.get('fell_back') else ''}" if "us" in row
                    else f"FAILED {row.get('error')} (sticky: {row.get('sticky')})")
            print(f"{text}  {i:2d} {row.get('choice', '?'):50s} {what}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
