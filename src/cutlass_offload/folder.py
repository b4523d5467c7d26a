"""Output folders: ``save`` writes a compile to a folder, ``check_folder`` checks
every file of one before anything is loaded (``api.load`` reads it back through the
pipeline stages).

An output folder (``compile(..., out_dir=...)`` / ``cutlass-offload compile --out``)
holds:
  model.pt2              the captured ExportedProgram (torch.export.save), its
                         tensors as meta tensors when weights.bin holds them
  weights.bin, .json     the program's parameters, buffers and constants, raw
                         (weights.py; absent for a program with tensors of
                         other kinds, which model.pt2 then holds)
  inputs.pt              the example inputs (torch.save)
  glue_cache.bin         Inductor's cache artifacts of the glue, when it was compiled
                         before the save (torch.compiler.save_cache_artifacts; a
                         GPU compile with Inductor glue): ``api.load`` hands them to
                         torch.compiler.load_cache_artifacts, so the first call on
                         another machine need not compile the glue again
  glue_binaries.tar      the binaries of the glue's C++ wrapper, when it compiled with
                         one, and of the GPU kernels it loads (runtime/glue_binaries.py):
                         the load puts them in Inductor's cache, where the wrapper's
                         compile and its first call find them
  libcutlass_offload.so  the CUTLASS library (absent when no region was offloaded)
  src/                   every CUDA source of the library, for inspection
  report.json            the compile's Report
  manifest.json          written last: a folder without it is incomplete

manifest.json (FOLDER_FORMAT 3) is a JSON object: "format", "options" (the
CompileOptions), "fingerprint" ([region, kernel] pairs the library was built for;
``api.load`` re-partitions and requires the same), "tuned" (tuning winners by problem),
"torch" (its version), "glue" ({"glue", "mode", "options"}), "weights" (the
weights index's name, or null when model.pt2 holds the tensors), "glue_cache" and
"glue_binaries" (their files' names, or null), "glue_kernel_files" (the absolute
paths of the kernel binaries the glue's C++ wrappers load; the glue cache is used
only where all exist after the load put the carried ones in place), "save_id" (a fresh
uuid per save), "files" ({relative path: integrity.record} of every other file)
and "checksum" (sha256 of the manifest's sorted JSON without "checksum"). Format 1
folders (no "files", no "checksum") still load, with cheaper checks; format 2
ones (no "weights") as before; a format newer than this package's is refused.

``begin_save`` starts a save right after capture: it makes the temporary folder and
writes weights.bin there in a background thread (the weights are the captured
program's, final from then on), while partition, select and the build go on; ``save``
then writes the rest and waits for it (llama's 1.67 GB took 3.5 s of a 5.4 s save on
the 2-core machine). A compile that fails meanwhile discards it.

Publishing is atomic: the folder is written beside ``out_dir`` in a temporary
folder (``.NAME.tmp-*``; stale ones an hour old are removed), then swapped into
place (one renameat2(RENAME_EXCHANGE) on Linux, so ``out_dir`` is never missing
for a loader; elsewhere a rename aside with a short window). ``api.load``
retries while a concurrent save changes the manifest under it.

Errors: CutlassOffloadError for an out_dir that may not be replaced (an existing
file, a non-empty folder that is no output folder), a path that is not an output
folder, or a saved model that partitions differently now; DiskFullError when the
disk has no room for the folder (out_dir unchanged); DamagedFileError naming the
first damaged file and the fix (compile again into the folder).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import types
import typing
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch

from . import build as build_stage
from . import integrity, recent_folders, weights
from .build.cache import remove_stale
from .capture import Captured
from .config import CompileOptions
from .errors import CutlassOffloadError, DamagedFileError, DiskFullError
from .runtime import glue_binaries
from .runtime.compiled_model import CompiledModel
from .runtime.glue import GlueSpec

MANIFEST = "manifest.json"
REPORT = "report.json"
# 2: the manifest records every file's size and sha256 ("files") and its own
# checksum; folders without them (format 1) still load, with cheaper checks.
# 3: the weights may lie in weights.bin (manifest "weights"), model.pt2 then holding
# meta tensors: a package that reads format 2 only would load those
FOLDER_FORMAT = 3


def _fingerprint(plan) -> list:
    return [[r.name, k.name] for r, k in plan.pairs]


def check_out_dir(out_dir) -> None:
    """Raise CutlassOffloadError (nothing written) when ``out_dir`` is an existing
    file, or an existing non-empty folder that is not a cutlass-offload output
    folder (no manifest.json): saving would replace it; or when a part of its path
    is a file, so it cannot be created."""
    out = Path(out_dir)
    if not os.path.lexists(out):
        # what exists of its path must be folders (else the save fails, after the work)
        if not next(p for p in out.absolute().parents if os.path.lexists(p)).is_dir():
            raise CutlassOffloadError(f"cannot create {out}: a part of {out.parent} is a file, not "
                                      "a folder; pass another out_dir (--out)")
        return
    if not out.is_dir() or out.is_symlink():
        raise CutlassOffloadError(f"{out} exists and is not a folder; an output folder would replace "
                                  "it: pass another out_dir (--out), or remove it first")
    if (out / MANIFEST).is_file():
        return                      # an earlier compile's folder, damaged or not: replaced
    if any(out.iterdir()):
        raise CutlassOffloadError(f"{out} is a folder that is not empty and not a cutlass-offload "
                                  "output folder (no manifest.json); an output folder would replace "
                                  "it: pass another out_dir (--out), or an empty or new folder")


def _fix(out: Path) -> str:
    return (f"the output folder {out} is damaged: compile the model again into it "
            f"(cutlass-offload compile MODEL --out {out}, or co.compile(..., out_dir=...))")


def _manifest_checksum(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _bytes_to_save(cap: Captured, example_inputs) -> int:
    """About what the folder's tensors take (weights, constants, inputs); the
    library and its sources (a few MB) are left to the margin, as a save begins
    before they are built."""
    seen, n = set(), 0
    ep = cap.exported
    tensors = [*ep.state_dict.values(), *ep.constants.values(), *example_inputs]
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                n += storage.nbytes()
    return n


_MARGIN = 64 << 20


class PendingSave:
    """A save begun by ``begin_save``: its temporary folder (``tmp``), the program
    model.pt2 gets (``program``: without its tensors when ``weighted``, which
    weights.bin then holds) and the background write of weights.bin. ``save``
    finishes it; ``discard`` waits for the writer and removes the folder."""

    def __init__(self, out: Path, tmp: Path, program, weighted: bool, future, cancel=None):
        self.out, self.tmp, self.program, self.weighted = out, tmp, program, weighted
        self._future, self._cancel = future, cancel

    def wait(self) -> None:
        """Block until weights.bin is written; raises the writer's error (OSError)."""
        if self._future is not None:
            self._future.result()

    def discard(self) -> None:
        if self._cancel is not None and not self._future.done():
            self._cancel.set()                 # a failed compile need not wait for the weights
        if self._future is not None:
            with contextlib.suppress(BaseException):
                self._future.result()          # never remove a folder under the writer
        shutil.rmtree(self.tmp, ignore_errors=True)


