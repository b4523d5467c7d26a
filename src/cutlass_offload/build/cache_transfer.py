"""Carry compiled kernels between machines that share no cache folder: ``export`` packs
the build cache's committed, intact objects and the kernel index into one tar file;
``import_`` publishes them into another cache (a CI artifact, a GPU box without the
compile host's disk). A kernel costs about 25 s of one core to compile and cold builds
are that cost times the distinct kernels (docs/measured.md, session 31), so a team
compiles each kernel once.

What travels: ``obj/<prefix>.<key16>/`` entries whose build succeeded and whose files
still match their recorded sizes and sha256 (BuildCache.lookup), and the
``index/<key32>.json`` records that point at them (which unit holds a kernel: how
a later build finds a kernel compiled in another unit). Failed builds, killed builds'
folders, linked libraries (relinked in a fraction of a second) and locks do not.
Entries keep their cache keys, which include the nvcc and CUTLASS versions: an entry
from another toolchain is carried but never hit.

Import is all or nothing per entry: every member name is checked before anything is
read (regular files under ``obj/`` or ``index/`` only: no links, absolute paths or
``..``; else ValueError naming the member and nothing is imported), each entry is
staged, checked against its own meta and published under the cache's per-key lock
(BuildCache.publish), so a concurrent build never sees half an entry; an entry that
fails its check is skipped and counted, one already in the cache is kept.
"""
from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import integrity
from .cache import META, BuildCache

FORMAT = "cutlass_offload-cache-export-1"
MANIFEST = "export.json"
OBJ_KIND, ARTIFACT = "obj", "unit.o"
# names start with a letter, digit or underscore: never "." or ".."
_ENTRY = re.compile(r"^obj/([A-Za-z0-9_][A-Za-z0-9_.+-]*\.[0-9a-f]{16})/([A-Za-z0-9_][A-Za-z0-9_.-]*)$")
_INDEX = re.compile(r"^index/([0-9a-f]{32})\.json$")
_MODES = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.xz": "w:xz", ".tar.bz2": "w:bz2"}


@dataclass
class Transfer:
    """What an export wrote or an import did (entry and index counts)."""

    entries: int = 0
    indexes: int = 0
    present: int = 0      # import: already in the cache, kept
    damaged: int = 0      # failed its size / sha256 check: left out (export) or skipped (import)
    bytes: int = 0

    def line(self, verb: str, path) -> str:
        extra = [f"{self.present} already cached"] if self.present else []
        extra += [f"{self.damaged} damaged, left out"] if self.damaged else []
        return (f"{verb} {self.entries} compiled units ({self.bytes / 2**20:.1f} MiB of files, "
                f"uncompressed) and {self.indexes} kernel index records "
                f"{'to' if verb == 'exported' else 'from'} {path}"
                + (f"; {', '.join(extra)}" if extra else ""))


def _mode(path: Path) -> str:
    for suffix, mode in _MODES.items():
        if path.name.endswith(suffix):
            return mode
    raise ValueError(f"{path}: name the export .tar, .tar.gz, .tgz, .tar.xz or .tar.bz2")


def export(path, cache: BuildCache | None = None) -> Transfer:
    """Write the cache's intact, successful objects and their index records to the tar
    file ``path`` (compression from its suffix), atomically: a temporary file renamed
    into place, readable as the umask allows (it is made to be shared). Raises
    ValueError for an unknown suffix, FileNotFoundError naming the folder when it
    does not exist (a mistyped path makes no folders)."""
    path, cache = Path(path), cache or BuildCache()
    mode, out = _mode(path), Transfer()
    kept = set()
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no such folder", str(path.parent))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as e:       # name the file asked for, not the temporary one beside it
        raise OSError(e.errno, e.strerror, str(path)) from e
    os.close(fd)
    try:
        with tarfile.open(tmp, mode) as tar:
            for meta_path in sorted((cache.root / OBJ_KIND).glob(f"*/{META}")):
                d = meta_path.parent
                prefix, _, key16 = d.name.rpartition(".")
                try:
                    meta = json.loads(meta_path.read_text())
                except (OSError, ValueError):
                    continue                       # not committed: a killed build
                if (not isinstance(meta, dict) or not meta.get("ok", True) or "key" not in meta
                        or not isinstance(meta.get("files"), dict)):
                    continue                       # a failure, or from before files were recorded
                if cache.lookup(OBJ_KIND, prefix, meta["key"], ARTIFACT) is None:
                    out.damaged += 1               # lookup warned, naming it
                    continue
                for f in sorted(meta["files"]) + [META]:
                    tar.add(d / f, arcname=f"{OBJ_KIND}/{d.name}/{f}", recursive=False)
                out.bytes += sum(r.get("size", 0) for r in meta["files"].values())
                kept.add(meta["key"])
                out.entries += 1
            for rec_path in sorted((cache.root / "index").glob("*.json")):
                try:
                    rec = json.loads(rec_path.read_text())
                except (OSError, ValueError):
                    continue
                arcname = f"index/{rec_path.name}"
                if isinstance(rec, dict) and rec.get("key") in kept and _INDEX.match(arcname):
                    tar.add(rec_path, arcname=arcname, recursive=False)
                    out.indexes += 1
            blob = json.dumps({"format": FORMAT, "entries": out.entries, "indexes": out.indexes}).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
        os.chmod(tmp, 0o666 & ~_umask())     # mkstemp's file is the owner's alone
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it for every
    thread meanwhile): /proc/self/status on Linux, else the common 0o022."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _check_members(tar: tarfile.TarFile, path) -> list:
    members = tar.getmembers()
    names = [m.name for m in members]
    if MANIFEST not in names:
        raise ValueError(f"{path} is not a cutlass_offload cache export (no {MANIFEST})")
    for m in members:
        if m.name == MANIFEST:
            continue
        if not m.isfile() or not (_ENTRY.match(m.name) or _INDEX.match(m.name)):
            raise ValueError(f"{path}: member {m.name!r} is not a cache file (only regular files "
                             "under obj/<unit>/ and index/ are imported); nothing was imported")
    return members


