"""The partitioner's result and the plan: regions with their chosen kernels."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fallback:
    """An op that stays in PyTorch, and why (reaches the user's report)."""

    node: str
    op: str
    reason: str


@dataclass(frozen=True)
class PartitionResult:
    regions: tuple
    fallbacks: tuple


@dataclass(frozen=True)
class Plan:
    """Regions with their chosen kernel instantiation; kernels are deduplicated."""

    arch: str
    regions: tuple           # GemmRegion | ConvRegion | NormRegion | GroupNormRegion
    kernels: tuple           # GemmKernel | ConvKernel | NormKernel | GroupNormKernel, parallel
    fallbacks: tuple

    @property
    def distinct_kernels(self) -> tuple:
        seen = {}
        for k in self.kernels:
            seen.setdefault(k.name, k)
        return tuple(seen.values())
