"""End-to-end and per-region latency of the built-in models on one GPU (issue 6,
items 3-4): PyTorch eager, torch.compile (default mode) and cutlass_offload
(heuristic kernels and, where available, tuned), in one run.

Per model (one after another; GPU memory freed in between):

* median latency (CUDA events around each synchronized forward, after warm-up) of
  eager PyTorch (channels_last for the conv models, as models.py sets), torch.compile
  (and its compile time), ours with plain dispatch, and PyTorch and ours each
  captured in a CUDA graph and replayed; ratios ours / eager and ours /
  torch.compile; norm-wise relative error against eager (and against the exported
  reference when loaded from a folder);
* per region (``--regions``, on by default): one forward records each offloaded
  region's inputs (forward pre-hooks); regions with the same signature (kind,
  problem, kernel, input shapes / strides / dtypes) are timed once and counted.
  Ours (the region module) against the PyTorch subgraph it replaces, on the same
  inputs, each as 10 calls in a CUDA graph (device time, median of ``--region-reps``
  replays); FLOPs from the region's problem (benchmarks/_region_stats.py), TFLOP/s
  and % of the measured peak (an 8192^3 fp16 torch.matmul timed once per run);
  norms in GB/s against a measured device copy; the issue-6 GEMM target flags
  (ours slower than PyTorch for M >= 256, more than 1.2x slower below); the worst
  offenders (device time lost per forward) are printed;
* per-call host overhead of an offloaded region (benchmarks/call_overhead.py's
  region_call_costs) for the region of each kind with the shortest kernel, against
  the 5 us target.

The tuned variant: folders from ``--tuned-from`` (a model without one is reported
as n/a); else, where ``cutlass_offload.compile`` accepts ``tune`` and no ``--from``
was given, compiled here with tune=True; else "n/a (no --tune in this build)".
Prints markdown tables; writes everything as JSON (``--json``, default
$OUT/runtime.json, else ./runtime.json). Needs a CUDA GPU (exits 2 without one).

    python benchmarks/runtime.py [MODEL ...] [--from /tmp/co_{model}]
        [--tuned-from /tmp/co_tuned_{model}] [--json FILE] [--no-compile-baseline]
        [--no-regions] [--reps 20] [--region-reps 10] [--top 12]
"""
from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))              # _timing, call_overhead
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _region_stats import (
    describe,
    gemm_m,
    group_by_signature,
    region_flops,
    region_kind,
    region_signature,
    target_flag,
    time_lost_us,
)
from _timing import events_ms, graph_ms

import cutlass_offload as co
from cutlass_offload.models import load_model

DEFAULT_MODELS = ("bert-base", "gpt2", "sd-unet", "resnet50")
OVERHEAD_TARGET_US = 5.0         # issue 6 item 4: host cost of one offloaded-region call
E2E_TARGET_MODELS = ("bert-base", "sd-unet")
E2E_EAGER_RATIO = 0.9            # issue 6: ours <= 0.9x eager and <= torch.compile
REGION_GRAPH_CALLS = 10          # region calls per CUDA graph when timing one region
NO_TUNE = "n/a (no --tune in this build)"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    p.add_argument("--from", dest="from_tpl", default=None, metavar="DIR_TEMPLATE",
                   help="load compiled folders (e.g. /tmp/co_{model}) instead of compiling here")
    p.add_argument("--tuned-from", dest="tuned_tpl", default=None, metavar="DIR_TEMPLATE",
                   help="load tuned compiled folders (e.g. /tmp/co_tuned_{model})")
    p.add_argument("--json", default=None, help="output file (default $OUT/runtime.json)")
    p.add_argument("--no-compile-baseline", action="store_true", help="skip torch.compile")
    p.add_argument("--regions", action=argparse.BooleanOptionalAction, default=True,
                   help="per-region table (default on)")
    p.add_argument("--reps", type=int, default=20, help="timed forwards per measurement")
    p.add_argument("--region-reps", type=int, default=10, help="graph replays per region timing")
    p.add_argument("--top", type=int, default=12, help="worst-offender rows printed per variant")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    a = p.parse_args(argv)
    for opt, tpl in (("--from", a.from_tpl), ("--tuned-from", a.tuned_tpl)):
        if tpl is not None and "{model}" not in tpl and len(a.models) > 1:
            p.error(f"{opt} {tpl!r} needs '{{model}}' to tell {len(a.models)} models apart")
    if a.reps < 1 or a.region_reps < 1:
        p.error("--reps and --region-reps must be >= 1")
    return a


