"""The sm90a conv search of benchmarks/kernels_bench.py (``--kinds conv --search full``):
every choice of ``select/conv.search_space`` (TMA implicit-GEMM tiles, clusters and
stage counts; the im2col lowering with and without split-K for small outputs)
timed on each corpus conv, and the learned conv table
(families/conv_sm90_table.py) written from the winners.

As the attention search (_attention_search.py): one parallel build of every
candidate kernel into the cache (prebuild), then one round per candidate rank,
the synthetic conv model compiled with the rank-th choice of each problem forced
(select's ``tuned``: conv_tuning_id -> ConvChoice), each region timed like the
heuristic's (10 calls in a CUDA graph, median replay) and checked against cuDNN
on the same inputs; a choice whose relative error exceeds ``TOL`` or whose call
fell back is not counted, nor is one whose launch fails (the round runs again
with the rules' choice for that problem; a fault that leaves CUDA unusable ends
the rounds, and the table is written from those done).
"""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import torch

from _attention_search import (branch_regions, compile_regions, prebuild_all, record_tuned,
                               time_region)

TOL = 1e-2          # relative error against cuDNN (fp32 accumulation on both sides)
MIN_GAIN = 1.02     # a table row only where the winner beats the rules' choice by this much


def search(rows, model, inputs, firsts, *, region_inputs, graph_us, rel_err) -> dict:
    """Time every search-space choice of each row's region (rows from the heuristic
    run of the same model, in entry order); fills each row's ``search`` ({tag: us or
    error}), ``search_choices`` ({tag: ConvChoice.to_dict()}), ``search_default``
    (the rules' tag), ``tuned`` / ``tuned_us``. Returns {"build_s", "rounds",
    "kernels", "failed_units"}."""
    from cutlass_offload.ir import ConvKernel
    from cutlass_offload.select import conv_tuning_id
    from cutlass_offload.select.conv import choose_conv_kernel, search_space
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    model = model.cuda()
    inputs = tuple(x.cuda() for x in inputs)
    base = branch_regions(compile_regions(model, inputs), inputs, firsts, region_inputs)
    spaces = {}
    for i, (m, _) in base.items():
        if not isinstance(m.kernel, ConvKernel):
            continue
        p = m.region.problem
        space = search_space(p, "sm90a", sms)
        if len(space) > 1:
            spaces[i] = (conv_tuning_id(p), space, p)
    kernels = {}
    for _, space, p in spaces.values():
        for c in space:
            k = choose_conv_kernel(p, "sm90a", sms, choice=c)
            kernels.setdefault(k.name, k)
    build_s, failed = prebuild_all(kernels)
    rounds = max((len(s) for _, s, _ in spaces.values()), default=0)
    launch_failed = []
    for r in range(rounds):
        tuned = {tid: space[r] for tid, space, _ in spaces.values() if r < len(space)}
        compiled, found, failed_here, tuned = _round(model, inputs, tuned, spaces, firsts,
                                                     region_inputs)
        launch_failed += [(rows[i].get("id") if i >= 0 else None, tag, err)
                          for i, tag, err in failed_here]
        for i, tag, err in failed_here:
            if i >= 0:
                rows[i].setdefault("search", {})[tag] = err
        if compiled is None:          # a fault no retry survives: the rounds end here
            break
        for i, (tid, space, p) in spaces.items():
            if r >= len(space) or i not in found or tuned.get(tid) != space[r]:
                continue
            m, xs = found[i]
            choice = space[r]
            tag = choice.tag
            rows[i].setdefault("search_choices", {})[tag] = choice.to_dict()
            out = rows[i].setdefault("search", {})
            want = choose_conv_kernel(p, "sm90a", sms, choice=choice).name
            if m.kernel.name != want:
                out[tag] = f"not built ({m.kernel.name})"
                continue
            out[tag] = time_region(m, xs, graph_us, rel_err, TOL)
        del compiled
        torch.cuda.empty_cache()
    for i, (_, space, _) in spaces.items():
        rows[i]["search_default"] = space[0].tag
        record_tuned(rows[i])
    return {"build_s": build_s, "rounds": rounds, "kernels": len(kernels),
            "failed_units": sorted(failed), "launch_failed": launch_failed}


