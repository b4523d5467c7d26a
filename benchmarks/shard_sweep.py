"""How a model's kernels are cut into translation units against build time: one
plan, built cold (a fresh kernel cache each time) with the sharded strategy at
several job counts and with ``single``, on one machine in one run.

Issue 17: the cold build is CPU-bound, and kernels in one unit share the CUTLASS
headers and template instantiations, so fewer, larger units do less work in all
while more units run in parallel. For each build this prints and writes (JSON):
the wall time, the units and their kernels, the longest unit, and the CPU time of
every process the build ran (user + system of waited-for children, from
``resource.getrusage(RUSAGE_CHILDREN)``), i.e. the total work.

    python benchmarks/shard_sweep.py sd-unet --arch sm_90a --jobs 16,8,4 --single \\
        --json $OUT/shard_sweep.json
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build_once(plan, strategy: str, jobs, root: Path) -> dict:
    """Build ``plan`` cold into a fresh cache under ``root``; the row of the JSON."""
    from cutlass_offload.build import build
    from cutlass_offload.build.cache import BuildCache
    cache = BuildCache(Path(tempfile.mkdtemp(dir=root)))
    cpu0, t0 = _children_cpu(), time.perf_counter()
    res = build(plan, strategy, cache, jobs)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    info = res.to_dict()
    units = [{"name": u["name"], "kernels": len(u["kernels"]), "seconds": u["seconds"],
              "peak_rss_mb": u.get("peak_rss_mb")} for u in info["units"]]
    return {"strategy": strategy, "jobs": res.jobs, "wall_s": wall, "children_cpu_s": cpu,
            "units": units, "critical_path_s": info["critical_path_seconds"],
            "kernels": len(plan.distinct_kernels), "failures": info["failures"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--arch", default="sm_90a", help="target (default: sm_90a)")
    p.add_argument("--jobs", default="16,8,4", help="job counts of the sharded builds, comma-separated (default: 16,8,4)")
    p.add_argument("--single", action="store_true", help="also build with the single strategy")
    p.add_argument("--json", default="shard_sweep.json", help="output (default: ./shard_sweep.json)")
    p.add_argument("--work", default=None, help="folder for the caches (default: a temporary one)")
    a = p.parse_args(argv)

    from cutlass_offload.api import resolve_arch
    from cutlass_offload.capture import capture
    from cutlass_offload.models import load_model
    from cutlass_offload.partition import partition
    from cutlass_offload.select import select

    arch = resolve_arch(a.arch)
    model, inputs = load_model(a.model, "fp16")
    plan = select(partition(capture(model, inputs).graph_module), arch)
    root = Path(a.work or tempfile.mkdtemp(prefix="shard_sweep_"))
    root.mkdir(parents=True, exist_ok=True)
    runs = [("sharded", int(j)) for j in a.jobs.split(",") if j.strip()]
    if a.single:
        runs.append(("single", None))
    out = {"model": a.model, "arch": arch, "cores": os.cpu_count(), "rows": []}
    for strategy, jobs in runs:
        row = build_once(plan, strategy, jobs, root)
        out["rows"].append(row)
        Path(a.json).write_text(json.dumps(out, indent=1))
        longest = max((u["seconds"] or 0 for u in row["units"]), default=0)
        print(f"{a.model} {strategy:8s} jobs {str(row['jobs']):>4s}: wall {row['wall_s']:6.1f} s, "
              f"{len(row['units'])} units, longest {longest:6.1f} s, "
              f"CPU of all processes {row['children_cpu_s']:7.1f} s", flush=True)
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
