"""What CUTLASS's umbrella headers cost a GEMM unit, and that leaving them out changes no
device code (issue 17: cold builds).

Until session 40 every sm90a GEMM unit included ``cutlass/gemm/collective/
collective_builder.hpp`` (every collective and builder, sm70 to sm120),
``cutlass/gemm/kernel/gemm_universal.hpp`` (every GEMM kernel) and
``cutlass/gemm/device/gemm_universal_adapter.h`` (those, plus the 2.x device layer).
emit/gemm_sm90.py now includes CUTLASS's sm90 pieces one by one and launches through
templates/sm90_kernel_adapter.h. For each epilogue form (``--forms``: CUTLASS's TMA
epilogue; the staged one with TMA stores) this compiles, one after another on this
machine, with nvcc's per-step times (``nvcc --time``):

* ``headers``: a unit of the family's includes alone, ``umbrella`` (the old set) and
  ``family`` (emit/gemm_sm90.includes of the kernel);
* ``unit``: the one-kernel unit as the build emits it (``family``) and the same text
  with the old includes and CUTLASS's adapter put back (``umbrella``).

The two units' PTX (kept by ``nvcc --keep``) must be the same once the names nvcc
derives from the file's hash (internal linkage) are normalized; the script exits 1 if
not. Prints a table, writes JSON (``--json``). Needs nvcc and the nvidia-cutlass
wheel, no GPU.

    python benchmarks/unit_headers.py [--forms tma,staged_tma] [--epilogue bias_gelu]
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "src"))
sys.path.insert(0, str(HERE))

import compile_profile  # noqa: E402  (its one-kernel unit and nvcc phase reader)

# What every sm90a GEMM unit included until session 40 (emit/gemm_sm90.py INCLUDES then)
UMBRELLA = (
    "cute/tensor.hpp", "cutlass/cutlass.h", "cutlass/numeric_types.h", "cutlass/kernel_hardware_info.h",
    "cutlass/epilogue/thread/activation.h", "cutlass/epilogue/fusion/operations.hpp",
    "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp", "cutlass/gemm/dispatch_policy.hpp",
    "cutlass/gemm/collective/collective_builder.hpp", "cutlass/epilogue/collective/collective_builder.hpp",
    "cutlass/gemm/kernel/gemm_universal.hpp", "cutlass/gemm/device/gemm_universal_adapter.h",
)
ADAPTER = ("co_sm90::KernelAdapter<GemmKernel>", "cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>")


def _includes(text: str) -> list:
    return re.findall(r"^#include <([^>]+)>$", text, re.M)


def umbrella_includes(family: tuple) -> tuple:
    """UMBRELLA, then what ``family`` (a unit's includes) adds beyond the GEMM family's
    own headers (the staged or GLU epilogue's, CuTe's extended wgmma)."""
    from cutlass_offload.emit import gemm_sm90
    own = set(gemm_sm90.INCLUDES) | set(gemm_sm90.KERNEL_HEADER.values()) | set(gemm_sm90.TMA_EPILOGUE_INCLUDES)
    return UMBRELLA + tuple(h for h in family if h not in own and h not in UMBRELLA)


def umbrella_unit(text: str, family: tuple) -> str:
    """``text`` (a one-kernel unit whose includes are ``family``) with those replaced by
    ``umbrella_includes`` and CUTLASS's adapter in place of ours."""
    if ADAPTER[0] not in text:
        raise SystemExit("the unit does not launch through co_sm90::KernelAdapter")
    lines = text.splitlines()
    at = [i for i, ln in enumerate(lines) if ln.startswith("#include <") and ln[10:-1] in family]
    if at != list(range(at[0], at[-1] + 1)):
        raise SystemExit("the unit's includes are not one block")
    head, body = lines[:at[0]], "\n".join(lines[at[-1] + 1:]).replace(ADAPTER[0], ADAPTER[1])
    out = "\n".join(head + [f"#include <{h}>" for h in umbrella_includes(family)] + [body])
    return out + "\n" if text.endswith("\n") else out


def normalize_internal_names(ptx: str) -> str:
    """``ptx`` with each internal-linkage name nvcc makes from the file's path and
    contents (a mangled ``<length>_INTERNAL_...`` or ``<length>_GLOBAL__N__...``
    component) replaced by one token: the same code in two files, the same text. The
    component's own length prefix says where it ends."""
    out, i = [], 0
    for m in re.finditer(r"_INTERNAL_|_GLOBAL__N__", ptx):
        if m.start() < i:
            continue        # inside a component already replaced
        j = m.start()
        while j > i and ptx[j - 1].isdigit():
            j -= 1
        if j == m.start():
            continue        # not a length-prefixed component
        out += [ptx[i:j], "INTERNAL"]
        i = m.start() + int(ptx[j:m.start()])
    return "".join(out) + ptx[i:]


def _normalized_ptx(folder: Path) -> str:
    return normalize_internal_names(next(folder.glob("*.ptx")).read_text())


def compile_one(src: Path, keep: bool) -> dict:
    from cutlass_offload.build import toolchain
    cmd = toolchain.compile_command(toolchain.find_nvcc(), "sm90a", str(src), str(src.with_suffix(".o")))
    at = cmd.index("-c")
    times = src.with_suffix(".time.csv")
    extra = ["--time", str(times)]
    if keep:
        folder = src.with_suffix(".keep")
        folder.mkdir()
        extra += ["--keep", "--keep-dir", str(folder)]
    t = time.perf_counter()
    proc = subprocess.run(cmd[:at] + extra + cmd[at:], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"nvcc failed on {src}:\n{proc.stderr[-4000:]}")
    return {"wall_s": round(wall, 2), "phases_ms": compile_profile.phases(times.read_text())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--forms", default="tma,staged_tma",
                   help="epilogue forms, of tma (CUTLASS's TMA epilogue), staged_tma (default %(default)s)")
    p.add_argument("--epilogue", default="bias_gelu", choices=sorted(compile_profile.EPILOGUES),
                   help="the kernel's epilogue (default %(default)s)")
    p.add_argument("--tile", default="128x128x64", help="CTA tile MxNxK (default %(default)s)")
    p.add_argument("--schedule", default="pingpong", choices=("pingpong", "coop"), help="default %(default)s")
    p.add_argument("--cluster", default="1x1x1", help="cluster shape MxNxK (default %(default)s)")
    p.add_argument("--json", default="unit_headers.json", help="where to write the rows (default %(default)s)")
    a = p.parse_args(argv)
    forms = [f.strip() for f in a.forms.split(",")]
    if not forms or any(f not in ("tma", "staged_tma") for f in forms):
        p.error("--forms: tma and / or staged_tma")
    if not re.fullmatch(r"\d+x\d+x\d+", a.cluster):
        p.error(f"--cluster {a.cluster!r}: three sizes MxNxK, e.g. 2x1x1")
    a.dtype = "f16"
    rows, same = [], True
    with tempfile.TemporaryDirectory(prefix="co_unit_headers_") as tmp:
        work = Path(tmp)
        for form in forms:
            text = compile_profile.emit_unit(form, a, work).read_text()
            family = tuple(_includes(text))
            family = family[family.index("cute/tensor.hpp"):]
            units = {"family": text, "umbrella": umbrella_unit(text, family)}
            heads = {"family": family, "umbrella": umbrella_includes(family)}
            for kind, includes in heads.items():
                src = work / f"{form}_{kind}_headers.cu"
                src.write_text("#include <cuda_runtime.h>\n" + "".join(f"#include <{h}>\n" for h in includes))
                rows.append({"form": form, "what": "headers", "includes": kind, **compile_one(src, False)})
                print(f"{form} headers {kind}: {rows[-1]['wall_s']:.1f} s", flush=True)
            ptx = {}
            for kind, unit in units.items():
                # one file name for both: nvcc derives internal names from it
                (work / f"{form}_{kind}").mkdir()
                src = work / f"{form}_{kind}" / "unit.cu"
                src.write_text(unit)
                rows.append({"form": form, "what": "unit", "includes": kind, **compile_one(src, True)})
                ptx[kind] = _normalized_ptx(src.with_suffix(".keep"))
                print(f"{form} unit {kind}: {rows[-1]['wall_s']:.1f} s", flush=True)
            rows[-1]["same_ptx"] = rows[-2]["same_ptx"] = ptx["family"] == ptx["umbrella"]
            same &= rows[-1]["same_ptx"]
    names = list(dict.fromkeys(n for r in rows for n in r["phases_ms"]))
    print("\n| form | what | includes | wall (s) | " + " | ".join(names) + " | same PTX |")
    print("| --- " * (len(names) + 5) + "|")
    for r in rows:
        print(f"| {r['form']} | {r['what']} | {r['includes']} | {r['wall_s']:.1f} | "
              + " | ".join(f"{r['phases_ms'].get(n, 0) / 1000:.1f}" for n in names)
              + f" | {r.get('same_ptx', '')} |")
    Path(a.json).write_text(json.dumps({"args": vars(a), "host": platform.node(), "rows": rows}, indent=1))
    print(f"wrote {a.json}")
    if not same:
        print("the PTX differs between the family's includes and the umbrella ones", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
