"""Seconds per kernel: CuTe DSL (nvidia-cutlass-dsl) against nvcc, no GPU needed
(issue 21: "can it compile for sm_90a on a machine without one?").

For each (tile M x N, cluster) config, on this machine:

* DSL: NVIDIA's Hopper persistent dense GEMM example
  (``examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/dense_gemm_persistent.py``
  of a CUTLASS checkout, passed as ``--example``: read, never copied here) compiled
  with ``cute.compile`` for ``CUTE_DSL_ARCH=sm_90a`` on fake tensors (M, N, K and
  the batch dynamic, the contiguous dims divisible by 8, as our kernels take them),
  then exported ahead of time (``export_to_c``: an object file and a C header that
  link into a shared library). fp16 in, fp32 accumulate, fp16 out, no epilogue.
  Each config compiles in a fresh process (``--fresh``, the default), so the time
  includes the DSL's start-up as a build would pay it, or all in one process.
* nvcc: our emitter's kernel of the same tile, cluster and dtypes (emit/gemm_sm90.py,
  plain epilogue; the cooperative schedule, where the DSL example uses one consumer
  warp group below N 256 and two at 256: the same tile work, not the same code)
  built alone with the ordinary build (its unit's seconds; a fresh cache, so nvcc
  runs; ``CUTLASS_OFFLOAD_JOBS=1``).

Prints a table, writes JSON (``--json``, default $OUT/dsl_compile_time.json or
benchmarks/results/dsl_compile_time.json). Exit 2 when the DSL is not installed
(``pip install 'cutlass_offload[dsl]'``).

    python benchmarks/dsl_compile_time.py --example PATH [--configs 128x128:1x1,128x256:2x1]
        [--no-nvcc] [--no-fresh]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIGS = "128x128:1x1,128x256:2x1,64x128:1x1"

# One config's DSL compile and export, run by ``python -c`` in a fresh process (or
# in this one): prints one JSON line.
_DSL_JOB = r"""
import importlib.util, json, os, sys, time
t0 = time.perf_counter()
import cutlass, cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import make_fake_compact_tensor
spec = importlib.util.spec_from_file_location("dense_gemm_persistent", sys.argv[1])
ex = importlib.util.module_from_spec(spec); spec.loader.exec_module(ex)
t_import = time.perf_counter() - t0
tm, tn, cm, cn, out = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]

def fake():     # (rows, cols, batch), cols contiguous and a multiple of 8
    return make_fake_compact_tensor(cutlass.Float16, (cute.SymInt(), cute.SymInt(divisibility=8),
                                    cute.SymInt()), stride_order=(1, 0, 2))
