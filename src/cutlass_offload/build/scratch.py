"""Scratch folders under the system temp dir that a killed process does not leak.

A build's intermediates (nvcc's steps: about 24 MB per unit, a Ray task's unit and
object, a tuning run's requests) live in a folder named ``<prefix><pid>_<random>``
that the context manager removes; kill -9 skips that. So each new scratch folder
first removes the ones of processes that no longer exist, once they are older than
``MIN_AGE_S``: a PID that was reused, or a live build seen from another PID
namespace (a /tmp shared between containers), keeps its folder until then, and no
compile leaves its folder untouched that long. Folders of older versions (no PID in
the name) go after ``cache.STALE_SECONDS``.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from .cache import STALE_SECONDS

MIN_AGE_S = 3600.0


@contextmanager
def scratch_dir(prefix: str):
    """A new folder ``<tmp>/<prefix><pid>_<random>`` (yielded as a str), removed on
    exit; dead processes' folders of the same prefix are removed first (``sweep``)."""
    root = Path(tempfile.gettempdir())
    sweep(root, prefix)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}_", dir=root)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep(root: Path, prefix: str, now: float | None = None) -> list:
    """Remove the folders ``<root>/<prefix>*`` that a dead process left (see the
    module docstring); returns their paths. Never raises for a folder it cannot
    read or remove (another user's, one removed meanwhile)."""
    now = time.time() if now is None else now
    removed = []
    for p in root.glob(prefix + "*"):
        pid = _pid(p.name[len(prefix):])
        if pid is not None and (pid == os.getpid() or _alive(pid)):
            continue
        try:
            age = now - p.stat().st_mtime
            if not p.is_dir() or age < (MIN_AGE_S if pid is not None else STALE_SECONDS):
                continue
            shutil.rmtree(p)
            removed.append(p)
        except OSError:
            continue
    return removed


def _pid(rest: str) -> int | None:
    head, sep, _ = rest.partition("_")
    return int(head) if sep and head.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                  # EPERM: it exists, as another user
        return True
    return True
