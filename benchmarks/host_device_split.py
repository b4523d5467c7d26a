"""What a CUTLASS 3.x unit's host side costs, and whether compiling the kernels
device-only saves CPU (issue 17: "kernels compiled device-only (cubin / fatbin),
launchers that are thin host code").

One sm90a GEMM kernel of a Linear (``--m/--n/--k``, ``--epilogue``) is emitted as
the build emits it (the learned table's choice) and compiled three ways, one after
another on this machine, each with nvcc's per-step times (``nvcc --time``):

* ``full``: ``nvcc -c`` of the unit, as the build runs it (host and device sides);
* ``device_only``: ``nvcc -cubin`` of the same unit: the device side alone
  (preprocessing, cicc, ptxas), what a device-only kernel build would cost;
* ``host_only``: ``nvcc -c`` of the unit with its launch rewritten to go through a
  kernel handle (``cudaLaunchKernelExC`` on a ``void*`` a cubin loader would fill)
  instead of ``cutlass::device_kernel<GemmKernel>``: no kernel is instantiated, so
  this is the thin launcher's cost when it still builds the Params with CUTLASS's
  host templates (``to_underlying_arguments``: TMA descriptors, scheduler);
* ``host_only_gxx`` (``--gxx``): that host unit given to the host compiler alone
  (``g++ -x c++``, no cudafe++ / cicc), which CUTLASS's kernel headers do not
  support; recorded with its first errors.

Split = device_only + host_only against full: the CPU seconds a split build would
spend per unit. Prints a table, writes JSON (``--json``, default
./host_device_split.json). Needs nvcc and the nvidia-cutlass wheel, no GPU.

    python benchmarks/host_device_split.py [--m 6000 --n 768 --k 768] [--epilogue relu] [--gxx]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from cutlass_offload import emit  # noqa: E402
from cutlass_offload.build import toolchain  # noqa: E402
from cutlass_offload.capture import capture  # noqa: E402
from cutlass_offload.config import CompileOptions  # noqa: E402
from cutlass_offload.partition import partition  # noqa: E402
from cutlass_offload.select import select  # noqa: E402

EPILOGUES = {"plain": lambda y: y, "relu": torch.relu, "gelu": torch.nn.functional.gelu}

# The launch through a handle: what a device-only build's host side would do (the
# cluster shape and PDL as attributes, the Params by value); compiled, never run here.
_HANDLE_LAUNCH = """\
extern "C" void* co_kernel_handle;   // filled by a cubin loader (cudaLibraryGetKernel)
static int co_launch(typename GemmKernel::Params& params, const CoGemmArgs& args, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attrs[2];
  config.gridDim = GemmKernel::get_grid_shape(params);
  config.blockDim = GemmKernel::get_block_shape();
  config.dynamicSmemBytes = GemmKernel::SharedStorageSize;
  config.stream = stream;
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cute::size<0>(typename GemmKernel::DispatchPolicy::ClusterShape{});
  attrs[0].val.clusterDim.y = cute::size<1>(typename GemmKernel::DispatchPolicy::ClusterShape{});
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = args.pdl;
  config.attrs = attrs;
  config.numAttrs = 2;
  void* kernel_args[] = {&params};
  return cudaLaunchKernelExC(&config, co_kernel_handle, kernel_args) == cudaSuccess ? CO_OK
                                                                               : CO_LAUNCH_FAILED;
}

"""


class _Linear(torch.nn.Module):
    def __init__(self, k, n, epilogue):
        super().__init__()
        self.lin, self.act = torch.nn.Linear(k, n), EPILOGUES[epilogue]

    def forward(self, x):
        return self.act(self.lin(x))


def emit_unit(m, n, k, epilogue):
    """(unit text, kernel name) of the one sm90a kernel the build would emit."""
    cap = capture(_Linear(k, n, epilogue).half(), (torch.randn(m, k).half(),))
    opts = CompileOptions(arch="sm90a")
    plan = select(partition(cap.graph_module, opts), "sm90a", opts, None)
    (kernel,) = plan.distinct_kernels
    if kernel.config.family != "cutlass3x_sm90":
        raise SystemExit(f"the plan's kernel is {kernel.config.family}, not a 3.x sm90a kernel")
    tu = emit.emit_unit([emit.emit_kernel(kernel)], "host_device_split")
    return tu.text, kernel.name


def host_only(text: str) -> str:
    """The unit with ``co_launch`` going through a kernel handle (no device_kernel
    instantiation). Raises ValueError when the emitted launcher is not found."""
    start = text.find("static int co_launch(")
    end = text.find("\nint run(", start)
    if start < 0 or end < 0:
        raise ValueError("co_launch / run not found in the emitted unit")
    return text[:start] + _HANDLE_LAUNCH + text[end + 1:]


def _steps(csv_path: Path) -> dict:
    """{nvcc step: seconds} from ``nvcc --time``'s CSV."""
    out = {}
    with open(csv_path) as f:
        for row in csv.reader(f):
            if len(row) >= 8 and row[7].strip() == "ms":
                step = row[1].strip()
                out[step] = round(out.get(step, 0.0) + float(row[6]) / 1000, 2)
    return out


