"""Cold build benchmark (issue 17): what a first compile costs, ours against
torch.compile, per model, in one run on one machine, every cache fresh.

Steps per model, each in a fresh Python process (in-process caches cannot help;
the model is built there by ``load_model(name, "fp16")``, its construction not
timed), in this order:

* ``ours_cold``: ``co.compile(model, inputs, arch=..., out_dir=...)`` as
  ``cutlass-offload compile`` runs it (model and inputs on the CPU), from capture to
  a loadable output folder, with an empty CUTLASS kernel cache (a fresh
  ``CUTLASS_OFFLOAD_CACHE_DIR``) and fresh Inductor / Triton caches; the report's
  phases (capture, partition, select, build, load = offload into the graph, save)
  and its build table (units compiled of units, critical path, link, each compiled
  unit). On a GPU machine the C++ call path's extension (also in that cache) builds
  beside it, as for a user; the process waits for it after the timing.
* ``ours_load``: ``co.load(folder, device=..., reference=False)`` in a new process
  (issue 17: < 2 s for sd-unet; no reference GraphModule: a deployment runs the
  model alone), and on a GPU the first call after it (``first_call_s``: the
  Inductor glue compiles there, its cache still empty since ``ours_cold`` compiled
  on the CPU); ``import_s``: the process's ``import torch, cutlass_offload``.
* ``ours_warm``: the same model compiled again into a new folder with the filled
  cache: total time, units compiled (must be 0), whether nvcc ran (a unit or the
  link).
* ``ours_changed``: capture, partition, select, one GEMM region's N shrunk by 4
  (compile_time.py's ``_changed``: a new kernel) and the sharded build with that
  cache: seconds and kernels compiled (expect 1).
* ``torch_compile_<mode>`` for each of ``--tc-modes`` (default ``default``):
  fresh ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` (set before torch is
  imported), model and inputs moved to the GPU (not timed), then
  ``torch.compile(model, mode=...)`` + the first call, synchronized. Without a CUDA
  GPU these are recorded as skipped.

    python benchmarks/cold_build.py [MODEL ...] [--arch sm_90a] [--jobs N]
        [--tc-modes default,reduce-overhead] [--no-torch-compile] [--json FILE]
        [--resume] [--budget-s S] [--work DIR] [--keep-work]

The JSON (``--json``, default ./cold_build.json) holds ``machine`` (cores, nvcc,
torch, GPU, date), ``arch``, ``tc_modes`` and per model ``steps``: {step: its
record, or {"error": ...} / {"skipped": ...}}, each run one with ``process_s`` (the
child process's wall time as the parent saw it) and ``finished`` (when). The JSON
is written after every step;
``--resume`` keeps the steps it holds (failed and skipped ones run again);
``--budget-s S`` starts no step after S seconds and exits 3 (run again with
``--resume``). Caches and folders live under ``--work`` (default: the JSON's path +
``.work``) so a resumed run finds the cold step's cache; a model's are removed once
its steps are done unless ``--keep-work``. MODEL: a built-in name or
package.module:factory (default: mlp).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

T_START = time.perf_counter()        # before torch: a child's import time counts from here

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))                  # compile_time (_changed)
sys.path.insert(0, str(HERE.parents[1] / "src"))

from _budget import Budget, OutOfBudget, finish  # noqa: E402

OURS = ("ours_cold", "ours_load", "ours_warm", "ours_changed")
NEEDS_CACHE = ("ours_load", "ours_warm", "ours_changed")     # what ours_cold leaves behind
LOAD_TARGET_S = 2.0                  # issue 17: loading sd-unet's folder
LOAD_TARGET_MODELS = ("sd-unet",)


# ---------------------------------------------------------------- child side

def _error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def build_summary(build: dict) -> dict:
    """The build table of a report's ``build`` (BuildResult.to_dict()) in numbers:
    units compiled of units, kernels compiled, critical path, link, and whether nvcc
    ran at all (a unit compiled by it, or the link; the launchers' unit compiles
    with the host compiler)."""
    units = build.get("units", [])
    compiled = [u for u in units if not u["cache_hit"]]
    nvcc_units = [u for u in compiled if "host compiler" not in (u.get("executor") or "")]
    return {"seconds": build.get("seconds", 0.0), "jobs": build.get("jobs"),
            "units": len(units), "units_compiled": len(compiled),
            "kernel_units_compiled": sum(1 for u in compiled if u["kernels"]),
            "kernels_compiled": sum(len(u["kernels"]) for u in compiled),
            "critical_path_s": build.get("critical_path_seconds", 0.0),
            "link_s": build.get("link_seconds", 0.0),
            "nvcc_ran": bool(nvcc_units) or bool(build.get("link_seconds")),
            "failures": len(build.get("failures", [])),
            "compiled": [{"name": u["name"], "kernels": len(u["kernels"]), "seconds": u["seconds"],
                          "peak_rss_mb": u.get("peak_rss_mb", 0.0), "executor": u.get("executor", "")}
                         for u in sorted(compiled, key=lambda u: -u["seconds"])]}


def _wait_fast_call() -> float:
    """Wait for the C++ call path's background build (started by compile / load on a
    GPU machine) so it does not run on into the next step; its extra seconds."""
    from cutlass_offload.runtime import fast_call
    t0 = time.perf_counter()
    fast_call.wait()
    return time.perf_counter() - t0


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def child_ours_compile(name: str, arch: str, out: Path) -> dict:
    import cutlass_offload as co
    from cutlass_offload.models import load_model
    import_s = time.perf_counter() - T_START
    model, inputs = load_model(name, "fp16")
    t0 = time.perf_counter()
    compiled = co.compile(model, inputs, arch=arch, out_dir=str(out))
    seconds = time.perf_counter() - t0
    rep = compiled.report
    print(rep, flush=True)
    return {"seconds": seconds, "phases": dict(rep.phases), "regions": len(rep.regions),
            "kernels": len(rep.kernels), "fallbacks": len(rep.fallbacks),
            "build": build_summary(rep.build) if rep.build else None,
            "out_bytes": _folder_bytes(out), "import_s": import_s,
            "fast_call_wait_s": _wait_fast_call()}


def child_ours_load(out: Path) -> dict:
    import torch

    import cutlass_offload as co
    import_s = time.perf_counter() - T_START
    device = "cuda" if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    compiled, _, inputs = co.load(str(out), device=device, reference=False)   # a deployment's load
    res = {"seconds": time.perf_counter() - t0, "device": device or "cpu (as exported)",
           "import_s": import_s, "glue": compiled.glue,
           "phases": getattr(compiled, "load_phases", {})}
    if device == "cuda":         # no region runs without a GPU
        with torch.no_grad():
            t0 = time.perf_counter()
            compiled(*inputs)
            torch.cuda.synchronize()
        res["first_call_s"] = time.perf_counter() - t0
    res["fast_call_wait_s"] = _wait_fast_call()
    return res


def child_ours_changed(name: str, arch: str) -> dict:
    from compile_time import _changed

    from cutlass_offload.api import resolve_arch
    from cutlass_offload.build import build
    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions, options_for_glue
    from cutlass_offload.models import load_model
    from cutlass_offload.partition import partition
    from cutlass_offload.runtime.glue import GlueSpec
    from cutlass_offload.select import select
    model, inputs = load_model(name, "fp16")
    t0 = time.perf_counter()
    # the options co.compile would use (glue "auto" decides which norms are regions)
    options = options_for_glue(CompileOptions(arch=resolve_arch(arch)), GlueSpec("auto", None, None).resolved())
    plan = _changed(select(partition(capture(model, inputs).graph_module, options), options.arch, options))
    t1 = time.perf_counter()
    res = build(plan, "sharded")
    end = time.perf_counter()
    return {"seconds": end - t0, "build_s": end - t1, "build": build_summary(res.to_dict())}


def child_torch_compile(name: str, mode: str) -> dict:
    import torch

    from cutlass_offload.models import load_model
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA GPU on this machine"}
    model, inputs = load_model(name, "fp16")
    model = model.cuda()
    inputs = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs)
    torch.cuda.synchronize()
    with torch.no_grad():
        t0 = time.perf_counter()
        fn = torch.compile(model, mode=None if mode == "default" else mode)
        fn(*inputs)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(2):          # reduce-overhead records its CUDA graph on a later call
            fn(*inputs)
        torch.cuda.synchronize()
    return {"seconds": first, "mode": mode, "next_two_calls_s": time.perf_counter() - t0}


def paths(work: Path) -> dict:
    """One model's folders under the work dir."""
    return {"cache": work / "cache", "inductor": work / "inductor", "triton": work / "triton",
            "out_cold": work / "out_cold", "out_warm": work / "out_warm"}


