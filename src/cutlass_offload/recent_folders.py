"""The output folders this cache's compiles saved last, so that a save into a new
folder can hard-link an earlier folder's weights.bin when it holds the very bytes
(weights.write ``previous``) instead of writing them again: a warm recompile of the
same model into a fresh folder (sd-unet: 1.72 GB of weights) then writes no weights.

The list is ``<cache_dir>/weights/recent_folders.json``: {"format": 1, "folders":
[absolute folder path, ...]}, newest first, at most ``KEEP``. It holds paths only:
nothing in it is trusted (a candidate's record is read from its own manifest, and
weights.write compares the bytes, in memory and on the linked file), and it keeps
no file alive (a deleted folder frees its disk; its path is dropped when seen gone).
A damaged or unreadable list is treated as empty and rewritten. Linking needs one
file system; across file systems the weights are written as before.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from filelock import FileLock, Timeout

from .config import knobs
from .weights import BIN

FILE = "recent_folders.json"
FORMAT = 1
KEEP = 8          # folders remembered (newest first)
CANDIDATES = 4    # recent folders a save offers (each costs a manifest read)


def _path() -> Path:
    return knobs().cache_dir / "weights" / FILE


def _read(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    folders = data.get("folders") if isinstance(data, dict) and data.get("format") == FORMAT else None
    return [f for f in folders if isinstance(f, str)] if isinstance(folders, list) else []


def recent(exclude: Path) -> list:
    """Up to CANDIDATES recently saved folders (Paths, newest first), ``exclude`` left
    out; the caller reads each one's manifest (folder.py)."""
    exclude = Path(exclude).absolute()
    return [Path(f) for f in _read(_path()) if Path(f) != exclude][:CANDIDATES]


def remember(out: Path) -> None:
    """Put ``out`` (a folder just saved with a weights.bin) first in the list, dropping
    folders that are gone. Best effort: a busy lock or an unwritable cache skips it."""
    path = _path()
    out = str(Path(out).absolute())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock", timeout=2):
            folders = [out] + [f for f in _read(path) if f != out and os.path.isfile(os.path.join(f, BIN))]
            tmp = path.with_name(f"{FILE}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"format": FORMAT, "folders": folders[:KEEP]}))
            os.replace(tmp, path)
    except (OSError, Timeout):
        pass
