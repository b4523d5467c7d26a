"""An Inductor glue's compiled artifacts, carried in an output folder: Inductor's cache
artifacts (GLUE_CACHE, ``save_cache_artifacts``) and its C++ wrapper's binaries
(GLUE_BINARIES, ``save_for`` / ``install``).

Inductor's cache artifacts (``torch.compiler.save_cache_artifacts``, the folder's
``glue_cache.bin``) hold the FX graph's cache entry but not what the host compiler
made of it: with the C++ wrapper a cache hit in a new process compiles the wrapper's
source again (checked on the CPU, torch 2.13: main.o, the kernels' optimized.o and
the link rebuilt after an FX graph cache hit). On an H100 host sd-unet's first call
after a load took 63.6-90.2 s with the C++ wrapper against 18.8 s with the Python one
(docs/measured.md, session 44).

The wrapper's binaries are named by the hash of its source and command line under
Inductor's cache dir, ``<cache>/<key[1:3]>/<key>.main.{o,so}``
(``codecache.CppCodeCache.load_async``), and its compile skips every target that
exists (``codecache._worker_compile_cpp``). So a folder carries them
(``GLUE_BINARIES``: an uncompressed tar of those paths relative to the cache dir), and
a load puts each one in place where it is missing, before the glue's first call.
Where the new process's wrapper source and flags hash alike (the same torch,
include paths and kernel paths) the compile finds them; elsewhere the names differ
and it compiles as before. A wrapper's optimized.o (C++ kernels: CPU glue only; a GPU
glue's kernels are Triton) is not carried: it is rebuilt, and the link is not.

A GPU wrapper also loads its Triton kernels' binaries at run time by absolute path
(``loadKernel("<cache>/<xx>/<hash>.cubin", ...)``, written by
``codecache.CudaKernelParamCache.set``), and an FX graph cache hit served from
GLUE_CACHE does not write them: in a new cache dir the first call failed with "CUDA
driver error: file not found" (sd-unet on the H200, session 47). So the tar carries
those binaries too (``kernel_files``), the manifest lists their absolute paths, and a
load hands GLUE_CACHE to Inductor only when every one of them is in place after
``install`` (``kernels_in_place``); otherwise the first call compiles the glue.
"""
from __future__ import annotations

import contextlib
import os
import re
import tarfile
import warnings
from pathlib import Path

import torch

GLUE_CACHE = "glue_cache.bin"
GLUE_BINARIES = "glue_binaries.tar"
# a member's name: "<key[1:3]>/<key>.main.o", ".main.so" (a wrapper) or ".cubin",
# ".fatbin", ".hsaco" (a kernel it loads); Inductor's code_hash keys
_MEMBER = re.compile(r"^([a-z0-9]{2})/(c[a-z0-9]{20,80})\.(main\.o|main\.so|cubin|fatbin|hsaco)$")
# a kernel binary's path as a GPU wrapper's source names it: loadKernel("<path>", ...)
_KERNEL_FILE = re.compile(r'"([^"\n]+\.(?:cubin|fatbin|hsaco))"')


def _valid(name: str) -> bool:
    m = _MEMBER.match(name)
    return m is not None and m.group(1) == m.group(2)[1:3]


def cpp_wrapper_keys() -> set:
    """The keys of the C++ wrappers this process has compiled or loaded (Inductor's
    ``CppWrapperCodeCache``), or an empty set with a torch that has none."""
    try:
        from torch._inductor.codecache import CppWrapperCodeCache
    except ImportError:
        return set()
    return set(getattr(CppWrapperCodeCache, "cache", {}))


def inductor_cache_dir() -> Path:
    """Inductor's cache dir of this process (``TORCHINDUCTOR_CACHE_DIR`` or its default)."""
    from torch._inductor.runtime.runtime_utils import cache_dir
    return Path(cache_dir())


def _member(key: str, suffix: str) -> str:
    return f"{key[1:3]}/{key}.main.{suffix}"


def _compiled_glue(compiled):
    """The compiled model's InductorGlue when it has compiled (its first call ran and
    did not fail), else None."""
    ind = getattr(compiled, "inductor", None)
    return None if ind is None or ind.first_call_s is None or ind.failed else ind


def save_cache_artifacts(compiled, tmp: Path) -> str | None:
    """Write Inductor's cache artifacts (``torch.compiler.save_cache_artifacts``:
    what this process compiled, the glue among it) as GLUE_CACHE when the
    compiled model's Inductor glue has compiled; its name, or None (nothing
    compiled yet, a torch without the API, or no artifacts)."""
    if _compiled_glue(compiled) is None:
        return None
    save_artifacts = getattr(torch.compiler, "save_cache_artifacts", None)
    if save_artifacts is None:
        return None
    try:
        got = save_artifacts()
    except Exception:  # noqa: BLE001 - the folder is whole without them: its first call compiles
        return None
    if not got or not got[0]:
        return None
    (tmp / GLUE_CACHE).write_bytes(got[0])
    return GLUE_CACHE


