"""Exception hierarchy.

``UnsupportedRegion`` is not fatal: the partitioner turns it into a fallback with
a reason that reaches the user's report. Everything else derives from
``CutlassOffloadError`` and stops the compile with context.
"""
from __future__ import annotations


class CutlassOffloadError(RuntimeError):
    """Base class of every error this package raises on purpose."""


def _rebuilt(cls, args: tuple, kwargs: dict, state: dict):
    """An error of ``cls`` made again from its constructor's arguments, with its
    attributes as they were (what ``__reduce__`` below returns to pickle)."""
    e = cls(*args, **kwargs)
    e.__dict__.update(state)
    return e


class UnsupportedRegion(Exception):
    """A candidate region that no kernel can run correctly; it stays in PyTorch."""


class LeftByChoice(UnsupportedRegion):
    """A candidate region left to PyTorch on purpose (options.offload_norms), not
    because no kernel could run it; the report counts these apart."""


class ToolchainError(CutlassOffloadError):
    """nvcc or the CUTLASS headers cannot be found or used."""


class CompileError(CutlassOffloadError):
    """nvcc failed. Carries the command, the log, the kept source and the regions hit.

    Attributes: message (str, what failed, without the lines below it), command
    (list[str]), log_path (str), source_path (str), kernels (tuple of kernel names
    in the failed translation unit), regions (tuple of region names that use them).
    Like every error here, it survives pickling (a Ray worker, a process pool).
    """

    def __init__(self, message, *, command, log_path, source_path, kernels=(), regions=()):
        self.message = message
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

    def __reduce__(self):
        # pickle (a Ray worker's or a process pool's error) rebuilds an exception from
        # self.args, the joined message, which this constructor does not take
        kw = {k: getattr(self, k) for k in ("command", "log_path", "source_path", "kernels", "regions")}
        return _rebuilt, (type(self), (self.message,), kw, dict(self.__dict__))


class CaptureError(CutlassOffloadError):
    """torch.export could not capture the model on its example inputs (its forward
    raised, or the export refused it); the original exception is the ``__cause__``,
    what torch printed to stderr meanwhile (e.g. the graph it traced) is
    ``torch_output``."""

    torch_output = ""


class InputsError(CutlassOffloadError, TypeError):
    """Example inputs the model's forward cannot take as they are given (a keyword-only
    parameter, more inputs than positional parameters): a TypeError, as Python's own
    call would raise, that the CLI reports in one line."""


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

    def __reduce__(self):
        return _rebuilt, (type(self), (self.path, self.problem, self.fix), {}, dict(self.__dict__))


class DiskFullError(CutlassOffloadError):
    """A write failed for lack of disk space (ENOSPC). Attributes: path (str), hint
    (str, what to do)."""

    def __init__(self, path, hint: str):
        self.path, self.hint = str(path), hint
        super().__init__(f"out of disk space writing {self.path}; {hint}")

    def __reduce__(self):
        return _rebuilt, (type(self), (self.path, self.hint), {}, dict(self.__dict__))
