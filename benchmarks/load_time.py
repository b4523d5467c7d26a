"""Load time of an output folder (issue 17: sd-unet's ``co.load`` under 2 s on the
2-core machine): ``co.load(folder)`` in a fresh Python process per run (nothing of
an earlier load is reused in memory; the files stay in the page cache), its wall
time and ``load_phases``, one JSON line per run, then the median of each.

    python benchmarks/load_time.py FOLDER [--runs 7] [--no-reference] [--src DIR ...]
    python benchmarks/load_time.py FOLDER --compile sd-unet [--arch sm_90a]

--compile MODEL first compiles the built-in MODEL into FOLDER on the CPU (eager glue)
with the unit tests' stand-in nvcc (tests/fault_helpers.fake_env): no kernel is
really built, so neither a GPU nor nvcc is needed, and the folder loads as a real
one does (the library is a small ELF file; the program and weights are the model's).
--src DIR (repeatable) imports cutlass_offload from DIR (a ``src`` folder, e.g. from
``git archive OLD src``) instead of the installed package; runs alternate between
the sources, so a before / after comparison shares the machine's state. A folder
compiled by one version may not load with another whose partition differs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_LOAD = """
import json, sys, time
import cutlass_offload as co
t = time.perf_counter()
compiled, _, _ = co.load(sys.argv[1], reference=sys.argv[2] == "1")
wall = time.perf_counter() - t
print(json.dumps({"wall": wall, **compiled.load_phases}))
"""

_COMPILE = """
import os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[4])
from fault_helpers import fake_env
os.environ.update(fake_env(Path(sys.argv[3])))
import cutlass_offload as co
from cutlass_offload.models import load_model
model, inputs = load_model(sys.argv[1])
co.compile(model, inputs, arch=sys.argv[5], out_dir=sys.argv[2], glue="eager")
"""


def _env(src: str | None) -> dict:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--no-reference", action="store_true", help="co.load(..., reference=False)")
    ap.add_argument("--src", action="append", default=None,
                    help="a src/ folder to import cutlass_offload from (repeatable)")
    ap.add_argument("--compile", metavar="MODEL", help="compile MODEL into FOLDER first (fake nvcc)")
    ap.add_argument("--arch", default="sm_90a")
    a = ap.parse_args(argv)
    sources = a.src or [None]
    if a.compile:
        tool = Path(a.folder).resolve().parent / f".{Path(a.folder).name}.tool"
        subprocess.run([sys.executable, "-c", _COMPILE, a.compile, a.folder, str(tool),
                        str(ROOT / "tests"), a.arch], env=_env(sources[-1]), check=True)
    runs = {s: [] for s in sources}
    for _ in range(a.runs):
        for s in sources:
            out = subprocess.run([sys.executable, "-c", _LOAD, a.folder, "0" if a.no_reference else "1"],
                                 env=_env(s), capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return 1
            rec = json.loads(out.stdout.strip().splitlines()[-1])
            runs[s].append(rec)
            print(json.dumps({"src": s or "installed", **{k: round(v, 3) for k, v in rec.items()}}),
                  flush=True)
    for s, recs in runs.items():
        keys = dict.fromkeys(k for r in recs for k in r)
        med = {k: round(statistics.median(r.get(k, 0.0) for r in recs), 3) for k in keys}
        print(f"median of {len(recs)} ({s or 'installed'}): {json.dumps(med)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
