"""The CUTLASS 3.x sm90 epilogue visitor tree (EVT) both gemm_sm90.py and
conv_sm90.py build for D = post(residual_op(activation(acc + bias), C)).

A non-plain epilogue is a chain of ``Sm90Compute`` nodes on top of
``Sm90AccFetch``: ``+ bias`` (a per-output-column ``Sm90RowBroadcast``), the
activation, the residual op with its source, the post activation. Every node
computes in fp32 and outputs ElementD: PyTorch runs these ops one at a time and
rounds each result to the tensor dtype, so the tree rounds at the same points
(round-to-nearest, no saturation). An fp16 overflow then gives PyTorch's inf /
NaN pattern (gelu(-inf) and silu(-inf) are NaN, inf - x stays inf, inf * 0 is
NaN) instead of finite values from an fp32 intermediate PyTorch never had; for
f32 (TF32) the rounding is the identity. A plain epilogue (no bias, no
activation, no residual) has no tree: the emitters use ``LinearCombination``.
"""
from __future__ import annotations

from pathlib import Path

from ..dtypes import BYTES, CPP
from ..ir import GemmEpilogue
from .activations import FUNCTOR

# dtype -> (C++ element type, bits); f32 is TF32 tensor-core math on fp32 storage
ELEMENT = {d: (CPP[d], 8 * BYTES[d]) for d in CPP}

# ir activation -> elementwise functor template (None: no node); activations.py
ACTIVATION = FUNCTOR

RESIDUAL = {"add": "cutlass::plus", "mul": "cutlass::multiplies"}

NS = "cutlass::epilogue::fusion::"


class Node:
    """One EVT node: its C++ type and the C++ initializer of its Arguments."""

    def __init__(self, type_: str, args: str, children: tuple = ()):
        self.type = type_
        self.args = args
        self.children = children

    def render_type(self, indent: int) -> str:
        pad = "  " * indent
        if not self.children:
            return pad + self.type
        inner = ",\n".join(c.render_type(indent + 1) for c in self.children)
        return f"{pad}{NS}Sm90EVT<{self.type},\n{inner}>"

    def render_args(self, indent: int) -> str:
        pad = "  " * indent
        if not self.children:
            return pad + self.args
        inner = ",\n".join(c.render_args(indent + 1) for c in self.children)
        return f"{pad}{{  // {self.type.split('<')[1].split(',')[0]}\n{inner},\n{pad}  {self.args}}}"


def compute(fn: str, out: str, *children: Node) -> Node:
    return Node(f"{NS}Sm90Compute<{fn}, {out}, ElementCompute, RoundStyle>", "{}", children)


def row_broadcast(pointer: str) -> Node:
    """A vector with one value per output column (N, resp. output channel K),
    constant along M and L."""
    return Node(
        f"{NS}Sm90RowBroadcast<0, TileShape, ElementBias, ElementCompute, "
        "cute::Stride<cute::_0, cute::_1, cute::_0>>",
        f"{{static_cast<ElementBias const*>({pointer}), ElementBias(0), {{}}}}")


def col_broadcast(pointer: str) -> Node:
    """A vector with one value per output row of the kernel's D, constant along N and
    L: the per-column bias of a GEMM computed transposed (KernelConfig.swap_ab), whose
    D^T rows are the problem's columns. Its alignment is the output's (AlignmentD):
    the vector is as long as D's contiguous extent."""
    return Node(
        f"{NS}Sm90ColBroadcast<0, TileShape, ElementBias, ElementCompute, "
        "cute::Stride<cute::_1, cute::_0, cute::_0>, AlignmentD>",
        f"{{static_cast<ElementBias const*>({pointer}), ElementBias(0), {{}}}}")


def per_sample_broadcast(pointer: str, rows_per_sample: str, ld: str) -> Node:
    """A (samples, N) row-major vector: output row m reads row m / ``rows_per_sample``
    (row stride ``ld``): a conv's per-sample (N, K, 1, 1) tensor, M being the
    linearized N * P * Q (templates/per_sample_broadcast.h, which the unit must
    carry: PER_SAMPLE_PREAMBLE)."""
    return Node("co_evt::Sm90PerSampleRowBroadcast<TileShape, ElementBias, ElementCompute>",
                f"{{static_cast<ElementBias const*>({pointer}), {rows_per_sample}, {ld}}}")


PER_SAMPLE_PREAMBLE = (Path(__file__).parent / "templates" / "per_sample_broadcast.h").read_text()


def src_fetch() -> Node:
    """The epilogue's source operand C."""
    return Node(f"{NS}Sm90SrcFetch<ElementC>", "{}")


def evt(ep: GemmEpilogue, residual_source: Node | None = None, transposed: bool = False) -> Node:
    """The epilogue tree for a non-plain epilogue; the root outputs ElementD.

    ``residual_source`` is the residual's node (default: the source C);
    ``transposed``: the kernel computes D^T (KernelConfig.swap_ab), so the bias runs
    along its rows (``col_broadcast``)."""
    # Each stage is (functor, extra children) applied on top of the tree so far.
    stages = []
    if ep.bias:
        bias = col_broadcast if transposed else row_broadcast
        stages.append(("cutlass::plus", (bias("args.bias"),)))
    if ACTIVATION[ep.activation]:
        stages.append((ACTIVATION[ep.activation], ()))
    if ep.residual != "none":
        source = residual_source if residual_source is not None else src_fetch()
        stages.append((RESIDUAL[ep.residual], (source,)))
    if ACTIVATION[ep.post_activation]:
        stages.append((ACTIVATION[ep.post_activation], ()))
    node = Node(f"{NS}Sm90AccFetch", "{}")
    for fn, extra in stages:
        # ElementD between nodes too: each stage's result rounded as PyTorch's op rounds it
        node = compute(fn, "ElementD", node, *extra)
    return node


def is_plain(ep: GemmEpilogue) -> bool:
    """No bias, activation or residual: LinearCombination with beta 0, no EVT."""
    return not ep.bias and ep.activation == "identity" and ep.residual == "none"


def semantics(ep: GemmEpilogue, acc: str, bias: str, source: str) -> str:
    """The epilogue as a formula, for the ``// D = ...`` comment."""
    if ep.glu:
        g, u = (f"gate + {bias}_g", f"up + {bias}_u") if ep.bias else ("gate", "up")
        act = f"{ep.activation}({g})" if ep.activation != "identity" else f"({g})"
        return f"{act} * ({u}), gate and up: {acc}'s columns interleaved in blocks of 8"
    x = f"{acc} + {bias}" if ep.bias else acc
    if ep.activation != "identity":
        x = f"{ep.activation}({x})"
    if ep.residual == "add":
        x = f"{x} + {source}"
    elif ep.residual == "mul":
        x = f"({x}) * {source}"
    if ep.post_activation != "identity":
        x = f"{ep.post_activation}({x})"
    return x
