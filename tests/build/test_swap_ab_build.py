"""Build tier: a swap_ab sm90a GEMM (D^T = B^T A^T, D^T stored column-major: emit/gemm_sm90.py)
compiles with nvcc and exports its region (no GPU: about a minute on 2 cores). Its tile
is also a skinny one (K tile 32, select/sm90.py skinny_configs) on a wgmma outside CuTe's
default N shapes (160), with a bias and GELU epilogue on the column broadcast, so the
one kernel compiles every part those configs change. The GPU tier
(tests/gpu/test_swap_ab_tiles.py) checks their results."""
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import gemm_table
from torch import nn

import cutlass_offload as co
from cutlass_offload.emit import gemm_sm90
from cutlass_offload.select import DEFAULT_NUM_SMS, sm90

pytestmark = pytest.mark.build

M, N, K = 154, 520, 96
CONFIG = sm90._config((64, 160, 32), (1, 1, 1), sm90.PINGPONG, swap_ab=True)


class Projection(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(K, N)

    def forward(self, x):
        return F.gelu(self.lin(x))


def compile_projection(out_dir=None):
    """The model compiled for sm_90a with a table whose entry for its GEMM is CONFIG
    (also run ahead: build_ahead.py)."""
    with tempfile.TemporaryDirectory() as d:
        with gemm_table(Path(d) / "table.json", M, K, [(N, CONFIG)], gpu="build test",
                        num_sms=DEFAULT_NUM_SMS["sm90a"]):
            return co.compile(Projection().half(), (torch.randn(M, K).half(),), arch="sm_90a",
                              out_dir=out_dir)


def test_a_swapped_kernel_compiles_and_exports_its_region(build_ahead, tmp_path):
    build_ahead.wait("swap_ab")
    compiled = compile_projection(tmp_path / "out")
    (kernel,) = compiled.plan.distinct_kernels
    assert kernel.config == CONFIG and kernel.name.endswith("64x160x32_c1x1x1_pingpong_swapab_align888_bias_gelu")
    assert not compiled.plan.fallbacks
    assert compiled.library_path.stat().st_size > 0
    code = gemm_sm90.emit(kernel).code
    assert "Sm90ColBroadcast" in code and "using LayoutD = cutlass::layout::ColumnMajor;" in code
    assert "MMA_64x160x16" in code       # the wgmma selector's atom, as wide as the tile
