"""The sm90a launchers' use of the Params cache (prelude.h CoParamsCache; no nvcc, no
GPU): ``run`` of the GEMM, the TMA conv and the Hopper attention looks the call up
before anything else, stores Params only after every check passed, and the GEMM /
conv store nothing when a workspace is initialized per call (stream-K). The cache's
own logic is compiled and run in tests/build/test_params_cache_logic.py."""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.emit import emit_kernel
from cutlass_offload.partition import partition
from cutlass_offload.select import select


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(128, 128)
        self.conv = nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x, img):
        y = F.gelu(self.lin(x)) + x
        q = y.view(2, 64, 2, 64).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q), torch.relu(self.conv(img))


@pytest.fixture(scope="module")
def sources():
    m = Block().half().eval()
    xs = (torch.randn(2, 64, 128).half(),
          torch.randn(2, 64, 16, 16).half().contiguous(memory_format=torch.channels_last))
    plan = select(partition(capture(m, xs).graph_module), "sm90a")
    return {type(r).__name__: emit_kernel(k).code for r, k in zip(plan.regions, plan.kernels)}


def _run_body(code: str) -> str:
    start = re.search(r"\nint run\(const Co\w+Args& args, cudaStream_t stream\) \{\n", code)
    assert start, "no run()"
    return code[start.end():code.index("\n}\n", start.end())]


@pytest.mark.parametrize("kind", ["GemmRegion", "ConvRegion", "AttentionRegion"])
def test_run_looks_the_call_up_first_and_stores_after_the_checks(sources, kind):
    code = sources[kind]
    assert "static CoParamsCache<" in code
    body = _run_body(code)
    first = body.strip().splitlines()[0]
    assert "co_params_cache.find(args)" in first, first
    put = body.index("co_params_cache.put(args, ")
    for check in ("CO_CANNOT_IMPLEMENT", "CO_WORKSPACE_TOO_SMALL"):
        assert body.rindex(check) < put, (kind, check)      # stored once every check passed


@pytest.mark.parametrize("kind", ["GemmRegion", "ConvRegion"])
def test_no_params_stored_when_a_workspace_is_initialized(sources, kind):
    body = _run_body(sources[kind])
    put = body.index("co_params_cache.put(")
    assert body.rindex("if (needed == 0) {", 0, put) > body.index("initialize_workspace")
