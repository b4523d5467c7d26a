"""Shared by the fault tests (tests/unit/test_integrity.py, test_faults.py): the
fake nvcc (fake_nvcc.py), a small model, and what must hold of a build cache and
an output folder whatever happened to the process that wrote them."""
import json
import sys
from pathlib import Path

import torch
import torch.nn as nn

TESTS = Path(__file__).resolve().parent
LIB = "libcutlass_offload.so"


def install_fake_nvcc(folder: Path) -> Path:
    """An executable ``folder/nvcc`` running fake_nvcc.py with this Python."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "nvcc"
    p.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{TESTS / "fake_nvcc.py"}" "$@"\n')
    p.chmod(0o755)
    return p


def fake_env(folder: Path, delay: float = 0.05) -> dict:
    """Environment of a build with the fake nvcc and a cache of its own under
    ``folder`` (no C++ call path build, no progress output)."""
    return {"CUTLASS_OFFLOAD_NVCC": str(install_fake_nvcc(folder)),
            "CUTLASS_OFFLOAD_CACHE_DIR": str(folder / "cache"),
            "CUTLASS_OFFLOAD_FAST_CALL": "0", "CUTLASS_OFFLOAD_PROGRESS": "off",
            "FAKE_NVCC_LOG": str(folder / "nvcc.log"), "FAKE_NVCC_DELAY": str(delay)}


def small_model(width: int = 32):
    """Two GEMM regions of two kernels (sm_80): one shard and the launchers."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width)).half()
    return model, (torch.randn(4, width, dtype=torch.float16),)


def nvcc_calls(folder: Path) -> list:
    log = folder / "nvcc.log"
    return log.read_text().splitlines() if log.exists() else []


def committed_entries(cache_root: Path) -> list:
    """(entry folder, meta, artifact name) of every committed cache entry."""
    out = []
    for meta_path in sorted(Path(cache_root).glob("*/*/meta.json")):
        kind = meta_path.parent.parent.name
        if kind not in ("obj", "lib"):
            continue
        meta = json.loads(meta_path.read_text())
        out.append((meta_path.parent, meta, "unit.o" if kind == "obj" else LIB))
    return out


def damaged_entries(cache_root: Path) -> list:
    """Committed entries whose files fail their records: must always be empty."""
    from cutlass_offload.build.cache import BuildCache
    return [(d.name, why) for d, meta, artifact in committed_entries(cache_root)
            if (why := BuildCache._damage(d, meta, artifact)) is not None]


def damage(path: Path, how: str) -> None:
    """truncate (to half), corrupt (flip one byte in the middle), empty, delete."""
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[:len(data) // 2])
    elif how == "corrupt":
        b = bytearray(data)
        b[len(b) // 2] ^= 0x5A
        path.write_bytes(bytes(b))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "delete":
        path.unlink()
    else:
        raise ValueError(how)
