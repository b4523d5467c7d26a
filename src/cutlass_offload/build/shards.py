"""Group distinct kernels into balanced shards (one translation unit each).

A translation unit costs a fixed part (parsing the CUTLASS/CuTe headers, first
instantiation of shared templates) plus a marginal part per distinct kernel
(../shared/design.md, measured with nvcc 13.0 on the 16-core H200 host: 3.x sm90a
~43 s fixed + ~7 s per kernel, 2.x ~10 s + ~1.6 s). With P parallel jobs the
floor is about fixed + U * marginal / P, so kernels of one family and dtype (which
share most template instantiations) go together, split into as many equal shards
as the job slots allow, while a split still shortens the longest shard.
"""
from __future__ import annotations

import math
import os

from ..config import knobs
from .toolchain import available_memory

COST = {"cutlass3x_sm90": (43.0, 7.0), "cutlass2x_sm80": (10.0, 1.6)}   # (fixed, per kernel) s
PEAK_MEMORY = {"cutlass3x_sm90": 4.5 * 2**30, "cutlass2x_sm80": 2.0 * 2**30}  # bytes per nvcc


def estimate(kernels) -> float:
    """Predicted seconds of one translation unit holding ``kernels``."""
    fams = {k.config.family for k in kernels}
    fixed = max(COST[f][0] for f in fams) if fams else 1.0
    return fixed + sum(COST[k.config.family][1] for k in kernels)


def job_slots(kernels=()) -> int:
    """Parallel nvcc processes: cores, capped by available memory / peak per job.

    Override with CUTLASS_OFFLOAD_JOBS.
    """
    if knobs().jobs:
        return knobs().jobs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    per_job = max((PEAK_MEMORY[k.config.family] for k in kernels), default=PEAK_MEMORY["cutlass2x_sm80"])
    mem = available_memory()
    by_memory = max(1, int(mem // per_job)) if mem else cores
    return max(1, min(cores, by_memory))


def plan_shards(kernels: list, slots: int) -> list:
    """Lists of kernels, one per shard, longest predicted first.

    Kernels are grouped by (family, dtype) and sorted by name inside a group; the
    group with the longest predicted shard is split further (into equal contiguous
    chunks) while shards <= slots and the split shortens it.
    """
    groups = {}
    for k in sorted(kernels, key=lambda k: k.name):
        groups.setdefault((k.config.family, k.dtype), []).append(k)
    parts = {g: 1 for g in groups}

    def longest(g):
        ks = groups[g]
        return estimate(ks[:math.ceil(len(ks) / parts[g])])

    while groups and sum(parts.values()) < slots:
        g = max(groups, key=longest)
        before, budget = longest(g), slots - sum(parts.values()) + parts[g]
        # the fewest parts that shorten the longest shard (ceil(n / p) has plateaus)
        better = next((p for p in range(parts[g] + 1, min(len(groups[g]), budget) + 1)
                       if estimate(groups[g][:math.ceil(len(groups[g]) / p)]) < before), None)
        if better is None:
            break
        parts[g] = better
    shards = []
    for g, ks in groups.items():
        n = parts[g]
        size, extra = divmod(len(ks), n)
        i = 0
        for j in range(n):
            step = size + (1 if j < extra else 0)
            shards.append(ks[i:i + step])
            i += step
    return sorted((s for s in shards if s), key=estimate, reverse=True)
