"""Host-side cost of one offloaded-region call (Python + argument mapping).

Without a GPU it times the mapping of a call onto the kernel's arguments (what a
region call does besides the ctypes launch) on CPU tensors; with a GPU it also
times whole region calls of a tiny GEMM (launch-bound, so the host path shows).
Prints microseconds per call; writes JSON. The ``host_*`` figures are taken with
the GPU kept busy (``host_us``), so they are host time alone; the others are
wall time per call, which for this launch-bound kernel is the GPU's pace.
``host_launcher_only_us`` repeats one call (the launcher's stored Params serve it),
``host_launcher_miss_us`` changes the output address on every call (the launcher
builds its Params: checks, TMA descriptors; plus a Python list lookup), and
``host_bare_launch_us`` is the floor: one empty kernel launched from Python
(``torch.cuda._sleep(0)``). ``host_cudnn_conv_*_us``: one cuDNN conv call as
Inductor's wrapper makes it (``torch.convolution``) on EfficientNet-b0 shapes, what a
conv left to PyTorch costs the host in default mode (against
``host_region_op_call_us``: session 29 measured them alike, 12.3-13.5 against 12.5 us).
``host_region_op_call_us`` calls the region op from Python (Inductor's Python
wrapper); ``host_region_op_cpp_wrapper_us`` from Inductor's C++ wrapper, the
default-mode glue's path since session 30 (``cpp_wrapper_call_us``), against
``host_mm_cpp_wrapper_us``: cuBLAS's mm of the same size as that wrapper calls it
(``aoti_torch_cuda_mm_out``).

    python benchmarks/call_overhead.py [--arch sm_90a] [--json call_overhead.json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cutlass_offload.capture import capture
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.select import select


class Block(torch.nn.Module):
    def __init__(self, d=768):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x, r):
        return self.lin(x) + r


def per_call_us(fn, n=20000) -> float:
    """Wall-clock microseconds per call of ``fn`` over ``n`` calls (after n / 10
    warm-up calls), without synchronizing: the host-side cost of a call as long as
    the GPU keeps up with the launches."""
    for _ in range(n // 10):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def host_us(fn, n=200, rounds=15, busy_ms=30.0) -> float:
    """Host microseconds per call of ``fn`` with the GPU kept busy: each round queues
    a ``busy_ms`` spin kernel (torch.cuda._sleep), then times ``n`` calls, whose
    launches queue behind it (n stays far below the launch queue's depth), then
    synchronizes. So the figure is the host path alone, never the kernel's time
    (``per_call_us`` of a launch-bound tiny kernel measures the GPU's pace
    instead). Median over ``rounds``."""
    import statistics
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    cycles = int(busy_ms / start.elapsed_time(end) * 1_000_000)    # spin cycles per busy_ms
    for _ in range(n // 10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        torch.cuda._sleep(cycles)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


MISS_ADDRESSES = 64     # above the 16 Params a launcher keeps (prelude.h CoParamsCache)


def _with_d(args, d):
    """A copy of the ctypes argument struct ``args`` with D at address ``d``."""
    copy = type(args).from_buffer_copy(args)
    copy.d = d
    return copy


def region_call_costs(mod, xs, n=2000) -> dict:
    """Host microseconds per call of one offloaded region module on its CUDA inputs
    ``xs`` (a tuple, as its forward takes them): ``call_us`` (the whole region call
    as a model makes it: the C++ call path when built, runtime/fast_call.py),
    ``python_call_us`` (the same call with the C++ path set aside: Python mapping,
    workspace, ctypes launch), ``map_us`` (the Python mapping alone, no launch) and
    ``pytorch_call_us`` (its PyTorch subgraph, the ops it replaces). ``fast_path``
    says whether ``call_us`` took the C++ path. Synchronizes once at the end. A
    kernel slower than the host path makes a ``*call_us`` the kernel time instead:
    compare with the region's device time.
    """
    from cutlass_offload.runtime import fast_call
    fast_call.load(block=True)
    with torch.no_grad():
        mod(*xs)
        mod(*xs)                      # warm-up: the signature goes to the C++ path
        before = mod._fast.calls if mod._fast is not None else 0
        result = {"call_us": per_call_us(lambda: mod(*xs), n)}
        result["fast_path"] = mod._fast is not None and mod._fast.calls > before
        saved, mod._fast = mod._fast, None
        try:
            result["python_call_us"] = per_call_us(lambda: mod(*xs), n)
        finally:
            mod._fast = saved
        result["map_us"] = per_call_us(lambda: mod._map(xs), n)
        result["pytorch_call_us"] = per_call_us(lambda: mod.fallback(*xs), n)
    torch.cuda.synchronize()
    return result


# Convs as Inductor's wrapper calls a conv it leaves to PyTorch
# (extern_kernels.convolution = aten.convolution): EfficientNet-b0's shapes at batch
# 32, channels_last fp16: name -> (C, K, H = W, R = S, stride, groups)
CUDNN_CONVS = {"depthwise_144x56_3x3": (144, 144, 56, 3, 1, 144),
               "depthwise_672x14_5x5": (672, 672, 14, 5, 1, 672),
               "se_expand_10_to_240_1x1": (10, 240, 1, 1, 1, 1)}


def cudnn_conv_host_us() -> dict:
    """Host microseconds of one cuDNN conv call per CUDNN_CONVS shape (GPU kept busy)."""
    out = {}
    with torch.no_grad():
        for name, (c, k, h, r, stride, groups) in CUDNN_CONVS.items():
            x = torch.randn(32, c, h, h, dtype=torch.float16, device="cuda").to(
                memory_format=torch.channels_last)
            w = torch.randn(k, c // groups, r, r, dtype=torch.float16, device="cuda").to(
                memory_format=torch.channels_last)
            args = (x, w, None, (stride, stride), (r // 2, r // 2), (1, 1), False, (0, 0), groups)
            torch.convolution(*args)            # cuDNN's plan for this shape, once
            out[f"host_cudnn_conv_{name}_us"] = host_us(lambda: torch.convolution(*args))
    return out


def _region_op_call(mod, xs):
    """(the region's op, its entry) with ``mod`` registered and its FastCall bound
    (what Inductor's glue calls: ``ops.call(entry, xs)``; the caller keeps ``entry``
    alive: the registry holds it weakly), or (None, None) when the region takes other
    inputs than tensors."""
    from cutlass_offload.runtime import ops
    kinds = ops.input_kinds(xs)
    if kinds is None or any(k != "tensor" for k in kinds):
        return None, None
    entry = ops.register(mod, kinds)
    ops.call(entry, xs)                     # binds, and checks the op runs
    return ops.region_op(len(xs), 0), entry


CHAIN = (1, 9)        # region calls per compiled graph: the per-call cost is the difference


def cpp_wrapper_call_us(entry, xs, n=50, shims=False) -> float | None:
    """Host microseconds per region call from Inductor's C++ wrapper (default-mode
    glue on CUDA since session 30: ``aoti_torch_call_dispatcher``, then the op's C++
    kernel): graphs of CHAIN[0] and CHAIN[1] chained calls of the region op (each
    output the next call's first input) compiled with ``cpp_wrapper``, each timed
    with the GPU kept busy; the difference over the extra calls. None when the
    region's output cannot feed its first input. ``shims``: the wrapper calls the op's
    C shim (ops.c_shims; glue.REGION_C_SHIMS) instead of the dispatcher."""
    from cutlass_offload.runtime import glue, ops
    out = ops.call(entry, xs)
    if out.shape != xs[0].shape or out.dtype != xs[0].dtype or out.stride() != xs[0].stride():
        return None
    op = ops.region_op(len(xs), 0)
    extra = {glue.SHIM_OPTION: ops.c_shims([(len(xs), 0)]) or {}} if shims else {}
    if shims and not extra[glue.SHIM_OPTION]:
        return None
    return cpp_wrapper_chain_us(lambda g, y, rest: g.call_function(op, (y, *rest, entry.id)), xs, n,
                                extra)


def cpp_wrapper_chain_us(call, xs, n=50, options=None) -> float:
    """Host microseconds per call that ``call(graph, y, rest)`` adds to an FX graph
    (returning the node of the call's output, which feeds the next call), compiled
    with Inductor's ``cpp_wrapper``: graphs of CHAIN[0] and CHAIN[1] chained calls
    on placeholders ``xs`` (y starts as xs[0], ``rest`` the others), each timed with
    the GPU kept busy; the difference over the extra calls."""
    import torch.fx as fx
    times = {}
    for k in CHAIN:
        g = fx.Graph()
        phs = [g.placeholder(f"x{i}") for i in range(len(xs))]
        y = phs[0]
        for _ in range(k):
            y = call(g, y, phs[1:])
        g.output(y)
        torch._dynamo.reset()
        fn = torch.compile(fx.GraphModule(torch.nn.Module(), g), backend="inductor",
                           options={"cpp_wrapper": True, **(options or {})})
        with torch.no_grad():
            fn(*xs)
            times[k] = host_us(lambda: fn(*xs), n=n)
    return (times[CHAIN[1]] - times[CHAIN[0]]) / (CHAIN[1] - CHAIN[0])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--json", default="call_overhead.json")
    p.add_argument("--shims", action="store_true",
                   help="also time the region op from the C++ wrapper through its C shim "
                        "(glue.REGION_C_SHIMS, off by default), last, after the JSON is written")
    a = p.parse_args()
    model = Block().half()
    x, r = torch.randn(8, 128, 768).half(), torch.randn(8, 128, 768).half()
    cap = capture(model, (x, r))
    plan = select(partition(cap.graph_module), a.arch.replace("_", ""))
    gm = offload(cap.graph_module, plan, library_path=None)
    (mod,) = [m for m in gm.modules() if type(m).__name__ == "GemmRegionModule"]
    args = (x, model.lin.weight, model.lin.bias, r)
    result = {"map_general_us": per_call_us(lambda: mod._map_general(args)),
              "map_cached_us": per_call_us(lambda: mod._map(args)),
              "torch_empty_us": per_call_us(lambda: torch.empty((8, 128, 768), dtype=torch.float16))}
    if torch.cuda.is_available():
        import cutlass_offload as co
        small = torch.nn.Linear(64, 64).half()
        compiled = co.compile(small, (torch.randn(8, 64).half(),), arch=a.arch).to("cuda")
        xs = torch.randn(8, 64, dtype=torch.float16, device="cuda")
        with torch.no_grad():
            result["region_call_us"] = per_call_us(lambda: compiled(xs), 5000)
            (mod,) = compiled.region_modules()
            seen = []
            hook = mod.register_forward_pre_hook(lambda m, args: seen.append(args))
            compiled(xs)
            hook.remove()
            result.update({f"region_{k}": v for k, v in region_call_costs(mod, seen[0], 5000).items()})
            # the parts of a C++-path call: the C++ object alone (operand check, output
            # allocation, launch), and the library's launcher alone on cached args (a
            # repeated call: the launcher's stored Params, then cudaLaunchKernelEx)
            import ctypes
            from cutlass_offload.runtime.region import current_stream
            xs_seen = seen[0]
            result["region_cpp_object_us"] = per_call_us(lambda: mod._fast(xs_seen), 5000)
            (args, _), = mod._direct.values()
            out = torch.empty(8, 64, dtype=torch.float16, device="cuda")
            args.d = out.data_ptr()
            ref, stream = ctypes.byref(args), current_stream(0)
            result["launcher_only_us"] = per_call_us(lambda: mod._fn(ref, stream), 5000)
            result["torch_empty_cuda_us"] = per_call_us(
                lambda: torch.empty((8, 64), dtype=torch.float16, device="cuda"), 5000)
            small = small.cuda()
            result["torch_linear_call_us"] = per_call_us(lambda: small(xs), 5000)
            # the same calls with the GPU kept busy: host time alone (issue 17's
            # "a region call costs <= 5 us of host time")
            result["host_region_call_us"] = host_us(lambda: compiled(xs))
            result["host_region_cpp_object_us"] = host_us(lambda: mod._fast(xs_seen))
            result["host_launcher_only_us"] = host_us(lambda: mod._fn(ref, stream))
            # the launcher's Params cache (prelude.h CoParamsCache) missed on every call:
            # D rotates over more output addresses than a launcher keeps
            big = torch.empty(MISS_ADDRESSES, 8 * 64, dtype=torch.float16, device="cuda")
            rotating = [ctypes.byref(_with_d(args, big[i].data_ptr())) for i in range(MISS_ADDRESSES)]
            turn = itertools.count()
            result["host_launcher_miss_us"] = host_us(
                lambda: mod._fn(rotating[next(turn) % MISS_ADDRESSES], stream))
            # the floor: one bare kernel launch from Python (pybind11 + cudaLaunchKernel)
            result["host_bare_launch_us"] = host_us(lambda: torch.cuda._sleep(0))
            op, entry = _region_op_call(mod, xs_seen)
            if op is not None:
                result["host_region_op_call_us"] = host_us(lambda: op(*xs_seen, entry.id))
                with torch.no_grad():
                    per_call = cpp_wrapper_call_us(entry, xs_seen)
                if per_call is not None:
                    result["host_region_op_cpp_wrapper_us"] = per_call
                # the anchor on the same path: cuBLAS's mm as Inductor's C++ wrapper
                # calls it (aoti_torch_cuda_mm_out, no dispatcher), same-size chain
                sq = torch.randn(xs.shape[1], xs.shape[1], dtype=xs.dtype, device="cuda")
                result["host_mm_cpp_wrapper_us"] = cpp_wrapper_chain_us(
                    lambda g, y, rest: g.call_function(torch.ops.aten.mm.default, (y, rest[0])),
                    (xs, sq))
            result["host_torch_empty_cuda_us"] = host_us(
                lambda: torch.empty((8, 64), dtype=torch.float16, device="cuda"))
            result["host_torch_linear_call_us"] = host_us(lambda: small(xs))
            w = small.weight
            result["host_torch_mm_us"] = host_us(lambda: torch.mm(xs, w))
            result.update(cudnn_conv_host_us())
        torch.cuda.synchronize()
    for k, v in result.items():
        print(f"{k:>24}: {v:8.1f} us")
    Path(a.json).write_text(json.dumps(result, indent=1))
    if a.shims and torch.cuda.is_available() and op is not None:
        # last: it crashed processes that compile several graphs with it (glue.py)
        with torch.no_grad():
            shim_call = cpp_wrapper_call_us(entry, xs_seen, shims=True)
        if shim_call is not None:
            result["host_region_op_cpp_shim_us"] = shim_call
            print(f"{'host_region_op_cpp_shim_us':>24}: {shim_call:8.1f} us")
            Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
