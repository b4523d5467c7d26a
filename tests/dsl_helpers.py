"""Helpers of the CuTe DSL GEMM's build and GPU tests (emit/dsl_gemm_sm90.py): compile
configurations, export them and link them with their C ABI shims into one shared
library whose ``co_test_run(which, args, stream)`` calls configuration ``which``."""
import shutil
import subprocess
from pathlib import Path

from cutlass_offload.emit import TEMPLATES
from cutlass_offload.emit import dsl_gemm_sm90 as dsl


def shim_library(out: Path, configs) -> Path:
    """configs: (tile, cluster, dtype, activation, bias, residual, post_relu) tuples.
    Returns the library's path. Raises what the DSL raises, FileNotFoundError
    without nvcc, subprocess.CalledProcessError when the link fails."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc")
    sources, objects = [], []
    for i, (tile, cluster, dtype, act, bias, residual, post) in enumerate(configs):
        compiled = dsl.compile_sm90(tile, cluster, dtype, act, bias, residual, post)
        obj, header = dsl.export(compiled, out, f"dsl_k{i}")
        objects.append(str(obj))
        sources.append(f'#include "{header.name}"\n' + dsl.shim(f"k{i}", f"dsl_k{i}", bias, residual))
    calls = "\n".join(f"  if (which == {i}) return k{i}::run(*args, stream);" for i in range(len(configs)))
    unit = out / "shims.cu"
    unit.write_text("#include <mutex>\n#include \"prelude.h\"\n" + "\n".join(sources)
                    + '\nextern "C" int co_test_run(int which, const CoGemmArgs* args, '
                    f"cudaStream_t stream) {{\n{calls}\n  return -1;\n}}\n")
    lib = out / "libdsl_test.so"
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-I", str(out),
                    "-I", str(TEMPLATES), str(unit), *objects, "-o", str(lib)],
                   check=True, capture_output=True, text=True)
    return lib