def child_main(a) -> int:
    """``--_one STEP``: run one step here, write its record to ``--result``."""
    p = paths(Path(a.work))
    try:
        if a._one == "ours_cold":
            res = child_ours_compile(a.model, a.arch, p["out_cold"])
        elif a._one == "ours_warm":
            res = child_ours_compile(a.model, a.arch, p["out_warm"])
        elif a._one == "ours_load":
            res = child_ours_load(p["out_cold"])
        elif a._one == "ours_changed":
            res = child_ours_changed(a.model, a.arch)
        else:
            res = child_torch_compile(a.model, a._one.removeprefix("torch_compile_"))
        rc = 0
    except Exception as e:  # noqa: BLE001 - recorded by the parent
        traceback.print_exc()
        res, rc = {"error": _error(e)}, 1
    Path(a.result).write_text(json.dumps(res, default=str))
    return rc


# ---------------------------------------------------------------- parent side

def step_env(step: str, work: Path, jobs: int | None) -> dict:
    """The environment of a step's process: fresh caches under the model's work dir
    (ours: one CUTLASS / Inductor / Triton cache the four ours steps share; each
    torch.compile mode its own, made fresh)."""
    if step.startswith("torch_compile_"):
        d = work / step
        return {"TORCHINDUCTOR_CACHE_DIR": str(d / "inductor"), "TRITON_CACHE_DIR": str(d / "triton")}
    p = paths(work)
    env = {"CUTLASS_OFFLOAD_CACHE_DIR": str(p["cache"]), "TORCHINDUCTOR_CACHE_DIR": str(p["inductor"]),
           "TRITON_CACHE_DIR": str(p["triton"])}
    if jobs:
        env["CUTLASS_OFFLOAD_JOBS"] = str(jobs)
    return env


