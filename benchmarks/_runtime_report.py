"""Markdown tables for benchmarks/runtime.py from its JSON-ready result dict (no GPU):
the model table, the worst-offender region table of each variant, the host
overhead table and a 'what limits it' line per model and variant."""
from __future__ import annotations

from _region_stats import time_lost_us

VARIANTS = ("heuristic", "tuned")


def _f(x, spec=".2f", none="-") -> str:
    return none if x is None else format(x, spec)


def _table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def model_table(result) -> str:
    """One row per (model, variant): latencies in ms, ratios, relative error, e2e target."""
    header = ["model", "variant", "regions (kernels)", "eager ms", "torch.compile ms (compile s)",
              "ours ms", "ours, Python call path ms", "PyTorch graph ms", "ours graph ms", "ours cuda_graphed() call ms",
              "ours/eager", "ours/compile", "cuda_graphed/eager", "cuda_graphed/compile",
              "graph ours/PyTorch", "rel. err", "e2e target"]
    rows = []
    for m in result["models"]:
        tc = m.get("torch_compile_ms")
        tc_cell = f"{tc:.2f} ({m['torch_compile_s']:.0f} s)" if tc else "not run"
        pt_graph = _f(m.get("eager_graph_ms"), ".3f")
        if m.get("eager_graph_of") == "the exported program":      # the nn.Module did not capture
            pt_graph += " (exported)"
        for name in VARIANTS:
            v = m.get(name)
            if not isinstance(v, dict):
                rows.append([m["model"], name, v or "-"] + [""] * (len(header) - 3))
                continue
            rows.append([m["model"], name, f"{v['regions']} ({v['kernels']})", _f(m["eager_ms"]),
                         tc_cell, _f(v["ours_ms"]), _f(v.get("ours_python_call_ms")), pt_graph,
                         _f(v.get("ours_graph_ms"), ".3f"), _f(v.get("ours_graphed_call_ms"), ".3f"),
                         _f(v.get("ours_vs_eager")), _f(v.get("ours_vs_torch_compile")),
                         _f(v.get("graphed_vs_eager")), _f(v.get("graphed_vs_torch_compile")),
                         _f(v.get("graph_ours_vs_pytorch")),
                         _f(v["rel_err_vs_eager"], ".1e"), v.get("e2e_target", "")])
    return _table(header, rows)


def _rate(r) -> str:
    if "tflops" in r:
        return f"{r['tflops']:.1f} TFLOP/s ({r['pct_peak']:.0f}%)"
    if "gbps" in r:
        return f"{r['gbps']:.0f} GB/s ({r['pct_peak']:.0f}%)"
    return "-"


def worst_offenders(rows, top) -> list:
    """The ``top`` timed groups losing the most device time per forward (ours vs
    PyTorch, times their count), worst first; untimed groups are left out."""
    timed = [r for r in rows if r.get("ours_us") and r.get("pytorch_us")]
    return sorted(timed, key=time_lost_us, reverse=True)[:top]


def region_table(rows, top) -> str:
    header = ["kind", "shape", "count", "kernel", "ours us", "PyTorch us", "ours/PyTorch",
              "achieved (% of peak)", "lost us/fwd", "flag"]
    body = [[r["kind"], r["shape"], r["count"], r["kernel"], _f(r["ours_us"], ".1f"),
             _f(r["pytorch_us"], ".1f"), _f(r.get("ratio")), _rate(r),
             _f(r.get("lost_us_per_forward"), ".1f"), r.get("flag", r.get("graph_error") or "")]
            for r in worst_offenders(rows, top)]
    return _table(header, body)


def overhead_table(result, target_us) -> str:
    header = ["model", "variant", "kind", "region call us", "C++ path", "Python path us", "map us",
              "PyTorch ops call us", "kernel device us", f"<= {target_us:g} us"]
    body = []
    for m in result["models"]:
        for name in VARIANTS:
            v = m.get(name)
            if not isinstance(v, dict):
                continue
            for o in v["host_overhead"]:
                verdict = "yes" if o["meets_target"] else "no"
                if o["gpu_bound"]:
                    verdict += " (GPU-bound: upper bound)"
                body.append([m["model"], name, o["kind"], _f(o["call_us"], ".1f"),
                             "yes" if o.get("fast_path") else "no", _f(o.get("python_call_us"), ".1f"),
                             _f(o["map_us"], ".1f"), _f(o["pytorch_call_us"], ".1f"),
                             _f(o["kernel_device_us"], ".1f"), verdict])
    return _table(header, body)


def limits_line(model, v) -> str:
    """What limits one variant, from the measurements: host dispatch (plain minus
    CUDA-graph latency), the regions' device time against PyTorch's, and the
    three groups losing the most."""
    parts = []
    if v.get("ours_graph_ms"):
        host = v["ours_ms"] - v["ours_graph_ms"]
        parts.append(f"host dispatch {host:.2f} ms of {v['ours_ms']:.2f} ms "
                     f"({100 * host / v['ours_ms']:.0f}%; in a CUDA graph {v['ours_graph_ms']:.3f} ms)")
    dev = v.get("region_device_us") or {}
    if dev.get("pytorch"):
        parts.append(f"offloaded regions {dev['ours'] / 1e3:.3f} ms on the device vs "
                     f"PyTorch's {dev['pytorch'] / 1e3:.3f} ms")
    miss = v.get("gemm_target_misses") or {}
    if miss.get("of_groups"):
        parts.append(f"GEMM target missed by {miss['groups']}/{miss['of_groups']} shapes "
                     f"({miss['regions']}/{miss['of_regions']} regions)")
    worst = [r for r in worst_offenders(v.get("region_groups", []), 3) if time_lost_us(r) > 0]
    if worst:
        parts.append("most lost: " + "; ".join(
            f"{r['kind']} {r['shape']} x{r['count']} (+{time_lost_us(r):.0f} us)" for r in worst))
    if v.get("region_calls_fell_back"):
        parts.append(f"{v['region_calls_fell_back']} region calls fell back to PyTorch")
    if v.get("layout_conversions_per_forward"):
        parts.append(f"{v['layout_conversions_per_forward']} NCHW->NHWC conversions per forward")
    return f"{model} ({v['variant']}): " + "; ".join(parts)


def format_report(result, top, target_us) -> str:
    """Everything runtime.py prints after the run, as markdown."""
    peaks = result["peaks"]
    out = [(f"GPU {result['gpu']}, torch {result['torch']}, {result['dtype']}; measured peak "
           f"{peaks['tflops']:.0f} TFLOP/s (fp16 matmul 8192^3), {peaks['gbps']:.0f} GB/s (copy); "
           f"{result['reps']} timed forwards per latency"), "", model_table(result), ""]
    for m in result["models"]:
        for name in VARIANTS:
            v = m.get(name)
            if isinstance(v, dict) and v["region_groups"]:
                out += [(f"### {m['model']} ({name}): worst offenders of {len(v['region_groups'])} "
                        "region shapes (device us per call, CUDA graph)"), "",
                        region_table(v["region_groups"], top), ""]
    out += ["### Host cost of one offloaded-region call", "", overhead_table(result, target_us), ""]
    out += ["### What limits each model", ""]
    out += ["- " + limits_line(m["model"], m[n]) for m in result["models"] for n in VARIANTS
            if isinstance(m.get(n), dict)]
    return "\n".join(out)
