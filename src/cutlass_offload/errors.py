"""Exception hierarchy.

``UnsupportedRegion`` is not fatal: the partitioner turns it into a fallback with
a reason that reaches the user's report. Everything else derives from
``CutlassOffloadError`` and stops the compile with context.
"""
from __future__ import annotations


class CutlassOffloadError(RuntimeError):
    """Base class of every error this package raises on purpose."""


class UnsupportedRegion(Exception):
    """A candidate region that no kernel can run correctly; it stays in PyTorch."""


class ToolchainError(CutlassOffloadError):
    """nvcc or the CUTLASS headers cannot be found or used."""


class CompileError(CutlassOffloadError):
    """nvcc failed. Carries the command, the log, the kept source and the regions hit.

    Attributes: command (list[str]), log_path (str), source_path (str),
    kernels (tuple of kernel names in the failed translation unit),
    regions (tuple of region names that use them).
    """

    def __init__(self, message, *, command, log_path, source_path, kernels=(), regions=()):
        self.command = list(command)
        self.log_path = str(log_path)
        self.source_path = str(source_path)
        self.kernels = tuple(kernels)
        self.regions = tuple(regions)
        repro = " ".join(self.command)
        super().__init__(
            f"{message}\n  regions: {', '.join(self.regions) or '-'}\n"
            f"  kernels: {', '.join(self.kernels) or '-'}\n"
            f"  source kept at: {self.source_path}\n  log: {self.log_path}\n  repro: {repro}")


class DeviceError(CutlassOffloadError):
    """No CUDA device, or a device of another architecture than the library targets."""


class KernelLaunchError(CutlassOffloadError):
    """A launcher returned a failure status other than 'cannot implement'."""


class DamagedFileError(CutlassOffloadError):
    """A file of an output folder or of the build cache is missing, truncated,
    corrupted or unreadable. Attributes: path (str), the file; fix (str), what to do."""

    def __init__(self, path, problem: str, fix: str):
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"{self.path} {problem}; {fix}")


class DiskFullError(CutlassOffloadError):
    """A write failed for lack of disk space (ENOSPC). Attribute: path (str)."""

    def __init__(self, path, hint: str):
        self.path = str(path)
        super().__init__(f"out of disk space writing {self.path}; {hint}")
