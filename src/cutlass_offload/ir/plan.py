"""The partitioner's result and the plan: regions with their chosen kernels."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fallback:
    """An op that stays in PyTorch, and why (reaches the user's report)."""

    node: str
    op: str
    reason: str
    by_choice: bool = False      # left to PyTorch on purpose (a norm Inductor fuses), not refused
    nodes: tuple = ()            # a refused region's nodes: the report sums their FLOPs


@dataclass(frozen=True)
class PartitionResult:
    regions: tuple
    fallbacks: tuple


def anchor_node(region) -> str:
    """The node a Fallback of ``region`` names: its anchor op (an attention region's
    SDPA call or softmax, not a layout copy or K/V repeat before it in ``nodes``), else
    its first node."""
    return getattr(region, "anchor", "") or region.nodes[0]


@dataclass(frozen=True)
class Plan:
    """Regions with their chosen kernel instantiation: ``pairs`` (region, kernel);
    ``regions`` and ``kernels`` are its two columns (equal lengths, checked);
    ``distinct_kernels`` deduplicates the kernels by name.

    Raises ValueError when the columns differ in length."""

    arch: str
    regions: tuple           # GemmRegion | ConvRegion | AttentionRegion | NormRegion | GroupNormRegion
    kernels: tuple           # the kernel chosen for each region, in the same order
    fallbacks: tuple

    def __post_init__(self):
        if len(self.regions) != len(self.kernels):
            raise ValueError(f"a Plan pairs each region with its kernel: {len(self.regions)} "
                             f"regions, {len(self.kernels)} kernels")

    @classmethod
    def from_pairs(cls, arch: str, pairs, fallbacks=()) -> "Plan":
        """The Plan of ``pairs`` ((region, kernel), ...)."""
        pairs = tuple(pairs)
        return cls(arch, tuple(r for r, _ in pairs), tuple(k for _, k in pairs), tuple(fallbacks))

    @property
    def pairs(self) -> tuple:
        """((region, kernel), ...) in region order."""
        return tuple(zip(self.regions, self.kernels))

    def keep(self, predicate, fallback_reason) -> "Plan":
        """The Plan of the pairs where ``predicate(region, kernel)`` holds; every other
        region becomes a Fallback whose reason is ``fallback_reason(region, kernel)``."""
        kept = [(r, k) for r, k in self.pairs if predicate(r, k)]
        gone = tuple(Fallback(anchor_node(r), r.form, fallback_reason(r, k))
                     for r, k in self.pairs if not predicate(r, k))
        return Plan.from_pairs(self.arch, kept, self.fallbacks + gone)

    @property
    def distinct_kernels(self) -> tuple:
        seen = {}
        for k in self.kernels:
            seen.setdefault(k.name, k)
        return tuple(seen.values())
