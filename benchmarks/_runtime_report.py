"""Markdown tables for benchmarks/runtime.py from its JSON-ready result dict (no GPU):
the issue-16 table (torch.compile anchors against ours with eager and Inductor
glue, accuracy, the done-when verdict), the model table, the worst-offender
region table of each variant, the host overhead table and a 'what limits it'
line per model and variant."""
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
        if "error" in m or "eager_ms" not in m:
            continue
        tc = m.get("torch_compile_ms")
        tc_cell = f"{tc:.2f} ({m['torch_compile_s']:.0f} s)" if tc else "not run"
        pt_graph = _f(m.get("eager_graph_ms"), ".3f")
        if m.get("eager_graph_of") == "the exported program":      # the nn.Module did not capture
            pt_graph += " (exported)"
        for name in VARIANTS:
            v = m.get(name)
            if not isinstance(v, dict) or "ours_ms" not in v:
                why = v.get("error", "-") if isinstance(v, dict) else (v or "-")
                rows.append([m["model"], name, why] + [""] * (len(header) - 3))
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
            if not isinstance(v, dict) or "ours_ms" not in v:
                continue
            for o in v.get("host_overhead", []):
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


def _ms(v):
    return v.get("ms") if isinstance(v, dict) else None


def _errs(v) -> dict:
    if not isinstance(v, dict):
        return {}
    return {k[len("rel_err_fp32_"):]: e for k, e in v.items() if k.startswith("rel_err_fp32_")}


def judge(m: dict, tol: float, ratio: float = 0.90) -> dict:
    """Issue 16's done-when for one model's result: ours with Inductor glue in
    reduce-overhead <= ``ratio`` x torch.compile reduce-overhead, ours with
    Inductor glue plain <= ``ratio`` x torch.compile default, slower than neither,
    and every error of ours against float32 (fresh inputs, second batch) below
    ``tol``. The ratios are the interleaved rounds' (runtime.bench_paired, step
    "paired") where that step ran, else the sequential steps'; both are kept.
    ``verdict``: "met", "MISS: ..." or "incomplete: ..." (a number missing)."""
    anchors = m.get("anchors") or {}
    tc, ro = _ms(anchors.get("default")), _ms(anchors.get("reduce-overhead"))
    oi, oro = _ms(m.get("ours_inductor")), _ms(m.get("ours_inductor_ro"))
    seq = (oi / tc if oi and tc else None, oro / ro if oro and ro else None)
    paired = m.get("paired") if isinstance(m.get("paired"), dict) else {}
    pr = tuple((paired.get(k) or {}).get("ratio") for k in ("default", "reduce-overhead"))
    out = {"ratio": ratio, "tolerance": tol,
           "plain_vs_torch_compile": pr[0] if pr[0] is not None else seq[0],
           "ro_vs_torch_compile_ro": pr[1] if pr[1] is not None else seq[1],
           "sequential": {"plain": seq[0], "ro": seq[1]},
           "ratios_from": (f"{paired['rounds']} interleaved rounds" if None not in pr
                           else "sequential steps")}
    errs = {f"{v}:{k}": e for v in ("ours_inductor", "ours_inductor_ro", "heuristic")
            for k, e in _errs(m.get(v)).items()}
    out["errors"] = errs
    missing = [n for n, x in (("torch.compile", tc), ("torch.compile reduce-overhead", ro),
                              ("ours inductor", oi), ("ours inductor reduce-overhead", oro)) if not x]
    bad_errs = [k for k, e in errs.items() if not (isinstance(e, (int, float)) and e < tol)]
    out["plain_met"] = None if out["plain_vs_torch_compile"] is None else out["plain_vs_torch_compile"] <= ratio
    out["ro_met"] = None if out["ro_vs_torch_compile_ro"] is None else out["ro_vs_torch_compile_ro"] <= ratio
    out["slower_than_neither"] = None if missing else (
        out["plain_vs_torch_compile"] <= 1.0 and out["ro_vs_torch_compile_ro"] <= 1.0)
    out["errors_ok"] = bool(errs) and not bad_errs
    if missing:
        out["verdict"] = "incomplete: no " + ", ".join(missing)
        return out
    why = []   # three digits: a 0.904x miss must not print as "0.90x"
    if not out["ro_met"]:
        why.append(f"reduce-overhead {out['ro_vs_torch_compile_ro']:.3f}x")
    if not out["plain_met"]:
        why.append(f"plain {out['plain_vs_torch_compile']:.3f}x")
    if not out["slower_than_neither"]:
        why.append("slower than torch.compile")
    if bad_errs:
        why.append("error above tolerance: " + ", ".join(bad_errs))
    out["verdict"] = "met" if not why else "MISS: " + "; ".join(why)
    return out


