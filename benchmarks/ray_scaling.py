"""Predicted cold build time on a Ray cluster, from the measured units of one build.

Reads the ``report.json`` that ``cutlass-offload compile MODEL --out DIR`` writes
(build.units: each translation unit's kernels, seconds, peak memory, source path;
build.link_seconds) and predicts the cold build on 1, 2, 4, 8, 16 nodes of 16
cores with a critical-path model:

* the measured unit times are list-scheduled onto nodes x cores slots, longest
  first, each on the slot that frees first (LPT); a node runs at most
  floor(node memory / the unit's peak memory) units at once as well;
* each unit's object travels back to the client at --bandwidth (added to its task),
  and the client's link also bounds the total: all bytes / bandwidth;
* each task pays --task-overhead seconds of Ray scheduling;
* the link step runs on the client after the last object: the measured link time.
The shards stay as measured (the sharder would cut more, smaller shards for more
slots: the prediction is pessimistic there), the unit times are taken as measured
on the build machine (another core speed scales them), and cached units count as
cold with their recorded seconds when present. Lower bound: the longest unit, its
transfer and the link.

    python benchmarks/ray_scaling.py out/unet/report.json --json ray_scaling.json
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
from pathlib import Path

NODES = (1, 2, 4, 8, 16)


def lpt_makespan(durations: list, slots: int) -> float:
    """Finish time of the last job when ``durations`` (s) go longest first onto
    ``slots`` parallel slots, each to the slot that frees first (Graham's LPT list
    schedule: within 4/3 of the optimum). 0.0 for no jobs; ValueError for slots < 1."""
    if slots < 1:
        raise ValueError("slots must be >= 1")
    free = [0.0] * min(slots, max(1, len(durations)))
    heapq.heapify(free)
    end = 0.0
    for d in sorted(durations, reverse=True):
        t = heapq.heappop(free) + d
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def predict(units: list, link_s: float, nodes: int, cores: int = 16, node_memory_gb: float = 128.0,
            bandwidth_mb_s: float = 1000.0, task_overhead_s: float = 0.05) -> dict:
    """Predicted build seconds on ``nodes`` x ``cores``. units: dicts with seconds,
    peak_rss_mb, object_bytes. Memory caps the slots at node_memory / the largest
    peak of any unit (a uniform cap: conservative for mixed builds)."""
    peak_gb = max((u["peak_rss_mb"] for u in units), default=0.0) / 1024
    per_node = cores if peak_gb <= 0 else max(1, min(cores, int(node_memory_gb // peak_gb)))
    tasks = [u["seconds"] + task_overhead_s + u["object_bytes"] / (bandwidth_mb_s * 1e6) for u in units]
    compile_s = lpt_makespan(tasks, nodes * per_node) if tasks else 0.0
    link_bound = sum(u["object_bytes"] for u in units) / (bandwidth_mb_s * 1e6)
    total = max(compile_s, link_bound) + link_s
    return {"nodes": nodes, "slots": nodes * per_node, "compile_seconds": compile_s,
            "link_seconds": link_s, "seconds": total}


def read_units(report: dict) -> tuple:
    """(units, link seconds, measured wall seconds) of a report.json's build."""
    b = report.get("build") or {}
    units = []
    for u in b.get("units", []):
        obj = Path(u.get("source") or "").with_name("unit.o") if u.get("source") else None
        size = obj.stat().st_size if obj is not None and obj.is_file() else 0
        seconds = u["seconds"]
        if u.get("cache_hit") and obj is not None:       # a warm report: the recorded cold time
            try:
                seconds = json.loads(obj.with_name("meta.json").read_text()).get("seconds", 0.0)
            except (OSError, ValueError):
                pass
        if seconds > 0:
            units.append({"name": u["name"], "seconds": seconds, "peak_rss_mb": u.get("peak_rss_mb", 0.0),
                          "object_bytes": size})
    return units, b.get("link_seconds", 0.0), b.get("seconds", 0.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", help="report.json of a cold `cutlass-offload compile --out DIR`")
    p.add_argument("--cores", type=int, default=16, help="cores per node (default 16)")
    p.add_argument("--node-memory-gb", type=float, default=128.0, help="memory per node (default 128)")
    p.add_argument("--bandwidth", type=float, default=1000.0, help="client link, MB/s (default 1000: 10 GbE)")
    p.add_argument("--task-overhead", type=float, default=0.05, help="Ray scheduling per task, s")
    p.add_argument("--models", type=int, default=1,
                   help="predict N builds of this size at once (a model zoo): one model's build is "
                        "bounded by its longest unit on one node already; many are not")
    p.add_argument("--object-mb", type=float, default=2.0,
                   help="object size assumed where the report's object is gone (MB)")
    p.add_argument("--json", default="ray_scaling.json")
    a = p.parse_args(argv)
    units, link_s, measured = read_units(json.loads(Path(a.report).read_text()))
    if not units:
        raise SystemExit(f"{a.report}: no compiled unit with a recorded time (compile it cold)")
    for u in units:
        u["object_bytes"] = u["object_bytes"] or int(a.object_mb * 1e6)
    units = [dict(u, name=f"{u['name']}#{i}") for i in range(a.models) for u in units]
    rows = [predict(units, link_s, n, a.cores, a.node_memory_gb, a.bandwidth, a.task_overhead) for n in NODES]
    longest = max(units, key=lambda u: u["seconds"])
    bound = longest["seconds"] + longest["object_bytes"] / (a.bandwidth * 1e6) + link_s
    assumptions = {
        "cores_per_node": a.cores, "node_memory_gb": a.node_memory_gb, "bandwidth_mb_s": a.bandwidth,
        "task_overhead_s": a.task_overhead, "models_built_at_once": a.models,
        "object_mb_where_unknown": a.object_mb,
        "model": "LPT list schedule of the measured unit times (+ transfer + overhead) on nodes x "
                 "slots, slots per node = min(cores, node memory / largest unit peak); client link "
                 "bounds all transfers; then the measured link step; shards as measured",
    }
    print(f"{a.report}: {len(units)} units, {sum(u['seconds'] for u in units):.1f} s of compiling, "
          f"{sum(u['object_bytes'] for u in units) / 2**20:.1f} MiB of objects, link {link_s:.1f} s, "
          f"measured wall {measured:.1f} s")
    print("assumptions: " + "; ".join(f"{k} {v}" for k, v in assumptions.items()))
    print(f"{'nodes':>5} {'slots':>6} {'compile s':>10} {'link s':>7} {'predicted s':>12}")
    for r in rows:
        print(f"{r['nodes']:>5} {r['slots']:>6} {r['compile_seconds']:>10.1f} {r['link_seconds']:>7.1f} "
              f"{r['seconds']:>12.1f}")
    print(f"lower bound (longest unit {longest['name']} + its transfer + link): {bound:.1f} s")
    out = {"report": os.path.abspath(a.report), "units": units, "link_seconds": link_s,
           "measured_seconds": measured, "assumptions": assumptions, "predictions": rows,
           "lower_bound_seconds": bound}
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