def tune_supported() -> bool:
    """Whether this build's cutlass_offload.compile takes ``tune``."""
    return "tune" in inspect.signature(co.compile).parameters


def _free():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _outs(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def rel_err(out, ref) -> float:
    """Largest norm-wise relative error over the outputs, in float64."""
    errs = []
    for o, r in zip(_outs(out), _outs(ref)):
        o, r = o.double(), r.double()
        errs.append(float((o - r).norm() / r.norm().clamp_min(1e-30)))
    return max(errs)


def _graph_or_reason(fn, calls, reps):
    """(ms, None) or (None, why the CUDA graph could not be captured)."""
    try:
        return graph_ms(fn, calls=calls, reps=reps), None
    except RuntimeError as e:
        torch.cuda.synchronize()
        return None, str(e).splitlines()[0][:200]


def measure_peaks(reps: int) -> dict:
    """Measured fp16 tensor-core peak (an 8192^3 torch.matmul, TFLOP/s) and device
    copy bandwidth (1 GiB copy_, GB/s counting read + write), each in a CUDA graph."""
    n, numel = 8192, 1 << 29
    mm_ms = _matmul_ms(n, reps)
    cp_ms = _copy_ms(numel, reps)
    _free()
    return {"matmul_8192_fp16_ms": mm_ms, "tflops": 2.0 * n ** 3 / (mm_ms * 1e-3) / 1e12,
            "copy_1gib_ms": cp_ms, "gbps": 2 * numel * 2 / (cp_ms * 1e-3) / 1e9}


def _matmul_ms(n, reps) -> float:
    a, b = (torch.randn(n, n, dtype=torch.float16, device="cuda") for _ in range(2))
    c = torch.empty_like(a)
    return graph_ms(lambda: torch.matmul(a, b, out=c), calls=3, reps=reps)


def _copy_ms(numel, reps) -> float:
    x = torch.empty(numel, dtype=torch.float16, device="cuda")
    y = torch.empty_like(x)
    return graph_ms(lambda: y.copy_(x), calls=3, reps=reps)


# -- per region -------------------------------------------------------------------

def record_region_calls(compiled, inputs) -> list:
    """One forward of ``compiled``; its region calls grouped by signature:
    [{"module", "inputs", "out_shape", "names", "count"}, ...] (the first member's
    module and inputs stand for the group)."""
    calls, shapes = [], {}

    # hooks return None: a forward hook's return value would replace the output
    def before(mod, xs):
        calls.append((mod, xs))

    def after(mod, xs, out):
        shapes.setdefault(mod, tuple(out.shape) if isinstance(out, torch.Tensor) else None)

    hooks = []
    for m in compiled.region_modules():
        hooks += [m.register_forward_pre_hook(before), m.register_forward_hook(after)]
    try:
        with torch.no_grad():
            compiled(*inputs)
        torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    items = [(region_signature(m.region, xs, m.kernel.name), (m, xs)) for m, xs in calls]
    return [{"module": members[0][0], "inputs": members[0][1], "out_shape": shapes[members[0][0]],
             "names": [m.region.name for m, _ in members], "count": len(members)}
            for _, members in group_by_signature(items)]


def _seq_kv(m, xs):
    """The key length of an attention call (None for other kinds, or when the
    module does not say which input is K: the problem's static seq_kv then)."""
    if region_kind(m.region) != "attention" or getattr(m, "_ik", None) is None:
        return None
    k = xs[m._ik]
    return int(k.shape[-1] if m.region.k_transposed else k.shape[-2])


def _bytes(xs, out_shape, esize) -> int:
    ins = sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))
    return ins + (0 if out_shape is None else int(torch.Size(out_shape).numel()) * esize)


