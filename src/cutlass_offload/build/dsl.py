"""CuTe DSL kernels into a shared library (issue 21): compile configurations of
emit/dsl_gemm_sm90.py ahead of time in worker processes, then link their objects
with their C ABI shims (CoGemmArgs, prelude.h) by one nvcc call.

Each worker imports the DSL once and compiles several configurations (the import
is ~2 s of the ~3 s a fresh process pays per kernel: benchmarks/dsl_compile_time.py).
Workers are spawned, not forked: the parent may hold a CUDA context. Not on the
default build path yet; benchmarks/dsl_gemm.py and the DSL tests use it.
"""
from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..abi import WORKSPACE_SUFFIX
from ..emit import TEMPLATES
from ..emit import dsl_gemm_sm90 as dsl
from ..emit import dsl_shim


def compile_object(config: dsl.DslGemmConfig, out_dir: str) -> tuple:
    """Compile and export one configuration into ``out_dir`` as ``<name>.o`` /
    ``<name>.h``. Returns (name, seconds to compile and export). Raises what the
    DSL raises (ImportError without it)."""
    t0 = time.perf_counter()
    compiled = dsl.compile_config(config)
    dsl.export(compiled, out_dir, config.name)
    return config.name, time.perf_counter() - t0


def compile_objects(configs, out_dir: Path, jobs: int = 1) -> dict:
    """Compile the distinct ``configs`` (DslGemmConfig) into ``out_dir``, ``jobs``
    at a time (1: in this process). Returns {name: seconds} for those compiled,
    {name: exception} entries for those that failed (the others still compile)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = list(dict.fromkeys(configs))
    if jobs <= 1:
        return {c.name: _seconds_or_error(compile_object, c, str(out_dir)) for c in todo}
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo)) or 1, mp_context=ctx) as pool:
        futures = {c.name: pool.submit(compile_object, c, str(out_dir)) for c in todo}
        return {name: _seconds_or_error(f.result) for name, f in futures.items()}


def _seconds_or_error(fn, *args):
    """``fn(*args)``'s seconds, or the exception it raised (reported per configuration)."""
    try:
        return fn(*args)[1]
    except Exception as e:  # noqa: BLE001 - one configuration's failure, the others go on
        return e


def runtime_archive() -> Path:
    """The DSL's static host runtime (``libcuda_dialect_runtime_static.a`` of the
    wheel, beside the ``libcute_dsl_runtime.so`` that its ``aot_config`` names): the
    exported objects call its ``_cudaLaunchKernelEx`` etc., and linking it in keeps
    the library free of a run-time dependency on the wheel. Raises
    FileNotFoundError when the wheel has none."""
    from cutlass.cute.export.aot_config import get_libdir
    archive = Path(get_libdir() or ".") / "libcuda_dialect_runtime_static.a"
    if not archive.is_file():
        raise FileNotFoundError(f"{archive}: the CuTe DSL's static runtime is missing "
                                "(reinstall nvidia-cutlass-dsl[cu13])")
    return archive


def symbol(config: dsl.DslGemmConfig) -> str:
    """The C entry point of ``config`` in a linked library: ``int <symbol>(const
    CoGemmArgs*, cudaStream_t)`` beside ``int64_t <symbol>_workspace(const
    CoGemmArgs*)``, the region launchers' ABI (abi.py), so runtime.library.Library
    and the tuner's profiler call it as they call a C++ kernel."""
    return "co_" + config.name


def link_library(out_dir: Path, configs, lib_name: str = "libdsl_gemm.so") -> Path:
    """Link the compiled ``configs`` (their objects in ``out_dir``) with their shims
    and the DSL's static runtime into ``out_dir/lib_name``: one entry point per
    configuration (``symbol``) and ``co_library_info`` (JSON: kind, kernel names),
    so runtime.library.Library loads it.
    Raises FileNotFoundError without nvcc or an object, subprocess.CalledProcessError
    (nvcc's stderr in it) when the link fails."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    out_dir = Path(out_dir)
    configs = list(dict.fromkeys(configs))
    sources, objects = [], []
    for i, c in enumerate(configs):
        obj = out_dir / f"{c.name}.o"
        if not obj.is_file():
            raise FileNotFoundError(f"{obj}: configuration {c.name} was not compiled")
        objects.append(str(obj))
        sym = symbol(c)
        sources.append(f'#include "{c.name}.h"\n' + dsl_shim.shim(f"k{i}", c.name, c.bias, c.residual, c.gated)
                       + f'extern "C" int {sym}(const CoGemmArgs* args, cudaStream_t stream) '
                       f"{{ return k{i}::run(*args, stream); }}\n"
                       f'extern "C" int64_t {sym}{WORKSPACE_SUFFIX}(const CoGemmArgs* args) '
                       f"{{ return k{i}::workspace_size(*args); }}\n")
    info = json.dumps({"kind": "dsl_gemm", "kernels": [c.name for c in configs]})
    sources.append('extern "C" const char* co_library_info() { return ' + json.dumps(info) + "; }\n")
    unit = out_dir / f"{Path(lib_name).stem}_shims.cu"
    unit.write_text("#include <mutex>\n#include \"prelude.h\"\n" + "\n".join(sources))
    lib = out_dir / lib_name
    tmp = lib.with_name(lib.name + ".partial")
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-I", str(out_dir),
                    "-I", str(TEMPLATES), str(unit), *objects, str(runtime_archive()),
                    "-o", str(tmp)], check=True, capture_output=True, text=True)
    tmp.replace(lib)        # never a half-written library under the final name
    return lib
