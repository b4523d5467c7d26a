"""The GEMM region maker: an anchor's operands (checks.py) plus its grown epilogue
(epilogue.py) become a GemmRegion with its GemmProblem."""
from __future__ import annotations

import math

from ..ir import GemmEpilogue, GemmProblem, GemmRegion
from .checks import m_hint
from .epilogue import grow_epilogue
from .graph_utils import max_alignment, static_int, val
from .wide_attention import NOTE_KEY as WIDE_NOTE_KEY


def make_gemm_region(index, node, ops, options, taken) -> tuple:
    """(GemmRegion, the nodes it takes) for a matched GEMM anchor ``node``; ValueError
    for an impossible problem."""
    state = grow_epilogue(node, ops, taken)
    return _make_region(index, node, ops, state), state.nodes


def _make_region(index, anchor, ops, state) -> GemmRegion:
    dtype = ops.dtype
    epilogue = GemmEpilogue(bias=state.bias, activation=state.activation,
                            residual=state.residual, post_activation=state.post_activation,
                            glu=state.glu)
    m_dims = ops.m_dims
    m_static = [static_int(d) for d in m_dims]
    m = None if any(s is None for s in m_static) else int(math.prod(m_static))
    batch = None
    if ops.batch_mode == "fold":
        batch = 1
    elif all(static_int(d) is not None for d in ops.batch_dims):
        batch = int(math.prod(static_int(d) for d in ops.batch_dims))
    layout_b = "col" if ops.b_nk else ("row" if static_int(val(ops.b).stride(-1)) == 1 else "col")
    align_b = max_alignment(ops.k if layout_b == "col" else ops.n, dtype)
    problem = GemmProblem(
        n=ops.n, k=ops.k, dtype=dtype, layout_b=layout_b, layout_a=ops.layout_a,
        align_a=_align_a(ops, dtype), align_b=align_b,
        align_c=max_alignment(ops.n // 2 if state.glu else ops.n, dtype),   # D's columns
        epilogue=epilogue, m=m, m_hint=max(1, m_hint(m_dims)), batch=batch,
        batch_hint=max(1, m_hint(ops.batch_dims)) if ops.batch_mode != "fold" else 1,
        a_batch_broadcast=ops.batch_mode == "a_broadcast", tf32=dtype == "f32")
    notes = tuple(state.notes)
    if WIDE_NOTE_KEY in anchor.meta:      # one of a wide attention's two GEMMs
        notes += (anchor.meta[WIDE_NOTE_KEY],)
    if ops.layout_a == "col":
        notes += ("A is read column-major (M contiguous: a transposed view), in place",)
    name = f"region{index}_{ops.form}_{epilogue.tag}"
    return GemmRegion(
        name=name, form=ops.form, nodes=tuple(n.name for n in state.nodes),
        a=ops.a.name, b=ops.b.name, problem=problem,
        bias=ops.bias.name if ops.bias is not None else None,
        c=state.c.name if state.c is not None else None,
        b_nk=ops.b_nk, batch_mode=ops.batch_mode, notes=notes)


def _align_a(ops, dtype) -> int:
    """A's alignment in elements: over K and its row stride for a row-major A; over
    M (the example's when dynamic: every call checks it again) and its column
    stride for a column-major one."""
    if ops.layout_a == "row":
        return max_alignment(ops.k, dtype)
    v = val(ops.a)
    m = static_int(v.shape[-2]) or m_hint(ops.m_dims)
    lda = static_int(v.stride(-1))
    return max_alignment(math.gcd(m, lda) if lda else m, dtype)
