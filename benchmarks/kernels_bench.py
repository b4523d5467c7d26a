"""The kernel corpus benchmark (issue 15): every distinct GEMM, conv2d and attention
problem of the built-in models and the zoo architectures (benchmarks/corpus/
corpus.json, from benchmarks/corpus.py), plus a synthetic GEMM grid, each run by
our kernel (the heuristic's and, with ``--search full``, the tuned one) and by
the anchor a user would call instead, on one GPU, in one run.

* GEMM (tune/: build, profile subprocess, float32 check on random data): ours
  with the heuristic (select: the learned table, else the shape rules) and tuned
  (tune(search="full"): the sm90 search space on plain fp16 proxies, the best
  configs with the problem's epilogue, launch knobs, PDL), against cuBLAS through
  PyTorch (``torch.mm`` / ``addmm`` for one batch entry, ``matmul`` for a batch)
  followed by the unfused epilogue ops. Each timed as back-to-back launches over
  up to four operand copies captured in a CUDA graph (tune/profile.py), median
  replay / launches. The grid: M in GRID_M x the (N, K) of the corpus's GEMMs
  with the most FLOPs, plain epilogue.
* conv2d: one synthetic model holding every corpus conv (NHWC, channels_last
  input), compiled; each region (our kernel) against its PyTorch subgraph
  (``F.conv2d`` channels_last: cuDNN, then the unfused epilogue), 10 calls in a
  CUDA graph, median replay.
* attention: one synthetic model of the corpus's SDPA problems, compiled; each
  region against ``F.scaled_dot_product_attention`` under each backend PyTorch
  has (flash, cuDNN, efficient, math), the fastest counted. With ``--search
  full`` (first dtype only) every Hopper config of the problem's search space
  is timed too (_attention_search.py: tuned = the fastest that matches SDPA);
  ``--write-attention-table FILE`` writes the winners per problem class
  (families/attention_sm90_table.json) and times the heuristic again with them.
* conv2d with ``--search full`` (first dtype only): every sm90a choice of the
  problem's search space (select/conv.py ``search_space``: TMA tiles and clusters;
  the im2col lowering with split-K for small outputs) is timed too
  (_conv_search.py); ``--write-conv-table FILE`` writes the winners per problem
  (families/conv_sm90_table.json) and times the heuristic again, every dtype.
* ``--gemm-set lowered-convs`` (or ``both``): the GEMMs of the corpus convs that
  sm90a lowers onto the GEMM (1x1 convs, few-channel convs through im2col;
  families/conv_gemm_sm90.py) as GEMM problems, so that a full search with
  ``--write-table`` (``--merge-table``: into the packaged table) puts conv shapes
  into the learned table; the conv part of the same run then selects with it.
* conv2d and attention regions are compiled with ``pytorch_when_faster`` off:
  the benchmark times our kernel even where select would leave PyTorch's.
* ``--staged-epilogue``: every GEMM and conv kernel that can take it is emitted
  with the staged epilogue (emit/staged.py) instead of CUTLASS's TMA epilogue, and
  the GLUs store by TMA (emit/glu_sm90.GLU_TMA); without it both are off, whatever
  $CUTLASS_OFFLOAD_STAGED_EPILOGUE says; with ``--search heuristic``, the
  kernel-by-kernel A/B against a run without it. ``--attention-o-store tma``: the
  Hopper attention kernels store O with the example's TMA epilogue instead of the
  staged store that ships (emit/attention_sm90.STAGED_EPILOGUE); ``--no-attention-ftz``:
  compiled without -ftz=true (emit/attention_sm90.FTZ).

Ratios are speedups: anchor time / our time (> 1: ours faster). Per kind and
dtype: geomean, minimum, how many below the issue's floors; the worst ten; TFLOP/s
and % of the measured peak (an 8192^3 fp16 matmul). ``--write-table FILE`` turns
a full search into the learned table select/sm90.py reads (the winner per shape,
with GPU, date and CUTLASS version). JSON to ``--json`` (default
``$OUT/kernels.json``, else ``benchmarks/results/kernels.json``).

    python benchmarks/kernels_bench.py [--kinds gemm,conv,attention] [--dtypes fp16,bf16]
        [--search full|heuristic] [--grid/--no-grid] [--write-table FILE]
        [--write-attention-table FILE] [--write-conv-table FILE] [--models A,B] [--json FILE]
        [--staged-epilogue] [--attention-o-store staged|tma] [--no-attention-ftz]

Needs a CUDA GPU (sm_90) and nvcc (exits 2 without a GPU).
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _timing import graph_ms  # noqa: E402

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus" / "corpus.json"
GRID_M = (16, 64, 256, 1024, 4096, 16384)
GRID_PAIRS = 12                  # (N, K) pairs of the grid: the corpus's heaviest
DTYPES = {"fp16": "f16", "bf16": "bf16"}
# issue 15's floors (speedup over the anchor)
FLOORS = {"gemm_plain": {"heuristic_geomean": 1.00, "heuristic_min": 0.90,
                         "tuned_geomean": 1.05, "tuned_min": 0.95},
          "gemm_fused": {"tuned_geomean": 1.15},
          "attention": {"heuristic_min": 1.00},
          "conv2d": {"heuristic_geomean": 1.00, "heuristic_min": 0.80}}


# -- the corpus --------------------------------------------------------------------------

def load_corpus(path: Path) -> dict:
    """corpus.json as written by benchmarks/corpus.py."""
    return json.loads(Path(path).read_text())


def _info(e: dict) -> dict:
    counts = e.get("counts", {})
    return {"count": sum(counts.values()) or 1, "models": sorted(counts), "id": e.get("id")}


def gemm_problems(corpus: dict, dtype: str) -> list:
    """[(GemmProblem, info)] for the corpus's offloaded GEMMs in ``dtype`` ("f16" /
    "bf16"); info: count (regions over all models), models, corpus id."""
    from dataclasses import replace

    from cutlass_offload.ir import GemmEpilogue, GemmProblem
    out = []
    for e in corpus.get("gemm", []):
        f = dict(e["problem"])
        f["epilogue"] = GemmEpilogue(**f["epilogue"])
        p = GemmProblem(**f)
        if p.dtype in ("f16", "bf16"):
            p = replace(p, dtype=dtype)
        out.append((p, _info(e)))
    return out


def col_b_twins(problems: list) -> list:
    """``problems`` with, after each one whose B is row-major (K, N), its twin with B
    column-major (N, K), its alignment over K (unless an identical problem is already
    there): the A/B of a constant weight stored K-major."""
    from dataclasses import replace

    from cutlass_offload.partition.graph_utils import max_alignment
    have = {p for p, _ in problems}
    out = []
    for p, info in problems:
        out.append((p, info))
        if p.layout_b == "row":
            twin = replace(p, layout_b="col", align_b=max_alignment(p.k, p.dtype))
            if twin not in have:
                have.add(twin)
                out.append((twin, {**info, "models": [f"{m} (K-major twin)" for m in info["models"]]}))
    return out


def lowered_conv_gemms(corpus: dict, dtype: str) -> list:
    """[(GemmProblem, info)]: the GEMM of each corpus conv that sm90a lowers onto the
    GEMM (families/conv_gemm_sm90.py: 1x1 convs read directly, few-channel convs
    through im2col), plain epilogue, one per distinct (M, N, K); info models
    ["lowered-conv"], so the GEMM classes keep to real GEMMs. A full search of them
    puts conv shapes into the learned table."""
    from dataclasses import replace

    from cutlass_offload.families import conv_gemm_sm90
    from cutlass_offload.ir import ConvProblem, GemmEpilogue
    from cutlass_offload.select.conv import pad_channels
    out, seen = [], set()
    for e in conv_entries(corpus):
        f = {k: (tuple(v) if isinstance(v, list) else v) for k, v in e.items()
             if k in ConvProblem.__dataclass_fields__ and k != "epilogue"}
        conv = pad_channels(ConvProblem(**{**f, "dtype": dtype}), "sm90a")
        it = conv_gemm_sm90.iterator_for(conv)
        if not it:
            continue
        g = replace(conv_gemm_sm90.gemm_problem(conv, it), epilogue=GemmEpilogue())
        g = replace(g, m=g.m if g.m is not None else g.m_hint)
        if (g.m, g.n, g.k) not in seen:
            seen.add((g.m, g.n, g.k))
            out.append((g, {"count": e.get("count", 1), "models": ["lowered-conv"],
                            "id": f"{it} of {e.get('id', '?')}"}))
    return out


def conv_entries(corpus: dict) -> list:
    """The corpus's offloaded conv2d problems as flat dicts (ConvProblem fields, the
    batch in ``n``, count, models)."""
    out = []
    for e in corpus.get("conv2d", []):
        f = dict(e["problem"])
        f["n"] = f.get("n") or f.get("n_hint", 1)
        out.append({**f, **_info(e)})
    return out


def attention_entries(corpus: dict) -> list:
    """The corpus's offloaded attention problems as flat dicts (AttentionProblem
    fields, the batch in ``batch``, count, models); only those without a bias
    input (a synthetic SDPA model gives none)."""
    out = []
    for e in corpus.get("attention", []):
        f = dict(e["problem"])
        if f.get("bias", "none") != "none" or f.get("causal") == "bottom_right":
            continue
        f["batch"] = f.get("batch") or f.get("batch_hint", 1)
        out.append({**f, **_info(e)})
    return out


def grid_problems(corpus_problems: list, dtype: str) -> list:
    """The synthetic grid: M in GRID_M x the GRID_PAIRS (N, K) pairs (B col-major,
    aligned) of the corpus with the most FLOPs, plain epilogue."""
    from cutlass_offload.ir import GemmProblem
    flops = {}
    corpus_problems = [(p, i) for p, i in corpus_problems if i.get("models") != ["grid"]]
    for p, info in corpus_problems:
        if p.layout_b == "col" and (p.align_a, p.align_b, p.align_c) == (8, 8, 8):
            flops[(p.n, p.k)] = flops.get((p.n, p.k), 0) + 2 * p.m * p.n * p.k * (p.batch or 1) * info["count"]
    pairs = [nk for nk, _ in sorted(flops.items(), key=lambda t: -t[1])[:GRID_PAIRS]]
    return [(GemmProblem(n=n, k=k, dtype=dtype, layout_b="col", align_a=8, align_b=8, align_c=8,
                         m=m, m_hint=m), {"count": 1, "models": ["grid"]})
            for n, k in pairs for m in GRID_M]


# -- GEMM ----------------------------------------------------------------------------------

def bench_gemms(problems: list, search: str, num_sms: int) -> list:
    """One row per problem: heuristic / tuned / anchor (cuBLAS) us, tags, speedups."""
    from cutlass_offload.config import CompileOptions
    from cutlass_offload.ir import GemmRegion, Plan
    from cutlass_offload.select import choose_kernel, tuning_id
    from cutlass_offload.tune import TuningCache, tune
    regions, kernels = [], []
    for i, (p, _) in enumerate(problems):
        rid = f"g{i}"
        regions.append(GemmRegion(name=rid, form="linear", nodes=(rid,), a="a", b="b", problem=p))
        kernels.append(choose_kernel(p, "sm90a", num_sms))
    plan = Plan("sm90a", tuple(regions), tuple(kernels), ())
    with tempfile.TemporaryDirectory(prefix="co_kernels_tuning_") as tmp:
        report = tune(plan, CompileOptions(arch="sm90a", num_sms=num_sms),
                      cache=TuningCache(Path(tmp)), search=search)
    by_tid = {tp.tuning_id: tp for tp in report.problems}
    rows = []
    for (p, info), k in zip(problems, kernels):
        tp = by_tid.get(tuning_id(p))
        rows.append(gemm_row(p, info, k, tp))
    return rows, report


def gemm_row(p, info, kernel, tp) -> dict:
    """The table row of one GEMM problem from its TunedProblem (or None: not run)."""
    m = p.m * (p.batch or 1)
    row = {"kind": "gemm", "dtype": p.dtype, "m": p.m, "n": p.n, "k": p.k, "batch": p.batch,
           "layout_a": p.layout_a, "layout_b": p.layout_b, "align": [p.align_a, p.align_b, p.align_c],
           "epilogue": p.epilogue.tag,
           # bias alone is part of cuBLAS's own call (addmm: cublasLt's bias epilogue)
           "fused": p.epilogue.tag not in ("plain", "bias"),
           "count": info["count"], "models": info["models"],
           "flops": 2.0 * m * p.n * p.k, "family": kernel.config.family,
           "heuristic": None, "heuristic_us": None, "tuned": None, "tuned_us": None,
           "tuned_no_pdl_us": None, "anchor_us": None}
    if tp is None:
        row["error"] = "not profiled (no kernel)"
        return row
    ok = {c.tag: c for c in tp.candidates if c.status == "ok" and c.us}
    h = ok.get(tp.heuristic)
    row.update(heuristic=tp.heuristic, heuristic_us=h.us if h else None, anchor_us=tp.torch_us,
               tuned=tp.winner, tuned_us=ok[tp.winner].us if tp.winner in ok else None)
    no_pdl = [c.us for c in ok.values() if not (c.launch or {}).get("pdl")]
    row["tuned_no_pdl_us"] = min(no_pdl) if no_pdl else None
    # every timed candidate of the final step (own epilogue and dtype), fastest first
    row["candidates_us"] = [[c.tag, c.us] for c in sorted(ok.values(), key=lambda c: c.us)]
    failed = [f"{c.tag}: {c.status}" for c in tp.candidates if c.status != "ok"]
    if failed:
        row["failed_candidates"] = failed
    if h is None:
        bad = next((c for c in tp.candidates if c.tag == tp.heuristic), None)
        row["error"] = f"heuristic kernel {bad.status if bad else 'missing'}"
    return add_speedups(row)


def add_speedups(row: dict) -> dict:
    a = row.get("anchor_us")
    for v in ("heuristic", "tuned", "tuned_no_pdl", "old_heuristic"):
        us = row.get(f"{v}_us")
        row[f"{v}_speedup"] = a / us if a and us else None
    return row


# -- conv2d and attention: synthetic models ------------------------------------------------

class _Branches(torch.nn.Module):
    """Runs one callable per input group; returns every output (one region each)."""

    def __init__(self, fns, arity):
        super().__init__()
        self.mods = torch.nn.ModuleList(fns)
        self.arity = arity

    def forward(self, *xs):
        outs, i = [], 0
        for mod, n in zip(self.mods, self.arity):
            outs.append(mod(*xs[i:i + n]))
            i += n
        return tuple(outs)


class _Conv(torch.nn.Module):
    def __init__(self, e):
        super().__init__()
        ep = e.get("epilogue", {})
        self.conv = torch.nn.Conv2d(e["c"], e["k"], (e["r"], e["s"]), stride=tuple(e["stride"]),
                                    padding=0, dilation=tuple(e["dilation"]), bias=ep.get("bias", False))
        self.pad = tuple(e["pad"])            # (top, bottom, left, right)
        self.act = ep.get("activation", "identity")
        self.residual = ep.get("residual", "none")

    def forward(self, x, *c):
        top, bottom, left, right = self.pad
        if top == bottom and left == right:
            y = F.conv2d(x, self.conv.weight, self.conv.bias, self.conv.stride, (top, left),
                         self.conv.dilation)
        else:
            y = self.conv(F.pad(x, (left, right, top, bottom)))
        y = {"identity": lambda t: t, "relu": F.relu, "silu": F.silu, "sigmoid": torch.sigmoid,
             "gelu_erf": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[self.act](y)
        if self.residual == "add":
            y = y + c[0]
        elif self.residual == "mul":
            y = y * c[0]
        return y


class _SDPA(torch.nn.Module):
    def __init__(self, e):
        super().__init__()
        self.causal = e.get("causal", "none") == "top_left"
        self.scale = e.get("scale")

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=self.scale)


def conv_model(entries, dtype):
    """(model, inputs, first input of each branch) with one conv branch per corpus
    conv entry."""
    mods, xs, arity = [], [], []
    for e in entries:
        mods.append(_Conv(e))
        n, c, h, w = e["n"], e["c"], e["h"], e["w"]
        x = torch.randn(n, c, h, w).to(memory_format=torch.channels_last)
        group = [x]
        if e.get("epilogue", {}).get("residual", "none") != "none":
            group.append(torch.randn(n, e["k"], *_out_hw(e)).to(memory_format=torch.channels_last))
        xs += group
        arity.append(len(group))
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    model = _Branches(mods, arity).to(dt).to(memory_format=torch.channels_last).eval()
    return model, tuple(x.to(dt) for x in xs), _firsts(arity)


def _out_hw(e) -> tuple:
    """(P, Q) of a conv entry: PyTorch's output size formula."""
    top, bottom, left, right = e["pad"]
    (sh, sw), (dh, dw) = e["stride"], e["dilation"]
    return ((e["h"] + top + bottom - dh * (e["r"] - 1) - 1) // sh + 1,
            (e["w"] + left + right - dw * (e["s"] - 1) - 1) // sw + 1)


def _firsts(arity) -> list:
    """Index of each branch's first input among the model's inputs."""
    out, i = [], 0
    for n in arity:
        out.append(i)
        i += n
    return out


def attention_model(entries, dtype):
    """(model, inputs, first input of each branch) with one SDPA branch per corpus
    attention entry, q / k / v of (B, H, L, E)."""
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    mods, xs = [], []
    for e in entries:
        mods.append(_SDPA(e))
        b, h = e["batch"], e["heads"]
        xs += [torch.randn(b, h, e["seq_q"], e["head_dim"], dtype=dt),
               torch.randn(b, h, e["seq_kv"], e["head_dim"], dtype=dt),
               torch.randn(b, h, e["seq_kv"], e["head_dim_v"], dtype=dt)]
    return _Branches(mods, [3] * len(mods)).eval(), tuple(xs), _firsts([3] * len(mods))


def graph_us(fn, calls: int = 10, reps: int = 20) -> float:
    """Device us of one call: ``calls`` calls in one CUDA graph, median of ``reps``
    replays (benchmarks/_timing.py)."""
    return graph_ms(fn, calls=calls, reps=reps) * 1e3


def region_inputs(compiled, inputs) -> list:
    """[(region module, its inputs)] of one forward, in call order."""
    calls = []
    hooks = [m.register_forward_pre_hook(lambda mod, xs: calls.append((mod, xs)))
             for m in compiled.region_modules()]
    try:
        with torch.no_grad():
            compiled(*inputs)
        torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    return calls


def _rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def bench_model_regions(kind, entries, model, inputs, firsts, anchors) -> list:
    """Compile ``model`` (sm_90a, heuristic kernels, none left to PyTorch for being
    measured slower), then time each region against
    ``anchors(module, xs)`` ({name: callable}); one row per entry, in entry order
    (a branch is found by its first input: the conv's x, the attention's q)."""
    from _attention_search import branch_regions, compile_regions
    model = model.cuda()
    inputs = tuple(x.cuda() for x in inputs)
    t0 = time.perf_counter()
    compiled = compile_regions(model, inputs)
    build_s = time.perf_counter() - t0
    found = branch_regions(compiled, inputs, firsts, region_inputs)
    reasons = "; ".join(sorted({f.reason for f in compiled.plan.fallbacks}))[:300]
    rows = []
    for i, e in enumerate(entries):
        row = {"kind": kind, **{k: v for k, v in e.items() if k != "models"},
               "models": e.get("models", []), "build_s": build_s}
        if i not in found and kind == "attention" and _wide(compiled, e):
            from wide_attention import corpus_row   # two GEMM regions, no attention region
            rows.append(add_speedups({**row, **corpus_row(e, inputs[firsts[i]].dtype, graph_us)}))
            continue
        if i not in found:
            row["error"] = f"not offloaded: {reasons}"
            rows.append(row)
            continue
        m, xs = found[i]
        before = m.fallback_calls
        times = {}
        with torch.no_grad():
            row["rel_err_vs_pytorch"] = _rel_err(m(*xs), m.fallback(*xs))
            row["kernel"] = m.kernel.name
            row["heuristic_us"] = graph_us(lambda m=m, xs=xs: m(*xs))
            for name, fn in anchors(m, xs).items():
                try:
                    times[name] = graph_us(fn)
                except RuntimeError as err:         # a backend that cannot run this shape
                    torch.cuda.synchronize()
                    times[name] = None
                    row.setdefault("anchor_errors", {})[name] = str(err).splitlines()[0][:160]
        row["anchors_us"] = times
        ok = {k: v for k, v in times.items() if v}
        if ok:
            best = min(ok, key=ok.get)
            row["anchor"], row["anchor_us"] = best, ok[best]
        row["fell_back"] = m.fallback_calls > before
        rows.append(add_speedups(row))
    del compiled
    torch.cuda.empty_cache()
    return rows


def _wide(compiled, entry) -> bool:
    """Whether the compile ran ``entry``'s attention as two GEMMs (partition/wide_attention.py)."""
    from cutlass_offload.partition.wide_attention import MAX_FUSED_HEAD_DIM
    return (max(entry["head_dim"], entry["head_dim_v"]) > MAX_FUSED_HEAD_DIM
            and any("two GEMMs" in n for r in compiled.plan.regions for n in map(str, r.notes)))


def conv_anchors(m, xs):
    return {"cudnn": lambda: m.fallback(*xs)}


def sdpa_anchors(m, xs):
    """SDPA under each backend on the region's own q, k, v (BHLE views)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    r = m.region
    q, k, v = xs[m._iq], xs[m._ik], xs[m._iv]
    causal = r.problem.causal == "top_left"
    out = {}
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)):
        def run(be=be):
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=r.problem.scale)
        out[name] = run
    return out


# -- summaries -----------------------------------------------------------------------------

def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(rows: list, peak_tflops: float) -> dict:
    """Per (kind, dtype, class) geomeans / minima of the speedups, with the floors."""
    for r in rows:
        for v in ("heuristic", "tuned"):
            us = r.get(f"{v}_us")
            if us and r.get("flops"):
                r[f"{v}_tflops"] = r["flops"] / us / 1e6
                r[f"{v}_pct_peak"] = 100.0 * r[f"{v}_tflops"] / peak_tflops
    groups = {}
    for r in rows:
        if r["kind"] == "gemm":
            cls = ("gemm_grid" if r["models"] == ["grid"] else
                   "gemm_lowered_conv" if r["models"] == ["lowered-conv"] else
                   "gemm_fused" if r["fused"] else "gemm_plain")   # plain: one cuBLAS call too
        else:
            cls = r["kind"]
        groups.setdefault((cls, r.get("dtype", "f16")), []).append(r)
    out = {}
    for (cls, dt), rs in sorted(groups.items()):
        s = {"problems": len(rs)}
        for v in ("heuristic", "tuned", "tuned_no_pdl", "old_heuristic"):
            sp = [r.get(f"{v}_speedup") for r in rs if r.get(f"{v}_speedup")]
            if sp:
                s[f"{v}_geomean"], s[f"{v}_min"], s[f"{v}_n"] = geomean(sp), min(sp), len(sp)
        floors = FLOORS.get(cls, {})
        s["floors"] = floors
        s["met"] = {k: (s.get(k) is not None and s[k] >= f) for k, f in floors.items()}
        out[f"{cls}/{dt}"] = s
    return out


def fmt_us(x):
    return f"{x:8.2f}" if x else "       -"


def fmt_x(x):
    return f"{x:5.2f}x" if x else "     -"


def shape_label(r) -> str:
    if r["kind"] == "gemm":
        b = f"x{r['batch']}" if (r.get("batch") or 1) > 1 else ""
        return f"{r['m']}x{r['n']}x{r['k']}{b} {r['layout_b']} {r['epilogue']}"
    if r["kind"] == "conv2d":
        return (f"n{r['n']} {r['h']}x{r['w']}x{r['c']} -> {r['k']} {r['r']}x{r['s']}/s{r['stride'][0]}"
                f" {r.get('epilogue', {}).get('activation', '')}")
    return (f"b{r['batch']} h{r['heads']} {r['seq_q']}x{r['seq_kv']} d{r['head_dim']}"
            f"{' causal' if r.get('causal', 'none') != 'none' else ''}")


def print_tables(rows, summary):
    print("\n| kind | dtype | problem | x | ours heuristic us | ours tuned us | anchor us | "
          "heuristic speedup | tuned speedup | tuned TFLOP/s (% peak) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        tf = (f"{r['tuned_tflops']:.0f} ({r['tuned_pct_peak']:.0f}%)" if r.get("tuned_tflops") else
              f"{r['heuristic_tflops']:.0f} ({r['heuristic_pct_peak']:.0f}%)" if r.get("heuristic_tflops")
              else "-")
        print(f"| {r['kind']} | {r.get('dtype')} | {shape_label(r)} | {r.get('count', 1)} | "
              f"{fmt_us(r.get('heuristic_us'))} | {fmt_us(r.get('tuned_us'))} | "
              f"{fmt_us(r.get('anchor_us'))} {r.get('anchor', '')} | {fmt_x(r.get('heuristic_speedup'))} | "
              f"{fmt_x(r.get('tuned_speedup'))} | {tf} |" + (f" {r['error']}" if r.get("error") else ""))
    print("\n| class | problems | heuristic geomean | heuristic min | tuned geomean | tuned min | "
          "tuned w/o PDL geomean | shape rules geomean | floors met |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k, s in summary.items():
        met = ", ".join(f"{f}: {'yes' if ok else 'NO'}" for f, ok in s["met"].items()) or "-"
        print(f"| {k} | {s['problems']} | {fmt_x(s.get('heuristic_geomean'))} | "
              f"{fmt_x(s.get('heuristic_min'))} | {fmt_x(s.get('tuned_geomean'))} | "
              f"{fmt_x(s.get('tuned_min'))} | {fmt_x(s.get('tuned_no_pdl_geomean'))} | "
              f"{fmt_x(s.get('old_heuristic_geomean'))} | {met} |")
    worst = sorted((r for r in rows if r.get("heuristic_speedup")), key=lambda r: r["heuristic_speedup"])[:10]
    print("\nWorst ten (heuristic speedup):")
    for r in worst:
        print(f"  {fmt_x(r['heuristic_speedup'])} {r['kind']} {r.get('dtype')} {shape_label(r)}: "
              f"ours {fmt_us(r['heuristic_us'])} us vs {fmt_us(r['anchor_us'])} us; "
              f"tuned {fmt_x(r.get('tuned_speedup'))} ({r.get('tuned')})")


# -- the learned table ---------------------------------------------------------------------

def write_table(report_problems, problems, path: Path, gpu: str, num_sms: int, note: str,
                base: dict | None = None, search: str = "full"):
    """select/sm90.py's table from a full search: per (M, N, K, batch, B and A layouts), the
    winner of the shape's plain fp16 problem when there is one, else of its first
    problem, plus as "residual" the winner of its first problem with a source-C
    epilogue where that differs. Only CUTLASS 3.x winners. ``base``: a table (same GPU
    and SM count) whose entries are kept where this search measured no winner for the
    shape."""
    from cutlass_offload.build.toolchain import cutlass_version
    from cutlass_offload.select import tuning_id
    by_tid = {tp.tuning_id: tp for tp in report_problems}
    entries = {}
    kept = {}
    if base is not None:
        if (base["gpu"], int(base["num_sms"])) != (gpu, num_sms):
            raise ValueError(f"--merge-table: the packaged table is for {base['gpu']} "
                             f"({base['num_sms']} SMs), this GPU is {gpu} ({num_sms})")
        kept = {(e["m"], e["n"], e["k"], e.get("batch", 1), e["layout_b"], e.get("layout_a", "row")): e
                for e in base["entries"]}
    order = sorted(problems, key=lambda pi: (pi[0].epilogue.tag != "plain", pi[0].dtype != "f16"))
    for p, _ in order:
        tp = by_tid.get(tuning_id(p))
        if tp is None or tp.winner_config is None or tp.winner_config["family"] != "cutlass3x_sm90":
            continue
        key = (p.m, p.n, p.k, p.batch or 1, p.layout_b, p.layout_a)
        ok = {c.tag: c.us for c in tp.candidates if c.status == "ok" and c.us}
        winner = {"config": tp.winner_config, "launch": tp.winner_launch or {},
                  "us": ok.get(tp.winner), "from": f"{p.dtype} {p.epilogue.tag}"}
        e = entries.get(key)
        if e is None:           # the first problem of the shape in ``order``: plain fp16 first
            entries[key] = {"m": p.m, "n": p.n, "k": p.k, "batch": p.batch or 1, "layout_b": p.layout_b,
                            **({"layout_a": p.layout_a} if p.layout_a != "row" else {}),
                            **winner, "anchor_us": tp.torch_us}
        elif p.epilogue.residual != "none" and "residual" not in e \
                and (winner["config"], winner["launch"]) != (e["config"], e["launch"]):
            e["residual"] = winner     # a source-C epilogue's own winner (sm90.Table)
    merged = {**kept, **entries}
    if kept:
        note += (f"; merged into the table of {base['date']} ({len(kept)} entries, "
                 f"{len(set(kept) & set(entries))} re-measured)")
        if base.get("note"):            # keep the base table's history
            note = f"{base['note']}; then {note}"
    data = {"gpu": gpu, "num_sms": num_sms, "date": datetime.date.today().isoformat(),
            "cutlass": cutlass_version(), "source": f"benchmarks/kernels_bench.py --search {search} --write-table",
            "note": note, "entries": sorted(merged.values(), key=lambda e: (e["m"], e["n"], e["k"]))}
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return len(merged)


# -- main ----------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=str(CORPUS))
    p.add_argument("--kinds", default="gemm,conv,attention")
    p.add_argument("--dtypes", default="fp16,bf16")
    p.add_argument("--search", default="full", choices=["full", "fitted", "heuristic"],
                   help="GEMMs: full = the sm90 search space and the wave-fitted tiles; fitted = "
                        "the heuristic's (the table's) choice against the fitted tiles only "
                        "(tune's docstring); conv / attention search only with full")
    p.add_argument("--grid", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--write-table", default=None, metavar="FILE")
    p.add_argument("--write-attention-table", default=None, metavar="FILE",
                   help="with --search full: the Hopper attention winners per problem class "
                        "(families/attention_sm90_table.json), then the heuristic timed again")
    p.add_argument("--write-conv-table", default=None, metavar="FILE",
                   help="with --search full: the sm90a conv winners per problem "
                        "(families/conv_sm90_table.json), then the heuristic timed again")
    p.add_argument("--models", default=None, metavar="A,B",
                   help="conv / attention problems of these corpus models only (e.g. a search "
                        "that fits a time budget)")
    p.add_argument("--json", default=None)
    p.add_argument("--write-pytorch-faster", default=None, metavar="FILE",
                   help="write the GEMM / conv / attention problems PyTorch ran faster (select/pytorch_faster.py)")
    p.add_argument("--head-dims", default=None, metavar="D,D",
                   help="attention: only the corpus problems of these head dims")
    p.add_argument("--merge-pytorch-faster", action="store_true",
                   help="with --write-pytorch-faster: keep the FILE's entries of problems this run "
                        "did not measure (a run over some models updates their problems only)")
    p.add_argument("--from-results", default=None, metavar="JSON",
                   help="with --write-pytorch-faster: take the rows of an earlier run (no GPU needed)")
    p.add_argument("--remeasure", action=argparse.BooleanOptionalAction, default=True,
                   help="after --write-table, time the heuristic again with the new table")
    p.add_argument("--limit", type=int, default=None, help="first N GEMM problems only (smoke runs)")
    p.add_argument("--gemm-shapes", default=None, metavar="MxNxK,...",
                   help="GEMM problems of these shapes only (M counts every batch entry's rows), "
                        "every epilogue and dtype of each: a search that fits a time budget")
    p.add_argument("--gemm-set", default="corpus", choices=["corpus", "lowered-convs", "both"],
                   help="GEMM problems: the corpus's GEMMs (and the grid), the GEMMs of the convs "
                        "sm90a lowers onto the GEMM (families/conv_gemm_sm90.py), or both")
    p.add_argument("--staged-epilogue", action="store_true",
                   help="emit every GEMM and conv kernel that can take it with the staged epilogue "
                        "(emit/staged.py) instead of CUTLASS's TMA epilogue, and the GLUs with TMA "
                        "stores: the A/B against a run without")
    p.add_argument("--attention-o-store", default="staged", choices=["staged", "tma"],
                   help="how the Hopper attention kernels store O: staged (the default, "
                        "emit/attention_sm90.STAGED_EPILOGUE) or the example's TMA epilogue")
    p.add_argument("--attention-ftz", action=argparse.BooleanOptionalAction, default=True,
                   help="compile the Hopper attention kernels with -ftz=true (the default, "
                        "emit/attention_sm90.FTZ); --no-attention-ftz: the A/B against them without")
    p.add_argument("--col-b-twins", action="store_true",
                   help="GEMMs: beside each problem with B row-major (K, N), the same problem with B "
                        "column-major: the A/B of storing a constant weight K-major "
                        "(the Linear layout; gpt2's Conv1D weights are (K, N))")
    p.add_argument("--merge-table", action="store_true",
                   help="with --write-table: keep the packaged table's entries for shapes not searched")
    return p.parse_args(argv)


def measure_peak() -> float:
    """fp16 TFLOP/s of an 8192^3 torch.matmul in a CUDA graph."""
    n = 8192
    a, b = (torch.randn(n, n, dtype=torch.float16, device="cuda") for _ in range(2))
    c = torch.empty_like(a)
    us = graph_us(lambda: torch.matmul(a, b, out=c), calls=3, reps=10)
    return 2.0 * n ** 3 / us / 1e6


def write_pytorch_faster(rows: list, path: Path, gpu: str, num_sms: int, source: str,
                         merge: bool = False) -> dict:
    """select/pytorch_faster.py's list from benchmark rows (atomic write). With
    ``merge`` the entries ``path`` holds already for problems the rows do not measure
    stay (the rows' problems get this run's verdict, listed or not); ValueError when
    that file is for another GPU."""
    from cutlass_offload.build.toolchain import cutlass_version
    from cutlass_offload.select import pytorch_faster as pf
    entries = pf.entries_from_rows(rows)
    path = Path(path)
    if merge and path.exists():
        old = json.loads(path.read_text())
        if (old.get("gpu"), old.get("num_sms")) != (gpu, num_sms):
            raise ValueError(f"--merge-pytorch-faster: {path} is for {old.get('gpu')} with "
                             f"{old.get('num_sms')} SMs, this run {gpu} with {num_sms}")
        measured = pf.measured_keys(rows)
        for kind in entries:
            kept = [e for e in old.get(kind, []) if pf.entry_key(kind, e) not in measured[kind]]
            entries[kind] = kept + entries[kind]
        source = f"{old.get('source')}; merged with {source}"
    data = {"gpu": gpu, "num_sms": num_sms, "date": datetime.date.today().isoformat(),
            "cutlass": cutlass_version(), "source": source, "below": pf.DEFER_BELOW, **entries}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return data


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.write_pytorch_faster and args.from_results:
        old = json.loads(Path(args.from_results).read_text())
        data = write_pytorch_faster(old["rows"], Path(args.write_pytorch_faster), old["gpu"],
                                    old["num_sms"], f"benchmarks/kernels_bench.py run of {old['date'][:10]} "
                                    f"({Path(args.from_results).name})", merge=args.merge_pytorch_faster)
        print(f"{len(data['gemm'])} GEMM, {len(data['conv2d'])} conv2d and {len(data['attention'])} attention problems "
              f"-> {args.write_pytorch_faster}")
        return 0
    if not torch.cuda.is_available():
        print("kernels_bench.py needs a CUDA GPU", file=sys.stderr)
        return 2
    # the epilogue forms set either way: $CUTLASS_OFFLOAD_STAGED_EPILOGUE never decides a run's
    from cutlass_offload.emit import attention_sm90, glu_sm90, staged
    staged.ENABLED = glu_sm90.GLU_TMA = bool(args.staged_epilogue)
    attention_sm90.STAGED_EPILOGUE = args.attention_o_store == "staged"
    attention_sm90.FTZ = args.attention_ftz
    out_path = Path(args.json or (Path(os.environ["OUT"]) / "kernels.json" if os.environ.get("OUT")
                                  else HERE / "results" / "kernels.json"))
    props = torch.cuda.get_device_properties(0)
    gpu, sms = props.name, props.multi_processor_count
    corpus = load_corpus(Path(args.corpus))
    kinds = args.kinds.split(",")
    dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    peak = measure_peak()
    print(f"{gpu}, {sms} SMs, torch {torch.__version__}; measured fp16 peak {peak:.0f} TFLOP/s; "
          f"search {args.search}" + ("; staged epilogue" if args.staged_epilogue else "")
          + ("" if args.attention_ftz else "; Hopper attention without -ftz=true")
          + f"; Hopper attention O store {args.attention_o_store}", flush=True)
    result = {"gpu": gpu, "num_sms": sms, "torch": torch.__version__, "date": datetime.datetime.now().isoformat(),
              "peak_tflops": peak, "search": args.search, "corpus": str(args.corpus),
              "staged_epilogue": args.staged_epilogue, "attention_ftz": args.attention_ftz,
              "attention_o_store": args.attention_o_store,
              "corpus_meta": {k: v for k, v in corpus.items() if k not in ("gemm", "conv2d", "attention")},
              "rows": [], "seconds": {}}

    def save():
        result["summary"] = summarize(result["rows"], peak)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1, default=str))

    if "gemm" in kinds:
        t0 = time.perf_counter()
        problems = []
        for dt in dtypes:
            ps = gemm_problems(corpus, dt)
            if args.gemm_set != "lowered-convs":
                problems += ps
                if args.grid and dt == "f16":
                    problems += grid_problems(ps, dt)
            if args.gemm_set != "corpus":
                problems += lowered_conv_gemms(corpus, dt)
        problems = problems[:args.limit] if args.limit else problems
        if args.gemm_shapes:
            wanted = {tuple(int(v) for v in t.split("x")) for t in args.gemm_shapes.split(",")}
            problems = [(p, i) for p, i in problems
                        if (p.m * (p.batch or 1), p.n, p.k) in wanted]
            print(f"{len(problems)} GEMM problems of {len(wanted)} shapes", flush=True)
        if args.col_b_twins:
            problems = col_b_twins(problems)
        rows, report = bench_gemms(problems, args.search, sms)
        result["rows"] += rows
        result["gemm_build"] = report.build
        result["ranking"] = report.ranking
        result["seconds"]["gemm"] = time.perf_counter() - t0
        save()
        if args.write_table and args.search in ("full", "fitted"):
            base = None
            if args.merge_table:
                from cutlass_offload.select import sm90 as sm90_rules
                base = json.loads(Path(sm90_rules.TABLE_FILE).read_text())
            n = write_table(report.problems, problems, Path(args.write_table), gpu, sms,
                            note=f"from {len(problems)} problems of {args.corpus} "
                                 f"(GEMM set {args.gemm_set}{', grid' if args.grid else ''})",
                            base=base, search=args.search)
            print(f"learned table: {n} shapes -> {args.write_table}", flush=True)
            # select reads the new table from here on (the conv part's lowered convs too)
            from cutlass_offload.select import sm90
            sm90.use_table(Path(args.write_table))
            if args.remeasure:
                # the heuristic as select now sees it, timed again: what a compile
                # without --tune gets from here on
                t1 = time.perf_counter()
                again, _ = bench_gemms(problems, "heuristic", sms)
                for row, new_row in zip(rows, again):
                    row["table_heuristic"] = new_row["heuristic"]
                    row["table_heuristic_us"] = new_row["heuristic_us"]
                    row["old_heuristic_us"] = row["heuristic_us"]
                    row["old_heuristic"] = row["heuristic"]
                    row["heuristic"], row["heuristic_us"] = new_row["heuristic"], new_row["heuristic_us"]
                    add_speedups(row)
                result["seconds"]["gemm_remeasure"] = time.perf_counter() - t1
                result["heuristic"] = "learned table (re-measured after --write-table)"
                save()
    for kind, key, build, anchors, read in (
            ("conv", "conv2d", conv_model, conv_anchors, conv_entries),
            ("attention", "attention", attention_model, sdpa_anchors, attention_entries)):
        entries = read(corpus)
        if args.models:
            wanted = set(args.models.split(","))
            entries = [e for e in entries if wanted & set(e.get("models", []))]
        if args.head_dims and kind == "attention":
            dims = {int(d) for d in args.head_dims.split(",")}
            entries = [e for e in entries if e["head_dim"] in dims]
        if kind not in kinds or not entries:
            continue
        t0 = time.perf_counter()
        searcher = {"attention": "_attention_search", "conv": "_conv_search"}[kind]
        table_path = {"attention": args.write_attention_table, "conv": args.write_conv_table}[kind]
        for dt in dtypes:
            rows = bench_model_regions(key, entries, *build(entries, dt), anchors)
            for r in rows:
                r["dtype"] = dt
            if args.search == "full" and dt == dtypes[0]:
                result[f"{kind}_search"] = importlib.import_module(searcher).search(
                    rows, *build(entries, dt)[:3], region_inputs=region_inputs, graph_us=graph_us,
                    rel_err=_rel_err)
                for r in rows:
                    add_speedups(r)
            result["rows"] += rows
            save()
        result["seconds"][kind] = time.perf_counter() - t0
        if table_path and args.search == "full":
            n = importlib.import_module(searcher).write_table(result["rows"], Path(table_path), gpu, sms)
            print(f"{kind} table: {n} rows -> {table_path}", flush=True)
            if kind == "attention":
                from cutlass_offload.families import attention_sm90_table as table
                table.TABLE_FILE = Path(table_path)
                table._rows.cache_clear()
            else:
                from cutlass_offload.families import conv_sm90_table
                conv_sm90_table.use_table(table_path)
            # the heuristic as select now sees it, timed again in every dtype
            t1 = time.perf_counter()
            old = [r for r in result["rows"] if r["kind"] == key]
            for dt in dtypes:
                again = bench_model_regions(key, entries, *build(entries, dt), anchors)
                for row, new_row in zip([r for r in old if r["dtype"] == dt], again):
                    row["old_heuristic_us"], row["old_heuristic"] = row.get("heuristic_us"), row.get("kernel")
                    row["heuristic_us"], row["kernel"] = new_row.get("heuristic_us"), new_row.get("kernel")
                    row["anchor_us"] = min(row.get("anchor_us") or 1e30, new_row.get("anchor_us") or 1e30)
                    add_speedups(row)
            result["seconds"][f"{kind}_remeasure"] = time.perf_counter() - t1
            save()
    save()
    if args.write_pytorch_faster:
        write_pytorch_faster(result["rows"], Path(args.write_pytorch_faster), gpu, sms,
                             f"benchmarks/kernels_bench.py run of {result['date'][:10]}",
                             merge=args.merge_pytorch_faster)
    print_tables(result["rows"], result["summary"])
    print(f"\nJSON: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
