"""Load a generated library with ctypes and check it fits the visible GPU."""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

import torch

from .. import abi
from ..abi import CO_CANNOT_IMPLEMENT, CO_OK, STATUS_NAMES  # noqa: F401 - re-exported
from ..errors import DamagedFileError, DeviceError
from ..integrity import elf_problem
from ..target import TARGETS
from ..ir import DECOMPOSITIONS, RASTER_ORDERS

_CTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "f32": ctypes.c_float, "i32": ctypes.c_int32}


def _fields(struct: str) -> list:
    """ctypes ``_fields_`` of one C ABI struct (abi.ARGS_FIELDS, prelude.h's order)."""
    return [(name, _CTYPES[kind]) for name, kind in abi.ARGS_FIELDS[struct]]


class CoGemmArgs(ctypes.Structure):
    """Mirror of ``struct CoGemmArgs`` in emit/templates/prelude.h."""

    _fields_ = _fields("CoGemmArgs")

    def set_launch(self, launch) -> None:
        """Copy an ir.GemmLaunch into the launch knob fields (codes as in prelude.h)."""
        self.raster_order = RASTER_ORDERS.index(launch.raster)
        self.swizzle = launch.swizzle
        self.splits = launch.splits
        self.decomposition = DECOMPOSITIONS.index(launch.decomposition)
        self.pdl = int(launch.pdl)


class CoConvArgs(ctypes.Structure):
    """Mirror of ``struct CoConvArgs`` in emit/templates/prelude.h."""

    _fields_ = _fields("CoConvArgs")


class CoNormArgs(ctypes.Structure):
    """Mirror of ``struct CoNormArgs`` in emit/templates/prelude.h."""

    _fields_ = _fields("CoNormArgs")


class CoGroupNormArgs(ctypes.Structure):
    """Mirror of ``struct CoGroupNormArgs`` in emit/templates/prelude.h."""

    _fields_ = _fields("CoGroupNormArgs")


class CoAttentionArgs(ctypes.Structure):
    """Mirror of ``struct CoAttentionArgs`` in emit/templates/prelude.h."""

    _fields_ = _fields("CoAttentionArgs")


ARGS_TYPES = {"CoGemmArgs": CoGemmArgs, "CoConvArgs": CoConvArgs, "CoNormArgs": CoNormArgs,
              "CoGroupNormArgs": CoGroupNormArgs, "CoAttentionArgs": CoAttentionArgs}
assert set(ARGS_TYPES) == set(abi.ARGS_FIELDS)



def check_device(arch: str, device=None) -> None:
    """Raise DeviceError unless a CUDA GPU that can run ``arch`` code is visible."""
    if not torch.cuda.is_available():
        raise DeviceError(f"this compiled model runs CUTLASS kernels built for {arch} and needs "
                          "a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
    cc = torch.cuda.get_device_capability(device)
    if not TARGETS[arch].runs_on(cc):
        name = torch.cuda.get_device_name(device)
        raise DeviceError(f"the library was built for {arch} but the GPU is {name} "
                          f"(sm_{cc[0]}{cc[1]}); recompile with the matching --arch")


class Library:
    """A loaded libcutlass_offload.so: region launchers by symbol.

    Raises DamagedFileError, before the dynamic loader sees the file, when it is
    not a complete ELF file (dlopen maps a truncated library and the process dies
    with SIGBUS on the first page past its end); OSError when dlopen refuses it.
    Callers that hold a recorded hash check it first (api.load, the build cache).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        why = elf_problem(self.path)
        if why is not None:
            raise DamagedFileError(self.path, why, "compile the model again (the library was damaged "
                                   "after it was built)")
        self._dll = ctypes.CDLL(str(self.path))
        info = self._dll.co_library_info
        info.restype = ctypes.c_char_p
        self.info = json.loads(info().decode())

    def launcher(self, symbol: str, args_type=CoGemmArgs):
        """(run, workspace_size) ctypes functions of one region taking ``args_type``."""
        run = getattr(self._dll, symbol)
        run.argtypes = [ctypes.POINTER(args_type), ctypes.c_void_p]
        run.restype = ctypes.c_int
        ws = getattr(self._dll, symbol + abi.WORKSPACE_SUFFIX)
        ws.argtypes = [ctypes.POINTER(args_type)]
        ws.restype = ctypes.c_int64
        return run, ws