def begin_save(cap: Captured, example_inputs, out_dir) -> PendingSave:
    """Check ``out_dir`` and the disk, make the temporary folder beside it and start
    writing the captured program's weights there in a background thread (an
    unchanged weights.bin of the folder being replaced, or of a recently saved
    folder, is linked instead: weights.write, recent_folders.py). Raises as
    ``save`` does, before anything is written."""
    out = Path(out_dir)
    check_out_dir(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise CutlassOffloadError(f"cannot create {out}: a part of {out.parent} is a file, not a "
                                  "folder; pass another out_dir (--out)") from None
    size = _bytes_to_save(cap, example_inputs)
    need = size + _MARGIN
    st = os.statvfs(out.parent)
    why = ("on a read-only file system" if st.f_flag & os.ST_RDONLY else  # no free space, not "disk full"
           "not on a disk file system (it reports no blocks)" if st.f_blocks == 0 else
           "not writable by this user" if not os.access(out.parent, os.W_OK | os.X_OK) else None)
    if why:
        raise CutlassOffloadError(f"cannot write {out}: {out.parent} is {why}; pass another out_dir (--out)")
    if st.f_bavail * st.f_frsize < need:
        raise DiskFullError(out, f"the folder needs about {size / 2**20:.1f} MiB, plus "
                                 f"{_MARGIN / 2**20:.0f} MiB kept free for the library and the "
                                 f"program, and "
                                 f"{st.f_bavail * st.f_frsize / 2**20:.0f} MiB are free; {_hint(out)}")
    # temporary folders of saves killed before they swapped in (an hour untouched: no save is that long)
    remove_stale(out.parent, f".{glob.escape(out.name)}.tmp-*", 3600)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as e:            # what os.access did not foresee
        raise CutlassOffloadError(f"cannot write {out}: {e.strerror}; pass another out_dir (--out)") from None
    tmp.chmod(0o777 & ~_umask())     # mkdtemp's 0700 would become the folder's
    parts = weights.split(cap.exported)
    if parts is not None and not parts[1]:
        parts = None             # no tensors: nothing to put beside the program
    if parts is None:          # or tensors weights.bin cannot hold: torch's archive holds them
        return PendingSave(out, tmp, cap.exported, False, None)
    cancel = threading.Event()
    pool = ThreadPoolExecutor(1, thread_name_prefix="co-weights")
    previous = [_previous_weights(f) for f in [out, *recent_folders.recent(out)]]
    future = pool.submit(weights.write, parts[1], tmp, [p for p in previous if p[0] is not None],
                         cancel=cancel)
    pool.shutdown(wait=False)
    return PendingSave(out, tmp, parts[0], True, future, cancel)


def _hint(out: Path) -> str:
    return f"free space there, or pass another out_dir (--out); {out} was not changed"


def save(compiled: CompiledModel, cap: Captured, example_inputs, options: CompileOptions, out_dir,
         glue: GlueSpec | None = None, pending: PendingSave | None = None):
    """Write the artifacts of a compile to out_dir, atomically (rename into place),
    with every file's size and sha256 in manifest.json (written last).
    ``glue``: the glue choice saved for ``load`` (default: "auto"). ``pending``: the
    ``begin_save`` of this capture and out_dir (None: begun here).

    Raises CutlassOffloadError for an out_dir that may not be replaced
    (``check_out_dir``), DiskFullError when the disk has no room for the folder
    (checked first: torch's archive writer aborts the process when a write fails
    at its end); out_dir is unchanged then.
    """
    started = time.perf_counter()
    out = Path(out_dir)
    pending = pending if pending is not None else begin_save(cap, example_inputs, out)
    tmp = pending.tmp
    try:
        try:
            _write_folder(pending, compiled, example_inputs, options, glue, save_started=started)
        except OSError as e:
            if integrity.is_disk_full(e):
                raise integrity.disk_full(e, out, _hint(out)) from e
            raise
        except RuntimeError as e:          # torch's writers report a failed write so
            st = os.statvfs(tmp)
            if st.f_bavail * st.f_frsize < _MARGIN:
                raise DiskFullError(out, f"{_hint(out)} ({str(e).splitlines()[0][:200]})") from e
            raise
        check_out_dir(out)             # still ours to replace (another process may have written)
        _swap_into_place(tmp, out)
        if pending.weighted:
            recent_folders.remember(out)     # a later save of the same weights may link them
    finally:
        pending.discard()              # after the swap: the replaced folder, if any


_canonical_lock = threading.Lock()
_canonical_skips = 0        # saves inside _no_canonical_form_check now
_canonical_real = None      # torch's canonicalize while they run


@contextlib.contextmanager
def _no_canonical_form_check():
    """While inside: torch's serializer skips its self-test of the canonical form.
    ``ExportedProgramSerializer.serialize`` calls ``canonicalize`` on the program it
    has just serialized ("Test canonical form is well defined") and drops the result;
    its deepcopy of that program is most of torch.export.save's time (sd-unet's
    program on the 2-core machine: 1.91 s with it, 0.58 s without; the archives are
    byte-identical, tests/unit/test_program_save.py). The stand-in returns the program
    unchanged, so a torch that did use the result would save it uncanonicalized,
    which still loads. Nested and concurrent uses are counted; the last one out
    restores torch's function."""
    global _canonical_skips, _canonical_real
    serde = getattr(getattr(torch, "_export", None), "serde", None)
    mod = getattr(serde, "serialize", None)
    if mod is None or not callable(getattr(mod, "canonicalize", None)):
        yield
        return
    with _canonical_lock:
        if _canonical_skips == 0:
            _canonical_real = mod.canonicalize
            mod.canonicalize = lambda ep, *args, **kwargs: ep
        _canonical_skips += 1
    try:
        yield
    finally:
        with _canonical_lock:
            _canonical_skips -= 1
            if _canonical_skips == 0:
                mod.canonicalize = _canonical_real


def save_program(program: torch.export.ExportedProgram, path: Path) -> None:
    """``torch.export.save(program, path)`` without torch's canonical-form self-test
    (``_no_canonical_form_check``)."""
    with _no_canonical_form_check():
        torch.export.save(program, str(path))


_hints_lock = threading.Lock()


def load_exported(path) -> torch.export.ExportedProgram:
    """``torch.export.load(path)``, with ``typing.get_type_hints`` memoized while it
    runs: torch's deserializer asks for the type hints of the same few schema
    dataclasses once per field of every node (sd-unet's program: about 38700 calls
    for 21 classes), which took a third of the load on the 2-core machine (6.2-7.0 s
    plain, 4.7-6.2 s memoized, interleaved). Only torch's serializer module sees the
    memoized function, and only for this call (one load at a time); a torch whose
    serializer no longer reads ``typing`` through its module global gets a plain
    load. Raises what ``torch.export.load`` raises."""
    try:
        from torch._export.serde import serialize
    except ImportError:
        serialize = None
    if getattr(serialize, "typing", None) is not typing:
        return torch.export.load(str(path))
    cache = {}

    def get_type_hints(obj, globalns=None, localns=None, include_extras=False):
        key = (obj, id(globalns), id(localns), include_extras)
        try:
            return cache[key]
        except KeyError:
            pass
        except TypeError:            # an unhashable obj: not cached
            return typing.get_type_hints(obj, globalns, localns, include_extras)
        hints = cache[key] = typing.get_type_hints(obj, globalns, localns, include_extras)
        return hints

    shim = types.ModuleType("typing")
    shim.__dict__.update(vars(typing))
    shim.get_type_hints = get_type_hints
    with _hints_lock:
        serialize.typing = shim
        try:
            return torch.export.load(str(path))
        finally:
            serialize.typing = typing


def _umask() -> int:
    """This process's umask, read without changing it (Linux); else 022."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _previous_weights(out: Path) -> tuple:
    """(path, manifest record) of weights.bin in an earlier saved folder (the one a
    save replaces, or a recent one), or (None, None); nothing here is trusted:
    weights.write checks the bytes."""
    try:
        record = json.loads((out / MANIFEST).read_text())["files"][weights.BIN]
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    return out / weights.BIN, record


def _write_folder(pending: PendingSave, compiled, example_inputs, options, glue,
                  save_started: float | None = None) -> None:
    tmp = pending.tmp
    # the program while weights.bin is written beside it (both release the GIL in writes)
    save_program(pending.program, tmp / "model.pt2")
    pending.wait()
    torch.save(tuple(example_inputs), tmp / "inputs.pt")
    glue_cache = glue_binaries.save_cache_artifacts(compiled, tmp)
    kernel_files = glue_binaries.kernel_files_for(compiled)   # read once: the tar and the manifest
    glue_bin = glue_binaries.save_for(compiled, tmp, kernel_files)  # the C++ wrapper Inductor compiled
    if compiled.library_path:
        shutil.copy2(compiled.library_path, tmp / build_stage.LIB_NAME)
        (tmp / "src").mkdir()
        for unit in compiled.report.build.get("units", []):   # every source, for inspection
            if unit.get("source") and os.path.exists(unit["source"]):
                shutil.copy2(unit["source"], tmp / "src" / f"{unit['name']}.{Path(unit['source']).parent.name.split('.')[-1]}.cu")
    files = integrity.records(tmp, skip={MANIFEST})
    # the report last, so that its phases hold the save's seconds (all but hashing
    # the report itself and writing the manifest)
    report = compiled.report.to_dict()
    if save_started is not None:
        report["phases"] = {**report.get("phases", {}), "save": time.perf_counter() - save_started}
    (tmp / REPORT).write_text(json.dumps(report, indent=1))
    files[REPORT] = integrity.record(tmp / REPORT)
    manifest = {"format": FOLDER_FORMAT, "options": asdict(options),
                "fingerprint": _fingerprint(compiled.plan),
                "tuned": compiled.report.tuning.get("winners", {}),
                "torch": torch.__version__, "glue": (glue or GlueSpec()).to_json(),
                "weights": weights.INDEX if pending.weighted else None,
                "glue_cache": glue_cache, "glue_binaries": glue_bin,
                "glue_kernel_files": kernel_files}
    manifest["save_id"] = uuid.uuid4().hex     # tells a loader that the folder changed
    manifest["files"] = dict(sorted(files.items()))
    manifest["checksum"] = _manifest_checksum(manifest)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))


GLUE_CACHE = glue_binaries.GLUE_CACHE


def _swap_into_place(new: Path, out: Path) -> None:
    """Make ``new`` the folder ``out``; afterwards ``new`` holds the old one, if any.

    Linux: one renameat2(RENAME_EXCHANGE), so ``out`` is never missing for a process
    loading it (man 2 rename). Elsewhere: the old folder is renamed aside first (a
    short window where ``out`` is absent; ``load`` retries).
    """
    for _ in range(3):
        if out.exists() and _rename_exchange(new, out):
            return
        if out.exists():
            aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, aside / "old")
            os.replace(new, out)
            os.replace(aside / "old", new)
            aside.rmdir()
            return
        try:
            os.replace(new, out)
            return
        except OSError as e:
            # another process's folder appeared at out meanwhile: exchange with it
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    os.replace(new, out)


def _rename_exchange(a: Path, b: Path) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2           # <fcntl.h>, <linux/fs.h>
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def no_folder_message(out: Path) -> str:
    """What to tell a user whose ``out`` holds no output folder."""
    if not out.exists():
        return f"{out} does not exist: run `cutlass-offload compile MODEL --out {out}` first"
    inside = sorted(str(m.parent) for m in out.glob(f"*/{MANIFEST}"))[:5] if out.is_dir() else []
    if inside:       # a parent of output folders, e.g. "out" for "out/mlp"
        return (f"{out} is not an output folder itself (no manifest.json), but holds "
                f"{', '.join(inside)}: pass one of them")
    return (f"{out} is not a complete cutlass-offload output folder (no manifest.json): "
            "run `cutlass-offload compile` first")


def check_folder(out_dir) -> dict:
    """Check every file of an output folder before anything of it is used; return
    its manifest.

    Folders saved since manifests record files: each file's size and sha256 (the
    library is hashed before the dynamic loader sees it), and the manifest's own
    checksum. Folders saved before (no "files" in the manifest) still load, with
    the checks that cost no record: the manifest and report parse, model.pt2 and
    inputs.pt are whole zip archives (their CRCs), the library's ELF headers and
    segments lie inside the file (a truncated library would kill the process with
    SIGBUS in dlopen).
    Raises CutlassOffloadError when out_dir is no output folder (no manifest.json),
    DamagedFileError naming the first damaged file and the fix.
    """
    out = Path(out_dir)
    path = out / MANIFEST
    if not path.is_file():
        raise CutlassOffloadError(no_folder_message(out))
    return _checked(out, path.read_text(errors="replace"))


class FileChecks:
    """Checks of some of a folder's files against their records, run while the loader
    does work that reads none of them (sd-unet's 1.7 GB of weights hash beside the
    program's deserialization): a background thread waits for a child process that
    hashes (integrity.chunk_digests ``in_child``). ``wait()`` returns once all pass
    and raises the first one's DamagedFileError; nothing of those files may be read
    before it returns."""

    def __init__(self, jobs: list, fix: str):
        self._jobs, self._fix, self._error, self._thread = jobs, fix, None, None
        if jobs:
            self._thread = threading.Thread(target=self._run, name="cutlass_offload-check",
                                            daemon=True)
            self._thread.start()

    def _run(self):
        try:
            for path, rec in self._jobs:
                integrity.check(path, rec, self._fix, in_child=True)
        except BaseException as e:  # noqa: BLE001 - raised by wait() on the loader's thread
            self._error = e

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error


def _checked(out: Path, text: str) -> dict:
    """The manifest parsed from ``text`` after checking it and the folder's files."""
    manifest, later = _checked_later(out, text, ())
    later.wait()
    return manifest


def _parsed_manifest(out: Path, text: str) -> dict:
    """The manifest parsed from ``text`` (``out``'s), checked itself: JSON, format,
    checksum, the keys load needs. Raises DamagedFileError / CutlassOffloadError."""
    path = out / MANIFEST
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise DamagedFileError(path, "is empty" if not text.strip() else f"is not valid JSON ({e})",
                               _fix(out)) from None
    if not isinstance(manifest, dict):
        raise DamagedFileError(path, "is not a JSON object", _fix(out))
    fmt = manifest.get("format", 1)          # first: a newer format may check otherwise
    if isinstance(fmt, int) and fmt > FOLDER_FORMAT:
        raise CutlassOffloadError(f"{out} was saved in folder format {fmt} by a newer "
                                  f"cutlass_offload; this one reads formats 1-{FOLDER_FORMAT}: "
                                  "upgrade it, or compile the model again with this one")
    if "checksum" in manifest and manifest["checksum"] != _manifest_checksum(manifest):
        raise DamagedFileError(path, "is corrupted (its checksum does not match its content)", _fix(out))
    if not isinstance(fmt, int):
        raise DamagedFileError(path, f"has a format that is not a number ({fmt!r})", _fix(out))
    missing = [k for k in ("options", "fingerprint") if k not in manifest]
    if missing:
        raise DamagedFileError(path, f"lacks {', '.join(missing)}", _fix(out))
    files = manifest.get("files")
    if manifest.get("weights") is not None and not isinstance(files, dict):
        raise DamagedFileError(path, "names a weights file but records no files", _fix(out))
    return manifest


def read_manifest(out_dir) -> dict:
    """An output folder's manifest, itself checked (JSON, format, checksum, the keys
    load needs), none of the other files: for what must be known before a load
    (e.g. the target arch), which then checks every file.
    Raises CutlassOffloadError when out_dir is no output folder, DamagedFileError
    for a damaged manifest."""
    out = Path(out_dir)
    path = out / MANIFEST
    if not path.is_file():
        raise CutlassOffloadError(no_folder_message(out))
    return _parsed_manifest(out, path.read_text(errors="replace"))


def _checked_later(out: Path, text: str, later) -> tuple:
    """(manifest, FileChecks): ``_checked``, but the recorded files named in ``later``
    are checked in the background (FileChecks); every other file is checked now."""
    manifest = _parsed_manifest(out, text)
    files = manifest.get("files")
    if isinstance(files, dict):
        for name in (build_stage.LIB_NAME, "model.pt2", "inputs.pt", "report.json",
                     weights.INDEX, weights.BIN, GLUE_CACHE):
            if name in files and name not in later:   # the files load uses first, then the sources
                integrity.check(out / name, files[name], _fix(out))
        for name, rec in files.items():
            if name not in later:
                integrity.check(out / name, rec if isinstance(rec, dict) else {}, _fix(out))
        return manifest, FileChecks([(out / name, rec if isinstance(rec, dict) else {})
                                     for name, rec in files.items() if name in later], _fix(out))
    # a folder saved before files were recorded (format 1)
    for name in ("model.pt2", "inputs.pt"):
        p = out / name
        try:
            with zipfile.ZipFile(p) as z:
                bad = z.testzip()
        except FileNotFoundError:
            raise DamagedFileError(p, "is missing", _fix(out)) from None
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            raise DamagedFileError(p, f"is not a complete archive ({e})", _fix(out)) from None
        if bad is not None:
            raise DamagedFileError(p, f"is corrupted (its record {bad} fails its CRC)", _fix(out))
    try:
        json.loads((out / "report.json").read_text())
    except FileNotFoundError:
        raise DamagedFileError(out / "report.json", "is missing", _fix(out)) from None
    except ValueError as e:
        raise DamagedFileError(out / "report.json", f"is not valid JSON ({e})", _fix(out)) from None
    lib = out / build_stage.LIB_NAME
    if manifest["fingerprint"] or lib.exists():
        why = integrity.elf_problem(lib)
        if why is not None:
            raise DamagedFileError(lib, why, _fix(out))
    return manifest, FileChecks([], _fix(out))
