"""Emit one direct depthwise conv2d fprop kernel (``direct_depthwise`` family).

``emit(kernel)`` returns a ``KernelSource`` whose code defines, inside
``namespace <kernel.name>``::

    int64_t workspace_size(const CoConvArgs& args);        // 0: no workspace
    int run(const CoConvArgs& args, cudaStream_t stream);  // a CoStatus

over the shared templates of templates/depthwise.cuh and depthwise_tiled.cuh
(hand-written CUDA over CUTLASS's numeric types, AlignedArray and cp.async; see there
for the two forms and their work split). The
epilogue ``D = post(residual_op(activation(acc + bias), C))`` is computed in fp32
and rounded once, as in the GEMM and conv kernels; the bias is optional (a null
pointer), the residual is an NHWC tensor of the output's shape or, with
``residual_broadcast``, a per-channel (C,) vector. ``run`` refuses
(CO_CANNOT_IMPLEMENT) what the instantiation does not compute: another filter
width or horizontal stride, dilation, K != C, C not a multiple of 8, pointers
that are not 16-byte aligned, sizes past 32-bit offsets per row. A kernel with
``tiled`` runs the tiled form where R = S and stride_h = stride_w and its tile fits
48 KB of shared memory, the row form otherwise.
"""
from __future__ import annotations

from pathlib import Path
from string import Template

from ..dtypes import CPP
from ..ir import DepthwiseKernel, KernelSource
from . import activations

FAMILY = DepthwiseKernel.FAMILY

INCLUDES = ("cutlass/cutlass.h", "cutlass/array.h", "cutlass/numeric_types.h")

# Shared by every depthwise kernel of a translation unit, inlined once per TU
# (include guard); templates only, so the same instantiation in two objects of one
# library links once.
_COMMON = "\n".join((Path(__file__).parent / "templates" / name).read_text()
                    for name in ("depthwise.cuh", "depthwise_tiled.cuh"))

# ir.GemmEpilogue -> the template's codes (templates/depthwise.cuh enum Activation / Residual)
ACTIVATION_CODES = {"identity": 0, "relu": 1, "gelu_erf": 2, "gelu_tanh": 3, "silu": 4, "sigmoid": 5,
                    "hardswish": 6, "hardsigmoid": 7, "quick_gelu": 8}
RESIDUAL_CODES = {"none": 0, "add": 1, "mul": 2}
POST_CODES = {"identity": 0, "relu": 1}

_KERNEL = """\
// ${name}: D = ${semantics}
namespace ${name} {

int64_t workspace_size(const CoConvArgs&) { return 0; }

int run(const CoConvArgs& args, cudaStream_t stream) {
  return co_depthwise::run<${element}, ${s}, ${stride_w}, ${outputs}, ${tiled}, ${act}, ${res}, ${broadcast}, ${post}>(
      args, stream);
}

}  // namespace ${name}
"""


def check(kernel: DepthwiseKernel) -> None:
    """Raise ValueError unless this family can build ``kernel``."""
    if kernel.config.family != FAMILY:
        raise ValueError(f"{kernel.name}: not a {FAMILY} kernel")
    if kernel.epilogue.residual_per_sample:
        raise ValueError(f"{kernel.name}: the depthwise kernel reads no per-sample residual")
    # filter width, stride and outputs per thread are DepthwiseKernel's own checks


def semantics(kernel: DepthwiseKernel) -> str:
    ep = kernel.epilogue
    d = "acc" + (" + bias" if ep.bias else "")
    if ep.activation != "identity":
        d = f"{ep.activation}({d})"
    if ep.residual != "none":
        c = "c[k]" if ep.residual_broadcast else "C"
        d = f"{d} {'+' if ep.residual == 'add' else '*'} {c}"
    if ep.post_activation != "identity":
        d = f"{ep.post_activation}({d})"
    return d


def emit(kernel: DepthwiseKernel) -> KernelSource:
    """The KernelSource of one depthwise kernel, preceded by the shared templates."""
    check(kernel)
    ep = kernel.epilogue
    body = Template(_KERNEL).substitute(
        name=kernel.name, semantics=semantics(kernel), element=CPP[kernel.dtype], s=kernel.s,
        stride_w=kernel.stride_w, outputs=kernel.outputs,
        tiled=", ".join(map(str, kernel.tiled or (0, 0, 128, 1))), act=ACTIVATION_CODES[ep.activation],
        res=RESIDUAL_CODES[ep.residual], broadcast="true" if ep.residual_broadcast else "false",
        post=POST_CODES[ep.post_activation])
    # the activations preamble always: the shared template names its functors
    return KernelSource(name=kernel.name, includes=INCLUDES, code=_COMMON + "\n" + body,
                        args_type="CoConvArgs", preamble=(activations.ACTIVATIONS_H,))
