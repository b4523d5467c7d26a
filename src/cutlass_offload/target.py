"""Compile targets, one row each: the name the pipeline uses, the names a user may
type, nvcc's gencode, the SM count kernel choice assumes without a GPU, and which
GPUs can run the code. A leaf module (imports nothing from the pipeline).

SM counts: 132 on H100 / H200 SXM, 108 on A100 (NVIDIA's datasheets). Runs on:
sm_90a code only on compute capability 9.0 (arch-specific features: wgmma, TMA);
sm_80 SASS on any 8.x (CUDA binary compatibility within a major version).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Target:
    arch: str                   # "sm90a" / "sm80": the pipeline's name
    name: str                   # as the user types it and the report prints it
    aliases: tuple              # other accepted spellings
    gencode: str                # nvcc flag
    num_sms: int                # default SM count for tile choice without a GPU
    runs_on: Callable           # (major, minor) -> bool


TARGETS = {
    # sm_90 is accepted for sm_90a: on Hopper only the arch-specific target has wgmma/TMA
    "sm90a": Target("sm90a", "sm_90a", ("sm90a", "sm_90a", "sm90", "sm_90"),
                    "-gencode=arch=compute_90a,code=sm_90a", 132, lambda cc: tuple(cc) == (9, 0)),
    # sm_86 / sm_87 / sm_89 (A10, L4, RTX 30 / 40, Orin) run the sm_80 SASS: accepted as it
    "sm80": Target("sm80", "sm_80", ("sm80", "sm_80", "sm86", "sm_86", "sm87", "sm_87", "sm89", "sm_89"),
                   "-gencode=arch=compute_80,code=sm_80", 108, lambda cc: cc[0] == 8),
}

ALIASES = {alias: t.arch for t in TARGETS.values() for alias in t.aliases}


def for_capability(cc) -> str | None:
    """The target a GPU of compute capability ``cc`` (major, minor) runs, or None."""
    for t in TARGETS.values():
        if t.runs_on(tuple(cc)):
            return t.arch
    return None
