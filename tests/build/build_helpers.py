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
