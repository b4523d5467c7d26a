"""What sd-unet's first call after co.load costs with Inductor's C++ wrapper at -O1,
at -O0 (AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0) and with the Python wrapper
(CUTLASS_OFFLOAD_CPP_WRAPPER=0), and at -O1 without ``runtime/isa_prefetch.py``'s early
CPU-ISA check (cpp_O1_no_isa_prefetch), issue 17: each variant in one fresh process with empty
Inductor / Triton caches, in that order (not interleaved), with its default-mode forward
time (CUDA events, ROUNDS (default 3) rounds of 20 forwards, a 5 s pause before
the fourth) and Dynamo's heaviest compile timers. The
folder is compiled first with the CLI (kernels only, no glue). Needs a CUDA GPU and nvcc;
prints one JSON line per step (seconds, ms).

Environment: ``MODEL`` (a built-in name, default sd-unet), ``VARIANTS`` (comma-separated
subset of the four, default all), ``PROFILE_TOP=N``: run each first call under cProfile
and write its N heaviest functions by cumulative and by own time to
``$OUT/first_call_profile_<variant>.txt`` (where the wrapper's compile goes).

    python benchmarks/wrapper_first_call.py
"""
import json, os, subprocess, sys, time
W = "/tmp/ow"
MODEL = os.environ.get("MODEL", "sd-unet")
VARIANTS = {"cpp_O1": {}, "cpp_O0": {"AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL": "O0"},
            "python_wrapper": {"CUTLASS_OFFLOAD_CPP_WRAPPER": "0"},
            # the C++ wrapper without runtime/isa_prefetch.py's early CPU-ISA check (session 49)
            "cpp_O1_no_isa_prefetch": {"WRAPPER_FIRST_CALL_NO_ISA_PREFETCH": "1"}}
if os.environ.get("VARIANTS"):
    VARIANTS = {k: VARIANTS[k] for k in os.environ["VARIANTS"].split(",")}
if len(sys.argv) == 1:
    os.makedirs(W, exist_ok=True)
    env = dict(os.environ, CUTLASS_OFFLOAD_CACHE_DIR=os.environ.get("CUTLASS_OFFLOAD_CACHE_DIR", f"{W}/coc"))   # kernels only: a warm cache changes nothing timed here
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", "import sys; from cutlass_offload.cli import main; sys.exit(main())", "compile", MODEL, "--arch", "sm_90a",
                        "--out", f"{W}/folder", "-q"], env=env, capture_output=True, text=True)
    print(json.dumps({"step": "compile_cpu_style", "rc": p.returncode, "s": round(time.perf_counter() - t, 1),
                      "tail": p.stderr[-600:] if p.returncode else ""}), flush=True)
    for name, extra in VARIANTS.items():
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{W}/{name}_ind", TRITON_CACHE_DIR=f"{W}/{name}_tri", **extra)
        t = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, name], env=env, capture_output=True, text=True)
        line = [l for l in p.stdout.splitlines() if l.startswith("{")]
        print(json.dumps({"step": name, "process_s": round(time.perf_counter() - t, 1),
                          **(json.loads(line[-1]) if line else {"error": p.stderr[-1500:]})}), flush=True)
    sys.exit(0)

import torch
import cutlass_offload as co
if os.environ.get("WRAPPER_FIRST_CALL_NO_ISA_PREFETCH") == "1":
    from cutlass_offload.runtime import isa_prefetch
    isa_prefetch.start = lambda: []   # Inductor checks the ISAs itself, in the wrapper's compile
t = time.perf_counter()
compiled, _, inputs = co.load(f"{W}/folder", device="cuda", glue="inductor", reference=False)
load_s = time.perf_counter() - t
top_n = int(os.environ.get("PROFILE_TOP", "0"))
if top_n:
    import cProfile, io, pstats
    prof = cProfile.Profile()
    prof.enable()
t = time.perf_counter()
with torch.no_grad():
    compiled(*inputs)
torch.cuda.synchronize()
first = time.perf_counter() - t
if top_n:
    prof.disable()
    buf = io.StringIO()
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top_n)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, f"first_call_profile_{sys.argv[1]}.txt"), "w") as f:
        f.write(buf.getvalue())
# why forwards after the first call differed with / without the ISA threads (session 50:
# 0.87-0.97 against 1.44-1.51 ms on bert-base): which threads still run, which ISA is picked
from cutlass_offload.runtime import isa_prefetch
alive = [t.name for t in isa_prefetch._threads if t.is_alive()]
try:
    from torch._inductor import cpu_vec_isa
    picked = str(cpu_vec_isa.pick_vec_isa())
except Exception as e:  # noqa: BLE001
    picked = f"error: {e}"
ms = []
with torch.no_grad():
    for r in range(int(os.environ.get("ROUNDS", "3"))):
        if r == 3:
            time.sleep(5)   # rounds 4.. after a pause: does a background job slow rounds 1-3?
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            compiled(*inputs)
        b.record(); b.synchronize()
        ms.append(a.elapsed_time(b) / 20)
from torch._dynamo.utils import compile_times
ct = compile_times(repr="csv", aggregate=True)
top = sorted(zip(ct[0], ct[1]), key=lambda kv: -float(kv[1] or 0))[:8] if isinstance(ct, tuple) else str(ct)[:800]
print(json.dumps({"isa_threads_alive": alive, "isa_picked": picked, "load_s": round(load_s, 2), "first_call_s": round(first, 2), "ms_per_forward": [round(x, 3) for x in ms],
                  "report_glue": str(getattr(compiled, "report", ""))[-0:][:0] or None, "compile_times_top": top}, default=str))
