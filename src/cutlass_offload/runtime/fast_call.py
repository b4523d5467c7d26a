"""The C++ call path of offloaded regions (csrc/fast_call.cpp), built against the
running PyTorch and loaded on demand.

A region call that repeats a cached signature (runtime/region.py) is replayed by a
``FastCall`` object in C++: check the operands' sizes / strides / dtype / device,
patch their pointers and a new output into the cached args, launch on the current
stream. It saves the Python mapping, ctypes and ``torch.empty`` of each call
(issue 17: a region call's host cost under 5 us).

The extension is compiled with the host C++ compiler (``CXX``, else ``c++``)
against ``torch.utils.cpp_extension``'s include and library paths, once per
(source, PyTorch build, Python, compiler), into ``cache_dir/fast_call/<key>/`` (a
file lock for concurrent processes; published by atomic rename, so a killed build
leaves nothing half-written). ``prefetch()`` builds it in a background thread
(``compile()`` and ``load()`` start it): regions take the Python path until it is
ready. A build that fails is reported once as a warning with the compiler's log
kept in ``cache_dir/fast_call/<key>.log``; the Python path then serves every call.
``CUTLASS_OFFLOAD_FAST_CALL=0`` turns the C++ path off.

The extension also exports the region ops' C shims (``aoti_torch_<device>_region_<T>t_<I>i``),
which Inductor's C++ wrapper calls directly instead of the dispatcher (ops.c_shims,
glue.REGION_C_SHIMS); ``export_symbols`` makes them visible to the wrappers it loads.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from ..config import compiler_identity, knobs
from ..integrity import elf_problem

SOURCE = Path(__file__).resolve().parent / "csrc" / "fast_call.cpp"
EXPORTS = SOURCE.with_suffix(".map")      # the linker's list of exported symbols
MODULE_NAME = "_co_fast_call"

_build_lock = threading.Lock()   # one build + import at a time
_start_lock = threading.Lock()   # starting the background thread (never held during a build)
_state = {"module": None, "error": None, "thread": None, "global": None}


def _compiler() -> str:
    return knobs().cxx


def build_command(source: Path, output: Path, cxx: str | None = None) -> list:
    """The compiler command that builds the extension from ``source`` into ``output``."""
    from torch.utils import cpp_extension

    abi = int(torch.compiled_with_cxx11_abi())
    cmd = [cxx or _compiler(), "-O2", "-std=c++20", "-fPIC", "-shared", "-fvisibility=hidden",
           "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={MODULE_NAME}",
           f"-Wl,--version-script={EXPORTS}",
           str(source), "-o", str(output), f"-I{sysconfig.get_paths()['include']}"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    for lib in cpp_extension.library_paths():
        cmd += [f"-L{lib}", f"-Wl,-rpath,{lib}"]
    return cmd + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def cache_key(cxx: str | None = None) -> str:
    """Hash of what the built extension depends on: its source, the PyTorch build
    (version, git revision, CUDA, C++ ABI), the Python and the compiler."""
    h = hashlib.sha256(SOURCE.read_bytes() + b"\0" + EXPORTS.read_bytes())
    for part in (torch.__version__, getattr(torch.version, "git_version", ""), str(torch.version.cuda),
                 str(torch.compiled_with_cxx11_abi()), sys.version,
                 compiler_identity(cxx or _compiler())):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:24]


def _library_path(root: Path, key: str) -> Path:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return root / key / f"{MODULE_NAME}{suffix}"


def build(root: Path | None = None) -> Path:
    """The extension's path, compiling it first when the cache has none.

    Raises RuntimeError (compiler output in ``<root>/<key>.log``) when it fails.
    """
    from filelock import FileLock

    root = Path(root) if root else knobs().cache_dir / "fast_call"
    root.mkdir(parents=True, exist_ok=True)
    key = cache_key()
    path = _library_path(root, key)
    if path.exists():
        why = elf_problem(path)          # a truncated extension would SIGBUS the import
        if why is None:
            return path
        warnings.warn(f"cutlass_offload: the cached C++ call path {path} {why}; building it again",
                      RuntimeWarning, stacklevel=2)
    with FileLock(str(root / f"{key}.lock")):
        if path.exists() and elf_problem(path) is None:    # another process built it meanwhile
            return path
        shutil.rmtree(root / key, ignore_errors=True)      # a damaged one
        for stale in root.glob(f".{key}.*"):  # left by a process that exited mid-build
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            cmd = build_command(SOURCE, tmp / path.name)
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                log = root / f"{key}.log"
                log.write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
                raise RuntimeError(f"building the C++ call path failed (exit {proc.returncode}); "
                                   f"compiler output in {log}")
            os.replace(tmp, root / key)           # publish the folder in one step
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def enabled() -> bool:
    return knobs().fast_call


def load(block: bool = True):
    """The extension module, or None (not enabled, failed, or still building when
    ``block`` is False: then a background build is started)."""
    if _state["module"] is not None or _state["error"] is not None or not enabled():
        return _state["module"]
    if not block:
        prefetch()                # returns at once, even while a build runs
        return None
    with _build_lock:
        if _state["module"] is None and _state["error"] is None:
            try:
                _state["module"] = _import(build())
            except Exception as e:  # noqa: BLE001 - any failure leaves the Python path
                _state["error"] = f"{type(e).__name__}: {e}"
                warnings.warn(f"cutlass_offload: the C++ call path is unavailable ({_state['error']}); "
                              "offloaded regions use the Python call path", RuntimeWarning, stacklevel=2)
    return _state["module"]


def wait() -> None:
    """Wait for the background build that ``prefetch`` started, if any (starts none:
    a process without one returns at once)."""
    t = _state["thread"]
    if t is not None:
        t.join()


def prefetch() -> None:
    """Build and import the extension in a background thread (once per process)."""
    if not enabled() or _state["module"] is not None or _state["error"] is not None:
        return
    with _start_lock:
        if _state["thread"] is None:
            t = threading.Thread(target=load, name="cutlass_offload-fast-call", daemon=True)
            _state["thread"] = t
            t.start()


def export_symbols(module) -> bool:
    """Make the loaded extension's symbols global (dlopen RTLD_NOLOAD | RTLD_GLOBAL on
    the file Python imported), so that a library loaded later, Inductor's C++ wrapper
    calling the region ops' C shims (ops.c_shims), resolves them. False when it cannot."""
    if _state["global"] is None:
        try:
            _state["global"] = ctypes.CDLL(module.__file__, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
        except (OSError, AttributeError):
            return False
    return True


def error() -> str | None:
    """Why the C++ call path is unavailable in this process, if it is."""
    return _state["error"]


def take_shim_error() -> BaseException | None:
    """The exception of this thread's last failed region-op C shim call, then forgotten
    (None when there is none, or no extension is loaded): the Python exception the
    region's implementation raised, or a RuntimeError with a C++ one's message. Inductor's
    C++ wrapper only sees a shim's error code and raises "API call failed"; the glue
    raises this one from it (runtime/glue.py)."""
    module = _state["module"]
    kept = module.take_shim_error() if module is not None else None
    if kept is None:
        return None
    exception, message = kept
    return exception if isinstance(exception, BaseException) else RuntimeError(
        f"cutlass_offload region op: {message}")
