"""cutlass_offload: offload PyTorch GEMM, conv2d, attention and norm regions to CUTLASS
kernels built into one shared library. Importing the package has no side effects.

    compiled = cutlass_offload.compile(model, (x,), arch="sm_90a")
    y = compiled(x)
    print(cutlass_offload.explain(model, (x,), arch="sm_90a"))   # a dry run: nothing built
"""
from .api import compile, compile_captured, load, resolve_arch
from .dry_run import DryRun, explain
from .folder import check_folder
from .capture import capture
from .config import CompileOptions
from .backend import backend, make_backend
from .errors import (CaptureError, CompileError, CutlassOffloadError, DamagedFileError, DeviceError,
                     DiskFullError, InputsError, KernelLaunchError, ToolchainError, UnsupportedRegion)

__version__ = "0.1.0"
__all__ = ["compile", "explain", "DryRun", "compile_captured", "capture", "CompileOptions", "load",
           "check_folder", "resolve_arch", "backend", "make_backend", "CaptureError", "CompileError",
           "CutlassOffloadError", "DamagedFileError", "DeviceError", "DiskFullError", "InputsError",
           "KernelLaunchError",
           "ToolchainError", "UnsupportedRegion"]