def save_for(compiled, dest: Path, kernels=None) -> str | None:
    """``save`` of what a compiled model's Inductor glue needs from the host compiler,
    when it has compiled: the binaries of the C++ wrappers it compiled, and the kernel
    binaries that every C++ wrapper of this process loads (``kernels``, by default
    ``kernel_files_for(compiled)``: a caller that has it passes it, as reading the
    wrappers' sources costs); the file's name or None."""
    ind = _compiled_glue(compiled)
    if ind is None:
        return None
    if kernels is None:
        kernels = kernel_files_for(compiled)
    return save(getattr(ind, "cpp_wrapper_keys", None) or set(), dest, kernels or ())


def kernel_files_for(compiled) -> list | None:
    """``kernel_files`` of every C++ wrapper this process has compiled or loaded, when
    the compiled model's Inductor glue has compiled (else an empty list): GLUE_CACHE
    holds whatever the process compiled (``save_cache_artifacts``), not only the glue,
    and a cache hit on any of those graphs loads its wrapper's kernels by path."""
    return [] if _compiled_glue(compiled) is None else kernel_files(cpp_wrapper_keys())


def kernel_files(keys) -> list | None:
    """The absolute paths of the kernel binaries that the C++ wrappers ``keys`` load at
    run time, read from their sources (``<cache>/<key[1:3]>/<key>.main.cpp``); sorted,
    each once. None when a wrapper's source cannot be read: which files it loads is
    then unknown, and a folder saying so does not use its GLUE_CACHE."""
    root = inductor_cache_dir()
    found = set()
    for k in keys:
        try:
            found.update(_KERNEL_FILE.findall((root / f"{k[1:3]}/{k}.main.cpp").read_text()))
        except (OSError, UnicodeDecodeError):
            return None
    return sorted(found)


def kernels_in_place(manifest: dict) -> bool:
    """Whether a folder's GLUE_CACHE may be handed to Inductor: every kernel binary its
    C++ wrappers load (the manifest's "glue_kernel_files") exists. A folder saved with
    GLUE_BINARIES before that list was kept (sessions 44-46) does not say which files
    its wrappers load, so its cache is not used either; nor is one whose list is null
    (a wrapper's source was unreadable at the save)."""
    if "glue_kernel_files" not in manifest:
        return not manifest.get("glue_binaries")
    files = manifest["glue_kernel_files"]
    return isinstance(files, list) and all(isinstance(f, str) and os.path.isfile(f) for f in files)


def save(keys, dest: Path, kernels=()) -> str | None:
    """Write the binaries of the C++ wrappers ``keys`` (``cpp_wrapper_keys()`` added
    by the glue's compile) and the kernel binaries ``kernels`` (absolute paths,
    ``kernel_files``) that lie in Inductor's cache dir to ``dest / GLUE_BINARIES``;
    its name, or None when none of them exists on disk."""
    root = inductor_cache_dir()
    names = [m for k in sorted(keys) for m in (_member(k, "o"), _member(k, "so"))]
    for f in kernels:
        with contextlib.suppress(ValueError):        # a kernel elsewhere: not carried
            names.append(Path(f).relative_to(root).as_posix())
    names = [m for m in names if _valid(m) and (root / m).is_file()]
    if not names:
        return None
    with tarfile.open(dest / GLUE_BINARIES, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            tar.add(root / name, arcname=name, recursive=False)
    return GLUE_BINARIES


def install(path: Path, saved_torch: str | None) -> int:
    """Put each binary of the folder's ``path`` (a GLUE_BINARIES tar, checked with the
    folder's files) into Inductor's cache dir where it is missing; the number put in
    place. Only for the torch version that wrote them (another one's wrapper would not
    hash alike anyway). Each file is written beside its target and renamed onto it, so
    a concurrent compile never sees half of one. A member of any other name or kind is
    skipped; a failure is a warning (the first call then compiles the wrapper)."""
    if saved_torch != torch.__version__:
        return 0
    placed = 0
    try:
        root = inductor_cache_dir()
        with tarfile.open(path, "r:") as tar:
            for info in tar.getmembers():
                if not (info.isfile() and _valid(info.name)):
                    continue
                target = root / info.name
                if target.exists():
                    continue
                data = tar.extractfile(info).read()
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
                try:
                    with open(tmp, "wb") as f:
                        f.write(data)
                    os.chmod(tmp, 0o755 if info.name.endswith(".so") else 0o644)
                    os.replace(tmp, target)
                finally:
                    tmp.unlink(missing_ok=True)
                placed += 1
    except (OSError, tarfile.TarError) as e:
        warnings.warn(f"cutlass_offload: the glue's compiled wrapper in {path} could not be put in "
                      f"Inductor's cache ({e}); the first call compiles it", RuntimeWarning, stacklevel=2)
    return placed


def member_names(path: Path) -> list:
    """The member names of a GLUE_BINARIES tar (for tests and reports)."""
    with tarfile.open(path, "r:") as tar:
        return tar.getnames()
