"""Group distinct kernels into balanced shards (one translation unit each).

A translation unit costs a fixed part (parsing the CUTLASS/CuTe headers, first
instantiation of shared templates), plus a large part for each distinct mainloop
(dtype, layouts, alignment, tile, cluster, schedule) and a small part for each
further epilogue on a mainloop already in the unit. Kernels of one family and
dtype go together; within a group they are packed (largest mainloop first) into
as many shards as the job slots allow while a split still shortens the longest
shard: the floor of the wall time is about fixed + the longest shard's work.

Costs, in seconds (relative weights for balancing, not predictions):
* 3.x sm90a GEMMs and convs: measured on the 2-core machine, each unit compiled alone
  with the build's nvcc -c (session 41, the sm90 GEMM units without CUTLASS's umbrella
  headers; benchmarks/results/unit_costs_2core_2026-12-06_s41.txt): one kernel 23.8 s,
  a second epilogue on its mainloop +1.9 s, a second mainloop +5.7 s, four mainloops
  45.0 s, hence 18 / 6.4 / 1.9 (CUTLASS's TMA epilogue, the default; with the staged
  epilogue 12.6 s, +0.5, +4.4, 25.0 s: 8.3 / 4.3 / 0.5, near enough in ratio to share
  the row). Until session 41 the row was 43 / 9 / 3, from the 16-core H200 host with
  the umbrella headers (a one-kernel unit about 35 s alone, each further kernel 7-9 s:
  benchmarks/results/shard_sweep_sdunet_2026-12-02_h200.json, where 17 units built
  sd-unet in 90.6 s against 100.6-152.6 s for 13 down to 9 units).
* 3.x Hopper FMHA (emit/attention_sm90.py; family cutlass3x_sm90, priced by kind):
  the SD UNet's head dims 40, 80 and 160 on 2 cores. With the staged O store and
  -ftz=true (the default since session 42): one kernel 21.0 s, two 33.9 s, three
  43.1 s (benchmarks/results/unit_costs_fmha_staged_2core_2026-12-06_s42.txt): 10 /
  11 / 11. With the example's TMA epilogue (session 41): 29.6, 46.5, 59.5 s. Every
  config instantiates its own mainloop, softmax and epilogue, 2x a GEMM mainloop,
  and no kernel comes cheap beside another; priced as a GEMM, sd-unet's three FMHA
  kernels shared one unit, the build's longest (79.6 s for two of them on the H200
  host in session 14).
* 2.x sm80: on 2 cores (session 42, benchmarks/results/unit_costs_sm80_2core_2026-12-06_s42.txt)
  bert-base's and gpt2's GEMM kernels, 1 / 2 / 4 / 8 in a unit: 7.7 / 8.6 / 10.1 / 13.1 s:
  7 / 0.8 / 0.4 (it was 10 / 2 / 0.8, an early H200 measurement).
* rowwise_norm (emit/norm.py): a one-kernel TU 2.8 s on 2 cores in session 42 (9-13 s
  when it included more of CUTLASS's headers), ~350 MB peak; kernels nearly free:
  2.5 / 0.3 / 0.3.
* nhwc_group_norm (emit/group_norm.py): the same headers; on 2 cores one kernel 10.1 s
  (sm_90a), sd-unet's six 12.7 s, ~350 MB peak: 4 / 0.3 / 0.3 as well.
* direct_depthwise (emit/depthwise.py): the norms' headers and one small kernel
  template each (every instantiation is a fully unrolled kernel of its own): 4 / 1 / 1,
  not yet timed.
* attention (emit/attention.py; family cutlass2x_sm80, priced by kind): on 2 cores
  in session 42 one kernel 5.4 s, two 6.3 s (the same tile with and without bias),
  three 7.3 s, ~0.6 GB peak: 4.4 / 1 / 1 (it was 12 / 6 / 6, measured beside another
  job when the kernel included CUTLASS's umbrella headers).
"""
from __future__ import annotations

import math
import os

from ..config import knobs
from .toolchain import available_memory

COST = {"cutlass3x_sm90": (18.0, 6.4, 1.9), "attention_sm90": (10.0, 11.0, 11.0),  # fixed, mainloop, epilogue
        "cutlass2x_sm80": (7.0, 0.8, 0.4),
        "rowwise_norm": (2.5, 0.3, 0.3), "nhwc_group_norm": (4.0, 0.3, 0.3),
        "direct_depthwise": (4.0, 1.0, 1.0), "attention": (4.4, 1.0, 1.0)}
