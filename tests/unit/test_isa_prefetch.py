"""runtime/isa_prefetch.py: Inductor's CPU-ISA check run early in background threads,
so that the C++ wrapper's compile finds every ISA's answer cached; and InductorGlue
starts it only where a C++ wrapper may be compiled on CUDA."""
import json
import os
import platform
import subprocess
import sys

import pytest
import torch

from cutlass_offload.runtime import glue, isa_prefetch

CHILD = r"""
import json, time
from torch._inductor import cpu_vec_isa
from cutlass_offload.runtime import isa_prefetch
threads = isa_prefetch.start()
assert isa_prefetch.start() == threads          # once per process
for t in threads:
    t.join()
calls = []
real = cpu_vec_isa.VecISA.check_build
cpu_vec_isa.VecISA.check_build = lambda self, code: calls.append(str(self)) or real(self, code)
picked = str(cpu_vec_isa.pick_vec_isa())
print(json.dumps({"threads": len(threads), "checked_again": calls, "picked": picked,
                  "candidates": [str(i) for i in isa_prefetch.candidates()]}))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="Inductor checks x86 ISAs")
def test_prefetched_checks_leave_nothing_for_inductor_to_check(tmp_path):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["threads"] == len(got["candidates"]) >= 1, got
    assert got["checked_again"] == [], got        # pick_vec_isa found every answer cached
    assert got["picked"] in got["candidates"] + [""], got


class NoRegions(torch.nn.Module):
    def forward(self, x):
        return x.sin()


@pytest.mark.parametrize("kw, started", [
    ({}, True),                                            # default mode: our C++ wrapper choice
    ({"mode": "reduce-overhead"}, False),                  # CUDA graphs: the Python wrapper
    ({"options": {"cpp_wrapper": False}}, False),
    ({"mode": "reduce-overhead", "options": {"cpp_wrapper": True}}, True),
])
def test_glue_starts_the_checks_where_a_cpp_wrapper_may_compile(monkeypatch, kw, started):
    monkeypatch.setattr(glue, "CPP_WRAPPER_IN_DEFAULT_MODE", True)
    monkeypatch.delenv("CUTLASS_OFFLOAD_CPP_WRAPPER", raising=False)
    calls = []
    monkeypatch.setattr(isa_prefetch, "start", lambda: calls.append(1) or [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    glue.InductorGlue(torch.fx.symbolic_trace(NoRegions()), **kw)
    assert bool(calls) == started
    calls.clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    glue.InductorGlue(torch.fx.symbolic_trace(NoRegions()), **kw)
    assert calls == []                                     # no CUDA: nothing started