def run(cmd: list, timing: Path | None) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd + (["--time", str(timing)] if timing else []), capture_output=True, text=True)
    rec = {"s": round(time.perf_counter() - t0, 2), "rc": proc.returncode}
    if timing is not None and timing.exists():
        rec["steps_s"] = _steps(timing)
    if proc.returncode:
        errors = [l for l in (proc.stdout + proc.stderr).splitlines() if "error" in l]
        rec["errors"] = len(errors)
        rec["first_errors"] = errors[:5]
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=6000)
    p.add_argument("--n", type=int, default=768)
    p.add_argument("--k", type=int, default=768)
    p.add_argument("--epilogue", default="relu", choices=sorted(EPILOGUES))
    p.add_argument("--gxx", action="store_true", help="also try the host unit with g++ alone")
    p.add_argument("--json", default="host_device_split.json")
    a = p.parse_args(argv)
    nvcc = toolchain.find_nvcc()
    text, name = emit_unit(a.m, a.n, a.k, a.epilogue)
    res = {"machine": {"cores": os.cpu_count(), "host": platform.node(), "date": time.strftime("%Y-%m-%d"),
                       "nvcc": toolchain.nvcc_version(nvcc), "cutlass": toolchain.cutlass_version()},
           "problem": [a.m, a.n, a.k], "epilogue": a.epilogue, "kernel": name, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="co_split_") as d:
        d = Path(d)
        (d / "unit.cu").write_text(text)
        (d / "host.cu").write_text(host_only(text))
        base = toolchain.compile_command(nvcc, "sm90a", "SRC", "OUT")
        src_i = base.index("SRC")
        flags = [x for x in base[:src_i] if x != "-c"]
        runs = {"full": flags + ["-c", str(d / "unit.cu"), "-o", str(d / "unit.o")],
                "device_only": flags + ["-cubin", str(d / "unit.cu"), "-o", str(d / "unit.cubin")],
                "host_only": flags + ["-c", str(d / "host.cu"), "-o", str(d / "host.o")]}
        for step, cmd in runs.items():
            res["runs"][step] = run(cmd, d / f"{step}.csv")
            print(f"{step}: {res['runs'][step]}", flush=True)
        if a.gxx:
            inc = toolchain.cuda_include_dir(nvcc)
            gxx = ["g++", "-x", "c++", "-std=c++17", "-O1", "-DNDEBUG", "-fPIC", "-w", "-I", inc,
                   "-isystem", os.path.join(inc, "cccl")]
            for x in toolchain._includes():     # nvcc's -Xcompiler=-idirafter,DIR as g++ takes it
                gxx += x.split("=", 1)[1].split(",", 1) if x.startswith("-Xcompiler=") else [x]
            res["runs"]["host_only_gxx"] = run(gxx + ["-c", str(d / "host.cu"), "-o", str(d / "h.o")], None)
    r = res["runs"]
    split = r["device_only"]["s"] + r["host_only"]["s"]
    res["split_s"] = round(split, 2)
    print(f"\n{name}: {a.m}x{a.n}x{a.k} {a.epilogue}, {os.cpu_count()} cores, one compile at a time")
    print("| compile | s | steps (s) |\n| --- | --- | --- |")
    for step, rec in r.items():
        steps = ", ".join(f"{k} {v}" for k, v in rec.get("steps_s", {}).items() if v >= 0.05)
        fail = f" (failed, {rec['errors']} errors)" if rec["rc"] else ""
        print(f"| {step} | {rec['s']}{fail} | {steps} |")
    print(f"| split (device_only + host_only) | {split:.2f} | {split / r['full']['s']:.2f}x full |")
    Path(a.json).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
