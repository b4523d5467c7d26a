"""Two launches of each form of benchmarks/staged_epilogue.py's problems (the TMA
epilogue's and the staged one's libraries, built or taken from the kernel cache), for
a profiler: nothing is timed here.

    ncu --clock-control none --kernel-name device_kernel --section SpeedOfLight \\
        --section WarpStateStats --section InstructionStats --csv --page details \\
        python benchmarks/staged_epilogue_ncu.py 0 1 9 10 > ncu.csv

Arguments: indices into staged_epilogue.PROBLEMS. Needs a CUDA GPU and nvcc.
"""
import ctypes
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import staged_epilogue as se  # noqa: E402

from cutlass_offload.emit import region_symbol  # noqa: E402
from cutlass_offload.ir import GemmLaunch  # noqa: E402
from cutlass_offload.runtime.library import CoGemmArgs, Library  # noqa: E402
from cutlass_offload.tune import profile as prof  # noqa: E402


def main(argv) -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    libs = se.build_libraries(torch.cuda.get_device_properties(dev).multi_processor_count)
    loaded = {form: Library(path) for form, (path, *_) in libs.items()}
    for i in map(int, argv):
        name, m, n, k, fields = se.PROBLEMS[i]
        ep = {"bias": False, "activation": "identity", "residual": "none", "post_activation": "identity",
              **fields}
        spec = {"m": m, "n": n, "k": k, "batch": 1, "dtype": "f16", "layout_b": "col", "epilogue": ep}
        args = prof.operand_copies(spec, dev)[0].args
        for form, (_, rows, _, _) in libs.items():
            run, ws = loaded[form].launcher(region_symbol(rows[i]["region"]), CoGemmArgs)
            args.set_launch(GemmLaunch(**rows[i]["launch"]))
            need = int(ws(ctypes.byref(args)))
            workspace = torch.empty(max(need, 1), dtype=torch.uint8, device=dev)
            args.workspace, args.workspace_bytes = (workspace.data_ptr(), need) if need > 0 else (None, 0)
            for _ in range(2):
                if run(ctypes.byref(args), torch.cuda.current_stream().cuda_stream) != 0:
                    raise SystemExit(f"{form} {name}: the launcher refused the call")
            torch.cuda.synchronize()
            print(form, name, rows[i]["kernel"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