def time_groups(groups, reps, peaks, pytorch_cache) -> list:
    """One row per group: ours vs the PyTorch subgraph on the same inputs (device
    us per call in a CUDA graph), FLOPs, TFLOP/s, % of peak, target flag.
    pytorch_cache: signature without kernel -> PyTorch us (shared across variants)."""
    rows = []
    for g in groups:
        m, xs, out_shape = g["module"], g["inputs"], g["out_shape"]
        r = m.region
        kind, skv = region_kind(r), _seq_kv(m, xs)
        before = m.fallback_calls
        with torch.no_grad():
            err = rel_err(m(*xs), m.fallback(*xs))
            ours, ours_why = _graph_or_reason(lambda m=m, xs=xs: m(*xs), REGION_GRAPH_CALLS, reps)
            key = region_signature(r, xs, None)
            if key not in pytorch_cache:
                pytorch_cache[key] = _graph_or_reason(lambda m=m, xs=xs: m.fallback(*xs),
                                                      REGION_GRAPH_CALLS, reps)
            theirs, theirs_why = pytorch_cache[key]
        row = {"kind": kind, "form": r.form, "shape": describe(r, out_shape, skv) if out_shape else "?",
               "count": g["count"], "regions": g["names"], "kernel": m.kernel.name,
               "ours_us": None if ours is None else ours * 1e3,
               "pytorch_us": None if theirs is None else theirs * 1e3,
               "fell_back": m.fallback_calls > before, "rel_err_vs_pytorch": err,
               "graph_error": ours_why or theirs_why}
        flops = region_flops(r, out_shape, skv) if out_shape else None
        nbytes = _bytes(xs, out_shape, m._esize)
        row.update({"flops": flops, "bytes": nbytes, "m": gemm_m(r, out_shape) if out_shape else None})
        if row["ours_us"] and row["pytorch_us"]:
            row["ratio"] = row["ours_us"] / row["pytorch_us"]
            row["lost_us_per_forward"] = time_lost_us(row)
            row["flag"] = ("fell back" if row["fell_back"] else
                           target_flag(kind, row["m"], row["ours_us"], row["pytorch_us"]))
            sec = row["ours_us"] * 1e-6
            if flops:
                row["tflops"] = flops / sec / 1e12
                row["pct_peak"] = 100.0 * row["tflops"] / peaks["tflops"]
            else:
                row["gbps"] = nbytes / sec / 1e9
                row["pct_peak"] = 100.0 * row["gbps"] / peaks["gbps"]
        rows.append(row)
    return rows


def host_overheads(groups, rows) -> list:
    """Per region kind: host us per call of the group with the shortest kernel
    (call_overhead.region_call_costs), against OVERHEAD_TARGET_US."""
    from call_overhead import region_call_costs
    best = {}
    for i, g in enumerate(groups):
        kind = region_kind(g["module"].region)
        t = rows[i]["ours_us"] if rows and rows[i]["ours_us"] else float("inf")
        if kind not in best or t < best[kind][1]:
            best[kind] = (g, t)
    out = []
    for kind, (g, dev_us) in best.items():
        m = g["module"]
        costs = region_call_costs(m, g["inputs"], n=2000)
        dev = None if dev_us == float("inf") else dev_us
        out.append({"kind": kind, "region": m.region.name, "kernel": m.kernel.name, **costs,
                    "kernel_device_us": dev,
                    # the GPU, not the host, paces the loop when the kernel takes most of a call
                    "gpu_bound": dev is not None and dev >= 0.8 * costs["call_us"],
                    "meets_target": costs["call_us"] <= OVERHEAD_TARGET_US})
    return out


# -- per model ----------------------------------------------------------------------

