"""Build: one generated translation unit -> one shared library, by one nvcc call.

The library is cached by content (source text, nvcc command, nvcc version,
CUTLASS version, arch); a second build of the same plan compiles nothing.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import knobs
from ..emit import LibrarySource
from ..errors import CompileError
from ..ir import Plan
from . import toolchain
from .cache import BuildCache, cache_key

LIB_NAME = "libcutlass_offload.so"
SOURCE_NAME = "kernels.cu"


@dataclass(frozen=True)
class BuildResult:
    """library: path of the built .so inside the cache; seconds: nvcc wall time
    (0 on a cache hit); command: the nvcc argv."""

    library: Path
    source: Path
    cache_hit: bool
    seconds: float
    command: tuple


def build(src: LibrarySource, plan: Plan, cache: BuildCache | None = None) -> BuildResult:
    """Compile ``src`` for ``plan.arch`` into a shared library (cached).

    Raises ToolchainError without nvcc/CUTLASS, CompileError when nvcc fails (the
    source and log are kept under ``<cache>/failed/``).
    """
    cache = cache or BuildCache()
    nvcc = toolchain.find_nvcc()
    threads = knobs().nvcc_threads
    argv_shape = toolchain.nvcc_command("nvcc", plan.arch, SOURCE_NAME, LIB_NAME, threads)
    key = cache_key(src.text, " ".join(argv_shape[1:]), toolchain.nvcc_version(nvcc),
                    toolchain.cutlass_version(), plan.arch)
    prefix = f"lib_{plan.arch}_{len(src.kernel_spans)}k"
    hit = cache.lookup("lib", prefix, key, LIB_NAME)
    if hit is None:
        with cache.lock("lib", prefix, key):
            hit = cache.lookup("lib", prefix, key, LIB_NAME)   # another process built it
            if hit is None:
                return _compile(src, plan, cache, nvcc, threads, prefix, key)
    d, meta = hit
    if not meta.get("ok", True):
        raise _failure(src, plan, d, meta.get("command", []), (d / "nvcc.log").read_text(errors="replace"))
    return BuildResult(d / LIB_NAME, d / SOURCE_NAME, True, 0.0, tuple(meta.get("command", ())))


def _compile(src, plan, cache, nvcc, threads, prefix, key) -> BuildResult:
    staging = cache.staging("lib")
    try:
        (staging / SOURCE_NAME).write_text(src.text)
        cmd = toolchain.nvcc_command(nvcc, plan.arch, str(staging / SOURCE_NAME),
                                     str(staging / LIB_NAME), threads)
        if knobs().verbose:
            print(" ".join(cmd), flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        log = proc.stdout + proc.stderr
        (staging / "nvcc.log").write_text(log)
        if proc.returncode != 0:
            failed = cache.root / "failed" / f"{prefix}.{key[:16]}"
            if failed.exists():
                shutil.rmtree(failed)
            failed.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, failed)
            raise _failure(src, plan, failed, cmd, log)
        d = cache.publish("lib", prefix, key, staging, LIB_NAME,
                          {"ok": True, "command": cmd, "seconds": seconds, "arch": plan.arch,
                           "kernels": [k for k, _, _ in src.kernel_spans]})
        return BuildResult(d / LIB_NAME, d / SOURCE_NAME, False, seconds, tuple(cmd))
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


_LINE = re.compile(rf"{re.escape(SOURCE_NAME)}\((\d+)\)|line (\d+) of \S*{re.escape(SOURCE_NAME)}")


def _failure(src, plan, folder: Path, cmd, log) -> CompileError:
    lines = {int(a or b) for a, b in _LINE.findall(log)}
    kernels = sorted({k for k in (src.kernel_at_line(n) for n in lines) if k})
    if not kernels:
        kernels = [k for k, _, _ in src.kernel_spans]
    regions = [r.name for r, k in zip(plan.regions, plan.kernels) if k.name in kernels]
    first = next((l for l in log.splitlines() if "error" in l), log.strip()[:300])
    return CompileError(f"nvcc failed: {first}", command=cmd, log_path=folder / "nvcc.log",
                        source_path=folder / SOURCE_NAME, kernels=kernels, regions=regions)