# bytes per nvcc of a one-kernel unit (3.x: 4.1-5.2 GB for 1-5 kernels in the sweep
# above, 7.6 GB for 17), then per further mainloop and per further epilogue on a
# mainloop already in it: on 2 cores one 3.x GEMM kernel alone peaked at 1.6-3.8 GB,
# 42 in one unit at 16.6 GB (cicc; a second unit beside it was killed by the OOM
# killer on a 24 GiB machine; session 25).
PEAK_MEMORY = {"cutlass3x_sm90": 4.5 * 2**30, "attention_sm90": 4.5 * 2**30, "cutlass2x_sm80": 2.0 * 2**30,
               "rowwise_norm": 0.5 * 2**30, "nhwc_group_norm": 0.5 * 2**30,
               "direct_depthwise": 0.5 * 2**30,
               "attention": 0.6 * 2**30}
# 2.x's and the small families' from their 1-kernel figures, not measured per kernel.
# Fitted to 2-core units (nvcc 13.0, cicc's peak): 42 kernels / 26 mainloops 16.2 GiB,
# 13 / 12 12.3 GiB, 7 / 7 8.1 GiB, 11 / 5 6.9 GiB (the last three with nvcc -t2).
MAINLOOP_MEMORY = {"cutlass3x_sm90": 0.7 * 2**30, "attention_sm90": 0.7 * 2**30, "cutlass2x_sm80": 0.15 * 2**30,
                   "attention": 0.15 * 2**30}
EPILOGUE_MEMORY = {"cutlass3x_sm90": 0.1 * 2**30}
OTHER_KERNEL_MEMORY = 0.05 * 2**30


def _priced(kernel) -> str:
    """The COST / PEAK_MEMORY row of a kernel: its family, or for the attention
    kernels (priced apart from their families' GEMMs) "attention" (the sm80 kernel,
    family cutlass2x_sm80) or "attention_sm90" (the Hopper FMHA, cutlass3x_sm90)."""
    if kernel.kind == "attention":
        return {"cutlass2x_sm80": "attention", "cutlass3x_sm90": "attention_sm90"}.get(
            kernel.config.family, kernel.config.family)
    return kernel.config.family


def mainloop(kernel) -> tuple:
    """What two kernels must share for one to be cheap next to the other."""
    return (kernel.kind, kernel.config.family, kernel.dtype, kernel.layout_a, kernel.layout_b,
            getattr(kernel, "iterator", ""), kernel.align_a,
            kernel.align_b, kernel.align_c, kernel.config.tile, kernel.config.cluster,
            kernel.config.stages, kernel.config.kernel_schedule, kernel.config.warp,
            getattr(kernel.config, "swap_ab", False))


def estimate(kernels) -> float:
    """Predicted relative cost of one translation unit holding ``kernels``."""
    if not kernels:
        return 0.0
    fixed = max(COST[_priced(k)][0] for k in kernels)
    seen, total = set(), fixed
    for k in kernels:
        _, new, extra = COST[_priced(k)]
        key = mainloop(k)
        total += extra if key in seen else new
        seen.add(key)
    return total


def peak_memory(kernels=()) -> float:
    """Bytes one nvcc of a unit holding ``kernels`` needs: the largest PEAK_MEMORY of
    their families plus, for each kernel after the first, MAINLOOP_MEMORY for a new
    mainloop or EPILOGUE_MEMORY for a further epilogue on one already in the unit
    (cicc holds every instantiation of the unit at once); a unit without CUTLASS kernels
    (launchers, library info) took 334 MB on 2 cores, hence 0.5 GiB. The Ray
    executor asks for this much per task."""
    kernels = list(kernels)
    if not kernels:
        return 0.5 * 2**30
    seen, extra = set(), 0.0
    for k in kernels:
        row, key = _priced(k), mainloop(k)
        extra += (EPILOGUE_MEMORY.get(row, OTHER_KERNEL_MEMORY) if key in seen else
                  MAINLOOP_MEMORY.get(row, OTHER_KERNEL_MEMORY))
        seen.add(key)
    first = max(MAINLOOP_MEMORY.get(_priced(k), OTHER_KERNEL_MEMORY) for k in kernels)
    return max(PEAK_MEMORY[_priced(k)] for k in kernels) + extra - first