def bench_variant(label, compiled, inputs, ref, a, peaks, pytorch_cache, source) -> dict:
    """Latency, error, per-region rows and host overhead of one compiled model."""
    from cutlass_offload.runtime import fast_call
    fast_call.load(block=True)            # time the C++ call path, not its build
    regions = compiled.region_modules()
    fb0, conv0 = sum(m.fallback_calls for m in regions), compiled.layout_conversions()
    with torch.no_grad():
        compiled(*inputs)                 # warm-up: signatures go to the C++ path
        out = compiled(*inputs)
        torch.cuda.synchronize()
        res = {"variant": label, "source": source, "regions": len(regions),
               "fast_call": fast_call.error() or "on",
               "regions_on_fast_call": sum(1 for m in regions if m._fast is not None and m._fast.entries),
               "kernels": len(compiled.plan.distinct_kernels),
               "rel_err_vs_eager": rel_err(out, ref),
               "layout_conversions_per_forward": compiled.layout_conversions() - conv0}
        del out
        res["ours_ms"] = events_ms(lambda: compiled(*inputs), a.reps)
        # the same with every region on the Python call path, for comparison
        saved = [(m, m._fast) for m in regions]
        for m, _ in saved:
            m._fast = None
        try:
            res["ours_python_call_ms"] = events_ms(lambda: compiled(*inputs), a.reps)
        finally:
            for m, fc in saved:
                m._fast = fc
        res["ours_graph_ms"], res["ours_graph_error"] = _graph_or_reason(
            lambda: compiled(*inputs), 1, a.reps)
        # the user-facing form of the same: CompiledModel.cuda_graphed(), timed per call
        # with its input copy, replay and output clone (captured on the first call)
        try:
            graphed = compiled.cuda_graphed(max_graphs=1)
            graphed(*inputs)
            res["ours_graphed_call_ms"] = events_ms(lambda: graphed(*inputs), a.reps)
            graphed = None          # frees the graph and its memory pool
        except RuntimeError as e:
            res["ours_graphed_call_ms"], res["ours_graphed_error"] = None, str(e).splitlines()[0]
    res["region_calls_fell_back"] = sum(m.fallback_calls for m in regions) - fb0
    res["disabled_regions"] = {m.region.name: m.disabled for m in regions if m.disabled}
    groups = record_region_calls(compiled, inputs)
    rows = time_groups(groups, a.region_reps, peaks, pytorch_cache) if a.regions else []
    res["region_groups"] = rows
    res["host_overhead"] = host_overheads(groups, rows)
    timed = [r for r in rows if r.get("ratio")]
    res["region_device_us"] = {"ours": sum(r["count"] * r["ours_us"] for r in timed),
                               "pytorch": sum(r["count"] * r["pytorch_us"] for r in timed)}
    gemm = [r for r in timed if r["kind"] == "gemm"]
    res["gemm_target_misses"] = {"groups": sum(r["flag"] == "MISS" for r in gemm),
                                 "regions": sum(r["count"] for r in gemm if r["flag"] == "MISS"),
                                 "of_groups": len(gemm), "of_regions": sum(r["count"] for r in gemm)}
    del groups
    return res


def _is_folder(tpl, name) -> bool:
    return (Path(tpl.format(model=name)) / "manifest.json").is_file()


def _folder(tpl, name):
    d = Path(tpl.format(model=name))
    if not (d / "manifest.json").is_file():
        raise SystemExit(f"runtime: {d} is not a compiled folder (no manifest.json): run "
                         f"`cutlass-offload compile {name} --out {d} --arch sm_90a` first")
    return d


def _ours(name, tpl, model, inputs, tune, ref, a, peaks, cache, label, ref_graph=None) -> dict:
    """Load (tpl) or compile (tune: with tune=True) one variant and benchmark it.
    ref_graph: the model's result dict, to fill in a PyTorch CUDA-graph time from
    the loaded exported program where the nn.Module could not be captured."""
    t0 = time.perf_counter()
    if tpl is not None:
        source = _folder(tpl, name)
        compiled, reference, _ = co.load(source, device="cuda")
        source = str(source)
    else:
        kw = {"tune": True} if tune else {}
        compiled, reference, source = co.compile(model, inputs, **kw), None, "compiled here"
    setup_s = time.perf_counter() - t0
    res = bench_variant(label, compiled, inputs, ref, a, peaks, cache, source)
    res["load_or_compile_s"] = setup_s
    if reference is not None:
        with torch.no_grad():
            res["rel_err_vs_exported"] = rel_err(compiled(*inputs), reference(*inputs))
            if ref_graph is not None and ref_graph.get("eager_graph_ms") is None:
                # the nn.Module did not capture (e.g. a host sync in the model's Python):
                # the exported ATen program runs the same ops and does
                ms, _ = _graph_or_reason(lambda: reference(*inputs), 1, a.reps)
                if ms is not None:
                    ref_graph.update(eager_graph_ms=ms, eager_graph_of="the exported program")
    return res


