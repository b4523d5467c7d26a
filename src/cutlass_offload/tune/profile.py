"""The profiling process: ``python -m cutlass_offload.tune.profile REQUEST RESULTS``.

Runs in its own process (tune/runner.py starts it) so that a candidate kernel
that faults cannot poison the CUDA context of the compile or of the other
candidates. REQUEST is JSON::

    {"library": "/path/libcutlass_offload.so", "device": 0,
     "problems": {"0": {"m", "n", "k", "batch", "dtype", "layout_b",
                        "a_batch_broadcast", "epilogue": {GemmEpilogue fields}}},
     "jobs": [{"id": "tune0_1", "problem": "0", "symbol": "co_tune0_1",
               "launch": {GemmLaunch fields} (optional: CUTLASS's defaults),
               "variants": [{GemmLaunch fields}, ...] (optional),
               "always_variants": true (optional)}],
     "knob_search": {"top": 2, "pdl": true} (optional)}

Each job is one candidate kernel behind the library's ordinary region launcher
(``extern "C" int co_<region>(const CoGemmArgs*, cudaStream_t)``, the runtime's
own ABI). Per problem the process makes random operands on the GPU (fresh,
seeded), computes a float32 reference, times the PyTorch ops the region replaces,
then for each job: runs it once into a NaN-poisoned output, checks it against the
reference (runtime/region.py VERIFY_TOLERANCE), and times it. RESULTS gets one
JSON line per event, flushed and fsync'ed before the next step, so the parent
can tell which job was running when the process died:

    {"event": "setup", "problem": "0"}
    {"event": "torch", "problem": "0", "us": 12.3}
    {"event": "start", "job": "tune0_1"}
    {"event": "done", "job": "tune0_1", "status": "ok", "us": 9.8, "rel_err": 2e-4}

Knob search (``knob_search``): once every job of a problem is timed, the ``top``
fastest correct ones are run again with each of their ``variants`` (run-time
launch knobs: no other kernel), and so are the jobs marked ``"always_variants":
true`` whatever their time (a stream-K kernel whose default launch is not its best
decomposition), then, with ``pdl``, the fastest of all with PDL switched on. Each such run is its own event pair, ``{"event": "start", "job":
"tune0_1@along_n_swz2"}`` / ``{"event": "done", "job": ..., "base": "tune0_1",
"launch": {...}, ...}``.

Timing: after about ``WARM_MS`` of GPU work (``_warm_up``: clocks out of idle),
``LAUNCHES`` back-to-back launches (fewer for big problems, about
``GRAPH_BUDGET_US`` of work per replay, at least 2; cycling over up to ``MAX_COPIES``
operand copies, so small problems are not all served from L2) captured in one
CUDA graph (host launch overhead removed, as in a graph-captured model), replayed
``REPLAYS`` times after a warm-up; the median replay time / launches, in us.
Without graph capture (it failed), the same launches timed eagerly.
Exit status: 0 done, 3 a candidate left a CUDA error (the context is unusable:
the parent starts a fresh process for the rest), 2 bad request.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

from ..ir import GemmLaunch
from ..runtime.library import (
    CO_CANNOT_IMPLEMENT,
    CO_OK,
    STATUS_NAMES,
    CoGemmArgs,
    Library,
)
from ..runtime.region import ESIZE, TORCH_DTYPE, VERIFY_TOLERANCE

LAUNCHES = 20
GRAPH_BUDGET_US = 2000.0  # per replay: big problems need fewer launches to time well
ASSUMED_TFLOPS = 400.0    # for that estimate only (an H200 runs fp16 GEMMs at 500-700)
REPLAYS = 15
WARMUP = 3
MAX_COPIES = 4
COPY_BYTES = 64 << 20     # aim: the copies together exceed the H200's 50 MB L2 (vendor datasheet)
EXIT_CUDA_ERROR = 3
WARM_MS = 300.0           # GPU work before the first timing (_warm_up)

ACTIVATIONS = {
    "identity": lambda x: x, "relu": torch.relu, "gelu_erf": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "sigmoid": torch.sigmoid,
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}


class Operands:
    """One copy of a problem's tensors on the GPU and the CoGemmArgs reading them.

    a (La, M, K), La = 1 when A is broadcast over the batch or L = 1: row-major, or
    M-contiguous for layout_a "col" (stored (La, K, M));
    b stored (L, N, K) for layout_b "col" (a Linear weight), (L, K, N) for "row";
    bias (N,), c (L, M, N) when the epilogue reads them; d (L, M, N) the output,
    (L, M, N / 2) under a GLU epilogue (B's and the bias's N values are then gate and
    up interleaved in blocks of 8, partition/gated_gemm.py).
    """

    def __init__(self, spec: dict, seed: int, device):
        m, n, k, batch = spec["m"], spec["n"], spec["k"], spec["batch"]
        ep, dt = spec["epilogue"], TORCH_DTYPE[spec["dtype"]]
        g = torch.Generator(device=device).manual_seed(seed)

        def rand(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g, device=device) * scale).to(dt)

        la = 1 if spec.get("a_batch_broadcast") or batch == 1 else batch
        self.spec = spec
        col_a = spec.get("layout_a", "row") == "col"
        self.a = rand(la, k, m).transpose(-1, -2) if col_a else rand(la, m, k)
        # B scaled so that the accumulator is about unit size whatever K is
        self.b = rand(batch, *((n, k) if spec["layout_b"] == "col" else (k, n)), scale=k ** -0.5)
        self.bias = rand(n, scale=0.5) if ep["bias"] else None
        self.c = rand(batch, m, n) if ep["residual"] != "none" else None
        self.glu = bool(ep.get("glu"))
        n_out = n // 2 if self.glu else n
        self.d = torch.empty(batch, m, n_out, dtype=dt, device=device)
        self.args = args = CoGemmArgs()
        args.a, args.b, args.d = self.a.data_ptr(), self.b.data_ptr(), self.d.data_ptr()
        args.bias = self.bias.data_ptr() if self.bias is not None else None
        args.c = self.c.data_ptr() if self.c is not None else None
        args.m, args.n, args.k, args.l = m, n, k, batch
        args.lda, args.ldb = (m if col_a else k), (k if spec["layout_b"] == "col" else n)
        args.ldc, args.ldd = n, n_out
        args.batch_stride_a = m * k if la > 1 else 0
        args.batch_stride_b = n * k if batch > 1 else 0
        args.batch_stride_c = m * n if batch > 1 else 0
        args.batch_stride_d = m * n_out if batch > 1 else 0
        if self.glu:
            # the model's own gate and up weights (N / 2, K) and biases, for the unfused
            # PyTorch sequence (torch_ops)
            bl = self.b_logical
            self.gate_w, self.up_w = (split_glu(bl, -1)[i].transpose(-1, -2).contiguous() for i in (0, 1))
            self.gate_b, self.up_b = split_glu(self.bias, -1) if self.bias is not None else (None, None)

    @property
    def b_logical(self):
        """B as (L, K, N)."""
        return self.b.transpose(-1, -2) if self.spec["layout_b"] == "col" else self.b

    def epilogue(self, acc, add_bias=True):
        """post(residual(act(acc + bias), C)) in acc's dtype (emit/evt_sm90.semantics);
        act(gate + bias_g) * (up + bias_u) under a GLU epilogue."""
        ep = self.spec["epilogue"]
        x = acc + self.bias.to(acc.dtype) if self.bias is not None and add_bias else acc
        if self.glu:
            g, u = split_glu(x, -1)
            return ACTIVATIONS[ep["activation"]](g) * u
        x = ACTIVATIONS[ep["activation"]](x)
        if ep["residual"] == "add":
            x = x + self.c.to(acc.dtype)
        elif ep["residual"] == "mul":
            x = x * self.c.to(acc.dtype)
        return torch.relu(x) if ep["post_activation"] == "relu" else x

    def reference(self):
        """float32 result, shape (L, M, N)."""
        return self.epilogue(torch.matmul(self.a.float(), self.b_logical.float()))

    def torch_ops(self):
        """The PyTorch ops the region replaces, in the problem's dtype: cuBLAS's
        addmm (bias) or mm for one batch entry (as F.linear / torch.mm call it), bmm
        / matmul for a batch, then the rest of the epilogue op by op."""
        a, b = self.a, self.b_logical
        if self.glu:         # the model's two linears, its activation and the product
            act = ACTIVATIONS[self.spec["epilogue"]["activation"]]
            if a.shape[0] == 1 and self.gate_w.shape[0] == 1:
                g = F.linear(a[0], self.gate_w[0], self.gate_b)
                return (act(g) * F.linear(a[0], self.up_w[0], self.up_b)).unsqueeze(0)
            g, u = torch.matmul(a, self.gate_w.transpose(-1, -2)), torch.matmul(a, self.up_w.transpose(-1, -2))
            if self.gate_b is not None:
                g, u = g + self.gate_b, u + self.up_b
            return act(g) * u
        if a.shape[0] == 1 and b.shape[0] == 1:
            if self.bias is not None:
                return self.epilogue(torch.addmm(self.bias, a[0], b[0]).unsqueeze(0), add_bias=False)
            return self.epilogue(torch.mm(a[0], b[0]).unsqueeze(0))
        return self.epilogue(torch.matmul(a, b))


def split_glu(t: torch.Tensor, dim: int) -> tuple:
    """(gate, up): ``t``'s ``dim`` (2N values, gate and up interleaved in blocks of 8,
    partition/gated_gemm.py) split into two views of N values each."""
    dim = dim % t.dim()
    n = t.shape[dim]
    v = t.unflatten(dim, (n // 16, 2, 8))
    return tuple(v.select(dim + 1, i).flatten(dim, dim + 1) for i in (0, 1))


def _copies(spec: dict) -> int:
    m, n, k, batch = spec["m"], spec["n"], spec["k"], spec["batch"]
    nbytes = ESIZE[spec["dtype"]] * batch * (m * k + n * k + 2 * m * n)
    return max(1, min(MAX_COPIES, math.ceil(COPY_BYTES / max(1, nbytes))))


def operand_copies(spec: dict, device) -> list:
    """The Operands a problem is timed on: enough fresh random copies to exceed the
    L2 cache together (``_copies``), seeded per copy."""
    return [Operands(spec, seed=1000 * i + 17, device=device) for i in range(_copies(spec))]


def _rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def launches_for(spec: dict) -> int:
    """Launches per timed graph: LAUNCHES, or fewer (>= 2) when they would take more
    than GRAPH_BUDGET_US at ASSUMED_TFLOPS."""
    flops = 2.0 * spec["m"] * spec["n"] * spec["k"] * spec["batch"]
    est_us = flops / (ASSUMED_TFLOPS * 1e6)
    return max(2, min(LAUNCHES, int(GRAPH_BUDGET_US / max(est_us, 1e-3))))


def time_us(launch_all, launches: int = LAUNCHES) -> tuple:
    """(us per launch, how) for ``launch_all(stream_handle)``, which issues
    ``launches`` launches on the given stream; how is "graph" or "eager" (capture
    failed)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            launch_all(side.cuda_stream)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    how = "graph"
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch_all(torch.cuda.current_stream().cuda_stream)
        run = graph.replay
        run()
    except RuntimeError:
        torch.cuda.synchronize()
        how = "eager"

        def run():
            launch_all(torch.cuda.current_stream().cuda_stream)
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / launches)
    return statistics.median(times), how


