"""Seconds per kernel: CuTe DSL (nvidia-cutlass-dsl) against nvcc, no GPU needed
(issue 21: "can it compile for sm_90a on a machine without one?").

For each (tile M x N, cluster) config and epilogue, on this machine:

* DSL, ``--source ours`` (the default): our Hopper GEMM with the fused epilogue
  (emit/dsl_gemm_sm90.py) compiled for sm_90a on fake tensors (M, N, K and the
  batch dynamic) and exported ahead of time (``export_to_c``: an object file and a
  C header that link into a shared library). ``--source example --example PATH``:
  NVIDIA's Hopper persistent dense GEMM example
  (``examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/dense_gemm_persistent.py``
  of a CUTLASS checkout: read, never copied here), plain epilogue only. Each
  config compiles in a fresh process (``--fresh``, the default), so the time
  includes the DSL's start-up as a build would pay it.
* nvcc: our C++ emitter's kernel of the same tile, cluster, dtype and epilogue
  (emit/gemm_sm90.py; cooperative for 128-row tiles, ping-pong for 64-row ones,
  where the DSL kernel uses one consumer warp group below N 256 and two at 256:
  the same tile work, not the same code) built alone with the ordinary build
  (its unit's seconds; a fresh cache, so nvcc runs; ``CUTLASS_OFFLOAD_JOBS=1``).

Prints a table, writes JSON (``--json``, default $OUT/dsl_compile_time.json or
benchmarks/results/dsl_compile_time.json). Exit 2 when the DSL is not installed
(``pip install 'cutlass_offload[dsl]'``).

    python benchmarks/dsl_compile_time.py [--configs 128x128:1x1,128x256:2x1]
        [--epilogue bias_gelu_erf] [--source ours|example --example PATH]
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
OURS = HERE.parent / "src" / "cutlass_offload" / "emit" / "dsl_gemm_sm90.py"

# Epilogue names (as ir.GemmEpilogue tags): (activation, bias, residual)
EPILOGUES = {"plain": ("identity", False, "none"), "bias": ("identity", True, "none"),
             "bias_gelu_erf": ("gelu_erf", True, "none"), "bias_resadd": ("identity", True, "add"),
             "silu_resmul": ("silu", False, "mul")}

# One config's DSL compile and export, run by ``python -c`` in a fresh process (or
# in this one): prints one JSON line. argv: source, example path, tm, tn, cm, cn,
# epilogue, out dir, epilogue as JSON, our module's path.
_DSL_JOB = r"""
import importlib.util, json, os, sys, time
source, example, out = sys.argv[1], sys.argv[2], sys.argv[8]
tm, tn, cm, cn = (int(v) for v in sys.argv[3:7])
epilogue = sys.argv[7]
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
t0 = time.perf_counter()
import cutlass, cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import make_fake_compact_tensor
# by path: the package's __init__ imports torch, which a DSL compile job does not need
spec = importlib.util.spec_from_file_location("dsl_gemm_sm90", sys.argv[10])
ours = importlib.util.module_from_spec(spec); spec.loader.exec_module(ours)
if source == "example":
    spec = importlib.util.spec_from_file_location("dense_gemm_persistent", example)
    ex = importlib.util.module_from_spec(spec); spec.loader.exec_module(ex)
