"""The persistent tuning cache: profiled GEMM winners by problem, GPU and CUTLASS.

One JSON file per (arch, GPU) under ``<cache_dir>/tuning/`` holding
``{"version": SCHEMA, "entries": {key: record}}``. The key is a sha256 over
everything that can change which kernel is fastest or whether it runs at all:
the problem (``select.tuning_id``: op, M/N/K/batch at the example size, dtypes,
layouts, alignments, epilogue), the arch, the CUTLASS version (headers hash
included, build/toolchain.py), the GPU name and SM count, and ``SCHEMA`` (bumped
when the candidate set or the record layout changes). A record holds the
winner's KernelConfig, the heuristic's tag and every candidate's result.

Writers merge under a file lock and publish with an atomic rename, so readers
(who take no lock) see the old file or the new one, never half of one; a
corrupt file reads as empty and is rewritten by the next store.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from filelock import FileLock

from ..config import knobs

SCHEMA = 2          # 2: the SPACE search, launch knobs in records (winner_launch)


def tuning_key(tuning_id: str, arch: str, cutlass_version: str, gpu: str, num_sms: int) -> str:
    """sha256 hex of the canonical JSON of every input that decides a winner."""
    text = json.dumps({"problem": json.loads(tuning_id), "arch": arch, "cutlass": cutlass_version,
                       "gpu": gpu, "num_sms": num_sms, "schema": SCHEMA}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower() or "gpu"


class TuningCache:
    """root: the tuning folder (default ``knobs().cache_dir / "tuning"``)."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else knobs().cache_dir / "tuning"

    def path(self, arch: str, gpu: str) -> Path:
        return self.root / f"{arch}_{_slug(gpu)}.json"

    def _read(self, path: Path) -> dict:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("version") != SCHEMA:
            return {}
        entries = data.get("entries")
        return entries if isinstance(entries, dict) else {}

    def lookup(self, arch: str, gpu: str, key: str) -> dict | None:
        """The stored record for ``key``, or None."""
        rec = self._read(self.path(arch, gpu)).get(key)
        return rec if isinstance(rec, dict) else None

    def store(self, arch: str, gpu: str, records: dict) -> Path:
        """Merge ``records`` ({key: record}) into the file, atomically. Returns its path.

        Raises OSError when the folder cannot be written (the compile goes on
        without caching: see tune.tune)."""
        path = self.path(arch, gpu)
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            entries = self._read(path)
            entries.update(records)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"version": SCHEMA, "entries": entries}, f, indent=1, sort_keys=True)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return path
