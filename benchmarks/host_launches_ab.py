"""What CompileOptions.host_launches is worth: ours compiled for default mode (host
launches: a conv cuDNN runs only slightly faster stays ours) against ours compiled for
reduce-overhead (those convs left to cuDNN), both run in default mode with Inductor
glue, beside torch.compile default, in interleaved rounds (issue 16's plain column).

Per model: the regions of each compile, the median per-round ratio of each to
torch.compile default and of the two to each other, and with ``--host-profile`` the
host time per forward of the heaviest Python-visible calls (cProfile) of each of ours.
Prints a table, writes JSON; needs a CUDA GPU (exit 2 without).

    python benchmarks/host_launches_ab.py efficientnet-b0 [--rounds 7] [--reps 10]
        [--host-profile 5] [--json host_launches_ab.json]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _timing import paired_ms, paired_ratio

import cutlass_offload as co
from cutlass_offload.models import load_model


def host_profile(fn, forwards: int, top: int = 8) -> list:
    """[[us per forward, calls per forward, function]] of the ``top`` functions by
    total time over ``forwards`` calls of ``fn``."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(forwards):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    rows = []
    for (file, line, name), (_, calls, tottime, _, _) in pstats.Stats(prof).stats.items():
        rows.append([tottime / forwards * 1e6, calls / forwards, f"{Path(file).name}:{line}({name})"])
    return sorted(rows, reverse=True)[:top]


def run_model(name: str, a) -> dict:
    model, inputs = load_model(name, "fp16")
    model = model.cuda().eval()
    inputs = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs)
    ours = {}
    for label, mode in (("host_launches", None), ("graph_choice", "reduce-overhead")):
        torch._dynamo.reset()
        compiled = co.compile(model, inputs, glue="inductor", mode=mode, dynamic_batch=True)
        compiled.set_glue("inductor", mode=None)          # both run plain: host launches
        ours[label] = compiled
    fns = {label: (lambda c=c: c(*inputs)) for label, c in ours.items()}
    tc = torch.compile(model)
    fns["torch_compile"] = lambda: tc(*inputs)
    res = {"regions": {label: len(c.region_modules()) for label, c in ours.items()}}
    with torch.no_grad():
        for f in fns.values():
            f()
            f()
        times = paired_ms(fns, a.rounds, a.reps)
        if a.host_profile:
            res["host_profile"] = {label: host_profile(fns[label], a.host_profile) for label in ours}
    res["rounds_ms"] = times
    res["ratio_to_torch_compile"] = {label: paired_ratio(times, label, "torch_compile") for label in ours}
    res["host_launches_to_graph_choice"] = paired_ratio(times, "host_launches", "graph_choice")
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--host-profile", type=int, default=0, metavar="N", help="cProfile N forwards of each of ours")
    p.add_argument("--json", default="host_launches_ab.json")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "models": {}}
    print("| model | regions (host launches / graph choice) | ours host launches / torch.compile | "
          "ours graph choice / torch.compile | host launches / graph choice |")
    print("| --- | --- | --- | --- | --- |")
    for name in a.models:
        r = out["models"][name] = run_model(name, a)
        rt = r["ratio_to_torch_compile"]
        print(f"| {name} | {r['regions']['host_launches']} / {r['regions']['graph_choice']} | "
              f"{rt['host_launches']:.3f} | {rt['graph_choice']:.3f} | {r['host_launches_to_graph_choice']:.3f} |")
        for label, rows in r.get("host_profile", {}).items():
            print(f"-- {name} / {label}: host us per forward, calls")
            for us, calls, fn in rows:
                print(f"   {us:9.1f} {calls:6.1f}  {fn}")
        Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
