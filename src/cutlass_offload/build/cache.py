"""Content-addressed build cache with atomic publish.

An entry is a folder ``<root>/<kind>/<prefix>.<hash16>/`` holding the artifact and
``meta.json``; the metadata file is written last and is the commit marker, so a
folder without it (a killed build) is ignored and rebuilt. Writers build in a
private temporary folder, then rename it into place under a per-key file lock
(double-checked), so concurrent processes never see half an entry.

The metadata records the size and sha256 of every file of the entry; a lookup
checks them, so an entry damaged afterwards (a truncated or corrupted object or
library, a full disk, a stray write) is a miss with a warning naming it, and is
rebuilt instead of linked or loaded.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

from filelock import FileLock

from .. import integrity
from ..config import knobs

META = "meta.json"
_warned = set()        # (entry, problem): each damaged entry is named once per process


class DamagedCacheEntryWarning(UserWarning):
    """A build cache entry failed its size / sha256 check and is rebuilt."""


DISK_FULL_HINT = ("free space there, or point CUTLASS_OFFLOAD_CACHE_DIR at a disk with room "
                  "(`cutlass-offload cache clear` removes its entries); nothing was cached")


# The folders cutlass_offload writes under a cache root (build/, tune/cache.py,
# runtime/fast_call.py, recent_folders.py): all that ``BuildCache.clear`` removes.
PARTS = ("obj", "lib", "index", "failed", "tuning", "fast_call", "weights")

# a staging folder untouched this long belongs to a killed process (no compile runs a day)
STALE_SECONDS = 24 * 3600


def remove_stale(folder: Path, pattern: str, age: float) -> None:
    """Remove the folders matching ``pattern`` in ``folder`` not modified for ``age``
    seconds: what processes killed while writing (kill -9, power loss) left behind."""
    now = time.time()
    for p in folder.glob(pattern):
        try:
            if now - p.stat().st_mtime > age:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def cache_key(*parts: str) -> str:
    """sha256 over the parts (source text, command, tool versions, ...)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