def bench_model(name, a, peaks) -> dict:
    model, inputs = load_model(name, a.dtype, a.batch, a.seq)
    if a.from_tpl:        # the inputs the folder was compiled with (the same seed)
        inputs = torch.load(_folder(a.from_tpl, name) / "inputs.pt")
    model = model.cuda()
    inputs = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs)
    res = {"model": name, "input_shapes": [list(x.shape) for x in inputs if isinstance(x, torch.Tensor)]}
    with torch.no_grad():
        ref = model(*inputs)
        res["eager_ms"] = events_ms(lambda: model(*inputs), a.reps)
        res["eager_graph_ms"], res["eager_graph_error"] = _graph_or_reason(lambda: model(*inputs), 1, a.reps)
    _free()
    cache = {}
    res["eager_graph_of"] = "the nn.Module" if res["eager_graph_ms"] else None
    res["heuristic"] = _ours(name, a.from_tpl, model, inputs, False, ref, a, peaks, cache, "heuristic",
                             ref_graph=res)
    if a.tuned_tpl and not _is_folder(a.tuned_tpl, name):
        res["tuned"] = f"n/a (no compiled folder {a.tuned_tpl.format(model=name)})"
    elif a.tuned_tpl:
        res["tuned"] = _ours(name, a.tuned_tpl, model, inputs, True, ref, a, peaks, cache, "tuned")
    elif not tune_supported():
        res["tuned"] = NO_TUNE
    elif a.from_tpl:
        res["tuned"] = "not run (pass --tuned-from, or leave out --from to compile tuned here)"
    else:
        res["tuned"] = _ours(name, None, model, inputs, True, ref, a, peaks, cache, "tuned")
    cache.clear()
    if not a.no_compile_baseline:
        torch._dynamo.reset()
        fast = torch.compile(model)
        with torch.no_grad():
            t0 = time.perf_counter()
            out = fast(*inputs)
            torch.cuda.synchronize()
            res["torch_compile_s"] = time.perf_counter() - t0
            res["torch_compile_rel_err_vs_eager"] = rel_err(out, ref)
            del out
            res["torch_compile_ms"] = events_ms(lambda: fast(*inputs), a.reps)
        del fast
        torch._dynamo.reset()
    for v in ("heuristic", "tuned"):
        if isinstance(res[v], dict):
            _ratios(name, res, res[v])
    return res


def _ratios(name, res, v):
    v["ours_vs_eager"] = v["ours_ms"] / res["eager_ms"]
    tc = res.get("torch_compile_ms")
    v["ours_vs_torch_compile"] = v["ours_ms"] / tc if tc else None
    if v["ours_graph_ms"] and res["eager_graph_ms"]:
        v["graph_ours_vs_pytorch"] = v["ours_graph_ms"] / res["eager_graph_ms"]
    gc = v.get("ours_graphed_call_ms")
    if gc:
        v["graphed_vs_eager"] = gc / res["eager_ms"]
        v["graphed_vs_torch_compile"] = gc / tc if tc else None
    if name in E2E_TARGET_MODELS:
        def verdict(ms):
            ok = ms / res["eager_ms"] <= E2E_EAGER_RATIO and (tc is None or ms <= tc)
            return "met" if ok else "MISS"
        v["e2e_target"] = (f"plain {verdict(v['ours_ms'])}"
                           + (f", cuda_graphed {verdict(gc)}" if gc else "")
                           + ("" if tc else " (no torch.compile run)"))


def _json_ready(x):
    """Region rows hold only plain values; drop anything else defensively."""
    return json.loads(json.dumps(x, default=str))


def main(argv=None) -> int:
    a = parse_args(argv)
    if not torch.cuda.is_available():
        print("runtime: needs a CUDA GPU (this machine has none); see --help", file=sys.stderr)
        return 2
    if a.from_tpl:            # fail before any timing; a missing tuned folder is reported per model
        for name in a.models:
            _folder(a.from_tpl, name)
    from _runtime_report import format_report
    torch.manual_seed(0)
    peaks = measure_peaks(a.reps)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": a.dtype,
              "reps": a.reps, "region_reps": a.region_reps, "tune_in_build": tune_supported(),
              "overhead_target_us": OVERHEAD_TARGET_US, "peaks": peaks, "models": []}
    for name in a.models:
        t0 = time.perf_counter()
        res = bench_model(name, a, peaks)
        _free()         # the model's and compiled models' tensors went with bench_model's frames
        res["benchmark_s"] = time.perf_counter() - t0
        print(f"{name}: done in {res['benchmark_s']:.0f} s", flush=True)
        result["models"].append(_json_ready(res))
    print(format_report(result, a.top, OVERHEAD_TARGET_US))
    path = Path(a.json) if a.json else Path(os.environ.get("OUT", ".")) / "runtime.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
