"""Where the CUTLASS sources are: ``cutlass_library/source`` of the nvidia-cutlass
wheel (headers under ``include/``, the examples some kernels are included from
under ``examples/``). A leaf module: the emitters and the build both read it.
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from .errors import ToolchainError


@functools.lru_cache(maxsize=None)
def cutlass_root() -> Path:
    """cutlass_library/source from the nvidia-cutlass wheel (never vendored)."""
    # find_spec, not import: cutlass_library's own imports are not needed for headers
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError("the nvidia-cutlass wheel is not installed (pip install nvidia-cutlass)")
    root = Path(list(spec.submodule_search_locations)[0]) / "source"
    if not (root / "include" / "cutlass" / "cutlass.h").is_file():
        raise ToolchainError(f"CUTLASS headers not found under {root}")
    return root