t1 = time.perf_counter()
gemm = ex.HopperWgmmaGemmPersistentKernel(cutlass.Float32, (tm, tn), (cm, cn), 1, True)
kernel = cute.compile(gemm, fake(), fake(), fake(), 132 // (cm * cn), cuda.CUstream(0))
t2 = time.perf_counter()
name = f"dsl_gemm_{tm}x{tn}_c{cm}x{cn}"
kernel.export_to_c(file_path=out, file_name=name, function_prefix=name)
t3 = time.perf_counter()
obj = os.path.join(out, name + ".o")
print(json.dumps({"import_s": t_import, "compile_s": t2 - t1, "export_s": t3 - t2,
                  "object_bytes": os.path.getsize(obj), "object": obj}))
"""


def dsl_time(example: Path, tile, cluster, out: Path, fresh: bool) -> dict:
    """The DSL's seconds for one config (see the module docstring)."""
    args = [str(example), *map(str, tile), *map(str, cluster), str(out)]
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a"}
    t0 = time.perf_counter()
    if fresh:
        p = subprocess.run([sys.executable, "-c", _DSL_JOB, *args], capture_output=True,
                           text=True, env=env)
        if p.returncode:
            return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:]}
        rec = json.loads(p.stdout.strip().splitlines()[-1])
    else:
        import contextlib
        import io
        os.environ["CUTE_DSL_ARCH"] = "sm_90a"
        buf, argv = io.StringIO(), sys.argv
        try:
            sys.argv = ["dsl_job", *args]
            with contextlib.redirect_stdout(buf):
                exec(compile(_DSL_JOB, "dsl_job", "exec"), {"__name__": "dsl_job"})
        finally:
            sys.argv = argv
        rec = json.loads(buf.getvalue().strip().splitlines()[-1])
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def nvcc_time(tile, cluster) -> dict:
    """Our emitter's kernel of the same tile and cluster, built alone in a fresh cache:
    its unit's seconds."""
    from dataclasses import replace

    from cutlass_offload import build
    from cutlass_offload.ir import GemmProblem, GemmRegion, Plan
    from cutlass_offload.select import choose_kernel, sm90
    config = sm90._config((*tile, 64), (*cluster, 1), sm90.COOP if tile[0] >= 128 else sm90.PINGPONG)
    p = GemmProblem(n=4096, k=4096, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                    m=4096, m_hint=4096)
    kernel = replace(choose_kernel(p, "sm90a", 132), config=config)
    plan = Plan("sm90a", (GemmRegion(name="g0", form="linear", nodes=("g0",), a="a", b="b",
                                     problem=p),), (kernel,), ())
    with tempfile.TemporaryDirectory(prefix="co_dsl_nvcc_") as cache:
        old = {k: os.environ.get(k) for k in ("CUTLASS_OFFLOAD_CACHE_DIR", "CUTLASS_OFFLOAD_JOBS")}
        os.environ.update(CUTLASS_OFFLOAD_CACHE_DIR=cache, CUTLASS_OFFLOAD_JOBS="1")
        try:
            t0 = time.perf_counter()
            res = build.build(plan, "sharded")
            wall = time.perf_counter() - t0
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    units = [u for u in res.units if u.name != "launchers"]
    return {"kernel": kernel.name, "schedule": config.kernel_schedule, "wall_s": wall,
            "unit_s": sum(u.seconds for u in units), "failures": [str(f) for f in res.failures]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", required=True, type=Path,
                    help="dense_gemm_persistent.py of a CUTLASS checkout (examples/python/CuTeDSL/"
                         "cute/hopper/kernel/dense_gemm/)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="TMxTN:CMxCN,... (default %(default)s)")
    ap.add_argument("--no-nvcc", dest="nvcc", action="store_false", help="time the DSL only")
    ap.add_argument("--fresh", action=argparse.BooleanOptionalAction, default=True,
                    help="each DSL compile in a fresh process (default)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        from importlib.metadata import version
        dsl_version = version("nvidia-cutlass-dsl")
    except Exception:  # noqa: BLE001 - not installed
        print("the CuTe DSL is not installed: pip install 'cutlass_offload[dsl]'", file=sys.stderr)
        return 2
    configs = []
    for item in a.configs.split(","):
        t, c = item.split(":")
        configs.append((tuple(int(v) for v in t.split("x")), tuple(int(v) for v in c.split("x"))))
    out_path = Path(a.json or (Path(os.environ["OUT"]) / "dsl_compile_time.json" if os.environ.get("OUT")
                               else HERE / "results" / "dsl_compile_time.json"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="co_dsl_") as tmp:
        for tile, cluster in configs:
            row = {"tile": list(tile), "cluster": list(cluster),
                   "dsl": dsl_time(a.example, tile, cluster, Path(tmp), a.fresh)}
            if a.nvcc:
                row["nvcc"] = nvcc_time(tile, cluster)
            rows.append(row)
            d, n = row["dsl"], row.get("nvcc", {})
            print(f"{tile[0]}x{tile[1]} c{cluster[0]}x{cluster[1]}: DSL compile {d.get('compile_s', float('nan')):.2f} s "
                  f"+ export {d.get('export_s', float('nan')):.2f} s (process {d.get('wall_s', 0):.1f} s)"
                  + (f"; nvcc unit {n['unit_s']:.1f} s" if n else ""), flush=True)
    print("\n| tile | cluster | DSL compile + export s | DSL process s | nvcc unit s | nvcc / DSL process |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        d, n = r["dsl"], r.get("nvcc")
        ce = d.get("compile_s", float("nan")) + d.get("export_s", float("nan"))
        ratio = f"{n['unit_s'] / d['wall_s']:.0f}x" if n and d.get("wall_s") else "-"
        print(f"| {r['tile'][0]}x{r['tile'][1]} | {r['cluster'][0]}x{r['cluster'][1]} | {ce:.2f} | "
              f"{d.get('wall_s', float('nan')):.1f} | {n['unit_s']:.1f} | {ratio} |" if n else
              f"| {r['tile'][0]}x{r['tile'][1]} | {r['cluster'][0]}x{r['cluster'][1]} | {ce:.2f} | "
              f"{d.get('wall_s', float('nan')):.1f} | - | - |")
    result = {"date": datetime.datetime.now().isoformat(), "host": platform.node(),
              "cpus": os.cpu_count(), "nvidia_cutlass_dsl": dsl_version, "example": str(a.example),
              "fresh_process": a.fresh, "rows": rows}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(f"\nJSON: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