t_import = time.perf_counter() - t0
name = f"dsl_gemm_{tm}x{tn}_c{cm}x{cn}_{epilogue}"
t1 = time.perf_counter()
if source == "example":
    def fake():     # (rows, cols, batch), cols contiguous and a multiple of 8
        return make_fake_compact_tensor(cutlass.Float16, (cute.SymInt(), cute.SymInt(divisibility=8),
                                        cute.SymInt()), stride_order=(1, 0, 2))
    gemm = ex.HopperWgmmaGemmPersistentKernel(cutlass.Float32, (tm, tn), (cm, cn), 1, True)
    kernel = cute.compile(gemm, fake(), fake(), fake(), 132 // (cm * cn), cuda.CUstream(0))
else:
    act, bias, residual = json.loads(sys.argv[9])
    kernel = ours.compile_sm90((tm, tn), (cm, cn), "f16", act, bias, residual)
t2 = time.perf_counter()
kernel.export_to_c(file_path=out, file_name=name, function_prefix=name)
t3 = time.perf_counter()
obj = os.path.join(out, name + ".o")
print(json.dumps({"import_s": t_import, "compile_s": t2 - t1, "export_s": t3 - t2,
                  "object_bytes": os.path.getsize(obj), "object": obj}))
"""


def dsl_time(source: str, example, tile, cluster, epilogue: str, out: Path, fresh: bool) -> dict:
    """The DSL's seconds for one config (see the module docstring)."""
    args = [source, str(example or ""), *map(str, tile), *map(str, cluster), epilogue, str(out),
            json.dumps(EPILOGUES[epilogue]), str(OURS)]
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
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


def nvcc_time(tile, cluster, epilogue: str) -> dict:
    """Our C++ emitter's kernel of the same tile, cluster and epilogue, built alone in
    a fresh cache: its unit's seconds."""
    from dataclasses import replace

    from cutlass_offload import build
    from cutlass_offload.ir import GemmEpilogue, GemmProblem, GemmRegion, Plan
    from cutlass_offload.select import choose_kernel, sm90
    act, bias, residual = EPILOGUES[epilogue]
    config = sm90._config((*tile, 64), (*cluster, 1), sm90.COOP if tile[0] >= 128 else sm90.PINGPONG)
    p = GemmProblem(n=4096, k=4096, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                    m=4096, m_hint=4096,
                    epilogue=GemmEpilogue(bias=bias, activation=act, residual=residual))
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
    ap.add_argument("--source", default="ours", choices=["ours", "example"])
    ap.add_argument("--example", type=Path, default=None,
                    help="with --source example: dense_gemm_persistent.py of a CUTLASS checkout "
                         "(examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="TMxTN:CMxCN,... (default %(default)s)")
    ap.add_argument("--epilogues", default="plain",
                    help=f"comma-separated, of {', '.join(EPILOGUES)} (the example: plain only)")
    ap.add_argument("--no-nvcc", dest="nvcc", action="store_false", help="time the DSL only")
    ap.add_argument("--fresh", action=argparse.BooleanOptionalAction, default=True,
                    help="each DSL compile in a fresh process (default)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.source == "example" and (a.example is None or a.epilogues != "plain"):
        ap.error("--source example needs --example PATH and takes the plain epilogue only")
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
        for (tile, cluster) in configs:
            for ep in a.epilogues.split(","):
                row = {"tile": list(tile), "cluster": list(cluster), "epilogue": ep, "source": a.source,
                       "dsl": dsl_time(a.source, a.example, tile, cluster, ep, Path(tmp), a.fresh)}
                if a.nvcc:
                    row["nvcc"] = nvcc_time(tile, cluster, ep)
                rows.append(row)
                d, n = row["dsl"], row.get("nvcc", {})
                print(f"{tile[0]}x{tile[1]} c{cluster[0]}x{cluster[1]} {ep}: DSL compile "
                      f"{d.get('compile_s', float('nan')):.2f} s + export {d.get('export_s', float('nan')):.2f} s "
                      f"(process {d.get('wall_s', 0):.1f} s)" + (f"; nvcc unit {n['unit_s']:.1f} s" if n else "")
                      + (f"; DSL error {d['error']}" if "error" in d else ""), flush=True)
    print("\n| tile | cluster | epilogue | DSL compile + export s | DSL process s | nvcc unit s | nvcc / DSL process |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        d, n = r["dsl"], r.get("nvcc")
        ce = d.get("compile_s", float("nan")) + d.get("export_s", float("nan"))
        ratio = f"{n['unit_s'] / d['wall_s']:.0f}x" if n and d.get("wall_s") and "error" not in d else "-"
        print(f"| {r['tile'][0]}x{r['tile'][1]} | {r['cluster'][0]}x{r['cluster'][1]} | {r['epilogue']} | "
              f"{ce:.2f} | {d.get('wall_s', float('nan')):.1f} | "
              f"{n['unit_s']:.1f} | {ratio} |" if n else
              f"| {r['tile'][0]}x{r['tile'][1]} | {r['cluster'][0]}x{r['cluster'][1]} | {r['epilogue']} | "
              f"{ce:.2f} | {d.get('wall_s', float('nan')):.1f} | - | - |")
    result = {"date": datetime.datetime.now().isoformat(), "host": platform.node(),
              "cpus": os.cpu_count(), "nvidia_cutlass_dsl": dsl_version, "source": a.source,
              "example": str(a.example) if a.example else None, "fresh_process": a.fresh, "rows": rows}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(f"\nJSON: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