def job_slots(kernels=()) -> int:
    """Parallel nvcc processes: cores, capped by available memory / peak per job.

    Override with CUTLASS_OFFLOAD_JOBS.
    """
    if knobs().jobs:
        return knobs().jobs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    per_job = max((PEAK_MEMORY[_priced(k)] for k in kernels), default=PEAK_MEMORY["cutlass2x_sm80"])
    mem = available_memory()
    by_memory = max(1, int(mem // per_job)) if mem else cores
    return max(1, min(cores, by_memory))


def _split(group: list, n: int) -> list:
    size, extra = divmod(len(group), n)
    out, i = [], 0
    for j in range(n):
        step = size + (1 if j < extra else 0)
        out.append(group[i:i + step])
        i += step
    return out


def _lpt(pieces: list, parts: int) -> list:
    """Largest piece first, each into the shard with the smallest estimate."""
    bins = [[] for _ in range(parts)]
    for piece in sorted(pieces, key=lambda p: (-estimate(p), p[0].name)):
        target = min(range(parts), key=lambda i: (estimate(bins[i]), i))
        bins[target].extend(piece)
    return [b for b in bins if b]


def _pack(kernels: list, parts: int) -> list:
    """Pack kernels into at most ``parts`` shards, keeping mainloop groups whole
    unless cutting one (which costs its mainloop once more) shortens the longest
    shard. Deterministic."""
    groups = {}
    for k in sorted(kernels, key=lambda k: k.name):
        groups.setdefault(mainloop(k), []).append(k)
    cuts = {key: 1 for key in groups}

    def packed(c):
        return _lpt([p for key, g in groups.items() for p in _split(g, c[key])], parts)

    def makespan(c):
        return max(estimate(b) for b in packed(c))

    best = makespan(cuts)
    improved = True
    while improved:
        improved = False
        for key in sorted(groups, key=lambda k: -estimate(groups[k])):
            for n in range(cuts[key] + 1, min(len(groups[key]), parts) + 1):
                trial = {**cuts, key: n}
                m = makespan(trial)
                if m < best:
                    cuts, best, improved = trial, m, True
                    break
            if improved:
                break
    return packed(cuts)


# Throughput of concurrent nvcc processes relative to one after another, by job slots.
# On the 2-vCPU machines (developers, CI) two CUTLASS 3.x compiles side by side
# (mlp at sm_90a: a 2-kernel and a 1-kernel unit) did 190 s of one-at-a-time work in
# 141 s, 1.35x instead of 2x: 0.675. On the 16-core H200 host one-kernel shards
# took 42-57 s beside 12 others against ~42-50 s alone: about 1.
def concurrency_efficiency(slots: int) -> float:
    return 0.675 if slots <= 2 else 1.0


def predicted_wall(shards: list, slots: int) -> float:
    """Predicted wall time (relative units, as ``estimate``) of compiling ``shards``
    on ``slots`` parallel jobs: longest-first list schedule, slowed by
    ``concurrency_efficiency`` when more than one shard runs at once."""
    loads = [0.0] * max(1, min(slots, len(shards)))
    for e in sorted((estimate(s) for s in shards), reverse=True):
        loads[loads.index(min(loads))] += e
    return max(loads) / (concurrency_efficiency(slots) if len(loads) > 1 else 1.0)


def choose_shards(kernels: list, slots: int, memory: int | None = None) -> list:
    """The sharded build's units: ``plan_shards``, unless putting every kernel into
    as few translation units as CUTLASS's headers allow (``header_compatible_groups``:
    the single strategy's units) is predicted to be at least as fast, which happens
    on few cores, where concurrent nvcc processes gain less than the fixed cost
    each extra unit repeats. Shards of one unit each are never slower than
    ``single`` by this model. Both are compared as they would be built: after
    ``fit_memory`` has cut each unit too big for its share of ``memory`` (bytes; None:
    this machine's available memory). Compared before the cut, sd-unet's one
    header-compatible unit of 39 kernels looked far longer than the five units it
    becomes on a 24 GiB machine, and the nine planned units were chosen instead: on
    2 cores 202 / 211 s of build against 194 / 211 s for the five (session 41)."""
    if not kernels:
        return []
    memory = available_memory() if memory is None else memory
    planned = fit_memory(plan_shards(kernels, slots), slots, memory)
    merged = fit_memory(sorted(header_compatible_groups(sorted(kernels, key=lambda k: k.name)),
                               key=estimate, reverse=True), slots, memory)
    return merged if predicted_wall(merged, slots) <= predicted_wall(planned, slots) else planned


def fit_memory(shards: list, slots: int, memory: int) -> list:
    """``shards`` with each one whose ``peak_memory`` exceeds its share of ``memory``
    (bytes; 0: unknown, nothing is split) cut into the fewest pieces (``_pack``)
    that fit, so that ``slots`` units compiling at once stay within it: one cicc
    holds all of its unit's instantiations, and on a 2-core 24 GiB machine two
    units of 42 CUTLASS 3.x kernels each were more than it had (PEAK_MEMORY's
    note). The share is of the units that will compile at once after the cut: one
    unit cut in two on 2 slots gets half, not all, of ``memory``. A one-kernel unit
    is never cut. Longest predicted first, as the input."""
    if not memory:
        return shards
    at_once = max(1, min(slots, len(shards)))
    while True:
        share = memory / at_once
        out = []
        for shard in shards:
            pieces = min(len(shard), math.ceil(peak_memory(shard) / share))
            while pieces < len(shard) and max(peak_memory(p) for p in _pack(shard, pieces)) > share:
                pieces += 1
            out += _pack(shard, pieces) if pieces > 1 else [shard]
        # more units than before may now run side by side: cut again for their share
        if min(slots, len(out)) <= at_once:
            return sorted(out, key=estimate, reverse=True)
        at_once = min(slots, len(out))


def unit_class(kernel) -> str:
    """Which kernels may share a translation unit: those of one class.

    * "conv3x": CUTLASS 3.x conv kernels cannot sit in a TU that also includes
      cutlass/gemm/kernel/gemm_universal.h (the 2.x GEMM emitter's headers pull it
      in, as the sm90 GEMM's did until session 40; the classes stay apart): ConvUniversal derives from 3.x GemmUniversal with a non-tuple problem
      shape, which the 2.x GemmUniversal partial specialization also matches
      (nvcc: "more than one partial specialization matches"; moving the include
      after the conv's instantiation makes g++ reject it instead). CUTLASS's own
      generator never mixes them either. A conv lowered onto the GEMM
      (iterator "direct" / "im2col", emit/conv_gemm_sm90.py) is a GEMM here.
    * "gemm3x_stream_k": 3.x GEMMs with the stream-K tile scheduler do not compile
      with the grid dependency control the persistent ones define for their TU
      (emit/gemm_sm90.py GDC_DEFINES).
    * "attention3x": the Hopper FMHA compiles with its own nvcc flags (-ftz=true,
      emit/attention_sm90.NVCC_FLAGS), which a TU applies to all it holds.
    * "common": everything else.
    """
    if kernel.config.family == "cutlass3x_sm90":
        if kernel.kind == "attention":
            return "attention3x"
        if kernel.kind == "conv2d_fprop" and not kernel.iterator:
            return "conv3x"
        # GEMMs, and convs lowered onto the GEMM (iterator "direct" / "im2col")
        if kernel.kind in ("gemm", "conv2d_fprop") and kernel.config.tile_scheduler == "stream_k":
            return "gemm3x_stream_k"
    return "common"


def header_compatible_groups(kernels) -> list:
    """The kernels split into groups that may share one translation unit (by
    ``unit_class``), in first-seen class order."""
    groups = {}
    for k in kernels:
        groups.setdefault(unit_class(k), []).append(k)
    return list(groups.values())


def plan_shards(kernels: list, slots: int) -> list:
    """Lists of kernels, one per shard, longest predicted first.

    Kernels are grouped by (kind, family, dtype, unit class); the group with the longest predicted
    shard gets more shards (skipping counts that do not shorten it) while the
    total stays within ``slots``.
    """
    groups = {}
    for k in sorted(kernels, key=lambda k: k.name):
        groups.setdefault((k.kind, k.config.family, k.dtype, unit_class(k)), []).append(k)
    parts = {g: 1 for g in groups}

    def longest(g, p=None):
        return max(estimate(s) for s in _pack(groups[g], p or parts[g]))

    while groups and sum(parts.values()) < slots:
        g = max(groups, key=longest)
        before, budget = longest(g), slots - sum(parts.values()) + parts[g]
        better = next((p for p in range(parts[g] + 1, min(len(groups[g]), budget) + 1)
                       if longest(g, p) < before), None)
        if better is None:
            break
        parts[g] = better
    shards = [s for g, ks in groups.items() for s in _pack(ks, parts[g])]
    return sorted(shards, key=estimate, reverse=True)
