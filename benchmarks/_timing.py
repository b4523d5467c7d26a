"""Timing helpers shared by the latency benchmarks (needs a CUDA GPU).

Medians from triton.testing.do_bench when triton is installed, else CUDA events;
``graph_ms`` times GRAPH_CALLS calls captured in one CUDA graph and replayed.
"""
from __future__ import annotations

import statistics

import torch

GRAPH_CALLS = 20


def median_ms(fn) -> float:
    try:
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))
    except ImportError:
        pass
    for _ in range(20):
        fn()
    times = []
    for _ in range(200):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_ms(fn) -> float:
    """Device time of one call: GRAPH_CALLS calls in one CUDA graph, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    return median_ms(g.replay) / GRAPH_CALLS