def _sync_error():
    """The CUDA error a synchronize reports, or None."""
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:
        return str(e).strip().splitlines()[0]
    return None


def profile_job(lib: Library, job: dict, copies: list, ref, launch: dict | None = None) -> dict:
    """One candidate launched with ``launch`` (GemmLaunch fields; None: the job's
    own, else CUTLASS's defaults): {"status", "us", "rel_err", "detail", "fatal"}
    (see tune/result.py)."""
    run, ws = lib.launcher(job["symbol"], CoGemmArgs)
    args = [c.args for c in copies]
    knobs = GemmLaunch(**(launch if launch is not None else job.get("launch") or {}))
    for a in args:
        a.set_launch(knobs)
    need = int(ws(ctypes.byref(args[0])))
    workspace = torch.empty(max(need, 1), dtype=torch.uint8, device=copies[0].d.device)
    for a in args:
        a.workspace, a.workspace_bytes = (workspace.data_ptr(), workspace.numel()) if need > 0 else (None, 0)
    first = copies[0]
    first.d.fill_(float("nan"))                  # an output the kernel never writes shows as NaN
    status = run(ctypes.byref(args[0]), torch.cuda.current_stream().cuda_stream)
    if status != CO_OK:
        err = _sync_error()
        kind = "cannot implement" if status == CO_CANNOT_IMPLEMENT else "error"
        return {"status": kind, "detail": err or STATUS_NAMES.get(status, str(status)),
                "fatal": err is not None}
    err = _sync_error()
    if err:
        return {"status": "error", "detail": err, "fatal": True}
    rel = _rel_err(first.d, ref)
    tol = VERIFY_TOLERANCE[first.spec["dtype"]]
    if not rel <= tol:                           # NaN fails too
        return {"status": "wrong result", "rel_err": rel if math.isfinite(rel) else None,
                "detail": f"relative error {rel:.3e} > {tol:g} against the float32 reference"}

    launches = launches_for(first.spec)

    def launch_all(stream):
        for i in range(launches):
            s = run(ctypes.byref(args[i % len(args)]), stream)
            if s != CO_OK:
                raise RuntimeError(f"launcher status {STATUS_NAMES.get(s, s)}")

    try:
        us, how = time_us(launch_all, launches)
    except RuntimeError as e:
        err = _sync_error()
        return {"status": "error", "detail": err or str(e), "fatal": err is not None}
    return {"status": "ok", "us": us, "rel_err": rel, "detail": "" if how == "graph" else "timed eagerly"}


