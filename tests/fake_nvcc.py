"""A fast stand-in for nvcc (CUTLASS_OFFLOAD_NVCC) for the fault tests: no CUDA,
no CUTLASS, real ELF files.

* ``--version``: a fixed version line.
* ``--dryrun``: refused (exit 1), as a wrapper without nvcc's step listing would.
* ``-c SRC -o OBJ``: an object defining one symbol named after SRC's sha256
  (compiled by the host C++ compiler), so equal sources give equal objects.
* ``-shared OBJ... -o LIB``: a shared library linking those objects plus
  ``co_library_info`` (returns "{}"), loadable by ctypes.

Each output is written into place in chunks with pauses (as a compiler writes
its output), so a kill lands in the middle of a write. Environment:
FAKE_NVCC_DELAY (seconds per call, default 0.2), FAKE_NVCC_LOG (a file each call
appends "compile <sha256 of SRC>" or "link <OUT name>" to), FAKE_NVCC_ENOSPC=1
(fail as nvcc does when the disk is full), FAKE_NVCC_FAIL=1 (a compile error on -c:
a front-end diagnostic on the source), FAKE_NVCC_BROKEN=1 (every -c and -shared fails
as with a host compiler that cannot run: no diagnostic), CXX (default c++).
"""
import hashlib
import os
import subprocess
import sys
import tempfile
import time


def _cxx(args, cwd):
    # run in the temporary folder on relative names: no random path in the output
    # (the file symbol), so equal inputs give byte-equal objects and libraries
    subprocess.run([os.environ.get("CXX") or "c++", *args], check=True, cwd=cwd)


def _write_slowly(data: bytes, out: str, seconds: float) -> None:
    chunks = 8
    step = max(1, -(-len(data) // chunks))
    with open(out, "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            time.sleep(seconds / chunks)


def main(args) -> int:
    if "--version" in args:
        print("nvcc: fake for cutlass_offload tests\nBuild cuda_fake.0")
        return 0
    if "--dryrun" in args:          # no steps to list: build/nvcc_steps.py runs us whole
        print("nvcc fake: --dryrun is not supported", file=sys.stderr)
        return 1
    out = args[args.index("-o") + 1]
    if os.environ.get("FAKE_NVCC_ENOSPC"):
        print(f"{out}: fatal error: can't write to {out}: No space left on device")
        return 1
    if os.environ.get("FAKE_NVCC_FAIL") and "-c" in args:
        src = next((a for a in args if a.endswith((".cu", ".cpp"))), "unit.cu")
        print(f"{src}(1): error: FAKE_NVCC_FAIL is set")
        return 1
    if os.environ.get("FAKE_NVCC_BROKEN"):
        print("gcc: broken toolchain (FAKE_NVCC_BROKEN)")
        return 1
    delay = float(os.environ.get("FAKE_NVCC_DELAY", "0.2"))
    time.sleep(delay / 2)
    with tempfile.TemporaryDirectory() as d:
        tmp = os.path.join(d, "out")
        if "-c" in args:
            src = next(a for a in args if a.endswith(".cu"))
            digest = hashlib.sha256(open(src, "rb").read()).hexdigest()
            c = os.path.join(d, "obj.cc")
            with open(c, "w") as f:
                f.write(f'extern "C" const char co_fake_{digest[:24]}[] = "{digest}";\n')
            _cxx(["-c", "-fPIC", "-O0", "obj.cc", "-o", "out"], d)
            what = f"compile {digest}"
        else:
            objs = [a for a in args if a.endswith(".o")]
            c = os.path.join(d, "info.cc")
            with open(c, "w") as f:
                f.write('extern "C" const char* co_library_info() { return "{}"; }\n')
            _cxx(["-shared", "-fPIC", "-O0", "info.cc", *[os.path.abspath(o) for o in objs],
                  "-o", "out"], d)
            what = f"link {os.path.basename(out)}"
        data = open(tmp, "rb").read()
    _write_slowly(data, out, delay / 2)
    log = os.environ.get("FAKE_NVCC_LOG")
    if log:
        with open(log, "a") as f:
            f.write(what + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
