"""Helpers of the build tier's tests that build a Plan directly (no model)."""
import ctypes
import json
from pathlib import Path

import pytest

from cutlass_offload import build, emit


def build_one_job(cache_dir, plan):
    """``build.build(plan, "sharded")`` into the build tier's cache with one nvcc job
    (one 3.x compile at a time: the 2-core machines' memory)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(cache_dir))
    mp.setenv("CUTLASS_OFFLOAD_JOBS", "1")
    try:
        return build.build(plan, "sharded")
    finally:
        mp.undo()


def library_exports(res, plan):
    """The built library (ctypes.CDLL), after checking that it lists the plan's kernels
    and exports each region's launcher and workspace query."""
    lib = ctypes.CDLL(str(res.library))
    lib.co_library_info.restype = ctypes.c_char_p
    info = json.loads(lib.co_library_info().decode())
    assert sorted(info["kernels"]) == sorted(k.name for k in plan.kernels)
    for r in plan.regions:
        getattr(lib, emit.region_symbol(r.name))
        getattr(lib, emit.region_symbol(r.name) + emit.WORKSPACE_SUFFIX)
    return lib


def kernel_units(res) -> list:
    """The build's kernel units (launchers left out), after checking none failed."""
    assert not res.failures, res.format()
    return [u for u in res.units if u.name != "launchers"]


def kernel_code(units) -> dict:
    """{kernel name: its code in its unit's source}: from the kernel's declarations
    (emit.emit_unit writes them first) to the next kernel's, for builds whose units
    hold kernels of more than one form."""
    code = {}
    for u in units:
        source = Path(u.source).read_text()
        starts = sorted((source.index(f"namespace {k} {{"), k) for k in u.kernels)
        for (start, name), (end, _) in zip(starts, starts[1:] + [(len(source), None)]):
            code[name] = source[start:end]
    return code


def attention_args(p, **kw):
    """CoAttentionArgs of a call of AttentionProblem ``p`` at a fake address (the host
    checks read only sizes and strides): Q (B, H, L, D), K / V (B, H / kv_group, L, D),
    contiguous; O BMHK; ``kw`` overrides fields."""
    from cutlass_offload.runtime.library import CoAttentionArgs
    a = CoAttentionArgs()
    a.q = a.k = a.v = a.out = 1 << 20
    a.bias = None
    a.batch, a.heads, a.seq_q, a.seq_kv = p.batch, p.heads, p.seq_q, p.seq_kv
    a.head_dim = a.head_dim_v = p.head_dim
    for t, h in (("q", p.heads), ("k", p.heads // p.kv_group), ("v", p.heads // p.kv_group)):
        setattr(a, f"{t}_stride_batch", h * p.seq_q * p.head_dim)
        setattr(a, f"{t}_stride_seq", p.head_dim)
        setattr(a, f"{t}_stride_head", p.seq_q * p.head_dim)
    a.out_stride_batch = p.seq_q * p.heads * p.head_dim
    a.out_stride_seq, a.out_stride_head = p.heads * p.head_dim, p.head_dim
    a.scale, a.causal = p.scale, 1 if p.causal == "top_left" else 0
    for name, value in kw.items():
        setattr(a, name, value)
    return a
