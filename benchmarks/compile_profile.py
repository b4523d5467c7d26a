"""Where one sm90a GEMM kernel unit's nvcc time goes, per epilogue form.

Emits a one-kernel unit (the kernel the build would emit for the given tile,
cluster, schedule, dtype and epilogue; ``--forms tma,staged,staged_tma``: CUTLASS's
TMA epilogue or the staged one of emit/staged.py with row stores or with TMA stores,
STORE = "tma"), compiles it with the build's own
``nvcc -c`` command (build/toolchain.compile_command), and prints:

* the wall time of each compile;
* nvcc's phases (``nvcc --time``: cudafe++, cicc, ptxas, the host compiler), ms;
* with ``--trace``: cicc's front-end template instantiations
  (``nvcc -fdevice-time-trace``, a second compile: tracing slows every phase, ptxas
  most), inclusive seconds by nesting depth, e.g.
  ``GemmUniversal::operator() > CollectiveEpilogue::store``.

Needs nvcc and the CUTLASS headers, no GPU. Writes JSON (``--json``).

    python benchmarks/compile_profile.py [--epilogue bias_gelu] [--tile 128x128x64]
        [--cluster 1x1x1] [--schedule pingpong|coop] [--dtype f16|bf16]
        [--forms tma,staged] [--trace] [--json compile_profile.json]

Session 38's runs on the 2-core machine (128x128x64 ping-pong;
``benchmarks/results/compile_profile_tma_vs_staged_epilogue_2core_2026-12-05_s38.txt``):
``--epilogue bias_gelu`` 26.1 s with the TMA epilogue (cicc 15.6 s) against 15.9 s
staged (cicc 6.6 s); traced, the TMA epilogue's ``CollectiveEpilogue::store`` is 8.0 of
the device kernel's 15.0 s of instantiation (plain epilogue).
"""
from __future__ import annotations

import argparse
import collections
import csv
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

EPILOGUES = {
    "plain": {},
    "bias": {"bias": True},
    "bias_relu": {"bias": True, "activation": "relu"},
    "bias_gelu": {"bias": True, "activation": "gelu_erf"},
    "bias_resadd": {"bias": True, "residual": "add"},
    "resadd": {"residual": "add"},
    "silu_resmul": {"activation": "silu", "residual": "mul"},
}


def phases(time_csv: str) -> dict:
    """{phase name: ms} from ``nvcc --time``'s CSV (columns: source file, phase
    name, input, output, arch, tool, metric, unit); repeated phases add up."""
    out: dict = collections.defaultdict(float)
    rows = list(csv.reader(io.StringIO(time_csv)))
    for row in rows[1:]:
        row = [c.strip() for c in row]
        if len(row) >= 8 and row[-1] == "ms":
            out[row[1]] += float(row[-2])
    return dict(out)


def _template_name(event: dict) -> str:
    """An instantiation event's template, without its arguments."""
    detail = event.get("args", {}).get("detail", "?")
    return re.match(r"[^<\[]*", detail).group(0).strip() or detail[:80]


def instantiation_tree(events: list, max_depth: int = 2, top: int = 10) -> dict:
    """{depth: [(path, seconds), ...]}: the inclusive time of cicc's template
    instantiation events (``-fdevice-time-trace``'s complete events whose name
    starts with "Instantiating") at each nesting depth up to ``max_depth``, by path
    of template names below the outermost, largest first, ``top`` per depth.
    Events nest when one lies within the other's [ts, ts + dur) (one thread)."""
    inst = sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("Instantiating")),
                  key=lambda e: (e["ts"], -e["dur"]))
    sums: dict = collections.defaultdict(collections.Counter)
    stack: list = []
    for e in inst:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        if len(stack) <= max_depth:
            path = [_template_name(s) for s in stack[1:]] + [_template_name(e)]
            sums[len(stack)][" > ".join(path)] += e["dur"] / 1e6
        stack.append(e)
    return {d: sums[d].most_common(top) for d in sorted(sums)}


# CUTLASS's TMA epilogue; the staged one with row stores; the staged one with TMA stores
FORMS = ("tma", "staged", "staged_tma")