class _Log:
    """The RESULTS file: one JSON object per line, on disk before the next step."""

    def __init__(self, f):
        self.f = f

    def __call__(self, **record):
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())


def _warm_up(device, ms: float = WARM_MS) -> None:
    """Keep the GPU busy with fp16 matmuls for about ``ms`` milliseconds, so the first
    problem is not timed while the clocks ramp up from idle: an idle H200 reports a
    345 MHz SM clock, and in session 24's corpus run the PyTorch anchor of whisper's
    biased 6000x768x768, timed by a freshly started profiling process, read 17.1 us
    against 14.5 for the same addmm in benchmarks/anchor_l2.py
    (anchor_l2_whisper_2026-12-03_h200.log; the ramp-up is the likely cause, not
    confirmed)."""
    a = torch.randn(4096, 4096, device=device, dtype=torch.float16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spent = 0.0
    while spent < ms:
        start.record()
        for _ in range(10):
            torch.mm(a, a)
        end.record()
        end.synchronize()
        spent += start.elapsed_time(end)


def _torch_launches(copies):
    def launch_all(stream):
        for i in range(launches_for(copies[0].spec)):
            copies[i % len(copies)].torch_ops()
    return launch_all


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cutlass_offload.tune.profile", description=__doc__)
    p.add_argument("request")
    p.add_argument("results")
    a = p.parse_args(argv)
    try:
        with open(a.request) as f:
            req = json.load(f)
        problems, jobs = req["problems"], req["jobs"]
    except (OSError, ValueError, KeyError) as e:
        print(f"bad request {a.request}: {e}", file=sys.stderr)
        return 2
    with open(a.results, "a") as f:
        return _run(req, problems, jobs, _Log(f))


def _run(req, problems, jobs, log) -> int:
    device = torch.device("cuda", int(req.get("device", 0)))
    torch.cuda.set_device(device)
    lib = Library(req["library"])
    order = list(dict.fromkeys(j["problem"] for j in jobs))
    _warm_up(device)
    for pid in order:
        spec = problems[pid]
        log(event="setup", problem=pid)
        copies = operand_copies(spec, device)
        ref = copies[0].reference()
        torch_us, _ = time_us(_torch_launches(copies), launches_for(spec))
        log(event="torch", problem=pid, us=torch_us)
        timed = []
        for job in (j for j in jobs if j["problem"] == pid):
            log(event="start", job=job["id"])
            rec = profile_job(lib, job, copies, ref)
            fatal = rec.pop("fatal", False)
            log(event="done", job=job["id"], **rec)
            if fatal:
                return EXIT_CUDA_ERROR
            if rec["status"] == "ok":
                timed.append((rec["us"], job, job.get("launch") or {}))
        if req.get("knob_search") and timed and not _knob_search(lib, req["knob_search"], timed,
                                                                 copies, ref, log):
            return EXIT_CUDA_ERROR
    return 0


def _knob_search(lib, search: dict, timed: list, copies, ref, log) -> bool:
    """Launch-knob variants of the fastest jobs, then PDL on the fastest of all
    (module docstring); False when a run left a CUDA error."""
    timed.sort(key=lambda t: t[0])

    def variant(job, launch) -> bool:
        vid = f"{job['id']}@{GemmLaunch(**launch).tag}"
        log(event="start", job=vid)
        rec = profile_job(lib, job, copies, ref, launch)
        fatal = rec.pop("fatal", False)
        log(event="done", job=vid, base=job["id"], launch=launch, **rec)
        if rec["status"] == "ok":
            timed.append((rec["us"], job, launch))
        return not fatal

    top = int(search.get("top", 2))
    retime = list(timed[:top]) + [t for t in timed[top:] if t[1].get("always_variants")]
    for _, job, base in retime:
        for launch in job.get("variants", []):
            if GemmLaunch(**launch) != GemmLaunch(**base) and not variant(job, launch):
                return False
    if search.get("pdl"):
        _, job, launch = min(timed, key=lambda t: t[0])
        if not launch.get("pdl"):
            return variant(job, dict(launch, pdl=True))
    return True


if __name__ == "__main__":
    sys.exit(main())
