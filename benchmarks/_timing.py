"""Timing helpers shared by the latency benchmarks (needs a CUDA GPU).

Medians from triton.testing.do_bench when triton is installed (its 200 ms budget),
else, or when a fixed number of repetitions is asked for, from CUDA events around
each call; ``graph_ms`` times ``calls`` calls captured in one CUDA graph and
replayed (device time: no host launch cost).
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch

GRAPH_CALLS = 20


def events_ms(fn, reps: int, warmup: int = 3) -> float:
    """Median ms of ``reps`` calls, each between two CUDA events and synchronized
    (so a host-bound call shows its host time), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def median_ms(fn, reps: int | None = None) -> float:
    """Median ms of one call of ``fn``: do_bench (200 ms of calls) when triton is
    installed and ``reps`` is None, else ``events_ms`` with ``reps`` (default 200)."""
    if reps is None:
        try:
            from triton.testing import do_bench
            return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))
        except ImportError:
            reps = 200
    return events_ms(fn, reps, warmup=max(3, reps // 10))


def graph_ms(fn, calls: int = GRAPH_CALLS, reps: int | None = None) -> float:
    """Device time in ms of one call: ``calls`` calls in one CUDA graph, replayed
    (``median_ms(replay, reps)`` / calls). Raises what capture raises."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return median_ms(g.replay, reps) / calls


def paired_ms(fns: dict, rounds: int, reps: int) -> dict:
    """{name: [median ms of ``reps`` calls per round]} for every callable of ``fns``,
    timed in ``rounds`` interleaved rounds (each round runs every fn in turn, the
    order rotated per round), so that a host whose speed drifts during the run
    (other tenants, clocks) weighs on every fn alike: compare them round by round."""
    names = list(fns)
    out = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            out[n].append(events_ms(fns[n], reps, warmup=1))
    return out


def paired_ratio(times: dict, num: str, den: str) -> float:
    """The median over rounds of times[num][i] / times[den][i] (``paired_ms``)."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def compile_problems(model, example: tuple, count: int) -> tuple:
    """``model`` (one conv per problem, each on its own input) compiled into one library
    from ``example`` (CPU tensors) with a dynamic batch and eager glue, moved to the GPU;
    asserts ``count`` region modules (the report says which fell back). Returns
    (compiled model, build seconds)."""
    import time

    import cutlass_offload as co
    t0 = time.perf_counter()
    compiled = co.compile(model, example, dynamic_batch=True, glue="eager").to("cuda")
    build_s = time.perf_counter() - t0
    assert len(compiled.region_modules()) == count, compiled.report.format()
    return compiled, build_s


def region_calls(compiled, xs) -> list:
    """For each input ``xs[i]`` of one forward of the compiled model ``compiled``, the
    region module that reads it and that module's arguments as the model passes them:
    [(module, args)] in input order (each region module timed alone on real
    operands). KeyError when an input reaches no region module."""
    mods, seen = compiled.region_modules(), {}
    hooks = [m.register_forward_pre_hook(lambda m, args: seen.setdefault(id(m), args)) for m in mods]
    try:
        with torch.no_grad():
            compiled(*xs)
    finally:
        for h in hooks:
            h.remove()
    out = []
    for x in xs:
        mod = next((m for m in mods if id(m) in seen and any(t is x for t in seen[id(m)])), None)
        if mod is None:
            raise KeyError(f"no region module reads input {tuple(x.shape)}")
        out.append((mod, seen[id(mod)]))
    return out


def conv_row(mod, args, pytorch_op, conv_alone, reference) -> tuple:
    """Time the conv region module ``mod`` on ``args`` (CUDA-graph replays, us) against
    PyTorch's same math ``pytorch_op()`` (cuDNN plus the unfused epilogue) and cuDNN's
    conv alone ``conv_alone()``, after checking its output against ``reference()``
    (float32). Returns (output, row fields: kernel, fell_back, rel_err, ours_us,
    cudnn_us, speedup, cudnn_conv_us, conv_speedup; speedups = PyTorch / ours)."""
    with torch.no_grad():
        out = mod(*args)
        ref = reference()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        ours = graph_ms(lambda: mod(*args)) * 1e3
        theirs = graph_ms(pytorch_op) * 1e3
        conv = graph_ms(conv_alone) * 1e3
    return out, {"kernel": mod.kernel.name, "fell_back": mod.fallback_calls, "rel_err": err,
                 "ours_us": ours, "cudnn_us": theirs, "speedup": theirs / ours,
                 "cudnn_conv_us": conv, "conv_speedup": conv / ours}


def write_result(name: str, data: dict, **meta) -> Path:
    """``{"meta": {gpu, torch, date, **meta}, **data}`` as JSON to $OUT/``name``.json
    (default ./out); returns the path."""
    import json
    import os
    import time
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), **meta}
    path = out / f"{name}.json"
    path.write_text(json.dumps({"meta": meta, **data}, indent=1))
    return path