def emit_unit(form: str, args, work: Path) -> Path:
    """The one-kernel unit's source, written under ``work``."""
    from cutlass_offload import emit
    from cutlass_offload.emit import staged
    from cutlass_offload.ir import GemmEpilogue, GemmKernel
    from cutlass_offload.select import sm90
    tile = tuple(int(x) for x in args.tile.split("x"))
    cluster = tuple(int(x) for x in args.cluster.split("x"))
    sched = {"pingpong": sm90.PINGPONG, "coop": sm90.COOP}[args.schedule]
    ep = GemmEpilogue(**EPILOGUES[args.epilogue])
    if form not in FORMS:
        raise SystemExit(f"--forms: {form!r}: one of {', '.join(FORMS)}")
    default = staged.ENABLED, staged.STORE
    staged.ENABLED = form != "tma"
    staged.STORE = "tma" if form == "staged_tma" else "rows"
    try:
        kernel = GemmKernel(arch="sm90a", dtype=args.dtype, layout_b="col", align_a=8, align_b=8, align_c=8,
                            epilogue=ep, config=sm90._config(tile, cluster, sched))
        text = emit.emit_unit([emit.emit_kernel(kernel)], f"compile_profile {form}").text
    finally:
        staged.ENABLED, staged.STORE = default
    src = work / f"{form}.cu"
    src.write_text(text)
    return src


def profile(form: str, args, work: Path) -> dict:
    """One form's compile: wall seconds, nvcc phases, the instantiation tree."""
    from cutlass_offload.build import toolchain
    src = emit_unit(form, args, work)
    times, trace = work / f"{form}.time.csv", work / f"{form}.trace.json"
    cmd = toolchain.compile_command(toolchain.find_nvcc(), "sm90a", str(src), str(work / f"{form}.o"))
    at = cmd.index("-c")

    def run(extra):
        t = time.perf_counter()
        proc = subprocess.run(cmd[:at] + extra + cmd[at:], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"nvcc failed on the {form} unit (source kept: {src}):\n{proc.stderr[-4000:]}")
        return time.perf_counter() - t

    wall = run(["--time", str(times)])
    row = {"form": form, "wall_s": round(wall, 2), "phases_ms": phases(times.read_text())}
    if args.trace:
        # a compile of its own: tracing slows every phase (ptxas most)
        run(["-fdevice-time-trace", str(trace)])
        # nvcc may append ".json" to the name it is given
        path = next(p for p in (trace, Path(str(trace) + ".json")) if p.exists())
        data = json.loads(path.read_text())
        events = data["traceEvents"] if isinstance(data, dict) else data
        row["instantiations_s"] = {str(d): [[p, round(s, 3)] for p, s in v]
                                   for d, v in instantiation_tree(events, args.depth).items()}
        path.unlink()       # hundreds of MB
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epilogue", default="plain", choices=sorted(EPILOGUES),
                   help="the kernel's epilogue (default %(default)s)")
    p.add_argument("--tile", default="128x128x64", help="CTA tile MxNxK (default %(default)s)")
    p.add_argument("--cluster", default="1x1x1", help="cluster shape MxNxK (default %(default)s)")
    p.add_argument("--schedule", default="pingpong", choices=("pingpong", "coop"),
                   help="kernel schedule (default %(default)s)")
    p.add_argument("--dtype", default="f16", choices=("f16", "bf16"), help="default %(default)s")
    p.add_argument("--forms", default="tma,staged",
                   help="epilogue forms to compile, comma-separated, of " + ", ".join(FORMS) +
                        " (staged: the row-store form; staged_tma: the TMA-store form that "
                        "CUTLASS_OFFLOAD_STAGED_EPILOGUE=1 builds; default %(default)s)")
    p.add_argument("--trace", action="store_true", help="also nvcc -fdevice-time-trace")
    p.add_argument("--depth", type=int, default=2,
                   help="nesting depth of the instantiation tree printed with --trace (default %(default)s)")
    p.add_argument("--json", default="compile_profile.json", help="where to write the rows (default %(default)s)")
    a = p.parse_args(argv)
    forms = [f.strip() for f in a.forms.split(",")]
    if not forms or any(f not in FORMS for f in forms):
        p.error(f"--forms: each of {', '.join(FORMS)}")
    for name in ("tile", "cluster"):
        value = getattr(a, name)
        if not re.fullmatch(r"\d+x\d+x\d+", value):
            p.error(f"--{name} {value!r}: three sizes MxNxK, e.g. 128x128x64")
    rows = []
    with tempfile.TemporaryDirectory(prefix="co_compile_profile_") as tmp:
        for form in forms:
            rows.append(profile(form, a, Path(tmp)))
            print(f"{form}: {rows[-1]['wall_s']:.1f} s", flush=True)
    names = list(dict.fromkeys(n for r in rows for n in r["phases_ms"]))
    print("\n| phase (ms) | " + " | ".join(r["form"] for r in rows) + " |")
    print("| --- |" + " --- |" * len(rows))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{r['phases_ms'].get(n, 0):.0f}" for r in rows) + " |")
    for r in rows:
        for depth, items in r.get("instantiations_s", {}).items():
            print(f"\n{r['form']}, instantiations at depth {depth} (inclusive s, traced):")
            for path, s in items:
                print(f"  {s:7.2f}  {path[-160:]}")
    Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
