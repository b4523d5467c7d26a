"""The direct depthwise conv2d family (``direct_depthwise``): which depthwise convs
its hand-written kernel runs (emit/templates/depthwise.cuh) and the kernel a
problem gets.

A depthwise conv (groups = C = K) has no reduction over channels, so it is no
GEMM: each output reads R * S inputs of its own channel. It is bound by memory
traffic, and the kernel is written for that: 16-byte channel vectors (C a
multiple of 8, 16-bit types), a window of inputs per thread held in registers
(its width, (outputs - 1) * stride_w + S, fixes S and stride_w at compile time),
the filter slice in shared memory (at most MAX_TAPS taps). CUTLASS's own 2.x
depthwise direct conv ran 2-155x slower than cuDNN on the H200
(benchmarks/depthwise, benchmarks/results/depthwise_direct_conv_2026-12-01_h200.json).

Two forms (templates/depthwise.cuh, depthwise_tiled.cuh): the row form reads each
thread's window from global memory; the tiled form stages a block's input tile in
shared memory first. Neither wins everywhere on the H200, so on sm90a the tiled form
(and its outputs per thread and block shape) is taken where the measured table
(TABLE_FILE, written by ``benchmarks/depthwise/tiled_bench.py --write-table``) says
it ran faster than the row form, in the dtype it was measured in (fp16); other
problems, dtypes and arches get the row form.
"""
from __future__ import annotations

import json
import warnings
from functools import lru_cache
from pathlib import Path

from ..ir import ConvProblem, DepthwiseKernel

MAX_TAPS = 81          # R * S: templates/depthwise.cuh kMaxTaps (shared memory per block)
MAX_WIDTH = 9          # S: the input window per thread lives in registers
# outputs per thread along a row: 4 for 7-wide filters (ConvNeXt: the wide window is
# shared by more outputs), 2 below (fewer registers, more threads in flight). Measured
# on the zoo's 16 depthwise convs (H200, benchmarks/depthwise_latency.py, variants in one
# run): 4 everywhere 1.21x cuDNN geomean (min 0.84x), 2 everywhere 1.17x (the 7x7s
# 0.60-0.88x), this rule 1.28x (min 0.84x).
WIDE = 7


TABLE_FILE = Path(__file__).with_name("depthwise_table.json")


def key_of(c, h, w, r, s, pad, stride) -> str:
    """The table's key of a depthwise conv of these sizes (any batch: the form that
    wins turns on the image and channel sizes; the table says which batch it timed)."""
    return f"c{c}_h{h}_w{w}_r{r}_s{s}_pad{'-'.join(map(str, pad))}_st{'-'.join(map(str, stride))}"


@lru_cache(maxsize=1)
def _table() -> tuple:
    """(dtype, {key: (PT, QT, threads, min_blocks)}) of TABLE_FILE; ("", {}) when it is
    missing or unreadable (warned: every problem then gets the row form)."""
    if not TABLE_FILE.exists():
        return "", {}
    try:
        data = json.loads(TABLE_FILE.read_text())
        return str(data["dtype"]), {k: tuple(int(v) for v in row["tiled"]) for k, row in data["rows"].items()}
    except (ValueError, KeyError, TypeError) as e:
        warnings.warn(f"{TABLE_FILE} unreadable ({e}); depthwise convs use the row form")
        return "", {}


def tiled_for(problem: ConvProblem, arch: str) -> tuple:
    """The measured tiled form (PT, QT, threads, min_blocks) for ``problem``, or ().
    Only for the dtype the table was measured in: the shapes that ran fastest in fp16
    with a register cap (2 or 4 blocks per SM) ran up to 10x slower in bf16 on the
    H200 (benchmarks/results/depthwise_latency_tiled_bf16_2026-12-03_h200.*; not
    profiled)."""
    dtype, rows = _table()
    if arch != "sm90a" or problem.dtype != dtype:
        return ()
    return rows.get(key_of(problem.c, problem.h, problem.w, problem.r, problem.s, problem.pad,
                           problem.stride), ())


def outputs_for(s: int) -> int:
    """Outputs per thread for a filter ``s`` wide."""
    return 4 if s >= WIDE else 2


def reason(problem: ConvProblem) -> str | None:
    """Why the direct depthwise kernel cannot run ``problem`` (a sentence), or None."""
    if not problem.depthwise:
        return "not a depthwise conv (groups = C = K)"
    if problem.dtype not in ("f16", "bf16"):
        return "an fp32 depthwise conv stays in PyTorch (the depthwise kernel is fp16 / bf16)"
    if problem.c % 8:
        return f"depthwise conv with C = {problem.c}, not a multiple of 8 (16-byte channel vectors)"
    if tuple(problem.dilation) != (1, 1):
        return "dilated depthwise conv stays in PyTorch (the depthwise kernel has dilation 1)"
    if problem.s > MAX_WIDTH or problem.r * problem.s > MAX_TAPS:
        return (f"depthwise filter {problem.r}x{problem.s} is larger than the kernel's "
                f"{MAX_WIDTH} columns / {MAX_TAPS} taps")
    if problem.stride[1] not in (1, 2):
        return f"depthwise conv with horizontal stride {problem.stride[1]} (the kernel takes 1 or 2)"
    return None


def choose(problem: ConvProblem, arch: str) -> DepthwiseKernel:
    """The kernel for a depthwise ``problem`` (ValueError with ``reason`` if none)."""
    why = reason(problem)
    if why is not None:
        raise ValueError(why)
    return DepthwiseKernel(arch=arch, dtype=problem.dtype, epilogue=problem.epilogue, s=problem.s,
                           stride_w=problem.stride[1], outputs=outputs_for(problem.s),
                           tiled=tiled_for(problem, arch))