def prepare(step: str, work: Path) -> None:
    """Make a step's caches fresh: ours_cold starts the model's shared caches and
    folders over; a torch.compile step its own."""
    if step == "ours_cold":
        for d in paths(work).values():
            shutil.rmtree(d, ignore_errors=True)
    elif step.startswith("torch_compile_"):
        shutil.rmtree(work / step, ignore_errors=True)
    elif step == "ours_warm":
        shutil.rmtree(paths(work)["out_warm"], ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)


def run_child(step: str, name: str, arch: str, work: Path, jobs: int | None) -> dict:
    """One step in a fresh ``python cold_build.py --_one STEP`` process."""
    prepare(step, work)
    result = work / f".{step}.result.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(HERE), "--_one", step, name, "--arch", arch,
           "--work", str(work), "--result", str(result)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, **step_env(step, work, jobs)}, check=False)
    wall = time.perf_counter() - t0
    try:
        res = json.loads(result.read_text())
    except (OSError, json.JSONDecodeError):
        res = {"error": f"the step's process exited {proc.returncode} without a result"}
    res["process_s"] = wall
    return res


def done(rec) -> bool:
    """A step record ``--resume`` keeps: measured, not failed or skipped."""
    return isinstance(rec, dict) and "error" not in rec and "skipped" not in rec


def model_steps(tc_modes) -> list:
    return list(OURS) + [f"torch_compile_{m}" for m in tc_modes]


