"""Locate nvcc and the CUTLASS headers; build the nvcc command line."""
from __future__ import annotations

import functools
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..config import knobs
from ..cutlass_source import cutlass_root  # noqa: F401 - re-exported
from ..errors import ToolchainError
from ..target import TARGETS

GENCODE = {arch: t.gencode for arch, t in TARGETS.items()}
# nvcc's -O is the host compiler's level only (the device steps, cicc and ptxas, are
# the same under -O1 and -O3: nvcc 13.0 --dryrun); -O1 takes 3-5 s off the host
# compile that ends every CUTLASS unit (2-core mlp sm_90a cold: 64.0 / 57.3 s against
# 68.9 / 66.4 s at -O3, benchmarks/results/mlp_build_2core_flags_2026-12-01.txt).
# -lineinfo (source lines for Nsight Compute) costs cicc ~4 s of ~49: only with
# CUTLASS_OFFLOAD_LINEINFO=1.
BASE_FLAGS = ("-std=c++17", "-O1", "-DNDEBUG", "--expt-relaxed-constexpr",
              "-Xcompiler=-fPIC", "-Xcompiler=-Wno-psabi")


def find_nvcc() -> str:
    """Path of nvcc: $CUTLASS_OFFLOAD_NVCC (which must then be one), else PATH, then
    $CUDA_HOME/bin, then the ``nvidia-cuda-nvcc`` wheel. Raises ToolchainError naming
    these options."""
    k = knobs()
    if k.nvcc:
        # set on purpose: a wrong path is an error, not a fall-through to another nvcc
        if os.path.isfile(k.nvcc) and os.access(k.nvcc, os.X_OK):
            return k.nvcc
        raise ToolchainError(f"CUTLASS_OFFLOAD_NVCC={k.nvcc!r} is not an executable file; "
                             "unset it to find nvcc on PATH, in $CUDA_HOME/bin or the nvidia-cuda-nvcc wheel")
    candidates = []
    which = shutil.which("nvcc")
    if which:
        candidates.append(which)
    if k.cuda_home:
        candidates.append(os.path.join(k.cuda_home, "bin", "nvcc"))
    for site in sys.path:
        candidates += glob.glob(os.path.join(site, "nvidia", "cuda_nvcc", "bin", "nvcc"))
        candidates += glob.glob(os.path.join(site, "nvidia", "cu*", "bin", "nvcc"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise ToolchainError(
        "nvcc not found. Put it on PATH, set CUDA_HOME (nvcc in $CUDA_HOME/bin), set "
        "CUTLASS_OFFLOAD_NVCC to its path, or `pip install nvidia-cuda-nvcc`.")


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """The 'Build cuda_...' line of ``nvcc --version`` (part of every cache key).
    Raises ToolchainError, naming $CUTLASS_OFFLOAD_NVCC when that is where ``nvcc``
    came from, if it does not run or its --version does not say nvcc (another program
    would fail every unit with a log that does not say why)."""
    def named():
        set_on_purpose = knobs().nvcc and os.path.abspath(knobs().nvcc) == os.path.abspath(nvcc)
        return f"{nvcc} (CUTLASS_OFFLOAD_NVCC)" if set_on_purpose else nvcc
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise ToolchainError(f"{named()} is not a working nvcc: `--version` failed ({e})") from e
    if "nvcc" not in out.lower() and "cuda compilation tools" not in out.lower():
        first = (out.strip().splitlines() or ["nothing"])[0][:80]
        raise ToolchainError(f"{named()} is not nvcc: its --version printed {first!r}")
    m = re.search(r"^Build .*$", out, re.M) or re.search(r"release [\d.]+", out)
    return m.group(0) if m else out.strip()


def include_dirs() -> tuple:
    """-I folders of every CUTLASS compile: include/, tools/util/include and, last,
    the folders the attention kernel is included from (emit/attention.py)."""
    from ..emit import attention
    r = cutlass_root()
    return (str(r / "include"), str(r / "tools" / "util" / "include")) + attention.extra_include_dirs()


def fallback_include_flags() -> list:
    """Folders searched after the system headers (gcc -idirafter, passed to the host
    preprocessor nvcc runs for every pass): the package's stand-ins for headers a
    toolkit may lack (cuRAND, included but unused by the attention kernel); a real
    header, when the toolkit has it, wins."""
    from ..emit import attention
    d = attention.compat_dir()
    if "," in d:
        raise ToolchainError(f"-Xcompiler splits on commas; the package path {d!r} has one")
    return [f"{_IDIRAFTER}{d}"]


_IDIRAFTER = "-Xcompiler=-idirafter,"


@functools.lru_cache(maxsize=None)
def cutlass_version() -> str:
    """CUTLASS version from cutlass/version.h plus a hash of the header tree listing."""
    text = (cutlass_root() / "include" / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{p} (\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    ver = ".".join(m.group(1) for m in parts if m)
    h = hashlib.sha256()
    # the headers, and the examples folders the attention kernels are included from
    for inc in (cutlass_root() / "include",
                cutlass_root() / "examples" / "41_fused_multi_head_attention",
                cutlass_root() / "examples" / "88_hopper_fmha"):
        for p in sorted(inc.rglob("*.h*")):
            st = p.stat()
            h.update(f"{p.relative_to(inc)}:{st.st_size}".encode())
    return f"{ver}+{h.hexdigest()[:12]}"


def _base(nvcc: str, arch: str) -> list:
    if arch not in GENCODE:
        raise ToolchainError(f"unknown arch {arch!r}; use one of {sorted(GENCODE)}")
    return [nvcc, *BASE_FLAGS, *(("-lineinfo",) if knobs().lineinfo else ()), GENCODE[arch]]


def _includes() -> list:
    out = []
    for d in include_dirs():
        out += ["-I", d]
    return out + fallback_include_flags()


# exports only co_* from a library (see the script for why)
EXPORTS_MAP = Path(__file__).resolve().parents[1] / "emit" / "templates" / "exports.map"
_VERSION_SCRIPT = "-Xlinker=--version-script="


def _exports_flag() -> str:
    if "," in str(EXPORTS_MAP):
        raise ToolchainError(f"-Xlinker splits on commas; the package path {EXPORTS_MAP} has one")
    return _VERSION_SCRIPT + str(EXPORTS_MAP)


def nvcc_command(nvcc: str, arch: str, source: str, output: str, threads: int = 0,
                 flags: tuple = ()) -> list:
    """The one nvcc invocation that turns a .cu into a shared library; ``flags``: the
    unit's own options (TranslationUnit.flags)."""
    return (_base(nvcc, arch) + list(flags) + ["-shared", _exports_flag(), f"-t{threads}"] + _includes()
            + [source, "-o", output])


@functools.lru_cache(maxsize=None)
def cuda_include_dir(nvcc: str) -> str | None:
    """The CUDA toolkit's include folder (the one holding cuda_runtime.h) that
    ``nvcc`` compiles against: the ``INCLUDES`` of its ``--dryrun`` (which sees
    through wrapper scripts), else ``<toolkit>/include`` beside the executable; None
    when there is none (a wheel's nvcc without the runtime headers beside it, a
    stand-in): the caller then compiles with nvcc."""
    candidates = []
    try:
        out = subprocess.run([nvcc, "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True,
                             text=True, check=False, timeout=60)
        candidates += re.findall(r'INCLUDES="?-I"?([^" ]+)', out.stdout + out.stderr)
    except (OSError, subprocess.SubprocessError):
        pass
    top = Path(nvcc).resolve().parent.parent
    candidates += [str(top / "include"), *map(str, sorted(top.glob("targets/*/include")))]
    for d in candidates:
        if (Path(d) / "cuda_runtime.h").is_file():
            return str(Path(d))
    return None


HOST_FLAGS = ("-x", "c++", "-std=c++17", "-O2", "-fPIC", "-w")


def host_compile_command(cxx: str, include_dir: str, source: str, output: str) -> list:
    """The host C++ compiler's -c of a unit without device code (the region
    launchers, the library info): it only calls the kernels' ``run`` functions and
    the CUDA runtime, so nvcc's device and cudafe passes are not needed (about 0.1 s
    against nvcc's 1.8 s on 2 cores)."""
    return [cxx, *HOST_FLAGS, "-I", include_dir, "-c", source, "-o", output]


def compile_command(nvcc: str, arch: str, source: str, output: str, cutlass: bool = True,
                    threads: int = 1, flags: tuple = ()) -> list:
    """nvcc -c: one translation unit to a relocatable object (position independent).
    threads > 1: nvcc's -t, running its independent steps (host and device passes)
    side by side on cores no other job uses. ``flags``: the unit's own options
    (TranslationUnit.flags, e.g. the Hopper attention's -ftz=true)."""
    t = [f"-t{threads}"] if threads > 1 else []
    return _base(nvcc, arch) + list(flags) + ["-c"] + t + (_includes() if cutlass else []) + [source, "-o", output]


def link_command(nvcc: str, arch: str, objects: list, output: str) -> list:
    """Link objects into one shared library (CUDA runtime linked statically) that
    exports the co_* C ABI only."""
    return [nvcc, GENCODE[arch], "-shared", _exports_flag(), *objects, "-o", output]


def flags_signature(cmd: list) -> str:
    """The command without file paths and nvcc's thread count (-tN: how many steps
    run at once, not what they produce): what of it must enter a cache key."""
    skip = set()
    for i, a in enumerate(cmd):
        if a in ("-I", "-o"):
            skip.update((i, i + 1))
        elif a.startswith(_IDIRAFTER) or re.fullmatch(r"-t\d+", a):
            skip.add(i)
    return " ".join(_VERSION_SCRIPT + Path(a[len(_VERSION_SCRIPT):]).name if a.startswith(_VERSION_SCRIPT)
                    else a for i, a in enumerate(cmd[1:], 1)
                    if i not in skip and not a.endswith((".cu", ".o", ".so")))


def available_memory() -> int:
    """Bytes of MemAvailable (Linux), or 0 when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
