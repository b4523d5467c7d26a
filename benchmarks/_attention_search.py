"""The Hopper attention search of benchmarks/kernels_bench.py (``--search full``): every
config of ``families/attention_sm90.search_space`` timed on each corpus attention
problem, and the learned table (families/attention_sm90_table.py) written from the
winners.

One round per candidate rank: the synthetic SDPA model is compiled with the
rank-th config of each problem forced (select's ``tuned``: attention_tuning_id ->
KernelConfig), after one parallel build of every candidate kernel into the cache
(prebuild), so a round only links. Each region is timed like the heuristic's (10
calls in a CUDA graph, median replay) and checked against PyTorch's SDPA on the
same inputs; a config whose relative error exceeds ``TOL`` or whose call fell
back is not counted.
"""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import torch

TOL = 1e-2          # relative error against SDPA (fp32 accumulation on both sides)
MIN_GAIN = 1.02     # a table row only where the winner beats the default by this much


def compile_regions(model, inputs, tuned=None):
    """``model`` compiled for sm_90a with eager glue, every measured-slower list off
    (we time our kernels), ``tuned`` forcing kernel choices."""
    from cutlass_offload.api import compile_captured
    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions
    cap = capture(model, inputs)
    return compile_captured(cap, CompileOptions(arch="sm90a", pytorch_when_faster=False),
                            tuned=tuned)


def branch_regions(compiled, inputs, firsts, region_inputs) -> dict:
    """{branch index: (region module, its inputs)}: a branch is found by its first
    input (the attention's q)."""
    branch_of = {inputs[i].data_ptr(): b for b, i in enumerate(firsts)}
    found = {}
    for m, xs in region_inputs(compiled, inputs):
        for x in xs:
            if isinstance(x, torch.Tensor) and x.data_ptr() in branch_of:
                found.setdefault(branch_of[x.data_ptr()], (m, xs))
    return found


def prebuild_all(kernels: dict):
    """Compile every candidate kernel ({name: kernel}) into the cache in one parallel
    build; (seconds, names of the units that failed)."""
    import time

    from cutlass_offload.prebuild import prebuild
    t0 = time.perf_counter()
    res = prebuild("sm90a", list(kernels.values()))
    failed = {u["name"] for u in res.to_dict().get("units", []) if not u.get("ok", True)}
    return time.perf_counter() - t0, failed


def record_tuned(row) -> bool:
    """Set ``row``'s ``tuned`` / ``tuned_us`` to its fastest timed search entry;
    False when none was timed."""
    timed = {t: us for t, us in row.get("search", {}).items() if isinstance(us, float)}
    if timed:
        best = min(timed, key=timed.get)
        row["tuned"], row["tuned_us"] = best, timed[best]
    return bool(timed)


def time_region(m, xs, graph_us, rel_err, tol):
    """One region's call on ``xs``: us per call (``graph_us``) when it ran our kernel
    within ``tol`` of its PyTorch subgraph, else why not ("fell back", "rel err ...")."""
    before = m.fallback_calls
    with torch.no_grad():
        err = rel_err(m(*xs), m.fallback(*xs))
        us = graph_us(lambda: m(*xs))
    if m.fallback_calls > before:
        return "fell back"
    if not err <= tol:
        return f"rel err {err:.2e}"
    return us


def _tag(config) -> str:
    q, kv, d = config.tile
    sched = "pingpong" if config.kernel_schedule.endswith("Pingpong") else "coop"
    return f"{q}x{kv}x{d}_s{config.stages}_{sched}" + ("_lpt" if config.tile_scheduler == "lpt" else "")


