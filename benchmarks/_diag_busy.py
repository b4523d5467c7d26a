import statistics, sys, time
import torch
sys.path.insert(0, "src")
import cutlass_offload as co
from torch.profiler import ProfilerActivity, profile


def busy_cycles(ms):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); torch.cuda._sleep(1_000_000); end.record(); end.synchronize()
    return int(ms / start.elapsed_time(end) * 1_000_000)


def timed(fn, busy, n=100):
    torch.cuda.synchronize()
    if busy:
        torch.cuda._sleep(busy_cycles(30))
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return round(statistics.median(ts), 1)


xs = torch.randn(8, 64, dtype=torch.float16, device="cuda")
for glue in ("inductor", "eager"):
    torch.manual_seed(0)
    small = torch.nn.Linear(64, 64).half()
    compiled = co.compile(small, (torch.randn(8, 64).half(),), arch="sm_90a", glue=glue).to("cuda")
    (mod,) = compiled.region_modules()
    with torch.no_grad():
        for _ in range(50):
            compiled(xs)
        for busy in (False, True):
            c0, p0 = mod.calls, mod._calls
            t = timed(lambda: compiled(xs), busy)
            print(glue, "busy" if busy else "idle", "median us", t, "calls", mod.calls - c0, "python-path calls", mod._calls - p0, "fallbacks", mod.fallback_calls, flush=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(busy_cycles(30))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(30):
                compiled(xs)
        torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
