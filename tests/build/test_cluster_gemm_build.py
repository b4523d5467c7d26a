"""Build tier: a clustered sm90a GEMM (128x128 tiles in a 2x2 cluster, TMA multicast)
compiles with nvcc, with the query that sizes its persistent grid from the clusters
the device holds (emit/templates/cluster_occupancy.h), and exports its region (no GPU:
about a minute on 2 cores). The GPU tier (tests/gpu/test_cluster_tiles.py) checks
clusters of 4 and 8 CTAs for results."""
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import gemm_table
from torch import nn

import cutlass_offload as co
from cutlass_offload.emit import gemm_sm90
from cutlass_offload.select import DEFAULT_NUM_SMS, sm90

pytestmark = pytest.mark.build

M, N, K = 512, 1280, 1280
CONFIG = sm90._config((128, 128, 64), (2, 2, 1), sm90.COOP)


def compile_projection(out_dir=None):
    """An fp16 Linear compiled for sm_90a with a table whose entry for its GEMM is
    CONFIG (also run ahead: build_ahead.py)."""
    with tempfile.TemporaryDirectory() as d:
        with gemm_table(Path(d) / "table.json", M, K, [(N, CONFIG)], gpu="build test",
                        num_sms=DEFAULT_NUM_SMS["sm90a"]):
            return co.compile(nn.Linear(K, N).half(), (torch.randn(M, K).half(),), arch="sm_90a",
                              out_dir=out_dir)


def test_a_clustered_kernel_compiles_and_exports_its_region(build_ahead, tmp_path):
    build_ahead.wait("cluster_gemm")
    compiled = compile_projection(tmp_path / "out")
    (kernel,) = compiled.plan.distinct_kernels
    assert kernel.config == CONFIG and "_c2x2x1_" in kernel.name
    assert not compiled.plan.fallbacks
    assert compiled.library_path.stat().st_size > 0
    code = gemm_sm90.emit(kernel).code
    assert "arguments.hw_info.max_active_clusters = co_max_active_clusters(" in code
