"""Helpers of the CuTe DSL GEMM's build and GPU tests (emit/dsl_gemm_sm90.py): compile
configurations, export them and link them with their C ABI shims into one shared
library (build/dsl.py), one entry point per configuration (``build.dsl.symbol``)."""
from pathlib import Path

from cutlass_offload.build import dsl as dsl_build
from cutlass_offload.emit.dsl_gemm_sm90 import DslGemmConfig


def shim_library(out: Path, configs) -> Path:
    """configs: DslGemmConfig, or (tile, cluster, dtype, activation, bias, residual,
    post_relu) tuples.
    Returns the library's path. Raises the first compile error, FileNotFoundError
    without nvcc, subprocess.CalledProcessError when the link fails."""
    configs = [c if isinstance(c, DslGemmConfig) else DslGemmConfig(*c) for c in configs]
    for name, result in dsl_build.compile_objects(configs, out).items():
        if isinstance(result, Exception):
            raise result
    return dsl_build.link_library(out, configs)
