"""GPU, CuTe DSL (issue 21; skipped without the ``[dsl]`` extra): our Hopper GEMM
with fused epilogues (emit/dsl_gemm_sm90.py), compiled, exported and linked with
its C ABI shim as the build tier does, called through CoGemmArgs like any region's
kernel: against a float32 reference on fresh random inputs, outputs poisoned, at
sizes off the tile (M, N not multiples of it; N and K multiples of 8) and batch 2."""
import ctypes
import math

import pytest
import torch
import torch.nn.functional as F

from cutlass_offload.build.dsl import symbol
from cutlass_offload.emit.dsl_gemm_sm90 import DslGemmConfig
from cutlass_offload.runtime.library import CoGemmArgs, Library
from dsl_helpers import shim_library
from helpers import TOLERANCE, rel_err

pytestmark = pytest.mark.gpu
pytest.importorskip("cutlass.cute", reason="the CuTe DSL is not installed (pip install '.[dsl]')")

CONFIGS = [  # tile, cluster, dtype, activation, bias, residual, post relu
    ((128, 128), (1, 1), "f16", "identity", False, "none", False),
    ((128, 256), (2, 1), "bf16", "gelu_erf", True, "add", False),
    ((64, 128), (1, 2), "f16", "silu", False, "mul", True),
    ((128, 64), (1, 1), "f16", "gelu_tanh", True, "none", False),
    ((64, 256), (1, 1), "bf16", "relu", True, "add", True),
]
DT = {"f16": torch.float16, "bf16": torch.bfloat16}
ACT = {"identity": lambda t: t, "relu": F.relu, "gelu_erf": F.gelu,
       "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}


GATED = [((128, 256), (1, 1), "f16", "silu"), ((128, 128), (2, 1), "bf16", "gelu_tanh")]


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """Every configuration (CONFIGS, then GATED) in one library, compiled once:
    ([run of each CONFIGS entry], [run of each GATED entry])."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    configs = [DslGemmConfig(*c) for c in CONFIGS]
    gated = [DslGemmConfig(t, c, d, act, gated=True) for t, c, d, act in GATED]
    lib = Library(str(shim_library(tmp_path_factory.mktemp("dsl"), configs + gated)))
    return ([lib.launcher(symbol(c))[0] for c in configs],
            [lib.launcher(symbol(c))[0] for c in gated])


def _reference(a, b, bias, c, act, residual, post):
    """PyTorch's ops one at a time in the dtype (the rounding points of our
    epilogues), from a float32 product."""
    dt = a.dtype
    y = (a.float() @ b.float().transpose(-1, -2))
    if bias is not None:
        y = y + bias.float()
    y = ACT[act](y.to(dt)).to(dt) if act != "identity" else y.to(dt)
    if residual == "add":
        y = (y.float() + c.float()).to(dt)
    elif residual == "mul":
        y = (y.float() * c.float()).to(dt)
    return F.relu(y) if post else y


@pytest.mark.parametrize("which", range(len(CONFIGS)))
@pytest.mark.parametrize("m, n, k, l", [(200, 136, 64, 1), (129, 264, 520, 2), (1024, 512, 1024, 1)])
def test_matches_float32(library, which, m, n, k, l):
    tile, cluster, dtype, act, has_bias, residual, post = CONFIGS[which]
    dt = DT[dtype]
    g = torch.Generator(device="cuda").manual_seed(which * 1000 + m + n + k)
    a = torch.randn(l, m, k, generator=g, device="cuda").to(dt)
    b = (torch.randn(l, n, k, generator=g, device="cuda") / math.sqrt(k)).to(dt)
    bias = torch.randn(n, generator=g, device="cuda").to(dt) if has_bias else None
    c = torch.randn(l, m, n, generator=g, device="cuda").to(dt) if residual != "none" else None
    d = torch.full((l, m, n), float("nan"), device="cuda", dtype=dt)     # poisoned
    args = CoGemmArgs(a=a.data_ptr(), b=b.data_ptr(), bias=bias.data_ptr() if bias is not None else None,
                      c=c.data_ptr() if c is not None else None, d=d.data_ptr(), m=m, n=n, k=k, l=l,
                      lda=k, ldb=k, ldc=n, ldd=n, batch_stride_a=m * k, batch_stride_b=n * k,
                      batch_stride_c=m * n, batch_stride_d=m * n)
    stream = torch.cuda.current_stream().cuda_stream
    assert library[0][which](ctypes.byref(args), stream) == 0
    torch.cuda.synchronize()
    ref = _reference(a, b, bias, c, act, residual, post)
    assert not d.isnan().any(), "elements left unwritten"
    err = rel_err(d, ref)
    assert err < TOLERANCE[dt], (CONFIGS[which], (m, n, k, l), err)


@pytest.mark.parametrize("which", range(len(GATED)))
@pytest.mark.parametrize("m, n, k", [(200, 136, 64), (1024, 520, 1024)])
def test_gated_matches_float32(library, which, m, n, k):
    """D = act(x Wg^T) * (x Wu^T) from one (2N, K) weight interleaving Wg and Wu rows."""
    tile, cluster, dtype, act = GATED[which]
    run = library[1][which]
    dt = DT[dtype]
    g = torch.Generator(device="cuda").manual_seed(which * 7 + m + n + k)
    x = torch.randn(m, k, generator=g, device="cuda").to(dt)
    wg, wu = ((torch.randn(n, k, generator=g, device="cuda") / math.sqrt(k)).to(dt) for _ in range(2))
    w = torch.stack([wg, wu], dim=1).reshape(2 * n, k).contiguous()
    d = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
    args = CoGemmArgs(a=x.data_ptr(), b=w.data_ptr(), d=d.data_ptr(), m=m, n=n, k=k, l=1,
                      lda=k, ldb=k, ldc=n, ldd=n)
    assert run(ctypes.byref(args), torch.cuda.current_stream().cuda_stream) == 0
    torch.cuda.synchronize()
    gate = ACT[act]((x.float() @ wg.float().T).to(dt)).to(dt)
    ref = (gate.float() * (x.float() @ wu.float().T).to(dt).float()).to(dt)
    assert not d.isnan().any(), "elements left unwritten"
    assert rel_err(d, ref) < TOLERANCE[dt], (GATED[which], (m, n, k), rel_err(d, ref))