def bench_model(name, steps, res, work: Path, runner, save, budget, tc_skip=None, keep_work=False):
    """Run ``steps`` of one model that ``res["steps"]`` does not hold yet, ``save()``
    after each. ``runner(step, work) -> record`` runs one (a fresh process; tests
    pass a fake). ``tc_skip``: why the torch.compile steps do not run (recorded as
    skipped), or None. Raises OutOfBudget before a step once ``budget`` is spent."""
    recs = res.setdefault("steps", {})
    missing = [s for s in steps if not done(recs.get(s))]
    # a resumed run whose cold cache is gone (another machine, --work removed) must
    # fill it again before the steps that read it
    if any(s in NEEDS_CACHE for s in missing) and done(recs.get("ours_cold")) \
            and not all(paths(work)[k].is_dir() for k in ("cache", "out_cold")):
        recs.pop("ours_cold")
        res.setdefault("notes", []).append("ours_cold ran again: its cache and folder were gone")
        missing.insert(0, "ours_cold")
    for step in steps:
        if step not in missing:
            continue
        if step.startswith("torch_compile_") and tc_skip:
            recs[step] = {"skipped": tc_skip}
            save()
            continue
        if step in NEEDS_CACHE and not done(recs.get("ours_cold")):
            recs[step] = {"error": "not run: ours_cold failed"}
            save()
            continue
        if budget.exhausted():
            raise OutOfBudget(f"{name}: {step}")
        budget.started = True
        print(f"{name}: {step} ...", flush=True)
        r = recs[step] = {**runner(step, work), "finished": _now()}
        print(f"{name}: {step} " + (f"FAILED: {r['error']}" if "error" in r else
                                    r.get("skipped") or f"{r.get('seconds', 0):.1f} s"), flush=True)
        save()
    if not keep_work and all(done(recs.get(s)) for s in steps if s in OURS):
        shutil.rmtree(work, ignore_errors=True)
    return res


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def machine_info() -> dict:
    import torch
    info = {"cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
            "torch": torch.__version__, "python": sys.version.split()[0],
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "date": _now()}
    try:
        from cutlass_offload.build.toolchain import find_nvcc, nvcc_version
        info["nvcc"] = nvcc_version(find_nvcc())
    except Exception as e:  # noqa: BLE001 - recorded, the table says so
        info["nvcc"] = f"unknown ({_error(e)})"
    return info


# ---------------------------------------------------------------- the table

def _s(rec, key="seconds", fmt="{:.1f}"):
    """A record's number, or why there is none."""
    if not isinstance(rec, dict):
        return "-"
    if "error" in rec:
        return "FAILED"
    if "skipped" in rec:
        return "skipped"
    v = rec.get(key)
    return fmt.format(v) if isinstance(v, (int, float)) else "-"


def row_cells(m: dict, tc_modes) -> list:
    st = m.get("steps", {})
    cold, load, warm, ch = (st.get(k) for k in OURS)
    b = (cold or {}).get("build") or {}
    phases = ", ".join(f"{p} {s:.1f}" for p, s in (cold or {}).get("phases", {}).items()) if done(cold) else "-"
    units = (f"{b['units_compiled']} of {b['units']} ({b['critical_path_s']:.1f})"
             if done(cold) and b else "-")
    load_txt = _s(load, fmt="{:.2f}")
    if done(load) and "first_call_s" in load:
        load_txt += f" (+{load['first_call_s']:.1f})"
    wb = (warm or {}).get("build") or {}
    warm_txt = _s(warm) + (f" ({wb['units_compiled']}, nvcc {'ran' if wb['nvcc_ran'] else 'no'})"
                           if done(warm) and wb else "")
    cb = (ch or {}).get("build") or {}
    ch_txt = _s(ch) + (f" ({cb['kernels_compiled']})" if done(ch) and cb else "")
    cells = [m["model"], str(cold.get("kernels", "-")) if done(cold) else "-", _s(cold), phases,
             units, load_txt, warm_txt, ch_txt]
    tcs = [st.get(f"torch_compile_{mode}") for mode in tc_modes]
    cells += [_s(t) for t in tcs]
    first = tcs[0] if tcs else None
    cells.append(f"{cold['seconds'] / first['seconds']:.2f}x" if done(cold) and done(first) else "-")
    return cells


def table(result: dict) -> str:
    modes = result.get("tc_modes", [])
    head = ["model", "kernels", "ours cold s", "phases s", "units compiled (crit. path s)",
            "load s (+1st call)", "warm s (units, nvcc)", "1 layer s (kernels)"]
    head += [f"torch.compile {m} s" for m in modes]
    head.append(f"ours cold / tc {modes[0]}" if modes else "ours / tc")
    out = [" | ".join(head), " | ".join("---" for _ in head)]
    out += [" | ".join(row_cells(m, modes)) for m in result.get("models", [])]
    mach = result.get("machine", {})
    out.append(f"machine: {mach.get('cores')} cores, GPU {mach.get('gpu') or 'none'}, torch "
               f"{mach.get('torch')}, nvcc {mach.get('nvcc')}, {mach.get('date')}; target "
               f"{result.get('arch')}")
    if result.get("torch_compile_note"):
        out.append(f"torch.compile: {result['torch_compile_note']}")
    for m in result.get("models", []):
        load = m.get("steps", {}).get("ours_load")
        if m["model"] in LOAD_TARGET_MODELS and done(load):
            ok = load["seconds"] < LOAD_TARGET_S
            out.append(f"{m['model']}: load {load['seconds']:.2f} s, issue 17's target < "
                       f"{LOAD_TARGET_S:g} s: {'met' if ok else 'MISS'}")
        warm = (m.get("steps", {}).get("ours_warm") or {}).get("build")
        if warm and (warm["units_compiled"] or warm["nvcc_ran"]):
            out.append(f"{m['model']}: the warm compile compiled {warm['units_compiled']} units "
                       f"(nvcc ran: {warm['nvcc_ran']}): expected none")
        for note in m.get("notes", []):
            out.append(f"{m['model']}: {note}")
    return "\n".join(out)


