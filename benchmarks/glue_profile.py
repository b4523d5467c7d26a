"""Where a forward's GPU time goes: torch.compile against ours with Inductor glue,
kernel by kernel (issue 15 / 16: "the profile that shows it").

Per model: torch.compile(model, mode=M) and ours compiled with glue "inductor" in
the same mode (``ours``: the default options, layer / RMS norms left to Inductor;
``--variants`` adds ``norms_all``: every norm a region, ``norms_none``: every norm left to
Inductor (group norms too, which it fuses with the adds before them), and ``ours_dynamic``: ours
captured with a dynamic batch, as benchmarks/runtime.py compiles it; and
``ours_python_wrapper`` / ``ours_cpp_wrapper``: ours in default mode with Inductor's
Python / C++ wrapper whatever glue.CPP_WRAPPER_IN_DEFAULT_MODE says, and
``ours_cpp_dispatcher``: the C++ wrapper calling the region ops through the dispatcher
instead of their C shims (glue.REGION_C_SHIMS); and
``attention_in_pytorch``: ours with every attention region left to PyTorch's SDPA,
as if the measured-faster list named them; and ``ours_no_pdl``: ours with every GEMM
launched without programmatic dependent launch, whatever the learned table says: with
PDL a kernel starts during its predecessor's tail and the profiler counts its wait as
its time; and ``ours_no_buffer_reuse``: ours with Inductor allocating every glue buffer
fresh (no reuse of a dead buffer, nothing in place), to test whether a Triton copy that
writes into a buffer our GEMMs have just read runs slower: in session 26's whisper
profile two such copies ran 1.5x their torch.compile counterparts; session 27: it does
not); and ``ours_dynamic_glue_auto``: ``ours_dynamic``'s capture with the glue's first
compile specialized like torch.compile's (``set_glue(dynamic="auto")``, runtime.py's
``--glue-dynamic auto``), to tell what the dynamic capture costs from what a symbolic
glue costs); and ``ours_per_sample_add``: ours with a conv's per-sample (N, K, 1, 1)
add fused into its epilogue (CompileOptions.per_sample_add: the UNet's time
embedding); and ``ours_sdpa_copies``: ours without the glue's SDPA rewrites
(runtime/glue_passes.py: layout copies before SDPA dropped, a query's factor folded
into its scale); and ``ours_glu_all_k``: ours with every gated pair one GEMM with a
GLU epilogue whatever its K (partition/gated_gemm.py MIN_K 0: the UNet's GEGLU
projections, K 320-1280), and ``ours_glu_staged_all_k``: the same with the GLU
epilogue's products staged in shared memory (emit/glu_sm90.GLU_STAGED); and
``ours_staged_epilogue``: ours with every GEMM that can take it on the staged
elementwise epilogue instead of the TMA one (emit/staged.ENABLED); and
``ours_fused_wide_attention``: ours with an attention of head dim above 256 kept whole
(CompileOptions.decompose_wide_attention off: the fused sm80 kernel, or PyTorch's SDPA
where the measured-faster list says so) instead of two GEMMs and a softmax, each checked against a
float32 copy of the model on fresh inputs (norm-wise relative error), timed (median
ms of ``--reps`` synchronized forwards, as benchmarks/runtime.py) and profiled over
``--profile-reps`` forwards with torch.profiler (CUDA activity; CUPTI records the
kernels inside CUDA graph replays too). Kernel time is summed per forward by class
(our CUTLASS kernels, cuBLAS, cuDNN conv, attention, Triton, eager elementwise,
copies, other) and the heaviest kernels are listed, so a gap between two variants
shows up as the class and the kernels that make it. Prints tables, writes JSON
(``--json``, default $OUT/glue_profile.json); needs a CUDA GPU (exit 2 without).

    python benchmarks/glue_profile.py llama convnext-tiny [--mode reduce-overhead]
        [--variants torch_compile,ours,norms_all] [--reps 20] [--profile-reps 5] [--rounds N]
        [--sequence N [--sequence-at REGEX]]

``--sequence N`` also lists each variant's kernels in launch order around the first
whose name matches ``--sequence-at`` (the first attention by default): the N before it
and two after, with durations and the idle time before each, so a kernel that runs
slower in one graph shows what ran just before it.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _timing import events_ms, paired_ms, paired_ratio
from runtime import _fp32_reference, fresh_inputs, rel_err

from cutlass_offload.api import compile_captured, resolve_arch
from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.models import load_model

VARIANTS = ("torch_compile", "ours", "ours_dynamic", "ours_python_wrapper", "ours_cpp_wrapper",
            "ours_cpp_dispatcher",
            "norms_all", "attention_in_pytorch", "ours_no_pdl", "ours_no_buffer_reuse",
            "ours_dynamic_glue_auto", "ours_per_sample_add", "norms_none", "ours_sdpa_copies",
            "ours_glu_all_k", "ours_glu_staged_all_k", "ours_staged_epilogue",
            "ours_fused_wide_attention")
WRAPPER = {"ours_python_wrapper": False, "ours_cpp_wrapper": True, "ours_cpp_dispatcher": True}


def _wrapper_options(variant: str) -> dict:
    options = {"cpp_wrapper": WRAPPER[variant]}
    if variant == "ours_cpp_dispatcher":
        from cutlass_offload.runtime import glue
        options[glue.SHIM_OPTION] = {}      # set by the caller: no region op gets a C shim
    return options


# Our kernels: CUTLASS templates in namespace cutlass (cuBLAS / cuDNN name theirs
# nvjet_*, sm90_xmma_*, or cutlass::Kernel2<cutlass_80_...> without the namespace)
# and the hand-written ones in namespaces co_*; then the kind by substring.
OURS = ("cutlass::device_kernel", "_ZN7cutlass13device_kernel", "cutlass::Kernel2<cutlass::",
        "cutlass::Kernel<cutlass::", "co_", "attention_kernel_batched")
KINDS = (("attention", ("fmha", "attention", "flash", "sdpa")),
         ("conv", ("conv", "fprop", "implicit", "depthwise", "winograd")),
         ("norm", ("norm",)),
         ("gemm", ("gemm", "nvjet", "gemv", "cublas", "cutlass")))
OTHERS = (("triton", ("triton",)),
          ("copy", ("copy", "memcpy", "memset", "nchwtonhwc", "nhwctonchw")),
          ("eager elementwise", ("at::native", "elementwise", "reduce_kernel")))


def classify(name: str) -> str:
    """'ours <kind>' for our kernels, else 'pytorch <kind>' / copy / triton / ..."""
    low = name.lower()
    ours = any(name.startswith(k) or f" {k}" in name or f"<{k}" in name for k in OURS)
    if not ours:
        for cls, keys in OTHERS:
            if any(k in low for k in keys):
                return cls
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return f"{'ours' if ours else 'pytorch'} {kind}"
    return "ours other" if ours else "other"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="built-in model names (cutlass-offload compile's)")
    p.add_argument("--mode", default="reduce-overhead", choices=["default", "reduce-overhead"],
                   help="torch.compile mode of the anchor and of our Inductor glue (default: %(default)s)")
    p.add_argument("--variants", default=",".join(VARIANTS[:2]),
                   help=f"comma-separated, from {', '.join(VARIANTS)} (default: %(default)s)")
    p.add_argument("--reps", type=int, default=20, help="timed forwards per measurement (default: %(default)s)")
    p.add_argument("--profile-reps", type=int, default=5,
                   help="forwards under torch.profiler (default: %(default)s)")
    p.add_argument("--top", type=int, default=12, help="heaviest kernels listed per variant (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=0, metavar="N",
                   help="keep every variant's forward alive and time them again in N "
                        "interleaved rounds, order rotated; ratios are medians of per-round "
                        "ratios to the first variant")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"],
                   help="the models' dtype (default: %(default)s)")
    p.add_argument("--host-profile", type=int, default=0, metavar="N",
                   help="also print the N Python functions with the most host time over "
                        "--reps forwards (cProfile, tottime), per variant")
    p.add_argument("--sequence", type=int, default=0, metavar="N",
                   help="also list, per variant, the N kernels that ran before the first one "
                        "matching --sequence-at (and two after), in order, with durations and gaps")
    p.add_argument("--sequence-at", default="attention|fmha|sdpa|flash",
                   help="regular expression of the kernel the --sequence window ends at "
                        "(default: %(default)s: the first attention)")
    p.add_argument("--json", default=None, help="where to write the JSON (default: $OUT/glue_profile.json)")
    return p.parse_args(argv)


def kernel_profile(fn, reps: int, sequence_at: str | None = None, window: int = 0) -> dict:
    """Kernel time per forward of ``fn`` (already warm), by class and by kernel; with
    ``window``, also ``sequence``: the kernels launched around the first one whose name
    matches ``sequence_at`` (``kernel_sequence``)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    by_kernel = collections.defaultdict(lambda: [0, 0.0])
    spans = []
    for ev in prof.events():
        if getattr(ev, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        dur = getattr(ev, "device_time", None)
        if dur is None:
            dur = getattr(ev, "cuda_time", 0.0)
        k = by_kernel[ev.name]
        k[0] += 1
        k[1] += float(dur)
        spans.append((ev.time_range.start, ev.time_range.end, ev.name))
    classes = collections.defaultdict(lambda: [0.0, 0.0])
    kernels = []
    for name, (count, us) in by_kernel.items():
        c = classes[classify(name)]
        c[0] += count / reps
        c[1] += us / reps
        kernels.append({"name": name, "class": classify(name), "per_forward": count / reps,
                        "us_per_forward": us / reps})
    kernels.sort(key=lambda k: -k["us_per_forward"])
    sequence = kernel_sequence(spans, sequence_at, window) if window else []
    return {"gpu_idle": idle_gaps(spans, reps), "sequence": sequence,
            "kernel_us": sum(k["us_per_forward"] for k in kernels),
            "kernels_per_forward": sum(k["per_forward"] for k in kernels),
            "classes": {c: {"kernels": n, "us": us} for c, (n, us) in
                        sorted(classes.items(), key=lambda kv: -kv[1][1])},
            "top": kernels[:40]}


def kernel_sequence(spans: list, pattern: str | None, window: int) -> list:
    """The kernels in the order they ran around the first whose name matches the
    regular expression ``pattern`` (case-insensitive; None: the first kernel): the
    ``window`` before it, it and two after, each {"name", "class", "us" (its
    duration), "gap_us" (idle time since the previous kernel ended)}. ``spans``:
    (start us, end us, name) of every kernel, any order. Where the same kernels take
    longer in one graph than another, their neighbours say what ran just before
    (e.g. whisper's head-split copies: 8.0 us in ours against 4.9 in torch.compile's)."""
    import re
    spans = sorted(spans)
    rx = re.compile(pattern, re.IGNORECASE) if pattern else None
    at = next((i for i, (_, _, name) in enumerate(spans) if rx is None or rx.search(name)), None)
    if at is None:
        return []
    out = []
    for i in range(max(0, at - window), min(len(spans), at + 3)):
        start, end, name = spans[i]
        gap = start - spans[i - 1][1] if i > 0 else 0.0
        out.append({"name": name, "class": classify(name), "us": end - start, "gap_us": max(gap, 0.0)})
    return out


def idle_gaps(spans: list, reps: int, top: int = 6) -> dict:
    """Where the GPU waits for the host: the idle time between consecutive kernels
    (``spans``: (start us, end us, name) of every kernel over ``reps`` forwards),
    per forward in total and by the kernel the gap follows (its ``top`` largest).
    A variant that is slower with the same kernel time shows here where it stalls."""
    spans.sort()
    after = collections.defaultdict(float)
    total, end, prev = 0.0, None, None
    for s, e, name in spans:
        if end is not None and s > end:
            total += s - end
            after[prev] += s - end
        if end is None or e >= end:
            end, prev = e, name
    worst = sorted(after.items(), key=lambda kv: -kv[1])[:top]
    return {"us_per_forward": total / reps,
            "after": [[us / reps, name] for name, us in worst]}


def _proc_cpu() -> dict:
    """{(pid, command): CPU seconds so far} of every process /proc shows (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        f = stat[stat.rindex(")") + 2:].split()
        out[(int(d.name), comm)] = (int(f[11]) + int(f[12])) / tick
    return out


def other_cpu(fn, reps: int) -> dict:
    """CPU use during ``reps`` forwards: this process's cores and the busiest other
    processes' (a host-bound forward slows down when something else is busy, e.g. a
    compile still running beside it). Empty off Linux."""
    if not Path("/proc/self/stat").exists():
        return {}
    torch.cuda.synchronize()
    before, t0 = _proc_cpu(), time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    after, wall = _proc_cpu(), time.perf_counter() - t0
    busy = sorted(((after[k] - before.get(k, 0.0)) / wall, f"{k[1]} ({k[0]})") for k in after)[::-1]
    me = next(((c, n) for c, n in busy if n.endswith(f"({os.getpid()})")), (0.0, ""))
    return {"wall_s": wall, "this_process_cores": me[0], "threads": len(os.listdir("/proc/self/task")),
            "others": [[round(c, 3), n] for c, n in busy if n != me[1] and c > 0.02][:8]}


def host_profile(fn, reps: int, top: int) -> list:
    """The ``top`` functions by own host time (cProfile tottime) over ``reps``
    forwards, as [us per forward, calls per forward, function]; C++ functions called
    from Python show as builtins."""
    import cProfile
    import pstats

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    rows = []
    for (file, line, func), (_, ncalls, tottime, _, _) in pstats.Stats(prof).stats.items():
        rows.append([tottime * 1e6 / reps, ncalls / reps, f"{Path(file).name}:{line}({func})"])
    rows.sort(key=lambda r: -r[0])
    return rows[:top]


@contextlib.contextmanager
def _attention_in_pytorch(on: bool):
    """While ``on``: select's measured-faster lookup names every attention problem,
    so the compile leaves each attention region to PyTorch (an A/B of our attention
    kernels inside the model, against the kernel benchmark's isolated figures)."""
    if not on:
        yield
        return
    from cutlass_offload.ir.attention import AttentionProblem
    from cutlass_offload.select import pytorch_faster
    real = pytorch_faster.reason

    def reason(problem, *args, **kw):
        if isinstance(problem, AttentionProblem):
            return "glue_profile.py attention_in_pytorch variant"
        return real(problem, *args, **kw)
    pytorch_faster.reason = reason
    try:
        yield
    finally:
        pytorch_faster.reason = real


@contextlib.contextmanager
def _no_buffer_reuse(on: bool):
    """While ``on``: Inductor neither reuses dead buffers nor writes in place (its
    compile and the first calls, which record reduce-overhead's CUDA graphs)."""
    if not on:
        yield
        return
    import torch._inductor.config as inductor_config
    with inductor_config.patch(allow_buffer_reuse=False, inplace_buffers=False):
        yield


@contextlib.contextmanager
def _no_sdpa_rewrites(on: bool):
    """While ``on``: the glue is compiled without glue_passes.rewrite_for_sdpa."""
    from cutlass_offload.runtime import glue
    real = glue.SDPA_REWRITES
    glue.SDPA_REWRITES = real and not on
    try:
        yield
    finally:
        glue.SDPA_REWRITES = real


@contextlib.contextmanager
def _glu_all_k(on: bool, staged: bool = False):
    """While ``on``: gated pairs become one GLU GEMM at any K (partition/gated_gemm.py
    MIN_K 0), e.g. the UNet's GEGLU projections (K 320-1280); with ``staged`` their
    epilogue stages the products in shared memory (emit/glu_sm90.GLU_STAGED)."""
    from cutlass_offload.emit import glu_sm90
    from cutlass_offload.partition import gated_gemm
    real, real_staged = gated_gemm.MIN_K, glu_sm90.GLU_STAGED
    gated_gemm.MIN_K = 0 if on else real
    glu_sm90.GLU_STAGED = staged if on else real_staged
    try:
        yield
    finally:
        gated_gemm.MIN_K, glu_sm90.GLU_STAGED = real, real_staged


@contextlib.contextmanager
def _staged_epilogue(on: bool):
    """While ``on``: GEMM kernels take the staged elementwise epilogue where it
    applies (emit/staged.ENABLED)."""
    from cutlass_offload.emit import staged
    real = staged.ENABLED
    staged.ENABLED = True if on else real
    try:
        yield
    finally:
        staged.ENABLED = real


@contextlib.contextmanager
def _no_pdl(on: bool):
    """While ``on``: every GEMM kernel select chooses launches without PDL."""
    if not on:
        yield
        return
    from dataclasses import replace

    from cutlass_offload import select
    real = select._kernel

    def kernel(problem, arch, config, launch=select.GemmLaunch()):
        return real(problem, arch, config, replace(launch, pdl=False))
    select._kernel = kernel
    try:
        yield
    finally:
        select._kernel = real


def run_variant(variant, model, inputs, check, a):
    """(result, the compiled forward or None): the forward is kept only for
    ``--rounds``, which times the variants again side by side."""
    if not a.rounds:              # with --rounds the kept forwards need their Dynamo caches
        torch._dynamo.reset()
    mode = None if a.mode == "default" else a.mode
    t0 = time.perf_counter()
    # Inductor's codegen (where buffers are reused) may run at the first call: both inside
    with _no_buffer_reuse(variant == "ours_no_buffer_reuse"), _no_sdpa_rewrites(variant == "ours_sdpa_copies"):
        if variant == "torch_compile":
            fn = torch.compile(model, mode=mode)
        else:
            options = CompileOptions(arch=resolve_arch(None),
                                     offload_norms={"norms_all": "all", "norms_none": "none"}.get(variant, "auto"),
                                     per_sample_add=variant == "ours_per_sample_add" or None,
                                     decompose_wide_attention=variant != "ours_fused_wide_attention")
            cap = capture(model, inputs,
                          dynamic_batch=variant in ("ours_dynamic", "ours_dynamic_glue_auto"))
            with _attention_in_pytorch(variant == "attention_in_pytorch"), _no_pdl(variant == "ours_no_pdl"), \
                    _glu_all_k(variant in ("ours_glu_all_k", "ours_glu_staged_all_k"),
                               staged=variant == "ours_glu_staged_all_k"), \
                    _staged_epilogue(variant == "ours_staged_epilogue"):
                fn = compile_captured(cap, options, glue="inductor", mode=mode,
                                      inductor_options=_wrapper_options(variant)
                                      if variant in WRAPPER and mode is None else None)
            if variant == "ours_dynamic_glue_auto":
                fn.set_glue("inductor", mode=mode, dynamic="auto")
        with torch.no_grad():
            fn(*inputs)
    with torch.no_grad():
        torch.cuda.synchronize()
        res = {"variant": variant, "setup_s": time.perf_counter() - t0}
        if variant != "torch_compile":
            res["regions"] = len(fn.plan.regions)
            res["glue_failed"] = fn.inductor.failed if fn.inductor else None
            res["glue_options"] = ({k: v if isinstance(v, (str, int, float, bool)) else str(v)
                                    for k, v in fn.inductor.used_options.items()}
                                   if fn.inductor and fn.inductor.used_options is not None else None)
            res["glue_rewrites"] = fn.inductor.rewrites if fn.inductor else None
        fresh, ref = check
        res["rel_err_fp32_fresh"] = rel_err(fn(*fresh), ref)
        res["ms"] = events_ms(lambda: fn(*inputs), a.reps)
        res["profile"] = kernel_profile(lambda: fn(*inputs), a.profile_reps, a.sequence_at, a.sequence)
        if a.host_profile:
            res["host_profile"] = host_profile(lambda: fn(*inputs), a.reps, a.host_profile)
            res["host_cpu"] = other_cpu(lambda: fn(*inputs), a.reps)
    if a.rounds:
        return res, fn
    fn = None
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    return res, None


def print_model(name, rows, top) -> None:
    print(f"\n== {name}")
    classes = []
    for r in rows:
        for c in r["profile"]["classes"]:
            if c not in classes:
                classes.append(c)
    head = ["variant", "ms/forward", "vs torch.compile", "rel. err", "kernel us", "kernels"] + classes
    base = next((r["ms"] for r in rows if r["variant"] == "torch_compile"), None)
    print(" | ".join(head))
    for r in rows:
        p = r["profile"]
        cells = [r["variant"], f"{r['ms']:.3f}", f"{r['ms'] / base:.2f}" if base else "-",
                 f"{r['rel_err_fp32_fresh']:.1e}", f"{p['kernel_us']:.0f}", f"{p['kernels_per_forward']:.0f}"]
        for c in classes:
            v = p["classes"].get(c)
            cells.append(f"{v['us']:.0f} ({v['kernels']:.0f})" if v else "-")
        print(" | ".join(cells))
    for r in rows:
        idle = r["profile"].get("gpu_idle")
        if idle:
            print(f"-- {name} / {r['variant']}: GPU idle {idle['us_per_forward']:.0f} us per forward; "
                  "most after: " + "; ".join(f"{us:.0f} us {k[:60]}" for us, k in idle["after"][:4]))
    for r in rows:
        print(f"-- {name} / {r['variant']}: heaviest kernels (us per forward, calls)")
        for k in r["profile"]["top"][:top]:
            print(f"   {k['us_per_forward']:9.1f} {k['per_forward']:5.0f}  {k['class']:<18} {k['name'][:110]}")
        seq = r["profile"].get("sequence")
        if seq:
            print(f"-- {name} / {r['variant']}: kernels in launch order around the first match "
                  "(us, idle us before it)")
            for k in seq:
                print(f"   {k['us']:8.1f} {k['gap_us']:7.1f}  {k['class']:<18} {k['name'][:110]}")
        if r.get("host_profile"):
            print(f"-- {name} / {r['variant']}: host time by Python function (us per forward, calls)")
            for us, calls, func in r["host_profile"]:
                print(f"   {us:9.1f} {calls:6.1f}  {func[:120]}")
            cpu = r.get("host_cpu") or {}
            if cpu:
                print(f"   CPU during {cpu['wall_s'] * 1e3:.0f} ms of forwards: this process {cpu['this_process_cores']:.2f} cores, "
                      f"{cpu['threads']} threads; others: {cpu['others'] or 'none busy'}")


DRIFT_LIMIT = 0.15     # rounds whose median strays further from the first timing are flagged


def drift(first_ms: float, rounds_ms: list, limit: float = DRIFT_LIMIT) -> float | None:
    """The relative difference of the rounds' median from the variant's first timing
    when it exceeds ``limit`` (a host whose speed drifted for that variant: its
    ratios in this run are suspect; session 35's torch.compile default-mode rounds ran
    7.5-7.7 ms against its first 4.88), else None."""
    med = sorted(rounds_ms)[len(rounds_ms) // 2]
    d = med / first_ms - 1
    return d if abs(d) > limit else None


def print_rounds(name, alive: dict, inputs, rows: dict, rounds: int, reps: int) -> None:
    """Time the kept variants in ``rounds`` interleaved rounds (_timing.paired_ms) and
    record each one's per-round ms and its median per-round ratio to the first variant
    (a host whose speed drifts within the process weighs on all alike)."""
    with torch.no_grad():
        times = paired_ms({v: (lambda f=f: f(*inputs)) for v, f in alive.items()}, rounds, reps)
    base = next(iter(alive))
    print(f"-- {name}: {rounds} interleaved rounds, ms per forward; ratio = median per-round ratio to {base}")
    for v, ms in times.items():
        ratio = paired_ratio(times, v, base)
        rows[v]["rounds_ms"], rows[v][f"rounds_ratio_to_{base}"] = ms, ratio
        print(f"   {v:<22} {' '.join(f'{m:.3f}' for m in ms)}   ratio {ratio:.3f}")
    for v, ms in times.items():
        d = drift(rows[v]["ms"], ms)
        rows[v]["rounds_drift"] = d
        if d is not None:
            print(f"   ! {v}: its rounds' median is {100 * d:+.0f}% off its first timing "
                  f"({rows[v]['ms']:.3f} ms): ratios against it in this run are suspect")


def main(argv=None) -> int:
    a = parse_args(argv)
    if not torch.cuda.is_available():
        print("glue_profile: needs a CUDA GPU", file=sys.stderr)
        return 2
    variants = [v for v in a.variants.split(",") if v]
    bad = sorted(set(variants) - set(VARIANTS))
    if bad:
        raise SystemExit(f"unknown variants {bad}: choose from {VARIANTS}")
    out = Path(a.json or Path(os.environ.get("OUT", ".")) / "glue_profile.json")
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "mode": a.mode,
              "date": time.strftime("%Y-%m-%d"), "models": {}}
    for name in a.models:
        model, inputs = load_model(name, dtype=a.dtype)
        model = model.cuda().eval()
        inputs = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs)
        fresh = fresh_inputs(inputs, 1234)
        with torch.no_grad():
            check = (fresh, _fp32_reference(model)(*fresh))
        rows, alive = [], {}
        for v in variants:
            try:
                res, fn = run_variant(v, model, inputs, check, a)
                rows.append(res)
                if fn is not None:
                    alive[v] = fn
                r = rows[-1]     # a line and the JSON per variant: a killed run keeps what it measured
                print(f"{name} / {v}: {r['ms']:.3f} ms, setup {r['setup_s']:.0f} s, "
                      f"rel. err {r['rel_err_fp32_fresh']:.1e}"
                      + (f", glue rewrites {r['glue_rewrites']}" if r.get("glue_rewrites") else ""), flush=True)
                result["models"].setdefault(name, {})[v] = r
                out.write_text(json.dumps(result, indent=1))
            except Exception as e:  # noqa: BLE001 - recorded; the other variants still run
                print(f"{name} / {v}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                result["models"].setdefault(name, {})[v] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        print_model(name, rows, a.top)
        if len(alive) > 1:
            print_rounds(name, alive, inputs, result["models"][name], a.rounds, a.reps)
        if alive:                 # run_variant resets Dynamo itself when nothing is kept
            alive = None
            torch._dynamo.reset()
        out.write_text(json.dumps(result, indent=1))
        del model, inputs
        gc.collect()
        torch.cuda.empty_cache()
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