def _cell(v, key="ms", time_key=None, spec=".2f"):
    if not isinstance(v, dict) or v.get(key) is None:
        return "-"
    cell = format(v[key], spec)
    if time_key and v.get(time_key) is not None:
        cell += f" ({v[time_key]:.0f} s)"
    return cell


def _err_cell(v) -> str:
    e = _errs(v)
    if not e:
        return "-"
    return " / ".join(f"{x:.1e}" if isinstance(x, (int, float)) else "n/a" for x in
                      (e.get("fresh"), e.get("batch2")))


def glue_table(result) -> str:
    """Issue 16: per model, eager PyTorch, the torch.compile anchors (compile s),
    ours with eager glue (plain, cuda_graphed()) and Inductor glue (plain,
    reduce-overhead; first-call s), ratios, errors against float32 (fresh inputs
    / second batch) and the done-when verdict."""
    header = ["model", "eager ms", "torch.compile ms (s)", "reduce-overhead ms (s)", "max-autotune ms (s)",
              "ours eager glue ms", "ours cuda_graphed() ms", "ours Inductor ms (s)",
              "ours Inductor reduce-overhead ms (s)", "ours compile s", "Inductor/compile",
              "Inductor RO/compile RO", "ratios from (sequential plain / RO)", "rel. err fresh / batch 2 (Inductor, RO)", "done when"]
    rows = []
    for m in result["models"]:
        if "error" in m:
            rows.append([m["model"], f"FAILED: {m['error']}"] + [""] * (len(header) - 2))
            continue
        a = m.get("anchors") or {}
        h = m.get("heuristic") if isinstance(m.get("heuristic"), dict) else {}
        d = m.get("done_when") or {}
        setup = m.get("ours_setup") or {}
        rows.append([m["model"], _f(m.get("eager_ms")), _cell(a.get("default"), time_key="compile_s"),
                     _cell(a.get("reduce-overhead"), time_key="compile_s"),
                     _cell(a.get("max-autotune"), time_key="compile_s"),
                     _f(h.get("ours_ms")), _f(h.get("ours_graphed_call_ms"), ".3f"),
                     _cell(m.get("ours_inductor"), time_key="first_call_s"),
                     _cell(m.get("ours_inductor_ro"), time_key="first_call_s"),
                     _f(setup.get("load_or_compile_s"), ".0f"),
                     _f(d.get("plain_vs_torch_compile")), _f(d.get("ro_vs_torch_compile_ro")),
                     f"{d.get('ratios_from', '-')} ({_f((d.get('sequential') or {}).get('plain'))} / "
                     f"{_f((d.get('sequential') or {}).get('ro'))})",
                     f"{_err_cell(m.get('ours_inductor'))}, {_err_cell(m.get('ours_inductor_ro'))}",
                     d.get("verdict", "-")])
    return _table(header, rows)


def format_report(result, top, target_us) -> str:
    """Everything runtime.py prints after the run, as markdown."""
    peaks = result["peaks"]
    out = [(f"GPU {result['gpu']}, torch {result['torch']}, {result['dtype']}; measured peak "
           f"{peaks['tflops']:.0f} TFLOP/s (fp16 matmul 8192^3), {peaks['gbps']:.0f} GB/s (copy); "
           f"{result['reps']} timed forwards per latency"), "",
           "### Inductor glue against the torch.compile anchors (issue 16)", "", glue_table(result), "",
           model_table(result), ""]
    for m in result["models"]:
        for name in VARIANTS:
            v = m.get(name)
            if isinstance(v, dict) and v.get("region_groups"):
                out += [(f"### {m['model']} ({name}): worst offenders of {len(v['region_groups'])} "
                        "region shapes (device us per call, CUDA graph)"), "",
                        region_table(v["region_groups"], top), ""]
    out += ["### Host cost of one offloaded-region call", "", overhead_table(result, target_us), ""]
    out += ["### What limits each model", ""]
    limits = ["- " + limits_line(m["model"], m[n]) for m in result["models"] for n in VARIANTS
              if isinstance(m.get(n), dict) and "ours_ms" in m[n]]
    out += limits or ["(from the eager-glue variants' region timings: none ran in this run)"]
    return "\n".join(out)
