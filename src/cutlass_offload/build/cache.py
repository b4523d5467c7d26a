"""Content-addressed build cache with atomic publish.

An entry is a folder ``<root>/<kind>/<prefix>.<hash16>/`` holding the artifact and
``meta.json``; the metadata file is written last and is the commit marker, so a
folder without it (a killed build) is ignored and rebuilt. Writers build in a
private temporary folder, then rename it into place under a per-key file lock
(double-checked), so concurrent processes never see half an entry.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from filelock import FileLock

from ..config import knobs

META = "meta.json"


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
        """The committed entry folder, or None. An entry whose meta is missing or
        corrupt, or whose artifact size differs from the recorded one, is a miss."""
        d = self.entry_dir(kind, prefix, key)
        try:
            meta = json.loads((d / META).read_text())
            if meta.get("key") != key:
                return None
            if meta.get("ok", True) and (d / artifact).stat().st_size != meta.get("size"):
                return None
            return d, meta
        except (OSError, ValueError):
            return None

    def lock(self, kind: str, prefix: str, key: str) -> FileLock:
        d = self.root / kind
        d.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d / f"{prefix}.{key[:16]}.lock"))

    def publish(self, kind: str, prefix: str, key: str, staging: Path, artifact: str | None,
                meta: dict) -> Path:
        """Move a finished staging folder into place (caller holds the lock)."""
        final = self.entry_dir(kind, prefix, key)
        meta = dict(meta, key=key, created=time.time())
        if artifact:
            meta["size"] = (staging / artifact).stat().st_size
        tmp_meta = staging / (META + ".tmp")
        tmp_meta.write_text(json.dumps(meta, indent=1))
        if final.exists():
            shutil.rmtree(final)          # a half entry left by a killed build
        os.replace(staging, final)
        os.replace(final / (META + ".tmp"), final / META)
        return final

    def staging(self, kind: str) -> Path:
        d = self.root / kind
        d.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".staging-", dir=d))

    def info(self) -> dict:
        entries, size = 0, 0
        if self.root.exists():
            for meta in self.root.glob("*/*/" + META):
                entries += 1
                size += sum(f.stat().st_size for f in meta.parent.iterdir() if f.is_file())
        return {"root": str(self.root), "entries": entries, "bytes": size}

    def clear(self) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
