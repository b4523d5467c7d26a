"""Locate nvcc and the CUTLASS headers; build the nvcc command line."""
from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..config import knobs
from ..errors import ToolchainError

GENCODE = {"sm90a": "-gencode=arch=compute_90a,code=sm_90a",
           "sm80": "-gencode=arch=compute_80,code=sm_80"}
BASE_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
              "-Xcompiler=-fPIC", "-Xcompiler=-Wno-psabi", "-lineinfo")


def find_nvcc() -> str:
    """Path of nvcc: $CUTLASS_OFFLOAD_NVCC, then PATH, then $CUDA_HOME/bin, then the
    ``nvidia-cuda-nvcc`` wheel. Raises ToolchainError naming these options."""
    k = knobs()
    candidates = []
    if k.nvcc:
        candidates.append(k.nvcc)
    which = shutil.which("nvcc")
    if which:
        candidates.append(which)
    if k.cuda_home:
        candidates.append(os.path.join(k.cuda_home, "bin", "nvcc"))
    for site in sys.path:
        candidates += glob.glob(os.path.join(site, "nvidia", "cuda_nvcc", "bin", "nvcc"))
        candidates += glob.glob(os.path.join(site, "nvidia", "cu*", "bin", "nvcc"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise ToolchainError(
        "nvcc not found. Put it on PATH, set CUDA_HOME (nvcc in $CUDA_HOME/bin), set "
        "CUTLASS_OFFLOAD_NVCC to its path, or `pip install nvidia-cuda-nvcc`.")


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """The 'Build cuda_...' line of ``nvcc --version`` (part of every cache key)."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise ToolchainError(f"{nvcc} --version failed: {e}") from e
    m = re.search(r"^Build .*$", out, re.M) or re.search(r"release [\d.]+", out)
    return m.group(0) if m else out.strip()


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


def include_dirs() -> tuple:
    r = cutlass_root()
    return (str(r / "include"), str(r / "tools" / "util" / "include"))


@functools.lru_cache(maxsize=None)
def cutlass_version() -> str:
    """CUTLASS version from cutlass/version.h plus a hash of the header tree listing."""
    text = (cutlass_root() / "include" / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{p} (\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    ver = ".".join(m.group(1) for m in parts if m)
    h = hashlib.sha256()
    inc = cutlass_root() / "include"
    for p in sorted(inc.rglob("*.h*")):
        st = p.stat()
        h.update(f"{p.relative_to(inc)}:{st.st_size}".encode())
    return f"{ver}+{h.hexdigest()[:12]}"


def nvcc_command(nvcc: str, arch: str, source: str, output: str, threads: int = 0) -> list:
    """The one nvcc invocation that turns a .cu into a shared library."""
    if arch not in GENCODE:
        raise ToolchainError(f"unknown arch {arch!r}; use one of {sorted(GENCODE)}")
    cmd = [nvcc, *BASE_FLAGS, GENCODE[arch], "-shared", f"-t{threads}"]
    for d in include_dirs():
        cmd += ["-I", d]
    cmd += [source, "-o", output]
    return cmd
