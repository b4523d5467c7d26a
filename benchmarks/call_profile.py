"""Per-call host time of a one-region model (a 64 x 64 fp16 Linear on sm_90a), idle and
with the GPU kept busy, under Inductor and eager glue, and a torch.profiler table of
30 busy calls (where the host time goes: the launch, the allocation, Dynamo).

"Busy": a 30 ms spin kernel (torch.cuda._sleep) is queued first, so the timed
launches queue behind it and never wait for the GPU. Prints the medians and the
profile tables; writes the medians as JSON. Needs a CUDA GPU.

    python benchmarks/call_profile.py [--json call_profile.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import cutlass_offload as co  # noqa: E402


def busy_cycles(ms: float) -> int:
    """Spin cycles of torch.cuda._sleep that last about ``ms`` milliseconds here."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    return int(ms / start.elapsed_time(end) * 1_000_000)


def median_call_us(fn, busy: bool, n: int = 100) -> float:
    """Median wall microseconds of ``n`` calls of ``fn``, each timed alone."""
    torch.cuda.synchronize()
    if busy:
        torch.cuda._sleep(busy_cycles(30))
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default="call_profile.json")
    a = p.parse_args()
    x = torch.randn(8, 64, dtype=torch.float16, device="cuda")
    result = {}
    for glue in ("inductor", "eager"):
        torch.manual_seed(0)
        compiled = co.compile(torch.nn.Linear(64, 64).half(), (torch.randn(8, 64).half(),),
                              arch="sm_90a", glue=glue).to("cuda")
        (mod,) = compiled.region_modules()
        with torch.no_grad():
            for _ in range(50):
                compiled(x)
            for busy in (False, True):
                calls, py_calls = mod.calls, mod._calls
                us = median_call_us(lambda: compiled(x), busy)
                key = f"{glue}_{'busy' if busy else 'idle'}_us"
                result[key] = us
                print(f"{key}: {us:.1f} us per call ({mod.calls - calls} calls, "
                      f"{mod._calls - py_calls} on the Python path, {mod.fallback_calls} fallbacks)",
                      flush=True)
            torch.cuda.synchronize()
            torch.cuda._sleep(busy_cycles(30))
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(30):
                    compiled(x)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
    Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