def import_(path, cache: BuildCache | None = None) -> Transfer:
    """Publish the entries of the export ``path`` into ``cache`` (see the module
    docstring). Raises ValueError for a missing or unreadable file, one that is not
    an export or one holding anything but cache files (before anything is
    imported); tarfile.TarError for an archive damaged past its member list."""
    path, cache = Path(path), cache or BuildCache()
    out = Transfer()
    try:
        tar = tarfile.open(path, "r:*")
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist") from None
    except (OSError, tarfile.TarError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0].rstrip(":")
        raise ValueError(f"{path} is not a readable tar file ({first})") from None
    with tar:
        members = _check_members(tar, path)
        manifest = json.loads(tar.extractfile(MANIFEST).read())
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError(f"{path}: export format {manifest.get('format')!r}, expected {FORMAT!r}")
        entries, indexes = {}, []
        for m in members:
            e = _ENTRY.match(m.name)
            if e:
                entries.setdefault(e.group(1), []).append((e.group(2), m))
            elif _INDEX.match(m.name):
                indexes.append(m)
        imported = set()
        for folder, files in sorted(entries.items()):
            key = _import_entry(tar, cache, folder, files, out)
            if key:
                imported.add(key)
        for m in indexes:
            rec = json.loads(tar.extractfile(m).read())
            if not (isinstance(rec, dict) and rec.get("key") in imported):
                continue
            target = cache.root / m.name
            try:
                if json.loads(target.read_text()) == rec:
                    continue                       # already there
            except (OSError, ValueError):
                pass
            cache.write_index(target.name, rec)
            out.indexes += 1
    return out


def _import_entry(tar, cache: BuildCache, folder: str, files: list, out: Transfer) -> str | None:
    """Stage, check and publish one entry; its key when it is in the cache after."""
    prefix, _, key16 = folder.rpartition(".")
    meta_member = dict(files).get(META)
    if meta_member is None:
        out.damaged += 1
        return None
    try:
        meta = json.loads(tar.extractfile(meta_member).read())
    except ValueError:
        out.damaged += 1
        return None
    key = meta.get("key") if isinstance(meta, dict) else None
    records = meta.get("files") if isinstance(meta, dict) else None
    if (not isinstance(key, str) or key[:16] != key16 or not isinstance(records, dict)
            or ARTIFACT not in records or not meta.get("ok", True)
            or set(records) != {n for n, _ in files if n != META}):
        out.damaged += 1
        return None
    if cache.lookup(OBJ_KIND, prefix, key, ARTIFACT) is not None:
        out.present += 1
        return key
    staging = cache.staging(OBJ_KIND)
    try:
        for name, m in files:
            if name != META:
                with tar.extractfile(m) as src, open(staging / name, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        if any(integrity.problem(staging / n, records[n]) for n in records):
            out.damaged += 1
            return None
        with cache.lock(OBJ_KIND, prefix, key):
            if cache.lookup(OBJ_KIND, prefix, key, ARTIFACT) is not None:
                out.present += 1               # another process imported or built it meanwhile
                return key
            kept = {k: v for k, v in meta.items() if k not in ("key", "created", "files", "size")}
            cache.publish(OBJ_KIND, prefix, key, staging, ARTIFACT, dict(kept, imported=True))
        out.entries += 1
        out.bytes += sum(r.get("size", 0) for r in records.values())
        return key
    finally:
        shutil.rmtree(staging, ignore_errors=True)
