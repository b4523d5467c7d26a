"""Compile-time benchmark: build strategies on the same machine, in one run.

For each model: capture + partition + select once, then build the plan cold with
each strategy into its own fresh cache (``single``: one TU, one nvcc; ``sharded``:
ours; ``per-region``: one module per region, one after another — on more than
--sample regions it builds a random sample and extrapolates linearly, labelled).
Then the warm rebuild (nothing changed) and the rebuild after one region's problem
changes (N - 4: a new kernel). Prints a table and writes JSON.

    python benchmarks/compile_time.py mlp bert-base --arch sm_90a --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cutlass_offload.api import resolve_arch                # noqa: E402
from cutlass_offload.build import build                     # noqa: E402
from cutlass_offload.build.cache import BuildCache          # noqa: E402
from cutlass_offload.capture import capture                 # noqa: E402
from cutlass_offload.ir import GemmRegion                   # noqa: E402
from cutlass_offload.models import load_model               # noqa: E402
from cutlass_offload.partition import partition             # noqa: E402
from cutlass_offload.select import choose_kernel, select    # noqa: E402


def _timed_build(plan, strategy, cache, jobs=None):
    t0 = time.perf_counter()
    res = build(plan, strategy, cache, jobs)
    return time.perf_counter() - t0, res


def _changed(plan):
    """The plan after one GEMM region's N shrinks by 4 (alignment 4: a new kernel)."""
    gemms = [j for j, r in enumerate(plan.regions) if isinstance(r, GemmRegion)]
    i = max(gemms, key=lambda j: plan.regions[j].problem.n)
    r = plan.regions[i]
    p = replace(r.problem, n=r.problem.n - 4, align_c=4,
                align_b=4 if r.problem.layout_b == "row" else r.problem.align_b)
    k = choose_kernel(p, plan.arch)
    regions = plan.regions[:i] + (replace(r, problem=p),) + plan.regions[i + 1:]
    kernels = plan.kernels[:i] + (k,) + plan.kernels[i + 1:]
    return replace(plan, regions=regions, kernels=kernels)


def bench_model(name, arch, strategies, sample, workdir, parallel_sample=None, on_step=None) -> dict:
    """One model's row; ``on_step(row)`` after each strategy (the JSON is written as
    the run goes, so a run stopped at a time limit keeps what it measured)."""
    model, inputs = load_model(name, "fp16")
    t0 = time.perf_counter()
    plan = select(partition(capture(model, inputs).graph_module), arch)
    row = {"model": name, "arch": arch, "regions": len(plan.regions),
           "distinct_kernels": len(plan.distinct_kernels), "frontend_s": time.perf_counter() - t0,
           "cores": os.cpu_count(), "strategies": {}}
    for strategy in strategies:
        cache = BuildCache(Path(workdir) / f"{name}-{strategy}")
        sub, factor, jobs = plan, 1.0, None
        if strategy == "per-region" and len(plan.regions) > sample:
            idx = sorted(random.Random(0).sample(range(len(plan.regions)), sample))
            sub = replace(plan, regions=tuple(plan.regions[i] for i in idx),
                          kernels=tuple(plan.kernels[i] for i in idx))
            factor = len(plan.regions) / sample
            jobs = parallel_sample
        seconds, res = _timed_build(sub, strategy, cache, jobs)
        if jobs:   # modules compiled side by side: the serial time is the sum of their times
            seconds = sum(u.seconds for u in res.units) + res.link_seconds
        row["strategies"][strategy] = {
            "seconds": seconds * factor, "measured_s": seconds, "extrapolated": factor != 1.0,
            "units_compiled": len(res.compiled), "jobs": res.jobs,
            "critical_path_s": res.critical_path,
            "peak_rss_mb": max((u.peak_rss_mb for u in res.units), default=0.0),
            "build": res.to_dict()}       # per-unit seconds: input of benchmarks/ray_scaling.py
        print(f"  {name} {strategy}: {seconds:.1f} s" + (f" x {factor:.1f} (sample)" if factor != 1 else ""),
              flush=True)
        if strategy == "sharded":
            warm_s, warm = _timed_build(plan, "sharded", cache)
            row["warm_rebuild_s"] = warm_s
            changed_s, changed = _timed_build(_changed(plan), "sharded", cache)
            row["changed_layer_rebuild_s"] = changed_s
            row["changed_layer_kernel_units_compiled"] = sum(
                1 for u in changed.compiled if u.kernels)
        if on_step:
            on_step(row)
    return row


def table(rows) -> str:
    head = ("model", "kernels", "regions", "single s", "sharded s", "per-region s",
            "vs single", "vs per-region", "warm s", "1 layer s (units)")
    out = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        s = r["strategies"]
        get = lambda k: s.get(k, {}).get("seconds")
        fmt = lambda v: f"{v:.1f}" if v is not None else "-"
        pr = get("per-region")
        pr_txt = fmt(pr) + (" (extrapolated)" if s.get("per-region", {}).get("extrapolated") else "")
        sh = get("sharded")
        ratio = lambda a: f"{a / sh:.1f}x" if a and sh else "-"
        out.append(" | ".join([r["model"], str(r["distinct_kernels"]), str(r["regions"]),
                               fmt(get("single")), fmt(sh), pr_txt, ratio(get("single")), ratio(pr),
                               fmt(r.get("warm_rebuild_s")),
                               f"{fmt(r.get('changed_layer_rebuild_s'))} "
                               f"({r.get('changed_layer_kernel_units_compiled', '-')})"]))
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--arch", default=None)
    p.add_argument("--strategies", default="single,sharded,per-region")
    p.add_argument("--sample", type=int, default=8, help="per-region: regions built when there are more")
    p.add_argument("--parallel-sample", type=int, default=None, metavar="JOBS",
                   help="per-region sample: compile the sampled modules JOBS at a time and sum "
                        "each module's own compile time (same serial estimate, less waiting)")
    p.add_argument("--json", default="compile_time.json")
    a = p.parse_args()
    arch = resolve_arch(a.arch)
    rows = []

    def save(partial=None):
        Path(a.json).write_text(json.dumps(rows + ([partial] if partial else []), indent=1))

    with tempfile.TemporaryDirectory(prefix="co-bench-") as work:
        for m in a.models:
            rows.append(bench_model(m, arch, a.strategies.split(","), a.sample, work,
                                    a.parallel_sample, on_step=save))
            save()
    print(table(rows))


if __name__ == "__main__":
    main()
