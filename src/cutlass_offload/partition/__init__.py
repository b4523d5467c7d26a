"""Partition: ATen graph -> regions (the bring-your-own-codegen step).

For each anchor op of the pattern table (patterns.py: one row per op, each with
its operand reader and its kind's region maker), read its operands (refusals become
fallbacks with a reason) and let the row's maker build the region: a GEMM or conv
grows its epilogue one user at a time while the current output has exactly one
user (epilogue.py, so no intermediate leaks out of the region); norms and
attention take the nodes their reader matched. Rows marked ``first`` (attention:
it owns its q @ k^T and p @ v matmuls) are matched in a pass before the others.
Regions never overlap: a node joins at most one. Heavy ops no anchor matches
(baddbmm, einsum, conv3d, transposed convs, unfolded batch norms, ...) become
fallbacks with a reason as well (unanchored.py), so the report lists every
matmul-, conv-, attention- and norm-like op that stays in PyTorch.
"""
from __future__ import annotations

import logging
from dataclasses import replace

import torch.fx as fx

from ..config import CompileOptions
from ..errors import LeftByChoice, UnsupportedRegion
from ..ir import Fallback, Note, PartitionResult, note_stops
from ..target import ALIASES, TARGETS
from .gated_gemm import fuse_gated_linears
from .parallel_gemm import combine_parallel_linears
from .patterns import ANCHOR_BY_TARGET
from .unanchored import unanchored_fallbacks
from .wide_attention import decompose_wide_sdpa

log = logging.getLogger(__name__)


def partition(gm: fx.GraphModule, options: CompileOptions = CompileOptions()) -> PartitionResult:
    """Find the regions of a canonicalized ATen graph with FakeTensor metadata.

    With ``options.combine_gemms``, two rewrites of ``gm`` (in place) follow the
    first pass, each followed by another: a gate and an up linear on one input whose
    outputs are multiplied after an activation (SwiGLU, GEGLU) become one linear
    over their interleaved weights with a GLU epilogue, on sm90a
    (partition/gated_gemm.py); then sibling linears the pass found as plain or
    bias-only GEMM regions on one input, each under a wave of tiles on the target,
    become one linear over their concatenated weights (partition/parallel_gemm.py).
    The rewritten regions' notes name their members. Before all that, with
    ``options.decompose_wide_attention``, an SDPA of head dim above 256 becomes two
    matmuls and a softmax (partition/wide_attention.py). Returns a PartitionResult;
    never raises for an unsupported op (it becomes a Fallback). Node names in the
    result refer to ``gm.graph``.
    """
    if options.decompose_wide_attention:
        decompose_wide_sdpa(gm)
    result = _find_regions(gm, options)
    if not options.combine_gemms:
        return result
    # any spelling CompileOptions accepts ("sm_80", "sm80"); sm90a's count without one
    target = TARGETS[ALIASES[options.arch]] if options.arch else TARGETS["sm90a"]
    num_sms = options.num_sms or target.num_sms
    gated = dict(fuse_gated_linears(gm, result.regions, target.arch))
    if gated:
        result = _find_regions(gm, options)
    combined = dict(combine_parallel_linears(gm, result.regions, num_sms))
    if combined:
        result = _find_regions(gm, options)
    if not (gated or combined):
        return result
    return PartitionResult(tuple(_note_gated(_note_combined(r, combined), gated)
                                 for r in result.regions), result.fallbacks)


def _note_combined(region, combined: dict):
    """``region`` with a note naming the linears it combines, if it is a combined one
    (and without the note that its epilogue stops at the slices: they are the point)."""
    if not region.nodes or region.nodes[0] not in combined:
        return region
    members = combined[region.nodes[0]]
    stops = note_stops("epilogue", region.nodes[0], len(members))     # one use per slice
    notes = tuple(n for n in region.notes if n != stops)
    return replace(region, notes=notes + (Note(
        f"combines the sibling linears {', '.join(members)} into one GEMM over their "
        f"concatenated weights",
        f"combines {len(members)} sibling linears into one GEMM (partition/parallel_gemm.py)"),))


def _note_gated(region, gated: dict):
    """``region`` with a note naming the gate and up linears it computes, if it is a
    rewritten gated pair."""
    if not region.nodes or region.nodes[0] not in gated:
        return region
    gate, up = gated[region.nodes[0]]
    return replace(region, notes=region.notes + (Note(
        f"computes the gated pair act({gate}) * {up} as one GEMM over their interleaved "
        f"weights, the product in its epilogue",
        "computes a gated pair (act(gate) * up) as one GEMM with a GLU epilogue "
        "(partition/gated_gemm.py)"),))


def _find_regions(gm: fx.GraphModule, options: CompileOptions) -> PartitionResult:
    """One pass of the pattern table over ``gm`` (``partition`` without combining)."""
    regions, fallbacks, taken = [], [], set()
    for first in (True, False):
        for node in gm.graph.nodes:
            if node.op != "call_function" or node in taken:
                continue
            anchor = ANCHOR_BY_TARGET.get(node.target)
            if anchor is None or anchor.first != first:
                continue
            try:
                ops = anchor.operands(node, options)
                if ops is None:          # not the anchor's pattern after all (a plain rsqrt)
                    continue
                region, nodes = anchor.make(len(regions), node, ops, options, taken)
            except (UnsupportedRegion, ValueError) as e:
                fallbacks.append(Fallback(node.name, anchor.form, str(e),
                                          by_choice=isinstance(e, LeftByChoice)))
                log.info("fallback %s (%s): %s", node.name, anchor.form, e)
                continue
            regions.append(region)
            taken.update(nodes)
    # heavy ops no anchor matches stay in PyTorch too: say so (unanchored.py)
    fallbacks += unanchored_fallbacks(gm.graph, taken)
    return PartitionResult(tuple(regions), tuple(fallbacks))
