"""What a folder's glue_cache.bin saves on the first call after co.load (issue 17).

Steps, each in a process of its own with fresh CUTLASS / Inductor / Triton caches:
``compile`` (co.compile with CUDA example inputs: the glue compiles beside the kernel
build and the folder is saved with Inductor's artifacts, glue_cache.bin), ``load`` (co.load
+ the first call, the artifacts handed to Inductor and, since session 44, the C++
wrapper's binaries put in its cache), ``load_no_binaries`` (the artifacts alone),
``load_no_glue_cache`` (both withheld) and ``torch_compile`` (torch.compile default mode + its first call, the
anchor). Needs a CUDA GPU and nvcc; prints one JSON line per step (seconds).

    MODEL=sd-unet python benchmarks/glue_cache_first_call.py
"""
import json, os, shutil, subprocess, sys, time
W = "/tmp/gc"
STEP = sys.argv[1] if len(sys.argv) > 1 else None

def fresh(tag):
    """The environment of one step: its own CUTLASS cache, and Inductor / Triton caches
    emptied at the same paths for every step, as a new machine's default ones would be
    (the C++ wrapper's source names its kernels' files by absolute path, so its
    binaries match only under the same cache path)."""
    env = dict(os.environ, CUTLASS_OFFLOAD_CACHE_DIR=f"{W}/{tag}_coc")
    for k, d in (("TORCHINDUCTOR_CACHE_DIR", "ind"), ("TRITON_CACHE_DIR", "tri")):
        shutil.rmtree(f"{W}/{d}", ignore_errors=True)
        env[k] = f"{W}/{d}"
    return env

if STEP is None:
    shutil.rmtree(W, ignore_errors=True); os.makedirs(W)
    model = os.environ.get("MODEL", "sd-unet")
    for step, tag in (("compile", "a"), ("load", "b"), ("load_no_binaries", "e"),
                      ("load_no_glue_cache", "c"), ("torch_compile", "d")):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, step, model], env=fresh(tag), capture_output=True, text=True)
        line = [l for l in p.stdout.splitlines() if l.startswith("{")]
        print(json.dumps({"step": step, "process_s": round(time.perf_counter() - t, 2),
                          **(json.loads(line[-1]) if line else {"error": p.stderr[-1500:]})}), flush=True)
    sys.exit(0)

t0 = time.perf_counter()
import torch
import cutlass_offload as co
from cutlass_offload.models import load_model
model_name = sys.argv[2]
t_imp = time.perf_counter() - t0
folder = f"{W}/folder"

def sync_call(fn, inputs):
    t = time.perf_counter()
    with torch.no_grad():
        fn(*inputs)
    torch.cuda.synchronize()
    return round(time.perf_counter() - t, 2)

if STEP in ("compile", "torch_compile"):
    model, inputs = load_model(model_name, "fp16")
    model = model.cuda().eval()
    inputs = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs)
    torch.cuda.synchronize()
    t = time.perf_counter()
    if STEP == "compile":
        compiled = co.compile(model, inputs, arch="sm_90a", out_dir=folder)
        torch.cuda.synchronize()
        total = round(time.perf_counter() - t, 2)
        rep = compiled.report
        print(json.dumps({"compile_s": total, "phases": getattr(rep, "phases", None),
                          "glue_cache": os.path.exists(f"{folder}/glue_cache.bin"),
                          "glue_cache_mb": round(os.path.getsize(f"{folder}/glue_cache.bin") / 2**20, 2)
                          if os.path.exists(f"{folder}/glue_cache.bin") else None,
                          "second_call_s": sync_call(compiled, inputs)}, default=str))
    else:
        fn = torch.compile(model)
        first = sync_call(fn, inputs)
        print(json.dumps({"compile_and_first_call_s": round(time.perf_counter() - t, 2), "first": first,
                          "second_call_s": sync_call(fn, inputs)}))
else:
    if STEP in ("load_no_binaries", "load_no_glue_cache"):
        from cutlass_offload.runtime import glue_binaries
        glue_binaries.install = lambda *a: 0
    if STEP == "load_no_glue_cache":
        torch.compiler.load_cache_artifacts = None      # api._load_glue_cache then skips it
    if True:
        t = time.perf_counter()
        compiled, _, inputs = co.load(folder, device="cuda", reference=False)
        load_s = round(time.perf_counter() - t, 2)
        first = sync_call(compiled, inputs)
        from torch._dynamo.utils import counters
        from cutlass_offload.runtime import glue_binaries
        manifest = json.loads(open(f"{folder}/manifest.json").read())
        # whether the load used the folder's glue cache, and whether Inductor hit it
        print(json.dumps({"import_s": round(t_imp, 2), "load_s": load_s, "first_call_s": first,
                          "second_call_s": sync_call(compiled, inputs),
                          "kernel_files": len(manifest.get("glue_kernel_files") or []),
                          "kernels_in_place": glue_binaries.kernels_in_place(manifest),
                          "fxgraph_cache_hit": counters["inductor"].get("fxgraph_cache_hit", 0),
                          "fxgraph_cache_miss": counters["inductor"].get("fxgraph_cache_miss", 0)}))