def search(rows, model, inputs, firsts, *, region_inputs, graph_us, rel_err) -> dict:
    """Time every search-space config of each row's region (rows from the heuristic
    run of the same model, in entry order); fills each row's ``search`` ({tag: us or
    error}), ``tuned`` / ``tuned_us``. Returns {"build_s", "rounds"}."""
    from cutlass_offload.families import attention_sm90
    from cutlass_offload.ir import AttentionKernelSm90
    from cutlass_offload.select import attention_tuning_id
    model = model.cuda()
    inputs = tuple(x.cuda() for x in inputs)
    base = branch_regions(compile_regions(model, inputs), inputs, firsts, region_inputs)
    spaces = {}
    for i, (m, _) in base.items():
        p = m.region.kernel_problem
        if attention_sm90.supports(p):
            spaces[i] = (attention_tuning_id(p), attention_sm90.search_space(p), p)
    kernels = {}
    for _, space, p in spaces.values():
        for c in space:
            k = AttentionKernelSm90(arch="sm90a", dtype=p.dtype, config=c, causal=p.causal != "none")
            kernels.setdefault(k.name, k)
    build_s, failed = prebuild_all(kernels)
    rounds = max((len(s) for _, s, _ in spaces.values()), default=0)
    for r in range(rounds):
        tuned = {tid: space[r] for tid, space, _ in spaces.values() if r < len(space)}
        compiled = compile_regions(model, inputs, tuned)
        found = branch_regions(compiled, inputs, firsts, region_inputs)
        for i, (tid, space, _) in spaces.items():
            if r >= len(space) or i not in found:
                continue
            m, xs = found[i]
            tag = _tag(space[r])
            out = rows[i].setdefault("search", {})
            if m.kernel.config != space[r]:
                out[tag] = f"not built ({m.kernel.name})"
                continue
            out[tag] = time_region(m, xs, graph_us, rel_err, TOL)
        del compiled
        torch.cuda.empty_cache()
    for i, (_, space, _) in spaces.items():
        if record_tuned(rows[i]):
            rows[i]["search_default"] = _tag(space[0])
    return {"build_s": build_s, "rounds": rounds, "kernels": len(kernels),
            "failed_units": sorted(failed)}


def write_table(rows, path: Path, gpu: str, num_sms: int) -> int:
    """families/attention_sm90_table.json from the searched rows: per problem class
    (head dim, causal, length buckets) the config with the least summed time over
    the class's rows that timed it on every row, kept only where it beats the
    default by MIN_GAIN. Where ``path`` holds a table already, the rows of the
    classes this run did not search stay (a run over some models updates their
    classes only); a searched class whose winner no longer beats the default loses
    its row. Returns the number of rows written."""
    from cutlass_offload.build.toolchain import cutlass_version
    from cutlass_offload.families.attention_sm90 import CONFIGS
    from cutlass_offload.families.attention_sm90_table import class_key
    by_tag = {_tag(c): c for c in CONFIGS}
    classes = {}
    for r in rows:
        if r.get("kind") != "attention" or not r.get("search"):
            continue
        key = class_key(r["head_dim"], r.get("causal", "none") != "none", r["seq_q"], r["seq_kv"])
        classes.setdefault(key, []).append(r)
    path = Path(path)
    out = {}
    if path.exists():
        out = {k: v for k, v in json.loads(path.read_text()).get("rows", {}).items()
               if k not in classes}
    for key, rs in sorted(classes.items()):
        tags = set.intersection(*({t for t, v in r["search"].items() if isinstance(v, float)} for r in rs))
        default = rs[0].get("search_default")
        if not tags or default not in tags:
            continue
        total = {t: sum(r["search"][t] for r in rs) for t in tags}
        best = min(total, key=total.get)
        if total[default] / total[best] < MIN_GAIN:
            continue
        cfg = by_tag[best]
        out[key] = {"head": cfg.tile[2], "block_kv": cfg.tile[1], "schedule": cfg.kernel_schedule,
                    "tile_scheduler": cfg.tile_scheduler, "block_q": cfg.tile[0],
                    "us": total[best] / len(rs), "default_us": total[default] / len(rs),
                    "from": sorted({f"{r['dtype']} b{r['batch']} h{r['heads']}" for r in rs})}
    data = {"gpu": gpu, "num_sms": num_sms, "date": datetime.date.today().isoformat(),
            "cutlass": cutlass_version(),
            "source": "benchmarks/kernels_bench.py --kinds attention --search full --write-attention-table",
            "min_gain": MIN_GAIN, "rows": dict(sorted(out.items()))}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return len(out)