class BuildCache:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else knobs().cache_dir

    def entry_dir(self, kind: str, prefix: str, key: str) -> Path:
        return self.root / kind / f"{prefix}.{key[:16]}"

    def lookup(self, kind: str, prefix: str, key: str, artifact: str):
        """(entry folder, meta) of the committed entry, or None. An entry whose meta
        is missing or corrupt (a build killed before it committed) is a miss; one
        whose files differ from their recorded size or sha256 is a miss with a
        DamagedCacheEntryWarning naming it (its rebuild replaces it)."""
        d = self.entry_dir(kind, prefix, key)
        try:
            meta = json.loads((d / META).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("key") != key:
            return None
        why = self._damage(d, meta, artifact)
        if why is not None:
            if (str(d), why) not in _warned:
                _warned.add((str(d), why))
                warnings.warn(f"cutlass_offload: build cache entry {d} is damaged ({why}); it is not "
                              "used and is compiled again", DamagedCacheEntryWarning, stacklevel=3)
            return None
        return d, meta

    @staticmethod
    def _damage(d: Path, meta: dict, artifact: str) -> str | None:
        files = meta.get("files")
        if isinstance(files, dict):
            if meta.get("ok", True) and artifact not in files:
                return f"{artifact} is not recorded"
            for name, rec in files.items():
                why = integrity.problem(d / name, rec if isinstance(rec, dict) else {})
                if why is not None:
                    return f"{name} {why}"
            return None
        # an entry written before files were recorded: its artifact's size, and an
        # ELF check (a truncated object or library passes no further than this)
        if not meta.get("ok", True):
            return None
        why = integrity.problem(d / artifact, {"size": meta.get("size", -1)})
        if why is None and artifact.endswith((".o", ".so")):
            why = integrity.elf_problem(d / artifact)
        return None if why is None else f"{artifact} {why}"

    def lock(self, kind: str, prefix: str, key: str) -> FileLock:
        d = self.root / kind
        d.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d / f"{prefix}.{key[:16]}.lock"))

    def publish(self, kind: str, prefix: str, key: str, staging: Path, artifact: str | None,
                meta: dict) -> Path:
        """Move a finished staging folder into place (caller holds the lock), with
        the size and sha256 of each of its files in the meta.

        Raises DiskFullError when the disk fills meanwhile; then no entry is left
        (the caller removes the staging folder).
        """
        final = self.entry_dir(kind, prefix, key)
        meta = dict(meta, key=key, created=time.time())
        moved = False
        try:
            meta["files"] = integrity.records(staging)
            if artifact:
                meta["size"] = meta["files"][artifact]["size"]     # read by older versions
            tmp_meta = staging / (META + ".tmp")
            tmp_meta.write_text(json.dumps(meta, indent=1))
            if final.exists():
                shutil.rmtree(final)          # a half or damaged entry
            os.replace(staging, final)
            moved = True
            os.replace(final / (META + ".tmp"), final / META)
        except OSError as e:
            if moved:                         # not committed: leave no half entry
                shutil.rmtree(final, ignore_errors=True)
            if integrity.is_disk_full(e):
                raise integrity.disk_full(e, final, DISK_FULL_HINT) from e
            raise
        return final

    def write_index(self, filename: str, record: dict) -> None:
        """Write ``index/<filename>`` (which unit holds a kernel) whole: a temporary
        file renamed into place."""
        path = self.root / "index" / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)

    def staging(self, kind: str) -> Path:
        d = self.root / kind
        d.mkdir(parents=True, exist_ok=True)
        remove_stale(d, ".staging-*", STALE_SECONDS)
        return Path(tempfile.mkdtemp(prefix=".staging-", dir=d))

    def info(self) -> dict:
        """root; entries (committed obj + lib entries, failures included) and their
        bytes; by kind: compiled units (obj, built), libraries (lib), failed (entries of
        units that failed to compile, cached), index records; kept_failures (folders under
        failed/: interrupted or toolchain-failed builds, kept for a look, not cached);
        disk_bytes: every file under the
        cache's folders (PARTS: tuning, the C++ call path's builds, kept failures too)."""
        out = {"root": str(self.root), "entries": 0, "bytes": 0, "compiled_units": 0,
               "libraries": 0, "failed": 0, "index_records": 0, "kept_failures": 0, "disk_bytes": 0}
        if not self.root.is_dir():
            return out
        for meta in self.root.glob("*/*/" + META):
            out["entries"] += 1
            out["bytes"] += sum(f.stat().st_size for f in meta.parent.iterdir() if f.is_file())
            try:
                ok = json.loads(meta.read_text()).get("ok", True)
            except (OSError, ValueError):
                ok = False
            kind = meta.parent.parent.name
            if not ok:
                out["failed"] += 1
            elif kind in ("obj", "lib"):
                out["compiled_units" if kind == "obj" else "libraries"] += 1
        out["index_records"] = sum(1 for _ in (self.root / "index").glob("*.json"))
        # sources and logs of builds that were interrupted or that the toolchain failed:
        # kept under failed/, not cached as failures (the next build compiles them again)
        kept = self.root / "failed"
        out["kept_failures"] = sum(1 for d in kept.iterdir() if d.is_dir()) if kept.is_dir() else 0
        for part in PARTS:
            for f in (self.root / part).rglob("*"):
                try:
                    if f.is_file() and not f.is_symlink():
                        out["disk_bytes"] += f.stat().st_size
                except OSError:
                    pass
        return out

    def clear(self) -> list:
        """Remove what cutlass_offload writes under the root (``PARTS``) and nothing else:
        the root may be any folder a user named in CUTLASS_OFFLOAD_CACHE_DIR, even one
        holding their own files (a fresh-user trial, session 50, pointed it at a folder of
        documents, which the old ``rmtree`` of the root deleted). The root itself goes
        only when that leaves it empty. Returns the removed paths."""
        removed = []
        if not self.root.is_dir():
            return removed
        for name in PARTS:
            p = self.root / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
                removed.append(p)
        try:
            self.root.rmdir()           # only if nothing else is in it
        except OSError:
            pass
        return removed