def _round(model, inputs, tuned, spaces, firsts, region_inputs, retries=8):
    """Compile and run one round. A region whose forced choice fails to launch
    (KernelLaunchError naming it) gets its rules' choice instead and the round runs
    again, up to ``retries`` times. Returns (compiled or None, {branch: (module,
    inputs)}, [(branch, choice tag, error)], the choices it ran): None when CUDA is
    left in an error state (a fault), after which nothing more can run in this
    process."""
    from cutlass_offload.errors import KernelLaunchError
    failed = []
    for _ in range(retries + 1):
        compiled = compile_regions(model, inputs, tuned)
        try:
            return compiled, branch_regions(compiled, inputs, firsts, region_inputs), failed, tuned
        except KernelLaunchError as e:
            try:
                torch.cuda.synchronize()
            except RuntimeError as fault:
                failed.append((-1, "?", f"fault after {e}: {fault}"[:300]))
                return None, {}, failed, tuned
            name = str(e).split(" ", 1)[0]
            mod = next((m for m in compiled.region_modules() if m.region.name == name), None)
            hit = None
            for i, (tid, space, _) in spaces.items():
                if mod is not None and tuned.get(tid) is not None and \
                        conv_kernel_name(space, tuned[tid], mod) == mod.kernel.name:
                    hit = (i, tid, space)
                    break
            if hit is None:
                raise
            i, tid, space = hit
            failed.append((i, tuned[tid].tag, f"launch failed: {e}"[:300]))
            tuned = {**tuned, tid: space[0]}
    raise RuntimeError(f"more than {retries} launch failures in one round")


def conv_kernel_name(space, choice, mod) -> str:
    """The kernel name ``choice`` gives the problem of region module ``mod``."""
    from cutlass_offload.select.conv import choose_conv_kernel
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return choose_conv_kernel(mod.region.problem, "sm90a", sms, choice=choice).name


def write_table(rows, path: Path, gpu: str, num_sms: int) -> int:
    """families/conv_sm90_table.json from the searched rows: per problem class (one
    class may hold several corpus convs, e.g. other epilogues), the choice with the
    least total time over the class's convs that timed it, where that beats the
    rules' choice by MIN_GAIN. Atomic write; returns the number of rows."""
    from cutlass_offload.build.toolchain import cutlass_version
    from cutlass_offload.families.conv_sm90_table import key_of
    by_key = {}
    for r in rows:
        if r.get("kind") != "conv2d" or "search" not in r:
            continue
        n = r["n"] if r.get("n") is not None else r["n_hint"]
        key = key_of(n, *(r[f] for f in ("h", "w", "c", "k", "r", "s", "pad", "stride", "dilation")))
        by_key.setdefault(key, []).append(r)
    out = {}
    for key, group in by_key.items():
        tags = set.intersection(*({t for t, us in g["search"].items() if isinstance(us, float)}
                                  for g in group))
        default = group[0]["search_default"]
        if not tags or default not in tags:
            continue
        total = {t: sum(g["search"][t] for g in group) for t in tags}
        best = min(total, key=total.get)
        if total[default] / total[best] < MIN_GAIN:
            continue
        out[key] = {"choice": group[0]["search_choices"][best], "us": total[best] / len(group),
                    "default_us": total[default] / len(group),
                    "anchor_us": sum(g.get("anchor_us") or 0 for g in group) / len(group)}
    data = {"gpu": gpu, "num_sms": num_sms, "date": datetime.date.today().isoformat(),
            "cutlass": cutlass_version(), "min_gain": MIN_GAIN,
            "source": "benchmarks/kernels_bench.py --kinds conv --search full --write-conv-table",
            "rows": dict(sorted(out.items()))}
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return len(out)