# ---------------------------------------------------------------- main

def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, path)


def load_partial(path: Path, arch: str) -> dict | None:
    """An earlier run's JSON to resume, or None (none, unreadable). Raises
    SystemExit when it was measured for another target."""
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if old.get("arch") not in (None, arch):
        raise SystemExit(f"cold_build: {path} holds target {old['arch']}, not {arch}: "
                         "use another --json or the same --arch")
    return old


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["mlp"])
    p.add_argument("--arch", default=None, help="sm_90a or sm_80 (default: the visible GPU's)")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (CUTLASS_OFFLOAD_JOBS)")
    p.add_argument("--tc-modes", default="default",
                   help="torch.compile modes, comma-separated (e.g. default,reduce-overhead)")
    p.add_argument("--no-torch-compile", action="store_true", help="skip the torch.compile steps")
    p.add_argument("--json", default="cold_build.json")
    p.add_argument("--resume", action="store_true", help="keep the steps the JSON already holds")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no step after this many seconds (exit 3; continue with --resume)")
    p.add_argument("--work", default=None, help="caches and folders (default: JSON path + .work)")
    p.add_argument("--keep-work", action="store_true", help="keep each model's caches and folders")
    # internal: one step in this (fresh) process
    p.add_argument("--_one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.tc_modes = [m.strip() for m in a.tc_modes.split(",") if m.strip()]
    return a


def main(argv=None, runner=None) -> int:
    a = parse_args(argv)
    if a._one:
        a.model = a.models[0]
        return child_main(a)
    import torch

    from cutlass_offload.api import resolve_arch
    from cutlass_offload.report import arch_name
    try:
        arch = arch_name(resolve_arch(a.arch))
    except Exception as e:  # noqa: BLE001 - no GPU and no --arch, or a bad name
        print(f"cold_build: {e}", file=sys.stderr)
        return 2
    gpu = torch.cuda.is_available()
    path = Path(a.json)
    work_root = Path(a.work) if a.work else path.with_name(path.name + ".work")
    old = load_partial(path, arch) if a.resume else None
    result = {"machine": machine_info(), "arch": arch, "tc_modes": a.tc_modes,
              "jobs": a.jobs, "models": []}
    same = ("cores", "gpu", "nvcc", "torch")
    if old and old.get("machine") and any(old["machine"].get(k) != result["machine"][k] for k in same):
        result["note"] = f"resumed on another machine; earlier steps ran on {old['machine']}"
    tc_skip = ("not run (--no-torch-compile)" if a.no_torch_compile
               else None if gpu else "skipped: no CUDA GPU on this machine")
    if tc_skip:
        result["torch_compile_note"] = tc_skip
    earlier = {m["model"]: m for m in (old or {}).get("models", [])}
    # the models this run does not name stay in the JSON as they were
    result["models"] = [m for n, m in earlier.items() if n not in a.models]
    steps = model_steps(a.tc_modes)
    runner = runner or (lambda name: lambda step, work: run_child(step, name, arch, work, a.jobs))
    budget, incomplete = Budget(a.budget_s), None
    for name in a.models:
        res = earlier.get(name) or {"model": name}
        result["models"].append(res)
        try:
            bench_model(name, steps, res, work_root / name, runner(name),
                        lambda: write_json(path, result), budget, tc_skip, a.keep_work)
        except OutOfBudget as e:
            incomplete = str(e)
            break
    if work_root.is_dir() and not any(work_root.iterdir()):
        work_root.rmdir()           # every model's work was removed: leave no empty folder
    return finish(result, incomplete, lambda: write_json(path, result), table(result), path, a.budget_s)


if __name__ == "__main__":
    sys.exit(main())
